#include "dist/tensor_group.h"

#include <algorithm>

#include "core/error.h"

namespace engine {

std::vector<float> gather_logical(const Param& param, const float* local, int64_t count, Communicator& tensor) {
  const TensorSlice& slice = param.slice;
  ENGINE_CHECK(slice.split() && slice.size == tensor.size() && slice.rank == tensor.rank(),
               param.name + " is not this group's slice");
  std::vector<float> values(size_t(count) * size_t(tensor.size()));
  tensor.all_gather(local, values.data(), count * int64_t(sizeof(float)), "all-gather of " + param.name).wait();
  const int64_t columns = slice.logical_columns();
  std::vector<float> whole(size_t(slice.logical.numel()));
  for (int r = 0; r < tensor.size(); ++r) {
    const TensorSlice theirs = slice.for_rank(r);
    const int64_t width = theirs.columns(), column = theirs.column_begin();
    const float* from = values.data() + size_t(r) * size_t(count);
    for (auto [begin, end] : theirs.rows())
      for (int64_t row = begin; row < end; ++row, from += width)
        std::copy_n(from, width, whole.data() + row * columns + column);
  }
  return whole;
}

}  // namespace engine
