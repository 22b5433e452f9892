// File-backed token data: `text` (any UTF-8 file, one token per byte) and `tokens` (pre-tokenised:
// llm.c's .bin with its 256-int32 header, version 1 holding uint16 tokens and version 2 uint32, as
// llm.c writes GPT-2's and Llama 3's; or raw uint16 as nanoGPT writes, or raw uint32).
//
// The token stream is split once: the first (1 - val_fraction) for training, the rest for
// validation. Each split is cut into windows of T + 1 tokens (stride T); an epoch visits every
// window once, in an order shuffled per epoch from the seed (or in file order with shuffle: false).
// With data.loss_mask (one byte per token), a target whose mask byte is 0 is kIgnoredTarget (-1):
// the model still reads the token, and is not trained to predict it.
// With data.document_end (packing), each window also gets its tokens' positions within their
// documents (0 after each end token, and at the window's start), and an end token's target, the
// next document's first token, is kIgnoredTarget: a document is trained as if it were alone.
#pragma once

#include <filesystem>
#include <vector>

#include "data/dataset.h"

namespace engine {

class TokenFile : public Dataset {
 public:
  // Loads and checks the file; throws UserError naming the file (and the offset of a bad token).
  TokenFile(const recipe::Recipe& recipe);

  void fill(Split split, int64_t index, Batch& batch) const override;
  std::string describe() const override;
  bool ignores_targets() const override { return !trained_.empty() || document_end_ >= 0; }

 private:
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> trained_;  // data.loss_mask: per token, whether predicting it is trained; empty: all
  int64_t train_end_ = 0;         // tokens [0, train_end) train, [train_end, size) validation
  uint64_t seed_;
  bool shuffle_;
  int64_t document_end_;  // data.document_end; -1: no packing
  std::string description_;
};

}  // namespace engine
