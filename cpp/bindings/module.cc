// pyckpt._core: the Python binding of the C++ core.
//
// Every function has one shape: parse arguments into native structs (GIL
// held) -> release the GIL -> run the core -> reacquire -> convert the result
// or raise through RaiseIfError (status_to_python.h); RunWithoutGil does the
// middle steps. The bulk entry points take their data as keyword arguments and
// their tuning as one options object (ReadOptions, WriteOptions), whose
// Native() is the one place the core's option structs are filled; their
// defaults are the core's (pyckpt/defaults.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "convert.h"
#include "pyckpt/copy.h"
#include "pyckpt/crc32c.h"
#include "pyckpt/defaults.h"
#include "pyckpt/layout.h"
#include "pyckpt/parallel.h"
#include "pyckpt/shard_reader.h"
#include "pyckpt/shard_writer.h"
#include "pyckpt/staged_writer.h"
#include "restricted_pickle.h"
#include "status_to_python.h"

namespace py = pybind11;

namespace pyckpt {
namespace binding {
namespace {

// Buffers smaller than this are checksummed without releasing the GIL.
constexpr size_t kReleaseThreshold = 64 * 1024;

// A counter the core adds processed bytes to, read by Python from any thread.
class ProgressCounter {
 public:
  std::atomic<uint64_t> value{0};
};

// Runs a core call (a callable returning a Status) with the GIL released, then
// raises its error, if any (RaiseIfError). The callable must not touch Python objects.
template <typename Fn>
void RunWithoutGil(Fn&& fn) {
  Status st;
  {
    py::gil_scoped_release release;
    st = fn();
  }
  RaiseIfError(st);
}

std::atomic<uint64_t>* CounterPtr(const py::handle& obj) {
  if (obj.is_none()) return nullptr;
  return &obj.cast<ProgressCounter&>().value;
}

// The core's option structs as default-constructed: the one source of the
// defaults of ReadOptionsPy/WriteOptionsPy and of their keyword arguments.
constexpr ShardReadOptions kReadDefaults{};
constexpr ShardWriteOptions kWriteDefaults{};

// The tuning of the shard readers and writers as Python sees it (`ReadOptions`,
// `WriteOptions`, keyword-constructed, named fields). Native() is the one place
// where the core's option struct is filled from it; call it with the GIL held
// (the progress counter is a Python object) and hold a reference to that counter
// while the core runs (the native options point into it).
struct ReadOptionsPy {
  uint64_t chunk_size = kReadDefaults.chunk_size;
  int threads = kReadDefaults.threads;
  bool verify = kReadDefaults.verify;
  uint64_t piece_size = kReadDefaults.piece_size;
  uint64_t max_gap = kReadDefaults.max_gap;
  bool whole_item_crc = kReadDefaults.whole_item_crc;
  py::object progress = py::none();

  ShardReadOptions Native() const {
    ShardReadOptions opt;
    opt.chunk_size = chunk_size;
    opt.threads = threads;
    opt.verify = verify;
    opt.piece_size = piece_size;
    opt.max_gap = max_gap;
    opt.whole_item_crc = whole_item_crc;
    opt.progress = CounterPtr(progress);
    return opt;
  }
};

struct WriteOptionsPy {
  uint64_t chunk_size = kWriteDefaults.chunk_size;
  int threads = kWriteDefaults.threads;
  uint64_t piece_size = kWriteDefaults.piece_size;
  bool sync = kWriteDefaults.sync;
  bool whole_items = kWriteDefaults.whole_items;
  py::object progress = py::none();

  ShardWriteOptions Native() const {
    ShardWriteOptions opt;
    opt.chunk_size = chunk_size;
    opt.threads = threads;
    opt.piece_size = piece_size;
    opt.sync = sync;
    opt.whole_items = whole_items;
    opt.progress = CounterPtr(progress);
    return opt;
  }
};

// The Python object of a counter (kept alive by the options), or None.
using OptionalCounter = std::optional<ProgressCounter*>;

py::object CounterObject(OptionalCounter counter) {
  if (!counter || *counter == nullptr) return py::none();
  return py::cast(*counter, py::return_value_policy::reference);  // the existing wrapper
}

OptionalCounter CounterOf(const py::object& obj) {
  if (obj.is_none()) return std::nullopt;
  return &obj.cast<ProgressCounter&>();
}

// The `progress` property of ReadOptions and WriteOptions.
template <typename Options>
OptionalCounter GetProgress(const Options& o) {
  return CounterOf(o.progress);
}
template <typename Options>
void SetProgress(Options& o, OptionalCounter p) {
  o.progress = CounterObject(p);
}

uint32_t Crc32c(const py::buffer& data, uint32_t crc) {
  py::buffer_info info = data.request();
  const size_t n = static_cast<size_t>(info.size * info.itemsize);
  if (n < kReleaseThreshold) return crc32c::Extend(crc, info.ptr, n);
  py::gil_scoped_release release;
  return crc32c::Extend(crc, info.ptr, n);
}

py::object Crc32cHardware(const py::buffer& data, uint32_t crc) {
  py::buffer_info info = data.request();
  uint32_t out = 0;
  bool ok;
  {
    py::gil_scoped_release release;
    ok = crc32c::ExtendHardware(crc, info.ptr, static_cast<size_t>(info.size * info.itemsize), &out);
  }
  if (!ok) return py::none();
  return py::int_(out);
}

uint32_t Crc32cPortable(const py::buffer& data, uint32_t crc) {
  py::buffer_info info = data.request();
  py::gil_scoped_release release;
  return crc32c::ExtendPortable(crc, info.ptr, static_cast<size_t>(info.size * info.itemsize));
}

py::tuple PlanLayoutPy(const py::handle& nbytes_obj, uint32_t num_files, uint64_t alignment) {
  auto arr = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(nbytes_obj);
  if (!arr || arr.ndim() != 1) throw py::type_error("nbytes must be a 1-d integer array");
  std::vector<uint64_t> nbytes(arr.data(), arr.data() + arr.shape(0));
  Layout layout;
  RunWithoutGil([&] { return PlanLayout(nbytes, num_files, alignment, &layout); });
  return py::make_tuple(ToNumpy(std::move(layout.file)), ToNumpy(std::move(layout.offset)),
                        py::cast(layout.file_sizes));
}

std::vector<ShardWriteItem> WriteItems(const std::vector<std::string>& keys, const py::list& arrays,
                                       const py::handle& files, const py::handle& offsets) {
  const size_t n = keys.size();
  if (static_cast<size_t>(py::len(arrays)) != n)
    throw py::value_error("keys and arrays differ in length");
  std::vector<uint32_t> f = files.is_none() ? std::vector<uint32_t>(n, 0)
                                            : IntVector<uint32_t>(files, n, "files");
  std::vector<uint64_t> o = offsets.is_none() ? std::vector<uint64_t>(n, 0)
                                              : IntVector<uint64_t>(offsets, n, "offsets");
  std::vector<ShardWriteItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    items[i].key = keys[i];
    items[i].src = ArrayView(arrays[i], /*writable=*/false, "tensor");
    items[i].file = f[i];
    items[i].offset = o[i];
  }
  return items;
}

py::tuple ChecksumTuple(ChecksumResult&& r) {
  return py::make_tuple(ToNumpy(std::move(r.crcs)), ToNumpy(std::move(r.crc_begin)));
}

py::tuple WriteShardsPy(const std::vector<std::string>& paths, const std::vector<uint64_t>& sizes,
                        const std::vector<std::string>& keys, const py::list& arrays,
                        const py::handle& files, const py::handle& offsets,
                        const WriteOptionsPy& options) {
  std::vector<ShardWriteItem> items = WriteItems(keys, arrays, files, offsets);
  const ShardWriteOptions opt = options.Native();
  const py::object counter = options.progress;  // alive while the core adds to it
  ChecksumResult result;
  RunWithoutGil([&] { return WriteShardFiles(paths, sizes, items, opt, &result); });
  return ChecksumTuple(std::move(result));
}

py::tuple ComputeChecksumsPy(const std::vector<std::string>& keys, const py::list& arrays,
                             const WriteOptionsPy& options) {
  std::vector<ShardWriteItem> items = WriteItems(keys, arrays, py::none(), py::none());
  const ShardWriteOptions opt = options.Native();
  const py::object counter = options.progress;  // alive while the core adds to it
  ChecksumResult result;
  RunWithoutGil([&] { return ComputeChecksums(items, opt, &result); });
  return ChecksumTuple(std::move(result));
}

void ReadShardsPy(const std::vector<std::string>& names, const py::list& buffers,
                  const std::vector<uint64_t>& bases, const std::vector<std::string>& keys,
                  const py::handle& sources, const py::handle& offsets, const py::handle& nbytes,
                  const py::handle& crcs_obj, const py::handle& crc_begin_obj, const py::list& dsts,
                  const ReadOptionsPy& options) {
  const ShardReadOptions opt = options.Native();
  const py::object counter = options.progress;  // alive while the core adds to it
  const uint64_t chunk_size = opt.chunk_size;
  const size_t ns = names.size();
  if (static_cast<size_t>(py::len(buffers)) != ns || bases.size() != ns)
    throw py::value_error("names, buffers and bases differ in length");
  std::vector<ShardSource> srcs(ns);
  std::vector<py::buffer_info> held;  // keeps exported buffers alive during the read
  held.reserve(ns);
  for (size_t s = 0; s < ns; ++s) {
    srcs[s].name = names[s];
    py::handle b = buffers[s];
    if (b.is_none()) continue;
    held.push_back(py::reinterpret_borrow<py::buffer>(b).request());
    srcs[s].in_memory = true;
    srcs[s].data = static_cast<const char*>(held.back().ptr);
    srcs[s].base = bases[s];
    srcs[s].size = static_cast<uint64_t>(held.back().size * held.back().itemsize);
  }
  const size_t n = keys.size();
  if (static_cast<size_t>(py::len(dsts)) != n) throw py::value_error("keys and dsts differ in length");
  std::vector<uint32_t> src_idx = IntVector<uint32_t>(sources, n, "sources");
  std::vector<uint64_t> off = IntVector<uint64_t>(offsets, n, "offsets");
  std::vector<uint64_t> len = IntVector<uint64_t>(nbytes, n, "nbytes");
  std::vector<uint64_t> crc_begin = IntVector<uint64_t>(crc_begin_obj, n + 1, "crc_begin");
  auto crcs = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>::ensure(crcs_obj);
  if (!crcs || crcs.ndim() != 1) throw py::type_error("crcs must be a 1-d integer array");
  const uint64_t ncrcs = static_cast<uint64_t>(crcs.shape(0));
  std::vector<ShardReadItem> items(n);
  for (size_t i = 0; i < n; ++i) {
    ShardReadItem& it = items[i];
    it.key = keys[i];
    it.source = src_idx[i];
    it.offset = off[i];
    it.nbytes = len[i];
    const uint64_t want = opt.whole_item_crc ? (len[i] > 0 ? 1 : 0)
                                             : (len[i] + chunk_size - 1) / (chunk_size ? chunk_size : 1);
    if (crc_begin[i] > ncrcs || crc_begin[i + 1] > ncrcs || crc_begin[i + 1] < crc_begin[i] ||
        crc_begin[i + 1] - crc_begin[i] != want)
      throw py::value_error("tensor '" + keys[i] + "' has the wrong number of checksums");
    it.crcs = crcs.data() + crc_begin[i];
    py::handle d = dsts[i];
    if (!d.is_none()) {
      it.has_dst = true;
      it.dst = ArrayView(d, /*writable=*/true, "destination array");
    }
  }
  RunWithoutGil([&] { return ReadShards(srcs, items, opt); });
}

// Fills `out` with bytes [begin, begin + len(out)) of a shard file whose
// tensors `arrays` start at `offsets`; gaps are zero padding. Used to stream
// shard files to object stores part by part without building them in memory.
void FillRangePy(const py::list& arrays, const py::handle& offsets_obj, uint64_t begin,
                 const py::buffer& out) {
  const size_t n = static_cast<size_t>(py::len(arrays));
  std::vector<uint64_t> offsets = IntVector<uint64_t>(offsets_obj, n, "offsets");
  std::vector<TensorView> views(n);
  for (size_t i = 0; i < n; ++i) {
    views[i] = ArrayView(arrays[i], false, "tensor");
    RaiseIfError(ValidateView(views[i], "tensor"));
  }
  py::buffer_info info = out.request(/*writable=*/true);
  char* dst = static_cast<char*>(info.ptr);
  const uint64_t len = static_cast<uint64_t>(info.size * info.itemsize);
  const uint64_t end = begin + len;
  py::gil_scoped_release release;
  uint64_t pos = begin;  // first byte of the range not yet written
  for (size_t i = 0; i < n; ++i) {
    const uint64_t a = offsets[i], b = a + views[i].NumBytes();
    if (b <= begin || a >= end || a == b) continue;
    const uint64_t lo = std::max(a, begin), hi = std::min(b, end);
    if (lo > pos) std::memset(dst + (pos - begin), 0, lo - pos);
    GatherRange(views[i], lo - a, hi - lo, dst + (lo - begin));
    pos = std::max(pos, hi);
  }
  if (pos < end) std::memset(dst + (pos - begin), 0, end - pos);
}

// A StagedWrite plus the Python arrays it points into (kept alive until wait()).
class PyStagedWrite {
 public:
  StagedWrite write;
  py::list keep;
};

std::unique_ptr<PyStagedWrite> StartStagedWritePy(
    const std::vector<std::string>& paths, const std::vector<uint64_t>& sizes,
    const std::vector<std::string>& keys, const py::list& staging, const py::object& live,
    const py::handle& files, const py::handle& offsets, const WriteOptionsPy& options) {
  std::vector<ShardWriteItem> items = WriteItems(keys, staging, files, offsets);
  std::vector<TensorView> live_views;  // none: staged externally (mark_ready)
  if (!live.is_none()) {
    const py::list live_list = live.cast<py::list>();
    if (static_cast<size_t>(py::len(live_list)) != items.size())
      throw py::value_error("staging and live differ in length");
    live_views.resize(items.size());
    for (size_t i = 0; i < items.size(); ++i)
      live_views[i] = ArrayView(live_list[i], false, "tensor");
  }
  const ShardWriteOptions opt = options.Native();
  auto out = std::make_unique<PyStagedWrite>();
  out->keep.append(staging);
  out->keep.append(live);
  out->keep.append(options.progress);  // the counter the writer threads add to
  RunWithoutGil([&] { return out->write.Start(paths, sizes, items, live_views, opt); });
  return out;
}

void CopyArraysPy(const py::list& srcs, const py::list& dsts, int threads) {
  const size_t n = static_cast<size_t>(py::len(srcs));
  if (static_cast<size_t>(py::len(dsts)) != n) throw py::value_error("srcs and dsts differ in length");
  std::vector<TensorView> s(n), d(n);
  for (size_t i = 0; i < n; ++i) {
    s[i] = ArrayView(srcs[i], false, "source array");
    d[i] = ArrayView(dsts[i], true, "destination array");
  }
  RunWithoutGil([&] { return CopyTensors(s, d, threads); });
}

}  // namespace
}  // namespace binding
}  // namespace pyckpt

PYBIND11_MODULE(_core, m, py::mod_gil_not_used()) {
  using namespace pyckpt::binding;
  m.doc() = "pyckpt's C++ core: CRC32C, shard layout, parallel verified shard I/O, parallel copies.";

  m.def("crc32c", &Crc32c, py::arg("data"), py::arg("crc") = 0,
        "CRC-32C of a buffer, continuing from `crc` (fastest implementation available).");
  m.def("crc32c_portable", &Crc32cPortable, py::arg("data"), py::arg("crc") = 0,
        "CRC-32C computed with the portable table implementation.");
  m.def("crc32c_hardware", &Crc32cHardware, py::arg("data"), py::arg("crc") = 0,
        "CRC-32C computed with the SSE4.2 implementation, or None without SSE4.2.");
  m.def("crc32c_combine", &pyckpt::crc32c::Combine, py::arg("crc_a"), py::arg("crc_b"),
        py::arg("len_b"), "CRC-32C of A||B from CRC(A), CRC(B) and len(B).");
  m.def("crc32c_mask", &pyckpt::crc32c::Mask, py::arg("crc"), "Masked form of a CRC for storage.");
  m.def("crc32c_unmask", &pyckpt::crc32c::Unmask, py::arg("masked"), "Inverse of crc32c_mask.");
  m.def("crc32c_implementation", &pyckpt::crc32c::Implementation,
        "Name of the CRC-32C implementation in use: 'sse4.2' or 'portable'.");
  m.def("default_threads", &pyckpt::DefaultThreads,
        "Worker threads used when a call passes threads <= 0.");
  m.def("plan_layout", &PlanLayoutPy, py::arg("nbytes"), py::arg("num_files"),
        py::arg("alignment"),
        "Places tensors into files: returns (file[uint32], offset[uint64], file_sizes).");
  py::class_<ProgressCounter>(m, "ProgressCounter",
                              "Bytes processed so far by the core calls it is passed to.")
      .def(py::init<>())
      .def_property_readonly(
          "value", [](const ProgressCounter& c) { return c.value.load(std::memory_order_relaxed); },
          "Bytes processed so far.")
      .def(
          "add", [](ProgressCounter& c, uint64_t n) { c.value.fetch_add(n); }, py::arg("n"),
          "Adds n bytes (for work done in Python).");
  py::class_<ReadOptionsPy>(m, "ReadOptions", "Tuning of read_shards.")
      .def(py::init([](uint64_t chunk_size, int threads, bool verify, uint64_t piece_size,
                       uint64_t max_gap, bool whole_item_crc, OptionalCounter progress) {
             ReadOptionsPy o;
             o.whole_item_crc = whole_item_crc;
             o.chunk_size = chunk_size;
             o.threads = threads;
             o.verify = verify;
             o.piece_size = piece_size;
             o.max_gap = max_gap;
             SetProgress(o, progress);
             return o;
           }),
           py::kw_only(), py::arg("chunk_size") = kReadDefaults.chunk_size,
           py::arg("threads") = kReadDefaults.threads, py::arg("verify") = kReadDefaults.verify,
           py::arg("piece_size") = kReadDefaults.piece_size,
           py::arg("max_gap") = kReadDefaults.max_gap,
           py::arg("whole_item_crc") = kReadDefaults.whole_item_crc,
           py::arg("progress") = py::none())
      .def_readwrite("chunk_size", &ReadOptionsPy::chunk_size,
                     "Bytes per checksummed chunk (the manifest's chunk_size).")
      .def_readwrite("threads", &ReadOptionsPy::threads,
                     "Worker threads (<= 0: default_threads()).")
      .def_readwrite("verify", &ReadOptionsPy::verify, "Check every chunk's CRC-32C.")
      .def_readwrite("piece_size", &ReadOptionsPy::piece_size, "Unit of parallel work in bytes.")
      .def_readwrite("whole_item_crc", &ReadOptionsPy::whole_item_crc,
                     "Each tensor has one CRC over all its bytes (chunk_size: read step only).")
      .def_readwrite("max_gap", &ReadOptionsPy::max_gap,
                     "Small tensors of one file closer than this many bytes share a read.")
      .def_property(
          "progress", &GetProgress<ReadOptionsPy>, &SetProgress<ReadOptionsPy>,
          py::return_value_policy::reference,
          "ProgressCounter the bytes read are added to, or None.");
  py::class_<WriteOptionsPy>(m, "WriteOptions", "Tuning of write_shards, compute_checksums and "
                                                "start_staged_write.")
      .def(py::init([](uint64_t chunk_size, int threads, uint64_t piece_size, bool sync,
                       OptionalCounter progress, bool whole_items) {
             WriteOptionsPy o;
             o.chunk_size = chunk_size;
             o.threads = threads;
             o.piece_size = piece_size;
             o.sync = sync;
             o.whole_items = whole_items;
             SetProgress(o, progress);
             return o;
           }),
           py::kw_only(), py::arg("chunk_size") = kWriteDefaults.chunk_size,
           py::arg("threads") = kWriteDefaults.threads,
           py::arg("piece_size") = kWriteDefaults.piece_size, py::arg("sync") = kWriteDefaults.sync,
           py::arg("progress") = py::none(), py::arg("whole_items") = kWriteDefaults.whole_items)
      .def_readwrite("whole_items", &WriteOptionsPy::whole_items,
                     "Write each tensor's slices in a row (staging through a ring).")
      .def_readwrite("chunk_size", &WriteOptionsPy::chunk_size, "Bytes per checksummed chunk.")
      .def_readwrite("threads", &WriteOptionsPy::threads,
                     "Worker threads (<= 0: default_threads()).")
      .def_readwrite("piece_size", &WriteOptionsPy::piece_size, "Unit of parallel work in bytes.")
      .def_readwrite("sync", &WriteOptionsPy::sync, "fsync every file before returning.")
      .def_property(
          "progress", &GetProgress<WriteOptionsPy>, &SetProgress<WriteOptionsPy>,
          py::return_value_policy::reference,
          "ProgressCounter the bytes written are added to, or None.");
  m.def("write_shards", &WriteShardsPy, py::kw_only(), py::arg("paths"), py::arg("file_sizes"),
        py::arg("keys"), py::arg("arrays"), py::arg("files"), py::arg("offsets"),
        py::arg_v("options", WriteOptionsPy(), "WriteOptions()"),
        "Writes arrays into new shard files; returns (masked chunk crcs, crc_begin).");
  m.def("compute_checksums", &ComputeChecksumsPy, py::kw_only(), py::arg("keys"),
        py::arg("arrays"), py::arg_v("options", WriteOptionsPy(), "WriteOptions()"),
        "Masked chunk CRCs of arrays without writing; returns (crcs, crc_begin).");
  m.def("read_shards", &ReadShardsPy, py::kw_only(), py::arg("names"), py::arg("buffers"),
        py::arg("bases"), py::arg("keys"), py::arg("sources"), py::arg("offsets"),
        py::arg("nbytes"), py::arg("crcs"), py::arg("crc_begin"), py::arg("dsts"),
        py::arg_v("options", ReadOptionsPy(), "ReadOptions()"),
        "Reads and verifies tensors from files (buffer None) or memory buffers into dsts.");
  m.def("fill_range", &FillRangePy, py::arg("arrays"), py::arg("offsets"), py::arg("begin"),
        py::arg("out"),
        "Fills `out` with file bytes [begin, begin+len(out)) of tensors placed at offsets (sorted).");
  py::class_<PyStagedWrite>(m, "StagedWrite",
                            "A write that overlaps copying live tensors into staging buffers.")
      .def(
          "stage",
          [](PyStagedWrite& self, int threads) {
            RunWithoutGil([&] { return self.write.Stage(threads); });
          },
          py::arg("threads") = pyckpt::kAutoThreads,
          "Copies every live tensor into its staging buffer; returns when all are copied.")
      .def(
          "order", [](const PyStagedWrite& self) { return self.write.Order(); },
          "Item indices in the order the writers need them (external staging).")
      .def(
          "mark_ready",
          [](PyStagedWrite& self, size_t item, const py::object& buffer) {
            if (buffer.is_none()) {
              RaiseIfError(self.write.MarkReady(item));
              return;
            }
            const pyckpt::TensorView view = ArrayView(buffer, /*writable=*/false, "staging buffer");
            self.keep.append(buffer);  // read by the writers until wait()
            RaiseIfError(self.write.MarkReady(item, &view));
          },
          py::arg("item"), py::arg("buffer") = py::none(),
          "Externally staged writes: staging buffer `item` is filled (or `buffer`, an array "
          "of its size, holds its bytes instead); the writers may use it.")
      .def(
          "wait_written",
          [](PyStagedWrite& self, size_t item) {
            RunWithoutGil([&] { return self.write.WaitWritten(item); });
          },
          py::arg("item"),
          "Externally staged writes: returns once item `item` was written (its staging "
          "memory may be reused); raises when the write ended first.")
      .def(
          "wait",
          [](PyStagedWrite& self) {
            pyckpt::ChecksumResult result;
            pyckpt::Status st;
            {
              py::gil_scoped_release release;
              st = self.write.Wait(&result);
            }
            self.keep = py::list();
            RaiseIfError(st);
            return ChecksumTuple(std::move(result));
          },
          "Waits for the write; returns (masked chunk crcs, crc_begin).");
  m.def("start_staged_write", &StartStagedWritePy, py::kw_only(), py::arg("paths"),
        py::arg("file_sizes"), py::arg("keys"), py::arg("staging"), py::arg("live"),
        py::arg("files"), py::arg("offsets"),
        py::arg_v("options", WriteOptionsPy(), "WriteOptions()"),
        "Plans a write of `staging` and starts writing each tensor once stage() copied it "
        "(live=None: once mark_ready(i) says buffer i is filled).");
  RegisterRestrictedPickle(m);
  m.def("copy_arrays", &CopyArraysPy, py::arg("srcs"), py::arg("dsts"), py::arg("threads") = pyckpt::kAutoThreads,
        "Copies every srcs[i] into dsts[i] (same byte size) in parallel.");
}
