// A Hugging Face tokenizer (tokenizer.json), for the commands that turn text into a model's token
// ids and back (`engine generate`): byte-level BPE, as GPT-2, Llama 3, Qwen and GPT-NeoX use it (the
// last two after a Unicode normalizer), and SentencePiece's BPE with byte fallback, as Llama 2,
// TinyLlama and Mistral use it.
//
// Encoding follows the tokenizers library step by step:
//   1. added tokens (<|endoftext|>, <|im_start|>, ...) are cut out of the text where they occur,
//      the longest first at each position, and become their own ids;
//   2. the rest is normalized where the tokenizer names a Unicode normal form (NFC, NFKC, NFD or
//      NFKD, by ICU: Qwen's and GPT-NeoX's NFC), then pre-tokenized, step by step: Split (Llama 3's regex) and
//      ByteLevel (its add_prefix_space on each piece, then GPT-2's regex where use_regex), regexes matched with PCRE2
//      in Unicode mode; each piece's UTF-8 bytes are then mapped to GPT-2's printable byte alphabet;
//   3. each piece is merged by BPE, lowest merge rank first (a whole piece found in the vocabulary
//      is one id where the model sets ignore_merges, as Llama 3's does);
//   4. with add_special_tokens, the post-processor's single-sequence template adds its special
//      tokens (Llama 3's <|begin_of_text|>), as the library's encode() does by default.
// Decoding maps tokens back through the byte alphabet (a token outside it as its own bytes) and
// replaces invalid UTF-8 with U+FFFD, as the library's ByteLevel decoder does; added tokens decode
// as their text.
//
// SentencePiece's shape (byte_fallback): each stretch of text between added tokens has its spaces
// replaced by "▁" and a "▁" put before it (Llama 2's Prepend and Replace normalizers; or the
// Metaspace pre-tokenizer, where the stretch does not start with one, and with prepend_scheme
// "first" before the text's first stretch only), and is merged by BPE as one piece of code points; a symbol outside the
// vocabulary becomes its UTF-8 bytes' <0xXX> tokens, or the unknown token (consecutive ones fused where fuse_unk).
// Decoding turns "▁" back into spaces and <0xXX> tokens into their bytes, and drops the one space
// the encoding put first (Llama 2's Strip, Metaspace's decoder).
//
// A tokenizer.json this does not implement (another normalizer, such as BERT's lowercasing;
// WordPiece, ...) is refused at load, naming the field, rather than encoded differently; text that
// is not UTF-8 is refused with its byte offset. tests/hf/hf_test.cpp checks the ids against the
// tokenizers library.
//
//   const Tokenizer tokenizer = Tokenizer::load("path/to/model/tokenizer.json");
//   std::vector<int32_t> ids = tokenizer.encode("Hello, café");
//   std::string text = tokenizer.decode(ids);
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace engine {

class Tokenizer {
 public:
  // Throws UserError naming the file and what is missing or unsupported.
  static Tokenizer load(const std::filesystem::path& file);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids outside the vocabulary throw UserError.
  std::string decode(const std::vector<int32_t>& ids) const;
  // One past the largest id (the vocabulary and the added tokens).
  int64_t id_limit() const { return id_limit_; }
  // The special tokens encode(text, true) puts before the text (Llama's <s>), and after it.
  const std::vector<int32_t>& special_prefix() const { return prefix_; }
  const std::vector<int32_t>& special_suffix() const { return suffix_; }

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  Tokenizer();
  struct Pattern;                      // a compiled PCRE2 regex
  struct PreTokenizer {                // one step: Split, or ByteLevel
    std::unique_ptr<Pattern> pattern;  // the pieces' split (none: ByteLevel without use_regex)
    bool add_prefix_space = false;     // ByteLevel: " " before each piece that lacks one
  };

  std::vector<std::string> merged(std::vector<std::string> symbols) const;  // BPE, lowest rank first
  void encode_piece(const std::string& mapped, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, bool first, std::vector<int32_t>& out) const;
  std::string normalized(std::string_view text) const;  // in unicode_form_, where there is one
  void encode_sentencepiece(std::string_view text, bool first, std::vector<int32_t>& out) const;
  std::string decode_sentencepiece(const std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token, byte-level mapped (added tokens: their text)
  std::vector<bool> added_;          // id -> whether it is an added token (decoded as it is)
  std::map<std::pair<std::string, std::string>, int> merge_ranks_;
  std::vector<std::pair<std::string, int32_t>> added_tokens_;  // longest first
  std::vector<PreTokenizer> pre_tokenizers_;  // applied in order, each to every piece of the one before
  std::vector<int32_t> prefix_, suffix_;      // the post-processor's special tokens around a sequence
  bool ignore_merges_ = false;
  int64_t id_limit_ = 0;
  // SentencePiece's shape (byte_fallback): "▁" before every stretch of text, or only the first.
  bool sentencepiece_ = false;
  bool metaspace_ = false;  // the Metaspace pre-tokenizer (else Llama 2's normalizer)
  bool prepend_first_only_ = false;
  bool fuse_unknown_ = false;
  int32_t unknown_ = -1;  // the unknown token's id, or -1
  // The Unicode normal form each stretch between added tokens is put in (an icu::Normalizer2),
  // or null.
  const void* unicode_form_ = nullptr;
};

}  // namespace engine
