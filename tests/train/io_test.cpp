// Data files and weights files: clear errors for every malformed input, exact round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../temp_dir.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "core/convert.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/permutation.h"
#include "recipe/load.h"
#include "trainer/session.h"
#include "trainer/train.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  static const ::engine::testing::TempDir dir("io");
  return dir / name;
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// An llm.c token file: version 1 for uint16 tokens, 2 for uint32.
template <class Token = uint16_t>
std::string llmc_file(uint32_t claimed, const std::vector<Token>& tokens, int32_t version = sizeof(Token) / 2) {
  int32_t header[256] = {20240520, version, int32_t(claimed)};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(Token));
  return bytes;
}

recipe::Recipe token_recipe(const fs::path& data, const std::string& source, int64_t vocab = 100,
                            const std::string& format = "auto") {
  recipe::MemorySourceReader reader;
  reader.add("r.yaml", "model: {arch: gpt, vocab_size: " + std::to_string(vocab) +
                           ", context_length: 8, n_layer: 1, n_head: 1, n_embd: 8}\n"
                           "data: {source: " +
                           source + ", path: " + data.string() + (source == "tokens" ? ", format: " + format : "") +
                           ", val_fraction: 0.25}\ntrain: {steps: 1, micro_batch_size: 2}\n");
  recipe::LoadOptions options;
  options.reader = &reader;
  return recipe::load_recipe("r.yaml", options).recipe;
}

std::string data_error(const recipe::Recipe& r) {
  try {
    make_dataset(r);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "dataset loaded";
  return "";
}

TEST(TokenData, LlmcFileLoadsAndBatchesAreShiftedWindows) {
  std::vector<uint16_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i % 97);
  fs::path path = scratch("ok.bin");
  write_bytes(path, llmc_file(200, tokens));
  auto r = token_recipe(path, "tokens");
  auto data = make_dataset(r);
  Batch batch(2, 8, 0);
  data->fill(Split::train, 3, batch);
  for (int64_t i = 0; i < 16; ++i)
    if (i % 8 != 7) {
      EXPECT_EQ(batch.targets[size_t(i)], batch.tokens[size_t(i + 1)]);
    }
}

// Vocabularies past 65536 (Llama 3's 128256): llm.c's version 2 files and raw uint32 files hold
// 32-bit tokens, and the batches carry them whole.
TEST(TokenData, ThirtyTwoBitTokensLoadFromLlmcVersionTwoAndRawFiles) {
  std::vector<uint32_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint32_t(70000 + 251 * i % 58000);
  const fs::path llmc = scratch("llama3.bin"), raw = scratch("llama3.u32");
  write_bytes(llmc, llmc_file(200, tokens));
  write_bytes(raw, std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4));
  for (const auto& [path, format] : {std::pair{llmc, "auto"}, std::pair{llmc, "llmc"}, std::pair{raw, "raw_uint32"}}) {
    auto data = make_dataset(token_recipe(path, "tokens", 128256, format));
    EXPECT_NE(data->describe().find("uint32"), std::string::npos) << data->describe();
    Batch batch(2, 8, 0);
    data->fill(Split::train, 0, batch);
    for (int64_t i = 0; i < 16; ++i) {
      EXPECT_GE(batch.tokens[size_t(i)], 70000) << format;
      if (i % 8 != 7) {
        EXPECT_EQ(batch.targets[size_t(i)], batch.tokens[size_t(i + 1)]) << format;
      }
    }
  }
  // The same tokens against GPT-2's vocabulary: the first is named.
  EXPECT_NE(data_error(token_recipe(llmc, "tokens", 50257)).find("token 70000 at token offset 0 is beyond"),
            std::string::npos);
  // Read as uint16 (the wrong width) they are other tokens: the format is the file's, not a guess.
  write_bytes(llmc, llmc_file<uint32_t>(200, tokens, 3));
  EXPECT_NE(data_error(token_recipe(llmc, "tokens", 128256)).find("unsupported llm.c token file version 3"),
            std::string::npos);
  write_bytes(llmc, llmc_file<uint32_t>(300, tokens));
  EXPECT_NE(data_error(token_recipe(llmc, "tokens", 128256)).find("header promises 300 tokens (2224 bytes)"),
            std::string::npos);
  write_bytes(raw, std::string(402, '\1'));
  EXPECT_NE(data_error(token_recipe(raw, "tokens", 128256, "raw_uint32")).find("not a whole number of uint32 tokens"),
            std::string::npos);
}

TEST(TokenData, TruncatedLlmcFileIsRefused) {
  fs::path path = scratch("truncated.bin");
  write_bytes(path, llmc_file(500, std::vector<uint16_t>(100, 1)));
  EXPECT_NE(data_error(token_recipe(path, "tokens")).find("header promises 500 tokens"), std::string::npos);
}

TEST(TokenData, TokenBeyondTheVocabularyNamesTheOffset) {
  std::vector<uint16_t> tokens(100, 3);
  tokens[57] = 4000;
  fs::path path = scratch("big.bin");
  write_bytes(path, std::string(reinterpret_cast<const char*>(tokens.data()), 200));
  std::string message = data_error(token_recipe(path, "tokens"));
  EXPECT_NE(message.find("token 4000 at token offset 57 is beyond model.vocab_size 100"), std::string::npos) << message;
  EXPECT_NE(message.find(path.string()), std::string::npos);
}

TEST(TokenData, OddByteCountIsRefused) {
  fs::path path = scratch("odd.bin");
  write_bytes(path, std::string(201, '\1'));
  EXPECT_NE(data_error(token_recipe(path, "tokens")).find("201 bytes of tokens is not a whole number of uint16 tokens"),
            std::string::npos);
}

TEST(TokenData, EmptyAndTooSmallFilesAreRefused) {
  fs::path empty = scratch("empty.txt");
  write_bytes(empty, "");
  EXPECT_NE(data_error(token_recipe(empty, "text", 256)).find("data file is empty"), std::string::npos);
  fs::path small = scratch("small.txt");
  write_bytes(small, "hello");
  EXPECT_NE(data_error(token_recipe(small, "text", 256)).find("cannot fill one sequence"), std::string::npos);
}

TEST(Permutation, IsABijectionForAnySize) {
  for (uint64_t n : {1ull, 2ull, 7ull, 100ull, 1000ull, 4097ull}) {
    Permutation p(n, n * 31 + 7);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t x = p(i);
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]);
      seen[x] = true;
    }
  }
}

// ---- safetensors ----

std::string header_file(const std::string& json, const std::string& data) {
  uint64_t length = json.size();
  return std::string(reinterpret_cast<const char*>(&length), 8) + json + data;
}

std::string safetensors_error(const std::string& bytes) {
  fs::path path = scratch("bad.safetensors");
  write_bytes(path, bytes);
  try {
    read_safetensors(path);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "loaded";
  return "";
}

TEST(Safetensors, MalformedFilesAreRefusedWithTheReason) {
  EXPECT_NE(safetensors_error("abc").find("shorter than its 8-byte header"), std::string::npos);
  EXPECT_NE(safetensors_error(header_file("{", "")).find("not a JSON object"), std::string::npos);
  std::string huge = header_file("{}", "");
  huge[0] = '\xff';
  EXPECT_NE(safetensors_error(huge).find("exceeds the file"), std::string::npos);
}

}  // namespace
}  // namespace engine

namespace engine {
namespace {

TEST(Safetensors, BadTensorEntriesAreRefused) {
  std::string data(16, '\0');
  EXPECT_NE(safetensors_error(header_file(R"({"a": {"dtype": "Q8", "shape": [4], "data_offsets": [0, 16]}})", data))
                .find("unsupported dtype"),
            std::string::npos);
  EXPECT_NE(safetensors_error(header_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}})", data))
                .find("out of bounds"),
            std::string::npos);
  EXPECT_NE(safetensors_error(header_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", data))
                .find("shape needs 12 bytes"),
            std::string::npos);
  EXPECT_NE(safetensors_error(header_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                                          data))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(safetensors_error(header_file(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 16]}})", data))
                .find("bad dimension"),
            std::string::npos);
}

// A GPT small enough to write by hand: vocabulary 17, width 8, two blocks of two heads.
recipe::Recipe tiny_gpt() {
  recipe::MemorySourceReader reader;
  reader.add("r.yaml",
             "model: {arch: gpt, vocab_size: 17, context_length: 8, n_layer: 2, n_head: 2, n_embd: 8}\n"
             "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 2}\n");
  recipe::LoadOptions options;
  options.reader = &reader;
  return recipe::load_recipe("r.yaml", options).recipe;
}

TEST(Weights, SaveAndLoadRoundTripExactlyAndCheckShapes) {
  auto r = tiny_gpt();
  Session a(r), b(r);
  a.store.initialize(1);
  b.store.initialize(2);
  fs::path path = scratch("w.safetensors");
  save_weights(path, a.store, r.model.arch, {{"arch", "gpt"}});
  // Hugging Face layout: GPT-2's Conv1D weights are stored (in, out).
  auto file = read_safetensors(path);
  EXPECT_EQ(file.tensors.at("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));
  load_weights(path, b.store, r.model.arch);
  for (size_t i = 0; i < a.model.graph.params().size(); ++i)
    EXPECT_EQ(std::memcmp(a.store.param(int(i)), b.store.param(int(i)), size_t(a.store.numel(int(i))) * 4), 0);

  // As Hugging Face publishes GPT-2: "transformer." prefixes, mask buffers and a tied head copy.
  std::vector<SafeTensor> hf;
  for (auto& [name, tensor] : read_safetensors(path).tensors) {
    tensor.name = "transformer." + name;
    hf.push_back(tensor);
  }
  hf.push_back({"transformer.h.0.attn.bias", DType::f32, {1, 1, 8, 8}, std::vector<std::byte>(256)});
  hf.push_back({"lm_head.weight", DType::f32, {17, 8}, read_safetensors(path).tensors.at("wte.weight").data});
  fs::path hf_path = scratch("hf.safetensors");
  write_safetensors(hf_path, hf, {});
  b.store.initialize(3);
  load_weights(hf_path, b.store, r.model.arch);
  EXPECT_EQ(std::memcmp(a.store.param(0), b.store.param(0), size_t(a.store.numel(0)) * 4), 0);

  r.model.n_embd = 16;  // a different model: every mismatch is named
  Session c(r);
  try {
    load_weights(path, c.store, r.model.arch);
    FAIL() << "loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'wte.weight' is f32 (17, 8), expected f32 (17, 16)"),
              std::string::npos)
        << e.what();
  }
}

// A Hugging Face model directory as published: bf16 or f16, one file or shards with their index.
// Each is widened into the f32 masters; every file the engine writes says `format: pt`; and what
// is not a loadable checkpoint says what it is.
TEST(Weights, HuggingFaceDirectoriesInBf16F16AndShardsLoad) {
  const auto r = tiny_gpt();
  Session a(r), b(r);
  a.store.initialize(1);
  const fs::path path = scratch("w32.safetensors");
  save_weights(path, a.store, r.model.arch, {});
  const SafetensorsFile f32 = read_safetensors(path);
  EXPECT_EQ(f32.metadata.at("format"), "pt");

  for (DType type : {DType::bf16, DType::f16}) {
    // The file's tensors rounded to `type`, split over two shards listed by an index.
    std::vector<SafeTensor> first, second;
    std::string map;
    for (const auto& [name, t] : f32.tensors) {
      const auto n = int64_t(t.data.size() / 4);
      SafeTensor narrow_t{name, type, t.shape, std::vector<std::byte>(size_t(n) * 2)};
      narrow(reinterpret_cast<const float*>(t.data.data()), narrow_t.data.data(), type, n);
      const bool in_first = first.size() <= second.size();
      (in_first ? first : second).push_back(narrow_t);
      map += std::string(map.empty() ? "" : ",") + "\"" + name + "\": \"" +
             (in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors") + "\"";
    }
    const fs::path dir = scratch("hf_" + std::string(dtype_name(type)));
    fs::create_directories(dir);
    write_safetensors(dir / "model-00001-of-00002.safetensors", first, {{"format", "pt"}});
    write_safetensors(dir / "model-00002-of-00002.safetensors", second, {{"format", "pt"}});
    std::ofstream(dir / "model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << map << "}}";
    b.store.initialize(7);
    load_weights(dir, b.store, r.model.arch);
    for (size_t i = 0; i < a.model.graph.params().size(); ++i) {
      const int64_t n = a.store.numel(int(i));
      std::vector<std::byte> rounded(static_cast<size_t>(n) * 2);
      std::vector<float> want(static_cast<size_t>(n));
      narrow(a.store.param(int(i)), rounded.data(), type, n);
      widen(rounded.data(), type, want.data(), n);
      EXPECT_EQ(std::memcmp(want.data(), b.store.param(int(i)), size_t(n) * 4), 0) << dtype_name(type) << " " << i;
    }
    // A shard the index names but the directory lacks, named with a tensor it should hold.
    fs::rename(dir / "model-00002-of-00002.safetensors", dir / "moved.safetensors");
    try {
      load_weights(dir, b.store, r.model.arch);
      ADD_FAILURE() << "loaded without a shard";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("names model-00002-of-00002.safetensors"), std::string::npos) << e.what();
    }
  }
  // One file in a directory.
  const fs::path single = scratch("hf_single");
  fs::create_directories(single);
  fs::copy_file(path, single / "model.safetensors");
  b.store.initialize(8);
  load_weights(single, b.store, r.model.arch);
  EXPECT_EQ(std::memcmp(a.store.param(0), b.store.param(0), size_t(a.store.numel(0)) * 4), 0);

  // Other formats, named for what they are.
  const auto refused = [&](const fs::path& source, const std::string& expected) {
    try {
      load_weights(source, b.store, r.model.arch);
      ADD_FAILURE() << source << " loaded";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  std::ofstream(scratch("pytorch_model.bin")) << "PK\x03\x04 a zip";
  refused(scratch("pytorch_model.bin"), "a zip archive (PyTorch's torch.save format");
  std::ofstream(scratch("config.json")) << "{\"model_type\": \"gpt2\"}";
  refused(scratch("config.json"), "a JSON file");
  const fs::path empty = scratch("hf_empty");
  fs::create_directories(empty);
  refused(empty, "a directory without model.safetensors or model.safetensors.index.json");

  // An untied head (lm_head.weight other than the embedding) into a tied model is refused, naming
  // the key that loads it.
  std::vector<SafeTensor> untied;
  for (const auto& [name, t] : f32.tensors) untied.push_back(t);
  untied.push_back({"lm_head.weight", DType::f32, {17, 8}, std::vector<std::byte>(17 * 8 * 4)});
  write_safetensors(scratch("untied.safetensors"), untied, {});
  refused(scratch("untied.safetensors"), "set model.tie_embeddings: false");
}

TEST(Weights, NonFiniteInitialWeightsAreRefusedNamingTheFileAndTheTensor) {
  recipe::MemorySourceReader reader;
  reader.add("r.yaml",
             "model: {arch: gpt, vocab_size: 17, context_length: 8, n_layer: 1, n_head: 2, n_embd: 8}\n"
             "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 2}\n");
  recipe::LoadOptions options;
  options.reader = &reader;
  auto r = recipe::load_recipe("r.yaml", options).recipe;
  Session a(r);
  a.store.initialize(1);
  fs::path good = scratch("finite.safetensors");
  save_weights(good, a.store, r.model.arch, {});
  // One file per poison, each a copy of the good one with one element of one tensor replaced (as
  // Hugging Face names it, with the "transformer." prefix, for the first).
  struct Poison {
    std::string file, tensor;
    int64_t element;
    float value;
    std::string expected;
  };
  const std::vector<Poison> poisons{
      {"nan.safetensors", "transformer.h.0.attn.c_attn.weight", 37, NAN, "NaN at element 37 (1 non-finite of 192)"},
      {"inf.safetensors", "wpe.weight", 5, INFINITY, "inf at element 5 (1 non-finite of 64)"},
      {"minus_inf.safetensors", "h.0.ln_1.bias", 0, -INFINITY, "-inf at element 0 (1 non-finite of 8)"}};
  for (const Poison& poison : poisons) {
    std::vector<SafeTensor> tensors;
    for (auto& [name, tensor] : read_safetensors(good).tensors) {
      if (poison.tensor.ends_with(name)) {
        tensor.name = poison.tensor;
        std::memcpy(tensor.data.data() + poison.element * 4, &poison.value, 4);
      }
      tensors.push_back(tensor);
    }
    fs::path path = scratch(poison.file);
    write_safetensors(path, tensors, {});
    Session b(r);
    try {
      load_weights(path, b.store, r.model.arch);
      ADD_FAILURE() << poison.file << " loaded";
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path.string() + ": initial weights must be finite"), std::string::npos) << message;
      EXPECT_NE(message.find("tensor '" + poison.tensor + "': " + poison.expected), std::string::npos) << message;
    }
  }
  Session c(r);
  EXPECT_NO_THROW(load_weights(good, c.store, r.model.arch));
}

}  // namespace
}  // namespace engine

namespace engine {
namespace {

recipe::LoadedRecipe tiny_run(const std::string& model, const fs::path& out) {
  recipe::MemorySourceReader reader;
  reader.add("r.yaml",
             "run: {output_dir: '" + out.string() + "', name: w}\nmodel: " + model +
                 "\ndata: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 2, log_every: 1}\n");
  recipe::LoadOptions options;
  options.reader = &reader;
  return recipe::load_recipe("r.yaml", options);
}

const char* kGqaLlama =
    "{arch: llama, vocab_size: 17, context_length: 8, n_layer: 2, n_head: 4, kv_heads: 2, n_embd: 16, "
    "tie_embeddings: false}";

TEST(Weights, LlamaFilesUseHuggingFaceSeparateProjections) {
  auto r = tiny_run(kGqaLlama, scratch("llama")).recipe;
  Session a(r), b(r);
  a.store.initialize(1);
  b.store.initialize(2);
  fs::path path = scratch("llama.safetensors");
  save_weights(path, a.store, r.model.arch, {});
  auto file = read_safetensors(path);
  // head size 4: q_proj (16, 16); k_proj and v_proj (2 heads x 4, 16) as num_key_value_heads = 2.
  EXPECT_EQ(file.tensors.at("model.layers.1.self_attn.q_proj.weight").shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(file.tensors.at("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(file.tensors.at("model.layers.1.self_attn.v_proj.weight").shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(file.tensors.count("model.layers.1.self_attn.qkv_proj.weight"), 0u);
  // The fused parameter's rows are q, then k, then v.
  int qkv = -1;
  for (size_t i = 0; i < a.model.graph.params().size(); ++i)
    if (a.model.graph.params()[i].name == "model.layers.1.self_attn.qkv_proj.weight") qkv = int(i);
  ASSERT_GE(qkv, 0);
  const auto& k = file.tensors.at("model.layers.1.self_attn.k_proj.weight").data;
  EXPECT_EQ(std::memcmp(k.data(), a.store.param(qkv) + 16 * 16, k.size()), 0);
  load_weights(path, b.store, r.model.arch);
  for (size_t i = 0; i < a.model.graph.params().size(); ++i)
    EXPECT_EQ(std::memcmp(a.store.param(int(i)), b.store.param(int(i)), size_t(a.store.numel(int(i))) * 4), 0);

  // Older Hugging Face files carry rotary frequency buffers: accepted and ignored.
  std::vector<SafeTensor> hf;
  for (auto& [name, tensor] : read_safetensors(path).tensors) hf.push_back(tensor);
  hf.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::f32, {2}, std::vector<std::byte>(8)});
  fs::path hf_path = scratch("llama_hf.safetensors");
  write_safetensors(hf_path, hf, {});
  b.store.initialize(3);
  load_weights(hf_path, b.store, r.model.arch);
  EXPECT_EQ(std::memcmp(a.store.param(qkv), b.store.param(qkv), size_t(a.store.numel(qkv)) * 4), 0);

  // A fused file (the engine's internal layout) is refused, naming the tensors it lacks.
  std::vector<SafeTensor> fused;
  for (size_t i = 0; i < a.model.graph.params().size(); ++i) {
    const Shape& shape = a.model.graph.value(a.model.graph.params()[i].value).shape;
    SafeTensor t{a.model.graph.params()[i].name, DType::f32, shape.dims,
                 std::vector<std::byte>(size_t(shape.numel()) * 4)};
    fused.push_back(std::move(t));
  }
  fs::path fused_path = scratch("llama_fused.safetensors");
  write_safetensors(fused_path, fused, {});
  try {
    load_weights(fused_path, b.store, r.model.arch);
    FAIL() << "loaded";
  } catch (const UserError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing tensor 'model.layers.0.self_attn.k_proj.weight' (8, 16)"), std::string::npos) << what;
    EXPECT_NE(what.find("separate q_proj, k_proj and v_proj"), std::string::npos) << what;
  }
}

// --dump-first-gradients writes the same names, shapes and layout as the weights file, for every
// architecture: a gradient lines up with its weight (GPT-2's Conv1D (in, out), Llama's q/k/v).
TEST(Weights, DumpedGradientsHaveTheLayoutOfTheWeightsFile) {
  const char* gpt = "{arch: gpt, vocab_size: 17, context_length: 8, n_layer: 1, n_head: 2, n_embd: 8}";
  for (const char* model : {gpt, kGqaLlama}) {
    fs::path out = scratch("dump");
    fs::remove_all(out);
    auto loaded = tiny_run(model, out);
    std::ostringstream log;
    TrainOptions options;
    options.first_gradients = out / "grads.safetensors";
    train(loaded, log, options);
    auto weights = read_safetensors(out / "w" / "model.safetensors").tensors;
    auto grads = read_safetensors(out / "grads.safetensors").tensors;
    ASSERT_EQ(weights.size(), grads.size()) << model;
    for (const auto& [name, w] : weights) {
      ASSERT_TRUE(grads.count(name)) << model << ": no gradient for " << name;
      EXPECT_EQ(grads.at(name).shape, w.shape) << name;
    }
    if (model == gpt) {
      EXPECT_EQ(grads.at("h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));  // (in, out)
    }
    if (model == kGqaLlama) {
      EXPECT_EQ(grads.at("model.layers.0.self_attn.v_proj.weight").shape, (std::vector<int64_t>{8, 16}));
    }
  }
}

TEST(Safetensors, ShapesWhoseSizeOverflowsAreRefused) {
  EXPECT_NE(
      safetensors_error(
          header_file(R"({"a": {"dtype": "F32", "shape": [1099511627776, 16777216], "data_offsets": [0, 0]}})", ""))
          .find("shape too large"),
      std::string::npos);
}

}  // namespace
}  // namespace engine
