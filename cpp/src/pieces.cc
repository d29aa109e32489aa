#include "pieces.h"

#include <algorithm>

#include "pyckpt/crc32c.h"

namespace pyckpt {

PiecePlan PlanPieces(const std::vector<Span>& items, uint64_t chunk_size, uint64_t piece_size,
                     uint64_t max_gap, bool whole_items) {
  PiecePlan plan;
  plan.order.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].nbytes > 0) plan.order.push_back(i);
  std::sort(plan.order.begin(), plan.order.end(), [&](size_t a, size_t b) {
    if (items[a].file != items[b].file) return items[a].file < items[b].file;
    return items[a].offset < items[b].offset;
  });

  std::vector<std::vector<Piece>> per_file;
  auto file_list = [&](uint32_t f) -> std::vector<Piece>& {
    if (per_file.size() <= f) per_file.resize(f + 1);
    return per_file[f];
  };

  bool in_run = false;
  Piece run;
  auto flush = [&]() {
    if (!in_run) return;
    plan.max_run_bytes = std::max(plan.max_run_bytes, run.end - run.begin);
    file_list(run.file).push_back(run);
    in_run = false;
  };

  for (size_t k = 0; k < plan.order.size(); ++k) {
    const Span& s = items[plan.order[k]];
    if (s.nbytes >= chunk_size) {
      flush();
      for (uint64_t b = 0; b < s.nbytes; b += piece_size) {
        Piece p;
        p.file = s.file;
        p.item = plan.order[k];
        p.item_begin = b;
        p.begin = s.offset + b;
        p.end = s.offset + std::min(s.nbytes, b + piece_size);
        file_list(s.file).push_back(p);
      }
      continue;
    }
    const uint64_t end = s.offset + s.nbytes;
    if (in_run && (s.file != run.file || s.offset < run.end || s.offset - run.end > max_gap ||
                   end - run.begin > piece_size))
      flush();
    if (!in_run) {
      in_run = true;
      run = Piece();
      run.run = true;
      run.file = s.file;
      run.begin = s.offset;
      run.run_first = k;
    }
    run.end = end;
    run.run_last = k + 1;
  }
  flush();

  if (!whole_items) {  // interleave the files' piece lists round-robin, piece by piece
    size_t longest = 0;
    for (auto& v : per_file) longest = std::max(longest, v.size());
    for (size_t i = 0; i < longest; ++i)
      for (auto& v : per_file)
        if (i < v.size()) plan.pieces.push_back(v[i]);
    return plan;
  }
  // Round-robin over the files by whole items: the slices of one item stay
  // together, so every piece before an item's last one belongs to an item that
  // comes before it (or to itself) in the item order.
  std::vector<size_t> next(per_file.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t f = 0; f < per_file.size(); ++f) {
      std::vector<Piece>& v = per_file[f];
      size_t& k = next[f];
      if (k >= v.size()) continue;
      const Piece first = v[k];
      plan.pieces.push_back(v[k++]);
      while (!first.run && k < v.size() && !v[k].run && v[k].item == first.item)
        plan.pieces.push_back(v[k++]);
      more = more || k < v.size();
    }
  }
  return plan;
}

size_t SplitItem(size_t item, uint64_t nbytes, uint64_t piece_size, std::vector<ItemRange>* out) {
  size_t count = 0;
  for (uint64_t b = 0; b < nbytes; b += piece_size, ++count)
    out->push_back(ItemRange{item, b, std::min(nbytes, b + piece_size)});
  return count;
}

void ChunkChecksums(const char* data, uint64_t logical_begin, uint64_t n, uint64_t chunk_size,
                    uint32_t* out) {
  uint64_t c = logical_begin / chunk_size;
  for (uint64_t off = 0; off < n; off += chunk_size, ++c) {
    uint64_t len = std::min(chunk_size, n - off);
    out[c] = crc32c::Mask(crc32c::Value(data + off, len));
  }
}

}  // namespace pyckpt
