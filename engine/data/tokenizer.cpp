#include "data/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// GPT-2's pre-tokenizer pattern, which tokenizers' ByteLevel applies with use_regex.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// SentencePiece's space, U+2581.
constexpr const char* kMetaspace = "\xe2\x96\x81";

// ICU's normalizer for a tokenizer.json normalizer type (NFC, NFKC, NFD, NFKD), or null.
const void* unicode_form(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                 : type == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                                  : nullptr;
  return U_SUCCESS(status) ? form : nullptr;
}

// Llama 2's normalizer: Prepend("▁"), then Replace(" ", "▁").
bool is_llama2_normalizer(const Json& n) {
  if (n.value("type", "") != "Sequence") return false;
  const Json& steps = n.value("normalizers", Json::array());
  return steps.size() == 2 && steps[0].value("type", "") == "Prepend" && steps[0].value("prepend", "") == kMetaspace &&
         steps[1].value("type", "") == "Replace" && steps[1].value("content", "") == kMetaspace &&
         steps[1].value("pattern", Json::object()).value("String", "") == " ";
}

// Llama 2's decoder: Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0). (Metaspace's own
// decoder leaves <0xXX> tokens as they are: refused.)
bool is_sentencepiece_decoder(const Json& d) {
  if (d.value("type", "") != "Sequence") return false;
  const Json& steps = d.value("decoders", Json::array());
  return steps.size() == 4 && steps[0].value("type", "") == "Replace" && steps[0].value("content", "") == " " &&
         steps[0].value("pattern", Json::object()).value("String", "") == kMetaspace &&
         steps[1].value("type", "") == "ByteFallback" && steps[2].value("type", "") == "Fuse" &&
         steps[3].value("type", "") == "Strip" && steps[3].value("content", "") == " " &&
         steps[3].value("start", 0) == 1 && steps[3].value("stop", 0) == 0;
}

// GPT-2's byte alphabet: every byte as a printable code point (bytes_to_unicode), as UTF-8.
const std::array<std::string, 256>& byte_alphabet() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> out;
    auto utf8 = [](uint32_t c) {
      std::string s;
      if (c < 0x80) {
        s += char(c);
      } else {
        s += char(0xc0 | (c >> 6));
        s += char(0x80 | (c & 0x3f));
      }
      return s;
    };
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      out[b] = utf8(printable ? b : next++);
    }
    return out;
  }();
  return table;
}

// The inverse: a mapped code point's UTF-8 back to its byte.
const std::unordered_map<std::string, unsigned char>& byte_of_symbol() {
  static const std::unordered_map<std::string, unsigned char> table = [] {
    std::unordered_map<std::string, unsigned char> out;
    for (int b = 0; b < 256; ++b) out[byte_alphabet()[size_t(b)]] = static_cast<unsigned char>(b);
    return out;
  }();
  return table;
}

// The UTF-8 code points of a string, each as its own string.
std::vector<std::string> code_points(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
    out.push_back(text.substr(i, length));
    i += length;
  }
  return out;
}

// The length of the valid UTF-8 sequence at text[i], or 0 where the bytes there are not one.
size_t utf8_sequence(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range (RFC 3629's table)
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;
  }
  if (i + length > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  return length;
}

// Bytes as UTF-8, each invalid byte replaced by U+FFFD.
std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const size_t length = utf8_sequence(bytes, i);
    if (length == 0) {
      out += "\xef\xbf\xbd";
      ++i;
    } else {
      out.append(bytes.substr(i, length));
      i += length;
    }
  }
  return out;
}

}  // namespace

struct Tokenizer::Pattern {
  pcre2_code* code = nullptr;
  ~Pattern() { pcre2_code_free(code); }
  // The pieces of `text`: each match, and each stretch between matches (tokenizers' Isolated).
  std::vector<std::string> split(const std::string& text) const {
    std::vector<std::string> pieces;
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t at = 0, gap = 0;
    while (at <= text.size()) {
      // The text was checked to be UTF-8 once, in encode().
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, PCRE2_NO_UTF_CHECK,
                                 match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(match);
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        throw UserError(std::string("the tokenizer's pre-tokenizer regex failed: ") +
                        reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      const size_t begin = ovector[0], end = ovector[1];
      if (end == begin) {  // an empty match: step over one code point
        if (begin >= text.size()) break;
        at = begin + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) ++at;
        continue;
      }
      if (begin > gap) pieces.push_back(text.substr(gap, begin - gap));
      pieces.push_back(text.substr(begin, end - begin));
      at = gap = end;
    }
    pcre2_match_data_free(match);
    if (gap < text.size()) pieces.push_back(text.substr(gap));
    return pieces;
  }
};

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const fs::path& file) {
  const std::string where = file.string();
  std::ifstream in(file);
  if (!in) throw UserError(where + ": cannot open the tokenizer (a Hugging Face model directory holds tokenizer.json)");
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    throw UserError(where + ": not JSON (" + e.what() + ")");
  }
  auto unsupported = [&](const std::string& what) {
    return UserError(where + ": " + what +
                     "; the engine reads byte-level BPE tokenizers without a normalizer (GPT-2, Llama 3) and "
                     "SentencePiece's BPE with byte fallback (Llama 2): prepare token files with "
                     "scripts/prepare-tokens for others");
  };
  Tokenizer t;
  const Json& model = j.value("model", Json::object());
  if (model.value("type", "") != "BPE") throw unsupported("model type " + model.value("type", std::string("none")));
  t.sentencepiece_ = model.value("byte_fallback", false);
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(affix) && !model[affix].is_null() && !model[affix].get<std::string>().empty())
      throw unsupported(std::string(affix));
  const Json& normalizer = j.value("normalizer", Json());
  if (!t.sentencepiece_ && !normalizer.is_null()) {
    t.unicode_form_ = unicode_form(normalizer.value("type", std::string()));
    if (!t.unicode_form_) throw unsupported("normalizer " + normalizer.value("type", std::string("?")));
  }
  if (t.sentencepiece_ && !normalizer.is_null() && !is_llama2_normalizer(normalizer))
    throw unsupported("normalizer " + normalizer.value("type", std::string("?")));
  t.ignore_merges_ = model.value("ignore_merges", false);
  t.fuse_unknown_ = model.value("fuse_unk", false);

  for (const auto& [token, id] : model.at("vocab").items()) {
    t.vocab_[token] = id.get<int32_t>();
    t.id_limit_ = std::max<int64_t>(t.id_limit_, id.get<int64_t>() + 1);
  }
  int rank = 0;
  for (const Json& merge : model.at("merges")) {
    std::pair<std::string, std::string> pair;
    if (merge.is_string()) {  // "a b" (tokenizers before 0.20)
      const std::string text = merge;
      const size_t space = text.find(' ');
      if (space == std::string::npos) throw UserError(where + ": merge " + merge.dump() + " is not two tokens");
      pair = {text.substr(0, space), text.substr(space + 1)};
    } else {  // ["a", "b"]
      pair = {merge.at(0).get<std::string>(), merge.at(1).get<std::string>()};
    }
    t.merge_ranks_.emplace(std::move(pair), rank++);
  }
  if (const Json& unk = model.value("unk_token", Json()); unk.is_string()) {
    // Needed only where a symbol has no token and no byte fallback (encode says so then).
    const auto it = t.vocab_.find(unk.get<std::string>());
    if (it != t.vocab_.end()) t.unknown_ = it->second;
  }

  for (const Json& added : j.value("added_tokens", Json::array())) {
    if (added.value("lstrip", false) || added.value("rstrip", false) || added.value("single_word", false))
      throw unsupported("added token " + added.value("content", std::string()) + " with lstrip, rstrip or single_word");
    const int32_t id = added.at("id");
    t.added_tokens_.emplace_back(added.at("content").get<std::string>(), id);
    t.id_limit_ = std::max<int64_t>(t.id_limit_, int64_t(id) + 1);
  }
  std::sort(t.added_tokens_.begin(), t.added_tokens_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  // Pre-tokenizers: ByteLevel, Split, or a Sequence of them.
  auto compile = [&](const std::string& pattern) {
    auto compiled = std::make_unique<Pattern>();
    int error = 0;
    PCRE2_SIZE offset = 0;
    compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &error, &offset, nullptr);
    if (!compiled->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw UserError(where + ": pre-tokenizer pattern " + pattern + ": " + reinterpret_cast<const char*>(message));
    }
    return compiled;
  };
  std::vector<Json> steps;
  const Json& pre = j.value("pre_tokenizer", Json());
  if (t.sentencepiece_) {
    // Llama 2: the normalizer prepends and replaces, no pre-tokenizer; newer conversions: Metaspace.
    if (normalizer.is_null()) {
      if (pre.value("type", "") != "Metaspace" || pre.value("replacement", "") != kMetaspace ||
          pre.value("split", true) || pre.value("prepend_scheme", "always") == "never")
        throw unsupported("a byte-fallback BPE whose pre_tokenizer is not Llama 2's (Metaspace without split)");
      t.prepend_first_only_ = pre.value("prepend_scheme", "always") == "first";
      t.metaspace_ = true;
    } else if (!pre.is_null()) {
      throw unsupported("pre_tokenizer " + pre.value("type", std::string("?")) + " after Llama 2's normalizer");
    }
  } else if (pre.is_null()) {
    throw unsupported("no pre_tokenizer");
  }
  if (t.sentencepiece_)
    ;  // no pre-tokenizer steps: each stretch of text is one piece
  else if (pre.value("type", "") == "Sequence")
    for (const Json& step : pre.at("pretokenizers")) steps.push_back(step);
  else
    steps.push_back(pre);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Json& step = steps[i];
    const std::string type = step.value("type", "");
    if (type == "ByteLevel") {
      // The bytes are mapped after the last step: a step after ByteLevel would see them mapped.
      if (i + 1 != steps.size()) throw unsupported("a pre-tokenizer after ByteLevel");
      t.pre_tokenizers_.push_back(
          {step.value("use_regex", true) ? compile(kGpt2Pattern) : nullptr, step.value("add_prefix_space", false)});
    } else if (type == "Split") {
      if (step.value("behavior", "") != "Isolated" || step.value("invert", false))
        throw unsupported("Split pre-tokenizer with behavior " + step.value("behavior", std::string("?")));
      const Json& pattern = step.at("pattern");
      if (!pattern.contains("Regex")) throw unsupported("Split pre-tokenizer on a plain string");
      t.pre_tokenizers_.push_back({compile(pattern.at("Regex").get<std::string>()), false});
    } else {
      throw unsupported("pre_tokenizer " + type);
    }
  }
  if (!t.sentencepiece_ && (steps.empty() || steps.back().value("type", "") != "ByteLevel"))
    throw unsupported("no ByteLevel pre-tokenizer");
  // The post-processor: ByteLevel (offsets only), TemplateProcessing's single-sequence template,
  // or a Sequence of those.
  std::vector<Json> processors;
  const Json& post = j.value("post_processor", Json());
  if (!post.is_null()) {
    if (post.value("type", "") == "Sequence")
      for (const Json& processor : post.at("processors")) processors.push_back(processor);
    else
      processors.push_back(post);
  }
  for (const Json& processor : processors) {
    const std::string type = processor.value("type", "");
    if (type == "ByteLevel") continue;
    if (type != "TemplateProcessing") throw unsupported("post_processor " + type);
    bool after = false;
    for (const Json& piece : processor.at("single")) {
      if (piece.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id");
      for (const Json& id : processor.at("special_tokens").at(name).at("ids"))
        (after ? t.suffix_ : t.prefix_).push_back(id.get<int32_t>());
    }
  }
  const Json& decoder = j.value("decoder", Json());
  if (t.sentencepiece_ ? !is_sentencepiece_decoder(decoder)
                       : !decoder.is_null() && decoder.value("type", "") != "ByteLevel")
    throw unsupported("decoder " + decoder.value("type", std::string("?")));

  t.tokens_.assign(size_t(t.id_limit_), std::string());
  t.added_.assign(size_t(t.id_limit_), false);
  for (const auto& [token, id] : t.vocab_) t.tokens_[size_t(id)] = token;
  for (const auto& [content, id] : t.added_tokens_) {
    t.tokens_[size_t(id)] = content;
    t.added_[size_t(id)] = true;
  }
  return t;
}

void Tokenizer::encode_piece(const std::string& mapped, std::vector<int32_t>& out) const {
  if (ignore_merges_)
    if (auto it = vocab_.find(mapped); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  for (const std::string& symbol : merged(code_points(mapped))) {
    auto it = vocab_.find(symbol);
    if (it == vocab_.end()) throw UserError("the tokenizer has no token for '" + symbol + "' and no unknown token");
    out.push_back(it->second);
  }
}

std::vector<std::string> Tokenizer::merged(std::vector<std::string> symbols) const {
  while (symbols.size() > 1) {
    int best = std::numeric_limits<int>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (auto it = merge_ranks_.find({symbols[i], symbols[i + 1]}); it != merge_ranks_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    if (best == std::numeric_limits<int>::max()) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + std::ptrdiff_t(at) + 1);
  }
  return symbols;
}

void Tokenizer::encode_sentencepiece(std::string_view text, bool first, std::vector<int32_t>& out) const {
  std::string piece;
  for (char c : text)
    if (c == ' ')
      piece += kMetaspace;
    else
      piece += c;
  // Llama 2's Prepend always; Metaspace where the stretch is the text's first (scheme "first") and
  // does not start with "▁" already.
  if (!metaspace_ || ((first || !prepend_first_only_) && piece.rfind(kMetaspace, 0) != 0)) piece.insert(0, kMetaspace);
  bool last_unknown = false;
  for (const std::string& symbol : merged(code_points(piece))) {
    if (auto it = vocab_.find(symbol); it != vocab_.end()) {
      out.push_back(it->second);
      last_unknown = false;
      continue;
    }
    // Byte fallback: the symbol's bytes as <0xXX> tokens, where the vocabulary has them all.
    std::vector<int32_t> bytes;
    for (unsigned char byte : symbol) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", byte);
      if (auto it = vocab_.find(name); it != vocab_.end()) bytes.push_back(it->second);
    }
    if (bytes.size() == symbol.size()) {
      out.insert(out.end(), bytes.begin(), bytes.end());
      last_unknown = false;
      continue;
    }
    if (unknown_ < 0) throw UserError("the tokenizer has no token for '" + symbol + "' and no unknown token");
    if (!(fuse_unknown_ && last_unknown)) out.push_back(unknown_);
    last_unknown = true;
  }
}

void Tokenizer::encode_ordinary(std::string_view text, bool first, std::vector<int32_t>& out) const {
  if (sentencepiece_) return encode_sentencepiece(text, first, out);
  std::vector<std::string> pieces{std::string(text)};
  for (const PreTokenizer& step : pre_tokenizers_) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (step.add_prefix_space && !piece.empty() && piece.front() != ' ') piece.insert(0, " ");
      if (!step.pattern) {
        next.push_back(std::move(piece));
        continue;
      }
      for (std::string& part : step.pattern->split(piece)) next.push_back(std::move(part));
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) {
    std::string mapped;
    for (unsigned char byte : piece) mapped += byte_alphabet()[byte];
    encode_piece(mapped, out);
  }
}

std::string Tokenizer::normalized(std::string_view text) const {
  if (!unicode_form_) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString source = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size())));
  const icu::UnicodeString result = static_cast<const icu::Normalizer2*>(unicode_form_)->normalize(source, status);
  if (U_FAILURE(status)) throw UserError(std::string("Unicode normalization failed: ") + u_errorName(status));
  std::string out;
  result.toUTF8String(out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_sequence(text, i);
    if (length == 0) throw UserError("the text to encode is not UTF-8 at byte " + std::to_string(i));
    i += length;
  }
  std::vector<int32_t> out;
  if (add_special_tokens) out = prefix_;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto found = std::find_if(added_tokens_.begin(), added_tokens_.end(), [&](const auto& added) {
      return !added.first.empty() && text.substr(i, added.first.size()) == added.first;
    });
    if (found == added_tokens_.end()) {
      ++i;
      continue;
    }
    if (i > start) encode_ordinary(normalized(text.substr(start, i - start)), start == 0, out);
    out.push_back(found->second);
    i += found->first.size();
    start = i;
  }
  if (start < text.size()) encode_ordinary(normalized(text.substr(start)), start == 0, out);
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string Tokenizer::decode_sentencepiece(const std::vector<int32_t>& ids) const {
  std::string text, bytes;  // bytes: since the last added token
  for (int32_t id : ids) {
    const std::string& token = tokens_[size_t(id)];
    if (added_[size_t(id)]) {
      text += lossy_utf8(bytes) + token;
      bytes.clear();
      continue;
    }
    if (token.size() == 6 && token.rfind("<0x", 0) == 0 && token.back() == '>' && std::isxdigit(token[3]) &&
        std::isxdigit(token[4])) {
      bytes += char(std::stoi(token.substr(3, 2), nullptr, 16));
      continue;
    }
    for (size_t at = 0; at < token.size();) {
      if (token.compare(at, 3, kMetaspace) == 0) {
        bytes += ' ';
        at += 3;
      } else {
        bytes += token[at++];
      }
    }
  }
  text += lossy_utf8(bytes);
  if (!text.empty() && text.front() == ' ') text.erase(0, 1);  // the space the encoding put first
  return text;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids)
    if (id < 0 || id >= id_limit_ || (tokens_[size_t(id)].empty() && !added_[size_t(id)]))
      throw UserError("token id " + std::to_string(id) + " is not in the tokenizer's vocabulary");
  if (sentencepiece_) return decode_sentencepiece(ids);
  std::string text, bytes;  // bytes: the byte-level tokens since the last added one
  for (int32_t id : ids) {
    if (added_[size_t(id)]) {
      text += lossy_utf8(bytes) + tokens_[size_t(id)];
      bytes.clear();
      continue;
    }
    for (const std::string& symbol : code_points(tokens_[size_t(id)])) {
      auto it = byte_of_symbol().find(symbol);
      if (it == byte_of_symbol().end())
        bytes += symbol;  // not of the byte alphabet: its own bytes, as the library's decoder
      else
        bytes += char(it->second);
    }
  }
  return text + lossy_utf8(bytes);
}

}  // namespace engine
