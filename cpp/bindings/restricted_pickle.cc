// The restricted pickle machine of pyckpt/codecs/distcp/unpickler.py, in C++:
// the rules are that module's doc, and this file keeps them exactly (the Python
// reference in tests/interop_dcp/reference_unpickler.py is checked against it).
//
// It builds Python objects, so it runs with the GIL held; it calls back into
// Python only for what the data asks of an allowed stand-in (a Global's `call`,
// the persistent-id function, a new `Obj`) and, on failure only, for the short
// rendering of a value in a message. It never throws: every refusal is a
// Status (Corruption, the message "<where>: <what> (pickle opcode at byte N)"),
// raised by RaiseIfError, and a Python exception that is not a refusal (a
// MemoryError, a KeyboardInterrupt in a callback) is left set and re-raised.
#include "restricted_pickle.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "status_to_python.h"

namespace pyckpt {
namespace binding {

namespace py = pybind11;

namespace {

// integers up to this magnitude are their own hash (CPython: modulo 2**61 - 1)
constexpr long long kIntKey = (1LL << 61) - 2;

// A new reference, released when this goes out of scope.
class Ref {
 public:
  explicit Ref(PyObject* p = nullptr) : p_(p) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(p_); }
  PyObject* get() const { return p_; }
  void reset(PyObject* p) {
    Py_XDECREF(p_);
    p_ = p;
  }
  PyObject* release() {
    PyObject* p = p_;
    p_ = nullptr;
    return p;
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  PyObject* p_;
};

// A Python str as UTF-8 (lone surrogates kept, as RaiseIfError decodes them).
std::string Utf8(PyObject* s) {
  Ref b(PyUnicode_AsEncodedString(s, "utf-8", "surrogatepass"));
  if (!b) {
    PyErr_Clear();
    return "?";
  }
  return std::string(PyBytes_AS_STRING(b.get()), static_cast<size_t>(PyBytes_GET_SIZE(b.get())));
}

// What a Global stand-in is, looked up once per object (the reference keeps the
// address from being reused while the machine runs).
struct GlobalInfo {
  PyObject* self = nullptr;      // owned
  PyObject* call = nullptr;      // owned; null when the stand-in's call is None
  PyObject* qualname = nullptr;  // owned
  bool is_class = false;
};

class Machine {
 public:
  Machine(const UnpickleArgs& a)
      : a_(a),
        d_(reinterpret_cast<const uint8_t*>(a.data)),
        end_(a.size),
        budget_(a.work_per_byte * a.size + a.work_base) {}

  ~Machine() {
    for (PyObject* o : stack_) Py_DECREF(o);
    for (PyObject* o : dense_) Py_DECREF(o);
    for (auto& kv : sparse_) Py_DECREF(kv.second);
    for (auto& kv : globals_) {
      Py_DECREF(kv.second.self);
      Py_XDECREF(kv.second.call);
      Py_XDECREF(kv.second.qualname);
    }
  }

  // Runs to STOP: the value (a new reference) and the position after STOP.
  Status Run(PyObject** value, size_t* after);
  bool python_error() const { return python_error_; }

 private:
  // -- failure ------------------------------------------------------------------------
  bool Fail(const std::string& what) {
    err_ = Status::Corruption(a_.where + ": " + what + " (pickle opcode at byte " +
                              std::to_string(op_at_) + ")");
    return false;
  }
  // A Python error is set that is not a refusal: it propagates as it is.
  bool PyFail() {
    python_error_ = true;
    err_ = Status::Corruption("python error");
    return false;
  }
  // The pending Python error of a callback: a TypeError or ValueError refuses
  // with `prefix: message`; the malformed-data kinds refuse as the reference's
  // catch-all does; anything else propagates. `prefix()` is rendered once the error
  // is fetched (it calls Python).
  template <typename Prefix>
  bool CallbackFail(Prefix prefix) {
    const bool refusal =
        PyErr_ExceptionMatches(PyExc_TypeError) || PyErr_ExceptionMatches(PyExc_ValueError);
    const bool malformed =
        PyErr_ExceptionMatches(PyExc_IndexError) || PyErr_ExceptionMatches(PyExc_KeyError) ||
        PyErr_ExceptionMatches(PyExc_OverflowError) || PyErr_ExceptionMatches(PyExc_RecursionError);
    if (!refusal && !malformed) return PyFail();
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Ref t(type), v(value), b(tb);
    Ref text(v ? PyObject_Str(v.get()) : PyUnicode_FromString(""));
    if (!text) return PyFail();
    std::string msg = Utf8(text.get());
    if (refusal) return Fail(prefix() + ": " + msg);
    Ref name(PyObject_GetAttrString(t.get(), "__name__"));
    if (!name) return PyFail();
    return Fail("malformed pickle (" + Utf8(name.get()) + ": " + msg + ")");
  }
  // unpickler._short(value): a bounded rendering, for messages.
  std::string Short(PyObject* v) {
    Ref s(PyObject_CallOneArg(a_.short_fn, v));
    if (!s || !PyUnicode_Check(s.get())) {
      PyErr_Clear();
      return "<?>";
    }
    return Utf8(s.get());
  }
  std::string TypeName(PyObject* v) {
    Ref name(PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(v)), "__name__"));
    if (!name || !PyUnicode_Check(name.get())) {
      PyErr_Clear();
      return Py_TYPE(v)->tp_name;
    }
    return Utf8(name.get());
  }

  // -- bytes --------------------------------------------------------------------------
  bool Take(uint64_t n, const uint8_t** p) {
    const uint64_t left = end_ - pos_;
    if (n > left)
      return Fail("truncated: " + std::to_string(n) + " bytes wanted, " + std::to_string(left) +
                  " left");
    *p = d_ + pos_;
    pos_ += static_cast<size_t>(n);
    return true;
  }
  bool Uint(int nbytes, uint64_t* v) {
    const uint8_t* p;
    if (!Take(static_cast<uint64_t>(nbytes), &p)) return false;
    uint64_t x = 0;
    for (int i = nbytes - 1; i >= 0; --i) x = (x << 8) | p[i];
    *v = x;
    return true;
  }

  // -- the stack (values are owned references) -------------------------------------------
  size_t Floor() const { return marks_.empty() ? 0 : marks_.back(); }
  bool Push(PyObject* o) {  // steals o; a null o is a pending Python error
    if (o == nullptr) return PyFail();
    stack_.push_back(o);
    return true;
  }
  bool Pop(Ref* out) {
    if (stack_.size() <= Floor()) return Fail("stack underflow");
    out->reset(stack_.back());
    stack_.pop_back();
    return true;
  }
  bool Top(PyObject** out) {
    if (stack_.size() <= Floor()) return Fail("stack underflow");
    *out = stack_.back();
    return true;
  }
  // Replaces the top (checked by Top before) with the new reference o.
  bool SetTop(PyObject* o) {
    if (o == nullptr) return PyFail();
    Py_DECREF(stack_.back());
    stack_.back() = o;
    return true;
  }
  bool PopMark(size_t* from) {
    if (marks_.empty()) return Fail("no MARK to pop to");
    *from = marks_.back();
    marks_.pop_back();
    return true;
  }
  // A new tuple or list of stack_[from:], which is removed.
  PyObject* TakeRange(size_t from, bool as_list) {
    const Py_ssize_t n = static_cast<Py_ssize_t>(stack_.size() - from);
    PyObject* out = as_list ? PyList_New(n) : PyTuple_New(n);
    if (out == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* o = stack_[from + static_cast<size_t>(i)];
      if (as_list)
        PyList_SET_ITEM(out, i, o);
      else
        PyTuple_SET_ITEM(out, i, o);
    }
    stack_.resize(from);
    return out;
  }
  void DropFrom(size_t from) {
    for (size_t i = from; i < stack_.size(); ++i) Py_DECREF(stack_[i]);
    stack_.resize(from);
  }

  // -- the memo: a dict of index -> value; the indices 0, 1, 2, ... in a vector ------------
  size_t MemoCount() const { return dense_.size() + sparse_.size(); }
  void Put(uint64_t idx, PyObject* v) {  // borrows v
    Py_INCREF(v);
    if (idx < dense_.size()) {
      Py_DECREF(dense_[idx]);
      dense_[idx] = v;
      return;
    }
    if (idx == dense_.size() && sparse_.find(idx) == sparse_.end()) {
      dense_.push_back(v);
      // keys put earlier beyond the dense part join it once it reaches them
      for (auto it = sparse_.find(dense_.size()); it != sparse_.end();
           it = sparse_.find(dense_.size())) {
        dense_.push_back(it->second);
        sparse_.erase(it);
      }
      return;
    }
    auto it = sparse_.find(idx);
    if (it != sparse_.end()) {
      Py_DECREF(it->second);
      it->second = v;
    } else {
      sparse_.emplace(idx, v);
    }
  }
  PyObject* Get(uint64_t idx) const {  // borrowed, or null
    if (idx < dense_.size()) return dense_[idx];
    auto it = sparse_.find(idx);
    return it == sparse_.end() ? nullptr : it->second;
  }
  bool MemoGet(int nbytes) {
    uint64_t idx;
    if (!Uint(nbytes, &idx)) return false;
    PyObject* v = Get(idx);
    if (v == nullptr)
      return Fail("memo entry " + std::to_string(idx) + " read before it was written");
    Py_INCREF(v);
    stack_.push_back(v);
    return true;
  }
  bool MemoPut(int nbytes) {
    uint64_t idx;
    PyObject* top;
    if (!Uint(nbytes, &idx) || !Top(&top)) return false;
    Put(idx, top);
    return true;
  }

  // -- values -------------------------------------------------------------------------
  bool Long(int nlen) {
    uint64_t n;
    const uint8_t* p;
    if (!Uint(nlen, &n)) return false;
    if (n > a_.max_long_bytes) return Fail("an integer of " + std::to_string(n) + " bytes");
    if (!Take(n, &p)) return false;
    return Push(_PyLong_FromByteArray(p, static_cast<size_t>(n), /*little_endian=*/1,
                                      /*is_signed=*/1));
  }
  bool Text(int nlen) {
    uint64_t n;
    const uint8_t* p;
    if (!Uint(nlen, &n) || !Take(n, &p)) return false;
    PyObject* s = PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(p),
                                       static_cast<Py_ssize_t>(n), "surrogatepass");
    if (s == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return PyFail();
      PyErr_Clear();
      return Fail("a string that is not UTF-8");
    }
    stack_.push_back(s);
    return true;
  }
  bool Bytes(int nlen) {
    uint64_t n;
    const uint8_t* p;
    if (!Uint(nlen, &n) || !Take(n, &p)) return false;
    return Push(PyBytes_FromStringAndSize(reinterpret_cast<const char*>(p),
                                          static_cast<Py_ssize_t>(n)));
  }
  bool Float() {
    const uint8_t* p;
    if (!Take(8, &p)) return false;
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];  // big-endian
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return Push(PyFloat_FromDouble(v));
  }

  // -- containers ---------------------------------------------------------------------
  bool TupleN(size_t n) {
    if (stack_.size() - Floor() < n) return Fail("stack underflow");
    return Push(TakeRange(stack_.size() - n, /*as_list=*/false));
  }
  bool KeyOk(PyObject* k) {
    PyTypeObject* t = Py_TYPE(k);
    if (t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyBool_Type || k == Py_None ||
        reinterpret_cast<PyObject*>(t) == a_.obj_type ||
        reinterpret_cast<PyObject*>(t) == a_.global_type)
      return true;
    if (t != &PyLong_Type) return false;
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(k, &overflow);
    return overflow == 0 && -kIntKey <= v && v <= kIntKey;
  }
  // Sets the pairs stack_[from:] into dict d (borrowed); the items stay on the stack
  // (the caller drops them).
  bool SetItems(PyObject* d, size_t from) {
    const size_t n = stack_.size() - from;
    if (!PyDict_CheckExact(d) || n % 2)
      return Fail("SETITEMS on a non-dict or an odd number of items");
    for (size_t i = from; i < stack_.size(); i += 2) {
      PyObject* k = stack_[i];
      if (!KeyOk(k))
        return Fail("unsupported dict key of type " + TypeName(k) +
                    (Py_TYPE(k) == &PyLong_Type ? " (a large integer)" : ""));
      const Py_ssize_t before = PyDict_GET_SIZE(d);
      if (PyDict_SetItem(d, k, stack_[i + 1]) < 0) return PyFail();
      if (PyDict_GET_SIZE(d) == before) return Fail("dict key " + Short(k) + " set twice");
    }
    return true;
  }
  // -- globals and calls --------------------------------------------------------------
  // The Global's cached facts, or null (Python error) ; `g` must be a Global.
  const GlobalInfo* Info(PyObject* g) {
    auto it = globals_.find(g);
    if (it != globals_.end()) return &it->second;
    GlobalInfo info;
    Ref kind(PyObject_GetAttrString(g, "kind"));
    Ref call(PyObject_GetAttrString(g, "call"));
    Ref qual(PyObject_GetAttrString(g, "qualname"));
    if (!kind || !call || !qual) return nullptr;
    const int is_class = PyUnicode_Check(kind.get())
                             ? PyUnicode_CompareWithASCIIString(kind.get(), "class")
                             : 1;
    info.is_class = is_class == 0;
    Py_INCREF(g);
    info.self = g;
    info.call = call.get() == Py_None ? nullptr : call.release();
    info.qualname = qual.release();
    return &globals_.emplace(g, info).first->second;
  }
  bool IsGlobal(PyObject* o) const {
    return PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(a_.global_type));
  }
  bool Resolve(PyObject* module, PyObject* name) {  // borrows; pushes the Global
    if (!PyUnicode_Check(module) || !PyUnicode_Check(name))
      return Fail("a global's module and name must be strings");
    Ref key(PyTuple_Pack(2, module, name));
    if (!key) return PyFail();
    PyObject* g = PyDict_GetItemWithError(a_.allowed, key.get());
    if (g == nullptr) {
      if (PyErr_Occurred()) return PyFail();
      return Fail("refused global " + Utf8(module) + "." + Utf8(name) +
                  ": not in the allow-list of what this file may hold (nothing was run)");
    }
    Py_INCREF(g);
    stack_.push_back(g);
    return true;
  }
  bool Line(PyObject** out) {  // a new reference to the text up to the next newline
    const size_t limit = std::min(end_, pos_ + 1024);
    const void* nl = std::memchr(d_ + pos_, '\n', limit - pos_);
    if (nl == nullptr) return Fail("unterminated GLOBAL");
    const size_t n = static_cast<size_t>(static_cast<const uint8_t*>(nl) - (d_ + pos_));
    PyObject* s = PyUnicode_DecodeASCII(reinterpret_cast<const char*>(d_ + pos_),
                                        static_cast<Py_ssize_t>(n), "replace");
    if (s == nullptr) return PyFail();
    pos_ += n + 1;
    *out = s;
    return true;
  }
  bool GlobalOp() {
    PyObject *m, *n;
    if (!Line(&m)) return false;
    Ref module(m);
    if (!Line(&n)) return false;
    Ref name(n);
    return Resolve(module.get(), name.get());
  }
  bool StackGlobal() {
    Ref name, module;
    if (!Pop(&name) || !Pop(&module)) return false;
    return Resolve(module.get(), name.get());
  }
  // Counts a call on `args` against the budget (unpickler.py's charge).
  bool Charge(PyObject* args) {
    uint64_t n = 1;
    if (PyTuple_CheckExact(args)) {
      const Py_ssize_t len = PyTuple_GET_SIZE(args);
      n += static_cast<uint64_t>(len);
      for (Py_ssize_t i = 0; i < len; ++i) {
        PyObject* a = PyTuple_GET_ITEM(args, i);
        if (PyUnicode_Check(a))
          n += static_cast<uint64_t>(PyUnicode_GET_LENGTH(a));
        else if (PyBytes_Check(a))
          n += static_cast<uint64_t>(PyBytes_GET_SIZE(a));
        else if (PyTuple_Check(a))
          n += static_cast<uint64_t>(PyTuple_GET_SIZE(a));
        else if (PyList_Check(a))
          n += static_cast<uint64_t>(PyList_GET_SIZE(a));
        else if (PyDict_Check(a))
          n += static_cast<uint64_t>(PyDict_GET_SIZE(a));
      }
    }
    work_ += n;
    if (work_ > budget_)
      return Fail("its calls pass arguments of more than " + std::to_string(budget_) +
                  " elements in all, over " + std::to_string(a_.work_per_byte) +
                  " per byte of its " + std::to_string(end_) +
                  " bytes (one argument passed again and again?)");
    return true;
  }
  bool Reduce() {
    Ref args;
    PyObject* fn;
    if (!Pop(&args) || !Top(&fn)) return false;
    const GlobalInfo* g = nullptr;
    if (IsGlobal(fn) && (g = Info(fn)) == nullptr) return PyFail();
    if (g == nullptr || g->call == nullptr || !PyTuple_CheckExact(args.get()))
      return Fail("REDUCE of " + Short(fn) + ", which this reader does not call");
    if (!Charge(args.get())) return false;
    if (g->call == a_.int_tuple) {  // torch.Size(dims), once per chunk box: natively
      PyObject* r = IntTuple(args.get());
      if (r != nullptr) return SetTop(r);
      if (PyErr_Occurred()) return PyFail();
    }  // else its Python function, and its message
    PyObject* r = PyObject_CallOneArg(g->call, args.get());
    if (r == nullptr)
      return CallbackFail([&] { return Utf8(g->qualname) + Short(args.get()); });
    return SetTop(r);
  }
  // unpickler.int_tuple of a tuple or list of exact ints: a new reference to the
  // tuple of them; null without an error for anything else (its Python function
  // says what is wrong), null with an error when memory runs out.
  static PyObject* IntTuple(PyObject* args) {
    if (PyTuple_GET_SIZE(args) != 1) return nullptr;
    PyObject* dims = PyTuple_GET_ITEM(args, 0);
    if (!PyTuple_CheckExact(dims) && !PyList_CheckExact(dims)) return nullptr;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(dims);
    PyObject** items = PySequence_Fast_ITEMS(dims);
    for (Py_ssize_t i = 0; i < n; ++i)
      if (!PyLong_CheckExact(items[i])) return nullptr;
    return PySequence_Tuple(dims);
  }
  bool NewObj() {
    Ref args;
    PyObject* cls;
    if (!Pop(&args) || !Top(&cls)) return false;
    const GlobalInfo* g = nullptr;
    if (IsGlobal(cls) && (g = Info(cls)) == nullptr) return PyFail();
    if (g == nullptr || !g->is_class || !PyTuple_CheckExact(args.get()))
      return Fail("NEWOBJ of " + Short(cls) + ", which this reader does not create");
    return SetTop(NewRecord(g->qualname, args.get()));
  }
  bool NewObjEx() {
    Ref kwargs;
    if (!Pop(&kwargs)) return false;
    if (!PyDict_CheckExact(kwargs.get()) || PyDict_GET_SIZE(kwargs.get()) != 0)
      return Fail("NEWOBJ_EX with keyword arguments");
    return NewObj();
  }
  // Obj(qualname, args): an instance whose slots cls, args and state are set
  // directly (what Obj.__init__ does, without running Python code); Obj(...) itself
  // when its slots are not plain member descriptors.
  PyObject* NewRecord(PyObject* qualname, PyObject* args) {
    if (!slots_looked_up_) {
      slots_looked_up_ = true;
      PyObject* dict = reinterpret_cast<PyTypeObject*>(a_.obj_type)->tp_dict;
      const char* names[3] = {"cls", "args", "state"};
      bool all = true;
      for (int i = 0; i < 3; ++i) {
        slots_[i] = dict ? PyDict_GetItemString(dict, names[i]) : nullptr;  // borrowed
        all = all && slots_[i] != nullptr && Py_TYPE(slots_[i]) == &PyMemberDescr_Type;
      }
      if (!all) slots_[0] = nullptr;
    }
    if (slots_[0] == nullptr) {
      PyObject* call_args[2] = {qualname, args};
      return PyObject_Vectorcall(a_.obj_type, call_args, 2, nullptr);
    }
    PyTypeObject* t = reinterpret_cast<PyTypeObject*>(a_.obj_type);
    Ref obj(t->tp_alloc(t, 0));
    if (!obj) return nullptr;
    PyObject* values[3] = {qualname, args, Py_None};
    for (int i = 0; i < 3; ++i)
      if (Py_TYPE(slots_[i])->tp_descr_set(slots_[i], obj.get(), values[i]) < 0) return nullptr;
    return obj.release();
  }
  bool Build() {
    Ref state;
    PyObject* inst;
    if (!Pop(&state) || !Top(&inst)) return false;
    bool ok = PyObject_TypeCheck(inst, reinterpret_cast<PyTypeObject*>(a_.obj_type));
    if (ok) {
      Ref cur(PyObject_GetAttr(inst, a_.state_name));
      if (!cur) return PyFail();
      ok = cur.get() == Py_None;
    }
    if (!ok) return Fail("BUILD of " + Short(inst) + ", which this reader does not give a state");
    return PyObject_SetAttr(inst, a_.state_name, state.get()) == 0 || PyFail();
  }
  bool PersId() {
    Ref pid;
    if (!Pop(&pid)) return false;
    if (a_.persistent == Py_None) return Fail("a persistent id, which this file may not hold");
    if (!Charge(pid.get())) return false;
    PyObject* r = PyObject_CallOneArg(a_.persistent, pid.get());
    if (r == nullptr) return CallbackFail([&] { return "persistent id " + Short(pid.get()); });
    stack_.push_back(r);
    return true;
  }

  bool Step(uint8_t op, bool* stop);

  const UnpickleArgs& a_;
  const uint8_t* d_;
  size_t pos_ = 0, end_, op_at_ = 0;
  uint64_t work_ = 0, budget_;
  std::vector<PyObject*> stack_;
  std::vector<size_t> marks_;
  std::vector<PyObject*> dense_;
  std::unordered_map<uint64_t, PyObject*> sparse_;
  std::unordered_map<PyObject*, GlobalInfo> globals_;
  Status err_;
  bool python_error_ = false;
  bool slots_looked_up_ = false;
  PyObject* slots_[3] = {nullptr, nullptr, nullptr};  // Obj's member descriptors (borrowed)
};

// One opcode (its byte at op_at_; pos_ is past it). *stop: it was STOP.
bool Machine::Step(uint8_t op, bool* stop) {
  switch (op) {
    // -- stack and memo
    case 0x94: {  // MEMOIZE: the top, whatever MARK is above it (as the reference)
      if (stack_.empty()) return Fail("stack underflow");
      Put(MemoCount(), stack_.back());
      return true;
    }
    case 'h': return MemoGet(1);  // BINGET
    case 'j': return MemoGet(4);  // LONG_BINGET
    case 'q': return MemoPut(1);  // BINPUT
    case 'r': return MemoPut(4);  // LONG_BINPUT
    case '(': marks_.push_back(stack_.size()); return true;  // MARK
    case '0': {  // POP
      Ref v;
      return Pop(&v);
    }
    case '1': {  // POP_MARK
      size_t from;
      if (!PopMark(&from)) return false;
      DropFrom(from);
      return true;
    }
    case '2': {  // DUP
      PyObject* top;
      if (!Top(&top)) return false;
      Py_INCREF(top);
      stack_.push_back(top);
      return true;
    }
    case 0x80: {  // PROTO
      uint64_t v;
      if (!Uint(1, &v)) return false;
      if (v < 2 || v > 5) return Fail("pickle protocol outside 2..5");
      return true;
    }
    case 0x95: {  // FRAME: its length is not needed
      const uint8_t* p;
      return Take(8, &p);
    }
    case '.': *stop = true; return true;  // STOP
    // -- scalars
    case 'N': Py_INCREF(Py_None); stack_.push_back(Py_None); return true;
    case 0x88: Py_INCREF(Py_True); stack_.push_back(Py_True); return true;
    case 0x89: Py_INCREF(Py_False); stack_.push_back(Py_False); return true;
    case 'K': case 'M': {  // BININT1, BININT2
      uint64_t v;
      if (!Uint(op == 'K' ? 1 : 2, &v)) return false;
      return Push(PyLong_FromUnsignedLongLong(v));
    }
    case 'J': {  // BININT
      uint64_t v;
      if (!Uint(4, &v)) return false;
      return Push(PyLong_FromLong(static_cast<int32_t>(static_cast<uint32_t>(v))));
    }
    case 0x8a: return Long(1);  // LONG1
    case 0x8b: return Long(4);  // LONG4
    case 'G': return Float();   // BINFLOAT
    case 0x8c: return Text(1);  // SHORT_BINUNICODE
    case 'X': return Text(4);   // BINUNICODE
    case 0x8d: return Text(8);  // BINUNICODE8
    case 'C': return Bytes(1);  // SHORT_BINBYTES
    case 'B': return Bytes(4);  // BINBYTES
    case 0x8e: return Bytes(8);  // BINBYTES8
    // -- containers
    case ')': return Push(PyTuple_New(0));  // EMPTY_TUPLE
    case 't': {  // TUPLE
      size_t from;
      return PopMark(&from) && Push(TakeRange(from, false));
    }
    case 0x85: return TupleN(1);
    case 0x86: return TupleN(2);
    case 0x87: return TupleN(3);
    case ']': return Push(PyList_New(0));  // EMPTY_LIST
    case 'l': {  // LIST
      size_t from;
      return PopMark(&from) && Push(TakeRange(from, true));
    }
    case 'a': {  // APPEND: the value is popped before the list is looked at
      Ref v;
      if (!Pop(&v)) return false;
      stack_.push_back(v.release());
      const size_t from = stack_.size() - 1;
      // the list is below the value, above the current mark (checked as Top would)
      PyObject* target;
      if (stack_.size() - 1 <= Floor()) return Fail("stack underflow");
      target = stack_[from - 1];
      if (!PyList_CheckExact(target)) return Fail("APPEND to a non-list");
      const bool ok = PyList_Append(target, stack_[from]) == 0;
      DropFrom(from);
      return ok || PyFail();
    }
    case 'e': {  // APPENDS
      size_t from;
      if (!PopMark(&from)) return false;
      // the list is the top below the items, above the next mark
      if (from <= Floor()) return Fail("stack underflow");
      PyObject* target = stack_[from - 1];
      if (!PyList_CheckExact(target)) return Fail("APPEND to a non-list");
      for (size_t i = from; i < stack_.size(); ++i)
        if (PyList_Append(target, stack_[i]) < 0) return PyFail();
      DropFrom(from);
      return true;
    }
    case '}': return Push(PyDict_New());  // EMPTY_DICT
    case 'd': {  // DICT
      size_t from;
      if (!PopMark(&from)) return false;
      Ref d(PyDict_New());
      if (!d) return PyFail();
      if (!SetItems(d.get(), from)) return false;
      DropFrom(from);
      stack_.push_back(d.release());
      return true;
    }
    case 's': {  // SETITEM: value and key popped, then the dict looked at
      if (stack_.size() <= Floor()) return Fail("stack underflow");
      if (stack_.size() - 1 <= Floor()) return Fail("stack underflow");
      const size_t from = stack_.size() - 2;
      if (from <= Floor()) return Fail("stack underflow");
      if (!SetItems(stack_[from - 1], from)) return false;
      DropFrom(from);
      return true;
    }
    case 'u': {  // SETITEMS
      size_t from;
      if (!PopMark(&from)) return false;
      if (from <= Floor()) return Fail("stack underflow");
      if (!SetItems(stack_[from - 1], from)) return false;
      DropFrom(from);
      return true;
    }
    // -- globals and objects
    case 'c': return GlobalOp();
    case 0x93: return StackGlobal();
    case 'R': return Reduce();
    case 0x81: return NewObj();
    case 0x92: return NewObjEx();
    case 'b': return Build();
    case 'Q': return PersId();
    default: {
      static const char* hex = "0123456789abcdef";
      std::string code = "0x";
      code += hex[op >> 4];
      code += hex[op & 15];
      return Fail("unsupported pickle opcode " + code);
    }
  }
}

Status Machine::Run(PyObject** value, size_t* after) {
  while (pos_ < end_) {
    op_at_ = pos_;
    const uint8_t op = d_[pos_++];
    bool stop = false;
    if (!Step(op, &stop)) return err_;
    if (stop) {
      Ref v;
      if (!Pop(&v)) return err_;
      *value = v.release();
      *after = pos_;
      return Status::OK();
    }
  }
  op_at_ = end_;
  Fail("no STOP opcode: truncated pickle");
  return err_;
}

}  // namespace

Status RestrictedUnpickle(const UnpickleArgs& args, PyObject** value, size_t* after,
                          bool* python_error) {
  // No cyclic collection while the machine runs: it allocates millions of small
  // objects, each collection would walk all it built so far (half its time went
  // there), and no cycle it may build is lost (collected once the GC is back on).
  const int was_enabled = PyGC_Disable();
  Status st;
  {
    Machine m(args);
    st = m.Run(value, after);
    *python_error = m.python_error();
  }
  if (was_enabled) PyGC_Enable();
  return st;
}

}  // namespace binding
}  // namespace pyckpt

namespace pyckpt {
namespace binding {

void RegisterRestrictedPickle(py::module_& m) {
  m.def(
      "restricted_unpickle",
      [](const py::bytes& data, const py::dict& allowed, const py::str& where,
         const py::object& persistent, const py::type& global_type, const py::type& obj_type,
         const py::object& short_fn, const py::object& int_tuple, uint64_t work_per_byte,
         uint64_t work_base,
         uint64_t max_long_bytes) -> py::tuple {
        UnpickleArgs a;
        char* buf = nullptr;
        Py_ssize_t len = 0;
        if (PyBytes_AsStringAndSize(data.ptr(), &buf, &len) < 0) throw py::error_already_set();
        a.data = buf;
        a.size = static_cast<size_t>(len);
        a.allowed = allowed.ptr();
        a.persistent = persistent.ptr();
        a.global_type = global_type.ptr();
        a.obj_type = obj_type.ptr();
        a.short_fn = short_fn.ptr();
        a.int_tuple = int_tuple.ptr();
        py::str state("state");
        a.state_name = state.ptr();
        a.where = Utf8(where.ptr());
        a.work_per_byte = work_per_byte;
        a.work_base = work_base;
        a.max_long_bytes = max_long_bytes;
        PyObject* value = nullptr;
        size_t after = 0;
        bool python_error = false;
        const Status st = RestrictedUnpickle(a, &value, &after, &python_error);
        if (python_error) throw py::error_already_set();
        RaiseIfError(st);
        return py::make_tuple(py::reinterpret_steal<py::object>(value), after);
      },
      py::kw_only(), py::arg("data"), py::arg("allowed"), py::arg("where"),
      py::arg("persistent"), py::arg("global_type"), py::arg("obj_type"), py::arg("short"),
      py::arg("int_tuple"),
      py::arg("work_per_byte"), py::arg("work_base"), py::arg("max_long_bytes"),
      "Runs the restricted pickle machine (pyckpt/codecs/distcp/unpickler.py's rules) over "
      "`data` to its STOP: (value, position after STOP); raises CorruptCheckpointError "
      "'<where>: <what> (pickle opcode at byte N)' for what it refuses.");
}

}  // namespace binding
}  // namespace pyckpt
