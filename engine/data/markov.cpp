#include "data/markov.h"

#include <cmath>

#include "core/rng.h"

namespace engine {

MarkovSource::MarkovSource(uint64_t seed, int64_t vocab, int64_t order, int64_t branching, int64_t sequence)
    : seed_(seed), vocab_(vocab), order_(order), branching_(std::min(branching, vocab)), sequence_(sequence) {
  double total = 0;
  for (int64_t j = 0; j < branching_; ++j) total += 1.0 / double(j + 1);
  double running = 0;
  for (int64_t j = 0; j < branching_; ++j) {
    running += 1.0 / double(j + 1) / total;
    cumulative_.push_back(running);
  }
  cumulative_.back() = 1.0;
}

double MarkovSource::entropy_rate() const {
  double h = 0, previous = 0;
  for (double c : cumulative_) {
    double p = c - previous;
    h -= p * std::log(p);
    previous = c;
  }
  return h;
}

std::optional<double> MarkovSource::loss_floor() const {
  double t = double(sequence_), k = double(order_);
  return ((k - 1) * std::log(double(vocab_)) + (t - k + 1) * entropy_rate()) / t;
}

std::string MarkovSource::describe() const {
  return "synthetic_markov: order " + std::to_string(order_) + " over " + std::to_string(vocab_) + " tokens, " +
         std::to_string(branching_) + " successors per context";
}

int32_t MarkovSource::successor(const int32_t* context, int64_t j) const {
  uint64_t h = mix64(seed_ ^ 0x6d61726b6f76ull);
  for (int64_t i = 0; i < order_; ++i) h = mix64(h ^ uint64_t(context[i]));
  // Successor j is the j-th distinct value of a hash sequence: probe until it differs from those
  // before it (branching is small, so this is a handful of hashes).
  int32_t chosen[64];
  int64_t found = 0;
  for (uint64_t probe = 0; found <= j; ++probe) {
    auto candidate = int32_t(mix64(h + probe) % uint64_t(vocab_));
    bool seen = false;
    for (int64_t k = 0; k < found; ++k) seen = seen || chosen[k] == candidate;
    if (!seen) chosen[found++] = candidate;
  }
  return chosen[j];
}

void MarkovSource::fill(Split split, int64_t index, Batch& batch) const {
  const int64_t t_len = batch.sequence;
  std::vector<int32_t> tokens(size_t(t_len + 1));
  for (int64_t b = 0; b < batch.batch; ++b) {
    uint64_t sample = uint64_t(index) * uint64_t(batch.batch) + uint64_t(b);
    RandomStream stream(mix64(seed_ ^ mix64(sample * 2 + (split == Split::validation ? 1 : 0))), RandomPurpose::data);
    for (int64_t i = 0; i < order_; ++i) tokens[size_t(i)] = int32_t(stream.below(uint64_t(vocab_)));
    for (int64_t i = order_; i <= t_len; ++i) {
      double u = stream.uniform();
      int64_t j = 0;
      while (j + 1 < branching_ && u >= cumulative_[size_t(j)]) ++j;
      tokens[size_t(i)] = successor(&tokens[size_t(i - order_)], j);
    }
    std::copy(tokens.begin(), tokens.begin() + t_len, batch.tokens.begin() + b * t_len);
    std::copy(tokens.begin() + 1, tokens.end(), batch.targets.begin() + b * t_len);
  }
}

}  // namespace engine
