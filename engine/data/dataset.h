// Dataset: where micro-batches come from. Every batch is a pure function of (seed, split, index),
// so runs are reproducible, a resumed run continues exactly, and a background thread can prepare
// batches ahead (BatchLoader) without changing what they contain.
//
//   auto data = make_dataset(recipe);                 // throws UserError for bad files
//   Batch batch(model.batch, model.sequence, data->features());
//   data->fill(Split::train, index, batch);
//   if (auto floor = data->loss_floor()) ...          // exact for synthetic_markov
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace engine {

enum class Split { train, validation };

// One micro-batch on the host: token inputs (B, T) and targets (B, T), or features (B, F) and
// class targets (B) for classification.
struct Batch {
  int64_t batch = 0, sequence = 0, features = 0;
  std::vector<int32_t> tokens;   // (B, T), empty for classification
  std::vector<float> inputs;     // (B, F), empty for token data
  std::vector<int32_t> targets;  // (B, T) or (B)
  // (B, T): each token's position within its document when windows are packed (data.document_end),
  // else empty (a window is one sequence: positions 0 .. T-1).
  std::vector<int32_t> positions;

  Batch(int64_t b, int64_t t, int64_t f);
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual void fill(Split split, int64_t index, Batch& batch) const = 0;
  virtual std::string describe() const = 0;
  // The lowest expected loss any model can reach on this data, when it is known exactly.
  virtual std::optional<double> loss_floor() const { return std::nullopt; }
  virtual int64_t features() const { return 0; }  // input width for classification data
  // Whether some targets are kIgnoredTarget (-1: not trained, a loss mask's prompt tokens).
  virtual bool ignores_targets() const { return false; }
};

std::unique_ptr<Dataset> make_dataset(const recipe::Recipe& recipe);

}  // namespace engine
