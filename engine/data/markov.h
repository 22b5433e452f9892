// synthetic_markov: a seeded Markov source of order k over a vocabulary of V tokens.
//
// Each context (the k previous tokens) has `branching` distinct successors, picked by hashing the
// context with the seed, with Zipf probabilities p_j proportional to 1 / (j + 1). Every context
// shares that one distribution (only the successors differ), so the entropy rate of the source is
// exactly H(p), whatever the chain's stationary distribution. A sample starts with k uniformly
// random tokens and continues with the chain, so its first k - 1 targets are uniform; the loss
// floor over a sequence of T targets is therefore exactly
//
//   floor = ((k - 1) ln V + (T - k + 1) H(p)) / T      nats per token
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace engine {

class MarkovSource : public Dataset {
 public:
  MarkovSource(uint64_t seed, int64_t vocab, int64_t order, int64_t branching, int64_t sequence);

  void fill(Split split, int64_t index, Batch& batch) const override;
  std::string describe() const override;
  std::optional<double> loss_floor() const override;
  double entropy_rate() const;  // H(p) in nats

  // The j-th successor of a context (its last `order` tokens).
  int32_t successor(const int32_t* context, int64_t j) const;

 private:
  uint64_t seed_;
  int64_t vocab_, order_, branching_, sequence_;
  std::vector<double> cumulative_;  // cumulative Zipf probabilities
};

}  // namespace engine
