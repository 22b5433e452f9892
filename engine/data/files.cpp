#include "data/files.h"

#include <climits>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/whole_file.h"
#include "data/permutation.h"
#include "loss/cross_entropy.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kLlmcMagic = 20240520;

std::string read_all(const fs::path& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) throw UserError(path.string() + ": data file not found");
  std::optional<std::string> bytes = read_whole_file(path);
  if (!bytes) throw UserError(path.string() + ": cannot read");
  if (bytes->empty()) throw UserError(path.string() + ": data file is empty");
  return std::move(*bytes);
}

}  // namespace

TokenFile::TokenFile(const recipe::Recipe& recipe)
    : seed_(uint64_t(recipe.run.seed)),
      shuffle_(recipe.data.shuffle),
      document_end_(recipe.data.document_end.value_or(-1)) {
  const fs::path& path = recipe.data.path;
  std::string bytes = read_all(path);
  const int64_t vocab = recipe.model.vocab_size;
  if (recipe.data.source == recipe::DataSource::text) {
    tokens_.assign(bytes.begin(), bytes.end());
    for (auto& t : tokens_) t &= 0xff;
    description_ = "text: " + path.string() + ", " + std::to_string(tokens_.size()) + " bytes";
  } else {
    int32_t header[256] = {};
    bool has_header = bytes.size() >= sizeof header;
    if (has_header) std::memcpy(header, bytes.data(), sizeof header);
    bool llmc = recipe.data.format == recipe::TokenFormat::llmc ||
                (recipe.data.format == recipe::TokenFormat::auto_detect && has_header && header[0] == kLlmcMagic);
    size_t start = 0, width = recipe.data.format == recipe::TokenFormat::raw_uint32 ? 4 : 2;
    if (llmc) {
      if (!has_header || header[0] != kLlmcMagic)
        throw UserError(path.string() + ": not an llm.c token file (magic " + std::to_string(kLlmcMagic) + " missing)");
      // llm.c's versions: 1 for uint16 tokens (GPT-2's vocabulary), 2 for uint32 (Llama 3's).
      if (header[1] != 1 && header[1] != 2)
        throw UserError(path.string() + ": unsupported llm.c token file version " + std::to_string(header[1]) +
                        " (1: uint16 tokens, 2: uint32)");
      width = header[1] == 1 ? 2 : 4;
      start = sizeof header;
      size_t expected = start + size_t(uint32_t(header[2])) * width;
      if (bytes.size() != expected)
        throw UserError(path.string() + ": header promises " + std::to_string(header[2]) + " tokens (" +
                        std::to_string(expected) + " bytes) but the file has " + std::to_string(bytes.size()) +
                        " bytes (truncated?)");
    }
    if ((bytes.size() - start) % width != 0)
      throw UserError(path.string() + ": " + std::to_string(bytes.size() - start) + " bytes of tokens is not a " +
                      "whole number of uint" + std::to_string(8 * width) + " tokens (truncated?)");
    size_t count = (bytes.size() - start) / width;
    tokens_.resize(count);
    for (size_t i = 0; i < count; ++i) {
      if (width == 2) {
        uint16_t t;
        std::memcpy(&t, bytes.data() + start + 2 * i, 2);
        tokens_[i] = t;
      } else {
        uint32_t t;
        std::memcpy(&t, bytes.data() + start + 4 * i, 4);
        if (t > uint32_t(INT32_MAX))
          throw UserError(path.string() + ": token " + std::to_string(t) + " at token offset " + std::to_string(i) +
                          " is beyond model.vocab_size " + std::to_string(vocab));
        tokens_[i] = int32_t(t);
      }
    }
    description_ = std::string("tokens (") +
                   (llmc ? "llm.c, uint" + std::to_string(8 * width) : "raw uint" + std::to_string(8 * width)) +
                   "): " + path.string() + ", " + std::to_string(count) + " tokens";
  }
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] >= vocab)
      throw UserError(path.string() + ": token " + std::to_string(tokens_[i]) + " at token offset " +
                      std::to_string(i) + " is beyond model.vocab_size " + std::to_string(vocab));

  if (!recipe.data.loss_mask.empty()) {
    const fs::path& mask_path = recipe.data.loss_mask;
    const std::string mask = read_all(mask_path);
    if (mask.size() != tokens_.size())
      throw UserError(mask_path.string() + ": a loss mask of " + std::to_string(mask.size()) + " bytes for " +
                      std::to_string(tokens_.size()) + " tokens in " + path.string() +
                      " (one byte per token: 0 not trained, 1 trained)");
    trained_.assign(mask.begin(), mask.end());
    int64_t trained = 0;
    for (size_t i = 0; i < trained_.size(); ++i) {
      if (trained_[i] > 1)
        throw UserError(mask_path.string() + ": byte " + std::to_string(int(trained_[i])) + " at offset " +
                        std::to_string(i) + " (a loss mask holds 0 and 1)");
      trained += trained_[i];
    }
    description_ += "; loss mask " + mask_path.string() + ": " + std::to_string(trained) + " trained tokens";
  }
  const int64_t t_len = *recipe.data.sequence_length;
  const auto total = int64_t(tokens_.size());
  train_end_ = total - int64_t(double(total) * recipe.data.val_fraction);
  if (train_end_ < t_len + 1)
    throw UserError(path.string() + ": " + std::to_string(train_end_) +
                    " training tokens cannot fill one sequence of " + std::to_string(t_len + 1) +
                    " (sequence_length + 1)");
  // The validation split must hold a sequence only when something evaluates on it.
  if (recipe.train.eval_every > 0 && recipe.data.val_fraction > 0 && total - train_end_ < t_len + 1)
    throw UserError(path.string() + ": the validation split (" + std::to_string(total - train_end_) +
                    " tokens) cannot fill one sequence of " + std::to_string(t_len + 1) +
                    "; raise data.val_fraction or use more data");
}

std::string TokenFile::describe() const { return description_; }

void TokenFile::fill(Split split, int64_t index, Batch& batch) const {
  const int64_t t_len = batch.sequence;
  int64_t begin = split == Split::train ? 0 : train_end_;
  int64_t end = split == Split::train ? train_end_ : int64_t(tokens_.size());
  const auto windows = uint64_t((end - begin - 1) / t_len);
  ENGINE_CHECK(windows > 0, "no windows in split");
  for (int64_t b = 0; b < batch.batch; ++b) {
    uint64_t sample = uint64_t(index) * uint64_t(batch.batch) + uint64_t(b);
    uint64_t epoch = sample / windows, position = sample % windows;
    uint64_t window =
        shuffle_ ? Permutation(windows, seed_ * 0x100000001b3ull + epoch * 2 + uint64_t(split))(position) : position;
    const int64_t first = begin + int64_t(window) * t_len;
    const int32_t* src = tokens_.data() + first;
    std::copy(src, src + t_len, batch.tokens.begin() + b * t_len);
    std::copy(src + 1, src + t_len + 1, batch.targets.begin() + b * t_len);
    if (!trained_.empty())
      for (int64_t i = 0; i < t_len; ++i)
        if (!trained_[size_t(first + i + 1)]) batch.targets[size_t(b * t_len + i)] = ops::kIgnoredTarget;
    if (document_end_ >= 0) {
      batch.positions.resize(batch.tokens.size());
      int32_t in_document = 0;  // a window starts a document, even one begun before it
      for (int64_t i = 0; i < t_len; ++i) {
        batch.positions[size_t(b * t_len + i)] = in_document++;
        if (src[i] == document_end_) {
          batch.targets[size_t(b * t_len + i)] = ops::kIgnoredTarget;
          in_document = 0;
        }
      }
    }
  }
}

}  // namespace engine
