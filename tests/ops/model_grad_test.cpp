// Whole-model gradient checks: every parameter gradient of a tiny GPT, Llama and MLP against
// central finite differences of the mean loss, computed by the same engine in forward mode.
#include <gtest/gtest.h>

#include <cmath>

#include "recipe/load.h"
#include "trainer/session.h"

namespace engine {
namespace {

recipe::LoadedRecipe tiny(const std::string& model, const std::string& data) {
  recipe::MemorySourceReader reader;
  reader.add("r.yaml",
             "model: " + model + "\ndata: " + data + "\ntrain: {steps: 1, micro_batch_size: 2}\nrun: {seed: 5}\n");
  recipe::LoadOptions options;
  options.reader = &reader;
  return recipe::load_recipe("r.yaml", options);
}

// Checks `samples` elements of every parameter; returns the worst relative error.
void check_gradients(const recipe::Recipe& r, double tolerance) {
  Session session(r);
  session.store.initialize(uint64_t(r.run.seed));
  // Larger weights than the default init make every path matter to the loss.
  for (size_t i = 0; i < session.model.graph.params().size(); ++i) {
    float* w = session.store.param(int(i));
    for (int64_t k = 0; k < session.store.numel(int(i)); ++k) w[k] = w[k] * 3 + 0.01f * float(k % 7);
  }
  Batch batch(session.micro_batch, session.model.sequence, session.data->features());
  session.data->fill(Split::train, 0, batch);
  session.store.zero_micro_grads();
  session.train_micro_batch(batch, 0, 0);

  auto loss_at = [&](float* w, float value) {
    *w = value;
    session.store.zero_micro_grads();
    return session.train_micro_batch(batch, 0, 0);
  };
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < session.model.graph.params().size(); ++i) {
    const float* g = session.store.grad(int(i));
    grads.emplace_back(g, g + session.store.numel(int(i)));
  }
  for (size_t i = 0; i < session.model.graph.params().size(); ++i) {
    const std::string& name = session.model.graph.params()[i].name;
    float* w = session.store.param(int(i));
    int64_t n = session.store.numel(int(i));
    for (int64_t k = 0; k < n; k += std::max<int64_t>(1, n / 5)) {
      float original = w[k];
      const float h = 2e-3f;  // small enough for the nonlinearity, large enough for float noise
      double up = loss_at(&w[k], original + h);
      double down = loss_at(&w[k], original - h);
      w[k] = original;
      double numeric = (up - down) / (2 * double(h));
      double analytic = grads[i][size_t(k)];
      double error = std::abs(numeric - analytic) / std::max(1e-2, std::abs(numeric) + std::abs(analytic));
      EXPECT_LT(error, tolerance) << name << "[" << k << "]: analytic " << analytic << " numeric " << numeric;
    }
  }
}

TEST(ModelGradients, GptMatchesFiniteDifferences) {
  auto loaded = tiny("{arch: gpt, vocab_size: 11, context_length: 5, n_layer: 2, n_head: 2, n_embd: 8}",
                     "{source: synthetic_markov, order: 1}");
  check_gradients(loaded.recipe, 2e-2);
}

TEST(ModelGradients, LlamaMatchesFiniteDifferences) {
  auto loaded =
      tiny("{arch: llama, vocab_size: 11, context_length: 5, n_layer: 2, n_head: 2, n_embd: 8, tie_embeddings: false}",
           "{source: synthetic_markov, order: 1}");
  check_gradients(loaded.recipe, 2e-2);
}

TEST(ModelGradients, GroupedQueryLlamaMatchesFiniteDifferences) {
  auto loaded = tiny(
      "{arch: llama, vocab_size: 11, context_length: 5, n_layer: 2, n_head: 4, kv_heads: 2, n_embd: 16, "
      "tie_embeddings: false}",
      "{source: synthetic_markov, order: 1}");
  check_gradients(loaded.recipe, 2e-2);
}

TEST(ModelGradients, MlpMatchesFiniteDifferences) {
  auto loaded = tiny("{arch: mlp, n_layer: 2, input_dim: 5, hidden_dim: 7, num_classes: 3, activation: gelu}",
                     "{source: classification, num_samples: 16}");
  check_gradients(loaded.recipe, 2e-2);
}

}  // namespace
}  // namespace engine
