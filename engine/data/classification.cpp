// classification: synthetic labelled vectors for the MLP. Each class has a centre drawn once from
// the seed (standard normal per feature); a sample is a uniformly chosen class's centre plus
// Gaussian noise of std `noise`. The first (1 - val_fraction) of num_samples are for training.
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"

namespace engine {

namespace {

class Classification : public Dataset {
 public:
  explicit Classification(const recipe::Recipe& r)
      : seed_(uint64_t(r.run.seed)),
        features_(r.model.input_dim),
        classes_(r.model.num_classes),
        noise_(r.data.noise),
        samples_(r.data.num_samples),
        train_(r.data.num_samples - int64_t(double(r.data.num_samples) * r.data.val_fraction)) {
    RandomStream stream(seed_, RandomPurpose::data, 1ull << 40);
    centres_.resize(size_t(classes_ * features_));
    for (float& c : centres_) c = stream.normal();
  }

  void fill(Split split, int64_t index, Batch& batch) const override {
    int64_t first = split == Split::train ? 0 : train_;
    int64_t count = split == Split::train ? train_ : samples_ - train_;
    ENGINE_CHECK(count > 0, "classification split without samples (the recipe rules prevent this)");
    for (int64_t b = 0; b < batch.batch; ++b) {
      int64_t sample = first + (index * batch.batch + b) % count;
      // One stream per sample (keyed by it), so samples never share random numbers.
      RandomStream stream(mix64(seed_ ^ 0x636c617373ull) ^ mix64(uint64_t(sample)), RandomPurpose::data);
      auto label = int32_t(stream.below(uint64_t(classes_)));
      batch.targets[size_t(b)] = label;
      for (int64_t f = 0; f < features_; ++f)
        batch.inputs[size_t(b * features_ + f)] =
            centres_[size_t(label * features_ + f)] + float(noise_) * stream.normal();
    }
  }

  std::string describe() const override {
    return "classification: " + std::to_string(samples_) + " samples of " + std::to_string(features_) +
           " features in " + std::to_string(classes_) + " classes";
  }
  int64_t features() const override { return features_; }

 private:
  uint64_t seed_;
  int64_t features_, classes_;
  double noise_;
  int64_t samples_, train_;
  std::vector<float> centres_;
};

}  // namespace

std::unique_ptr<Dataset> make_classification(const recipe::Recipe& recipe) {
  return std::make_unique<Classification>(recipe);
}

}  // namespace engine
