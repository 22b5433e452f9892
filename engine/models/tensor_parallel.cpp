#include "models/tensor_parallel.h"

#include "core/error.h"
#include "parallel/tensor_parallel.h"

namespace engine {

TensorParallel::TensorParallel(Graph& graph, TensorLayout layout, Lora& lora)
    : graph_(graph), size_(layout.size), rank_(layout.rank), lora_(lora) {
  ENGINE_CHECK(rank_ >= 0 && rank_ < size_, "tensor-parallel rank out of range");
}

ValueId TensorParallel::column(const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& blocks,
                               int64_t columns, int unit, ParamInit init, bool decay) {
  int64_t rows = 0;
  for (auto [begin, end] : blocks) rows = std::max(rows, end);
  Shape logical = columns ? Shape{rows, columns} : Shape{rows};
  if (!enabled()) return lora_.weight(name, logical, unit, init, decay);
  const TensorSlice slice{.logical = logical, .by_columns = false, .blocks = blocks, .rank = rank_, .size = int(size_)};
  int64_t local_rows = 0;
  for (auto [begin, end] : slice.rows()) local_rows += end - begin;
  ValueId w = lora_.weight(name, columns ? Shape{local_rows, columns} : Shape{local_rows}, unit, init, decay);
  graph_.set_slice(w, slice);
  return w;
}

ValueId TensorParallel::row(const std::string& name, int64_t rows, int64_t columns, int unit, ParamInit init,
                            bool decay) {
  if (!enabled()) return lora_.weight(name, Shape{rows, columns}, unit, init, decay);
  const int64_t part = columns / size_;
  ValueId w = lora_.weight(name, Shape{rows, part}, unit, init, decay);
  graph_.set_slice(
      w, TensorSlice{
             .logical = Shape{rows, columns}, .by_columns = true, .blocks = {}, .rank = rank_, .size = int(size_)});
  return w;
}

ValueId TensorParallel::whole(const std::string& name, Shape shape, int unit, ParamInit init, bool decay) {
  return lora_.weight(name, std::move(shape), unit, init, decay);
}

ValueId TensorParallel::enter(ValueId x, const std::string& name) {
  return enabled() ? ops::copy_to_tensor_group(graph_, x, name + ".tensor_copy") : x;
}

ValueId TensorParallel::leave(ValueId y, ValueId bias, const std::string& name) {
  return enabled() ? ops::reduce_from_tensor_group(graph_, y, bias, name + ".tensor_reduce") : y;
}

}  // namespace engine
