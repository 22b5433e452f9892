#include "data/dataset.h"

#include "data/files.h"
#include "data/markov.h"

namespace engine {

std::unique_ptr<Dataset> make_classification(const recipe::Recipe& recipe);

Batch::Batch(int64_t b, int64_t t, int64_t f) : batch(b), sequence(t), features(f) {
  if (f > 0) {
    inputs.resize(size_t(b * f));
    targets.resize(size_t(b));
  } else {
    tokens.resize(size_t(b * t));
    targets.resize(size_t(b * t));
  }
}

std::unique_ptr<Dataset> make_dataset(const recipe::Recipe& recipe) {
  switch (recipe.data.source) {
    case recipe::DataSource::synthetic_markov:
      return std::make_unique<MarkovSource>(uint64_t(recipe.run.seed), *recipe.data.vocab_size, recipe.data.order,
                                            recipe.data.branching, *recipe.data.sequence_length);
    case recipe::DataSource::text:
    case recipe::DataSource::tokens:
      return std::make_unique<TokenFile>(recipe);
    case recipe::DataSource::classification:
      return make_classification(recipe);
  }
  return nullptr;
}

}  // namespace engine
