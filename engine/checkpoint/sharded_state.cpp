#include "checkpoint/sharded_state.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "checkpoint/durable_io.h"
#include "core/error.h"
#include "offload/offloaded_state.h"

namespace engine {

namespace fs = std::filesystem;

void StateKind::read(size_t unit, int64_t first, int64_t count, float* out) const {
  if (offloaded)
    offloaded->read(offloaded_kind, unit, first, count, out);
  else
    std::memcpy(out, units[unit] + first, size_t(count) * 4);
}

void StateKind::write(size_t unit, int64_t first, int64_t count, const float* in) const {
  if (offloaded)
    offloaded->write(offloaded_kind, unit, first, count, in);
  else
    std::memcpy(units[unit] + first, in, size_t(count) * 4);
}

std::vector<StateKind> state_kinds(const ParameterStore& store, Optimizer& optimizer) {
  std::vector<StateKind> kinds;
  StateKind master{"master", {}};
  if (store.masters_offloaded()) {
    master.offloaded = store.offloaded();
    master.offloaded_kind = store.offloaded()->kind("master");
  } else {
    for (size_t u = 0; u < store.graph().units().size(); ++u) master.units.push_back(store.master(u));
  }
  kinds.push_back(std::move(master));
  for (Optimizer::StateTensor& t : optimizer.state()) kinds.push_back({t.name, t.units, t.offloaded, t.offloaded_kind});
  return kinds;
}

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.bin", rank);
  return name;
}

int64_t rank_file_bytes(const Graph& graph, int world, size_t kinds) {
  return ShardLayout(graph.units(), world, 0).total_shard() * int64_t(kinds) * 4;
}

void snapshot_rank(const ParameterStore& store, const std::vector<StateKind>& kinds, std::vector<std::byte>& image) {
  const ShardLayout& layout = store.layout();
  image.resize(size_t(layout.total_shard()) * kinds.size() * 4);
  std::byte* out = image.data();
  stream_rank(store, kinds, [&](const std::byte* data, size_t bytes) {
    std::memcpy(out, data, bytes);
    out += bytes;
  });
}

void stream_rank(const ParameterStore& store, const std::vector<StateKind>& kinds,
                 const std::function<void(const std::byte*, size_t)>& sink) {
  std::vector<float> piece;
  const ShardLayout& layout = store.layout();
  for (size_t u = 0; u < layout.units(); ++u) {
    const int64_t skip = layout.begin(u) - store.range_begin(u), count = layout.shard(u);
    for (const StateKind& kind : kinds) {
      if (!kind.offloaded) {
        sink(reinterpret_cast<const std::byte*>(kind.units[u] + skip), size_t(count) * 4);
        continue;
      }
      piece.resize(size_t(std::min(kStreamPieceElements, count)));
      for (int64_t first = 0; first < count; first += kStreamPieceElements) {
        const int64_t n = std::min(kStreamPieceElements, count - first);
        kind.read(u, skip + first, n, piece.data());
        sink(reinterpret_cast<const std::byte*>(piece.data()), size_t(n) * 4);
      }
    }
  }
}

namespace {

// The pieces of a tensor-parallel slice's local elements [first, first + count), which a rank file
// holds from byte `offset`: row by row, rows that continue the last piece joined to it (whole
// logical rows into one flat piece, a column slice's rows into one box).
void add_slice_pieces(const TensorSlice& slice, int file, int64_t offset, int64_t first, int64_t count,
                      std::vector<CheckpointPiece>& pieces) {
  const int64_t width = slice.columns(), columns = slice.logical_columns(), column = slice.column_begin();
  const std::vector<int64_t> logical_rows = slice.row_list();
  bool joinable = false;  // whether the last piece is this call's
  for (int64_t at = first; at < first + count;) {
    const int64_t local_row = at / width, in_row = at % width;
    const int64_t n = std::min(width - in_row, first + count - at);
    const int64_t logical = logical_rows[size_t(local_row)] * columns + column + in_row;
    const int64_t bytes = offset + (at - first) * 4;
    CheckpointPiece* last = joinable ? &pieces.back() : nullptr;
    const bool whole_row = in_row == 0 && n == width;
    if (last && !last->width && last->first + last->count == logical) {
      last->count += n;  // flat: the logical elements continue
    } else if (last && last->width == width && whole_row && last->first + (last->count / width) * columns == logical) {
      last->count += n;  // a box: the next row of the same columns
    } else {
      pieces.push_back({file, bytes, logical, n, whole_row && width < columns ? width : 0});
      joinable = true;
    }
    at += n;
  }
}

}  // namespace

std::vector<CheckpointTensor> describe_tensors(const Graph& graph, int world, const std::vector<std::string>& kinds,
                                               int tensor_parallel, int stages, int stage) {
  std::vector<CheckpointTensor> tensors;
  const ShardLayout layout(graph.units(), world, 0);
  for (size_t i = 0; i < graph.params().size(); ++i) {
    const Param& p = graph.params()[i];
    const Shape& shape = p.slice.split() ? p.slice.logical : graph.value(p.value).shape;
    const int64_t numel = graph.value(p.value).shape.numel();  // this rank's
    for (size_t k = 0; k < kinds.size(); ++k) {
      CheckpointTensor t{p.name, kinds[k], {shape.dims.begin(), shape.dims.end()}, {}};
      // Unit u's section for kind k in every rank file starts after the earlier units' sections.
      int64_t section = 0;
      for (size_t u = 0; u < size_t(p.unit); ++u) section += layout.shard(u) * int64_t(kinds.size());
      section += layout.shard(size_t(p.unit)) * int64_t(k);
      const int64_t shard = layout.shard(size_t(p.unit));
      // File d x T + s: data rank d's shard of tensor rank s's slice (the whole tensor when it is
      // not split: then tensor rank 0's alone is described).
      for (int s = 0; s < (p.slice.split() ? tensor_parallel : 1); ++s)
        for (int r = 0; r < world; ++r) {
          const int64_t begin = std::max(p.offset, r * shard), end = std::min(p.offset + numel, (r + 1) * shard);
          if (begin >= end) continue;
          const int file = (r * stages + stage) * tensor_parallel + s;
          const int64_t offset = (section + begin - r * shard) * 4;
          if (p.slice.split())
            add_slice_pieces(p.slice.for_rank(s), file, offset, begin - p.offset, end - begin, t.pieces);
          else
            t.pieces.push_back({file, offset, begin - p.offset, end - begin});
        }
      tensors.push_back(std::move(t));
    }
  }
  return tensors;
}

namespace {

// Bytes [offset, offset + count * 4) of one file go to elements [first, first + count) of unit
// `unit`'s optimizer range of `kind`.
struct Copy {
  int64_t offset, count;
  const StateKind* kind;
  size_t unit;
  int64_t first;
};

// The copies that elements [first, last) of `slice` (this rank's part of a tensor) need from the
// tensor's `pieces`, row by row; element 0 of the slice is element `base` of unit `unit`'s range.
void add_slice_copies(const TensorSlice& slice, int64_t first, int64_t last, const std::vector<CheckpointPiece>& pieces,
                      const StateKind& kind, size_t unit, int64_t base, std::map<int, std::vector<Copy>>& copies) {
  const int64_t width = slice.columns(), columns = slice.logical_columns(), column = slice.column_begin();
  const std::vector<int64_t> logical_rows = slice.row_list();
  for (int64_t at = first; at < last;) {
    const int64_t in_row = at % width, n = std::min(width - in_row, last - at);
    const int64_t row = logical_rows[size_t(at / width)], from = column + in_row;  // logical columns [from, from + n)
    for (const CheckpointPiece& piece : pieces) {
      int64_t begin, end, offset;
      if (!piece.width) {  // flat: logical elements [first, first + count)
        const int64_t logical = row * columns + from;
        begin = std::max(logical, piece.first) - row * columns;
        end = std::min(logical + n, piece.first + piece.count) - row * columns;
        offset = piece.offset + (row * columns + begin - piece.first) * 4;
      } else {  // a box of rows
        const int64_t first_row = piece.first / columns, first_column = piece.first % columns;
        if (row < first_row || row >= first_row + piece.count / piece.width) continue;
        begin = std::max(from, first_column);
        end = std::min(from + n, first_column + piece.width);
        offset = piece.offset + ((row - first_row) * piece.width + begin - first_column) * 4;
      }
      if (begin < end) copies[piece.file].push_back({offset, end - begin, &kind, unit, base + at + (begin - from)});
    }
    at += n;
  }
}

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

void load_sharded_state(const fs::path& dir, const Manifest& manifest, const ParameterStore& store,
                        const std::vector<StateKind>& kinds) {
  const Graph& g = store.graph();
  std::map<int, std::vector<Copy>> copies;  // by file
  for (size_t i = 0; i < g.params().size(); ++i) {
    const Param& p = g.params()[i];
    const size_t u = size_t(p.unit);
    const int64_t numel = store.numel(int(i));
    const int64_t range_begin = store.range_begin(u), range_end = range_begin + store.range_size(u);
    // The elements of this parameter inside this rank's optimizer range, as tensor elements.
    const int64_t first = std::max<int64_t>(0, range_begin - p.offset);
    const int64_t last = std::min<int64_t>(numel, range_end - p.offset);
    if (first >= last) continue;
    const Shape& shape = p.slice.split() ? p.slice.logical : g.value(p.value).shape;
    const std::vector<int64_t> dims(shape.dims.begin(), shape.dims.end());
    // A whole tensor is read row by row too when the checkpoint holds it in slices' boxes.
    const TensorSlice whole{.logical = shape, .blocks = {{0, shape.dims.empty() ? 1 : shape.dims[0]}}};
    for (const StateKind& kind : kinds) {
      const CheckpointTensor* t = manifest.find(p.name, kind.name);
      if (!t)
        throw UserError(dir.string() + " has no " + kind.name + " for parameter " + p.name +
                        (kind.name == "master" ? " (a different model)"
                                               : " (the checkpoint was written with another optimizer setting)"));
      if (t->shape != dims)
        throw UserError(dir.string() + ": parameter " + p.name + " is " + shape_text(t->shape) +
                        " in the checkpoint and " + shape_text(dims) + " in this recipe's model");
      const int64_t base = p.offset - range_begin;  // element 0 of the parameter in the range
      const bool boxes = std::any_of(t->pieces.begin(), t->pieces.end(), [](const auto& piece) { return piece.width; });
      if (p.slice.split() || boxes) {
        add_slice_copies(p.slice.split() ? p.slice : whole, first, last, t->pieces, kind, u, base, copies);
        continue;
      }
      for (const CheckpointPiece& piece : t->pieces) {
        const int64_t begin = std::max(first, piece.first), end = std::min(last, piece.first + piece.count);
        if (begin >= end) continue;
        copies[piece.file].push_back({piece.offset + (begin - piece.first) * 4, end - begin, &kind, u, base + begin});
      }
    }
  }
  for (auto& entry : copies) {
    std::vector<Copy>& list = entry.second;  // a plain reference: lambdas may not capture bindings (C++20)
    const CheckpointFile& f = manifest.files[size_t(entry.first)];
    const fs::path path = dir / f.name;
    std::sort(list.begin(), list.end(), [](const Copy& a, const Copy& b) { return a.offset < b.offset; });
    int64_t size = 0;
    size_t next = 0;  // the first copy that does not end before this chunk (chunks come in order)
    const uint64_t sum = read_file_chunks(path, [&](const std::byte* data, size_t bytes, int64_t at) {
      size = at + int64_t(bytes);
      while (next < list.size() && list[next].offset + list[next].count * 4 <= at) ++next;
      for (size_t k = next; k < list.size() && list[k].offset < size; ++k) {
        const Copy& c = list[k];
        const int64_t begin = std::max(c.offset, at), end = std::min(c.offset + c.count * 4, size);
        if (begin < end)  // file chunks and pieces are whole fp32 values
          c.kind->write(c.unit, c.first + (begin - c.offset) / 4, (end - begin) / 4,
                        reinterpret_cast<const float*>(data + (begin - at)));
      }
    });
    if (size != f.bytes)
      throw UserError(path.string() + " is " + std::to_string(size) + " bytes, the manifest says " +
                      std::to_string(f.bytes) + ": the checkpoint is damaged; resume from an earlier one");
    if (checksum_hex(sum) != f.xxh3)
      throw UserError(path.string() + " does not match its checksum (xxh3 " + checksum_hex(sum) +
                      ", the manifest says " + f.xxh3 +
                      "): the file is corrupted; resume from an earlier checkpoint (engine checkpoint list)");
  }
}

}  // namespace engine
