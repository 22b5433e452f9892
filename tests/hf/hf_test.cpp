// Hugging Face checkpoints as the starting point, with transformers as the client: tiny random
// GPT-2, Llama, Mistral and Qwen2 models (tied and untied heads, GQA, Llama 3.1's and linear
// rope_scaling, Qwen2's q, k and v biases; saved in fp32, bf16, fp16 and as shards) made by
// save_pretrained (make_models.py, run with .venv-hf's transformers), trained by the engine from
// their directories with sizes from config.json alone: the first step's loss equals transformers'
// on the same tokens within 1e-6 relative; `engine export` to a directory loads back into
// transformers (as the same model_type) with the engine's loss. A recipe that contradicts
// config.json, or a config the engine cannot express, is refused naming the key and the file. Text
// and JSONL become token files with a tokenizer's own ids (scripts/prepare-tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../shell.h"
#include "../temp_dir.h"
#include "core/error.h"
#include "core/whole_file.h"
#include "data/tokenizer.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;
const fs::path kSource = ENGINE_SOURCE_DIR;
const fs::path kPython = kSource / ".venv-hf" / "bin" / "python";

class HuggingFace : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kPython)) return;
    dir_ = new TempDir("hf_models");
    made_ = new ShellResult(
        run_shell("'" + kPython.string() + "' tests/hf/make_models.py '" + dir_->path().string() + "' 2>&1", kSource));
  }
  static void TearDownTestSuite() {
    delete made_;
    delete dir_;
  }
  void SetUp() override {
    if (!fs::exists(kPython))
      GTEST_SKIP() << kPython << " is missing: scripts/setup makes it (transformers over Debian's python3-torch)";
    ASSERT_EQ(made_->status, 0) << made_->output;
  }
  static ShellResult train(const std::string& model, const std::string& arch, const std::string& extra = "") {
    return run_shell("'" ENGINE_BINARY "' train tests/hf/start_from.yaml run.device=cpu model.arch=" + arch +
                         " model.init_from=" + (dir_->path() / model).string() +
                         " data.path=" + (dir_->path() / "tokens.bin").string() +
                         " run.output_dir=" + (dir_->path() / "runs").string() + " run.name=" + model + " " + extra,
                     kSource);
  }
  static inline TempDir* dir_ = nullptr;
  static inline ShellResult* made_ = nullptr;
};

TEST_F(HuggingFace, EveryModelDirectoryTrainsFromTransformersLoss) {
  std::ifstream in(dir_->path() / "reference.json");
  const nlohmann::json reference = nlohmann::json::parse(in);
  ASSERT_EQ(reference.size(), 9u);
  for (auto it = reference.begin(); it != reference.end(); ++it) {
    const std::string name = it.key(), arch = it.value().at("arch");
    const ShellResult run = train(name, arch);
    ASSERT_EQ(run.status, 0) << name << "\n" << run.output;
    EXPECT_NE(run.output.find("sizes from " + (dir_->path() / name / "config.json").string()), std::string::npos)
        << run.output;
    std::ifstream metrics(dir_->path() / "runs" / name / "metrics.jsonl");
    std::string first;
    std::getline(metrics, first);
    const double loss = nlohmann::json::parse(first).at("loss"), want = it.value().at("loss");
    EXPECT_NEAR(loss, want, 1e-6 * want) << name << ": the engine's first loss against transformers'";
    if (it.value().contains("loss_plain"))  // rope_scaling or q, k and v biases move it far beyond the tolerance
      EXPECT_GT(std::abs(it.value().at("loss_plain").get<double>() - want), 1e-3 * want) << name;
  }
}

// engine export to a directory writes what from_pretrained loads as it is (config.json, and the
// weights with format: pt): no missing, unexpected or mis-shaped keys, and transformers' loss of the
// exported model (trained one step) equals the engine's second step's loss on the same windows.
TEST_F(HuggingFace, AnExportedDirectoryLoadsInTransformersWithTheEnginesLoss) {
  for (const auto& [name, arch] : std::vector<std::pair<std::string, std::string>>{{"gpt2_tied_fp32", "gpt"},
                                                                                   {"llama_gqa_untied_fp32", "llama"},
                                                                                   {"llama_tied_fp16", "llama"},
                                                                                   {"llama_rope_llama3", "llama"},
                                                                                   {"mistral_fp32", "llama"},
                                                                                   {"qwen2_tied_bf16", "llama"}}) {
    ASSERT_EQ(train(name, arch, "run.name=one_" + name).status, 0) << name;
    const ShellResult two = train(name, arch, "train.steps=2 run.name=two_" + name);
    ASSERT_EQ(two.status, 0) << two.output;
    std::ifstream metrics(dir_->path() / "runs" / ("two_" + name) / "metrics.jsonl");
    std::string line;
    std::getline(metrics, line);
    std::getline(metrics, line);
    const double engine_loss = nlohmann::json::parse(line).at("loss");
    const fs::path exported = dir_->path() / ("exported_" + name);
    const ShellResult exported_run = run_shell(
        "'" ENGINE_BINARY "' export " + (dir_->path() / "runs" / ("one_" + name)).string() + " " + exported.string(),
        kSource);
    ASSERT_EQ(exported_run.status, 0) << exported_run.output;
    std::ifstream exported_config(exported / "config.json");
    EXPECT_EQ(nlohmann::json::parse(exported_config).value("model_type", ""), name.substr(0, name.find('_')))
        << name << ": the source's model_type (each model's name starts with it)";
    const ShellResult loaded = run_shell("'" + kPython.string() + "' tests/hf/loss_of.py " + exported.string() + " " +
                                             (dir_->path() / "tokens.bin").string() + " 16 2>/dev/null",
                                         kSource);
    ASSERT_EQ(loaded.status, 0) << loaded.output;
    const nlohmann::json result = nlohmann::json::parse(loaded.output);
    EXPECT_TRUE(result.at("missing").empty()) << name << ": " << loaded.output;
    EXPECT_TRUE(result.at("unexpected").empty()) << name << ": " << loaded.output;
    EXPECT_TRUE(result.at("mismatched").empty()) << name << ": " << loaded.output;
    EXPECT_NEAR(result.at("loss").get<double>(), engine_loss, 1e-6 * engine_loss) << name;
  }
}

TEST_F(HuggingFace, ARecipeThatContradictsConfigJsonIsRefusedNamingBoth) {
  const ShellResult layers = train("gpt2_tied_fp32", "gpt", "model.n_layer=3");
  EXPECT_EQ(layers.status, 2) << layers.output;
  EXPECT_NE(layers.output.find("model.n_layer is 3 but"), std::string::npos) << layers.output;
  EXPECT_NE(layers.output.find("config.json says n_layer = 2"), std::string::npos) << layers.output;
  const ShellResult tied = train("llama_gqa_untied_fp32", "llama", "model.tie_embeddings=true");
  EXPECT_EQ(tied.status, 2) << tied.output;
  EXPECT_NE(tied.output.find("tie_word_embeddings"), std::string::npos) << tied.output;
  const ShellResult factor = train("llama_rope_llama3", "llama", "model.rope_scaling=llama3 model.rope_factor=2");
  EXPECT_EQ(factor.status, 2) << factor.output;
  EXPECT_NE(factor.output.find("model.rope_factor is 2 but"), std::string::npos) << factor.output;
  EXPECT_NE(factor.output.find("config.json says rope_scaling.factor = 8"), std::string::npos) << factor.output;
  const ShellResult arch = train("llama_gqa_untied_fp32", "gpt");
  EXPECT_EQ(arch.status, 2) << arch.output;
  EXPECT_NE(arch.output.find("set model.arch: llama"), std::string::npos) << arch.output;
}

TEST_F(HuggingFace, AConfigTheEngineCannotExpressIsRefused) {
  const fs::path model = dir_->path() / "llama_scaled";
  fs::create_directories(model);
  for (const char* file : {"model.safetensors", "config.json"})
    fs::copy_file(dir_->path() / "llama_gqa_untied_fp32" / file, model / file, fs::copy_options::overwrite_existing);
  std::ifstream in(model / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  in.close();
  // Each configuration below is written over the model's config.json and refused, naming it.
  const auto expect_refused = [&](const std::string& wording) {
    std::ofstream(model / "config.json") << config.dump();
    const ShellResult run = train("llama_scaled", "llama");
    EXPECT_EQ(run.status, 2) << run.output;
    EXPECT_NE(run.output.find(wording), std::string::npos) << run.output;
  };
  config["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};  // NTK scaling, by the sequence's length
  expect_refused("rope_scaling of rope_type dynamic, which this engine's llama does not have");
  config.erase("rope_scaling");
  config["model_type"] = "mistral";
  config["sliding_window"] = 8;
  expect_refused("sliding_window 8 (attention over the last 8 positions only");
  config["model_type"] = "qwen2";
  config["use_sliding_window"] = true;
  expect_refused("use_sliding_window true, which this engine's qwen2 does not have");
  config["model_type"] = "gemma";
  expect_refused("model_type 'gemma' is not an architecture this engine trains");
}

// Instruction data: with a loss mask, the engine's first loss is transformers' cross-entropy with
// the untrained targets ignored (ignore_index), the mean over the trained ones.
TEST_F(HuggingFace, AMaskedLossIsTransformersLossWithIgnoredTargets) {
  const fs::path tokens = dir_->path() / "tokens.bin", mask = dir_->path() / "tokens.mask";
  std::string bytes(size_t(fs::file_size(tokens) / 2), '\1');
  for (size_t i = 0; i < bytes.size(); ++i)
    if (i % 5 < 2 || (i > 20 && i < 28)) bytes[i] = '\0';
  std::ofstream(mask, std::ios::binary) << bytes;
  for (const auto& [name, arch] : std::vector<std::pair<std::string, std::string>>{
           {"gpt2_tied_fp32", "gpt"}, {"llama_gqa_untied_fp32", "llama"}}) {
    const ShellResult run = train(name, arch, "run.name=masked_" + name + " data.loss_mask=" + mask.string());
    ASSERT_EQ(run.status, 0) << run.output;
    std::ifstream metrics(dir_->path() / "runs" / ("masked_" + name) / "metrics.jsonl");
    std::string first;
    std::getline(metrics, first);
    const double loss = nlohmann::json::parse(first).at("loss");
    const ShellResult reference =
        run_shell("'" + kPython.string() + "' tests/hf/loss_of.py " + (dir_->path() / name).string() + " " +
                      tokens.string() + " 16 " + mask.string() + " 2>/dev/null",
                  kSource);
    ASSERT_EQ(reference.status, 0) << reference.output;
    const double want = nlohmann::json::parse(reference.output).at("loss");
    EXPECT_NEAR(loss, want, 1e-6 * want) << name;
  }
}

// LoRA with PEFT as the reference: from the same base and the same adapter (PEFT's, B drawn at
// random too), three SGD steps give PEFT's losses, and the adapter the engine exports is PEFT's
// trained adapter; PEFT loads it over the base with the loss PEFT reached, and the merged export
// loads in transformers alone with the same loss. GPT-2 (Conv1D, fused c_attn) and a GQA Llama
// (q and v in the fused qkv projection, down_proj).
TEST_F(HuggingFace, LoraTrainsAsPeftDoesAndExportsAsAnAdapterAndMerged) {
  const fs::path tokens = dir_->path() / "tokens.bin";
  for (const auto& [name, arch, targets] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gpt2_tied_fp32", "gpt", "c_attn,c_proj,c_fc"},
           {"llama_gqa_untied_fp32", "llama", "q_proj,v_proj,down_proj"}}) {
    const fs::path out = dir_->path() / ("peft_" + name);
    fs::create_directories(out);
    const ShellResult reference =
        run_shell("'" + kPython.string() + "' tests/hf/peft_reference.py train " + (dir_->path() / name).string() +
                      " " + tokens.string() + " 16 " + out.string() + " " + targets + " 3 0.1 2>/dev/null",
                  kSource);
    ASSERT_EQ(reference.status, 0) << reference.output;
    const nlohmann::json want = nlohmann::json::parse(reference.output);
    const std::string run_name = "lora_" + name;
    const ShellResult run =
        train(name, arch,
              "run.name=" + run_name + " lora.rank=4 lora.alpha=8 lora.target_modules=" + targets +
                  " lora.init_from=" + (out / "adapter_start").string() +
                  " train.steps=3 optimizer.lr=0.1 train.gradient_clipping=0 checkpoint.at_end=true");
    ASSERT_EQ(run.status, 0) << run.output;
    std::ifstream metrics(dir_->path() / "runs" / run_name / "metrics.jsonl");
    std::vector<double> losses;
    for (std::string line; std::getline(metrics, line);)
      if (nlohmann::json j = nlohmann::json::parse(line); j.contains("loss")) losses.push_back(j.at("loss"));
    ASSERT_EQ(losses.size(), 3u) << run.output;
    for (size_t s = 0; s < 3; ++s)
      EXPECT_NEAR(losses[s], want.at("losses")[s].get<double>(), 1e-5 * losses[s]) << name << " step " << s;

    const fs::path adapter = out / "engine_adapter", merged = out / "engine_merged";
    const std::string run_dir = (dir_->path() / "runs" / run_name).string();
    ASSERT_EQ(
        run_shell("'" ENGINE_BINARY "' export " + run_dir + " " + adapter.string() + " --adapter", kSource).status, 0);
    ASSERT_EQ(run_shell("'" ENGINE_BINARY "' export " + run_dir + " " + merged.string(), kSource).status, 0);
    const ShellResult compared = run_shell("'" + kPython.string() + "' tests/hf/peft_reference.py compare " +
                                               (out / "adapter_end").string() + " " + adapter.string() + " 2>&1",
                                           kSource);
    ASSERT_EQ(compared.status, 0) << compared.output;
    EXPECT_LT(nlohmann::json::parse(compared.output).at("max_difference").get<double>(), 1e-5) << name;
    const ShellResult peft_loss = run_shell("'" + kPython.string() + "' tests/hf/peft_reference.py adapter_loss " +
                                                (dir_->path() / name).string() + " " + adapter.string() + " " +
                                                tokens.string() + " 16 2>/dev/null",
                                            kSource);
    ASSERT_EQ(peft_loss.status, 0) << peft_loss.output;
    const double final_loss = want.at("final");
    EXPECT_NEAR(nlohmann::json::parse(peft_loss.output).at("loss").get<double>(), final_loss, 1e-5 * final_loss);
    const ShellResult loaded = run_shell(
        "'" + kPython.string() + "' tests/hf/loss_of.py " + merged.string() + " " + tokens.string() + " 16 2>/dev/null",
        kSource);
    ASSERT_EQ(loaded.status, 0) << loaded.output;
    const nlohmann::json result = nlohmann::json::parse(loaded.output);
    EXPECT_TRUE(result.at("missing").empty() && result.at("unexpected").empty()) << name << ": " << loaded.output;
    EXPECT_NEAR(result.at("loss").get<double>(), final_loss, 1e-5 * final_loss) << name;

    // The run's last checkpoint exports the same model, its base taken from model.init_from.
    const fs::path from_checkpoint = out / "checkpoint_merged";
    const ShellResult checkpoint_export = run_shell(
        "'" ENGINE_BINARY "' export " + run_dir + "/checkpoints " + from_checkpoint.string() + " 2>&1", kSource);
    ASSERT_EQ(checkpoint_export.status, 0) << checkpoint_export.output;
    const ShellResult checkpoint_loss =
        run_shell("'" + kPython.string() + "' tests/hf/loss_of.py " + from_checkpoint.string() + " " + tokens.string() +
                      " 16 2>/dev/null",
                  kSource);
    ASSERT_EQ(checkpoint_loss.status, 0) << checkpoint_loss.output;
    EXPECT_NEAR(nlohmann::json::parse(checkpoint_loss.output).at("loss").get<double>(), final_loss, 1e-5 * final_loss);

    // Weights with adapters loaded into a model without LoRA: refused by name, never dropped.
    const ShellResult plain =
        run_shell("'" ENGINE_BINARY "' eval tests/hf/start_from.yaml model.arch=" + arch +
                      " model.init_from=" + (dir_->path() / name).string() + " data.path=" + tokens.string() +
                      " data.val_fraction=0.5 data.sequence_length=8 --weights " + run_dir + " 2>&1",
                  kSource);
    EXPECT_EQ(plain.status, 2) << plain.output;
    EXPECT_NE(plain.output.find("(a LoRA adapter: set lora.rank to load it)"), std::string::npos) << plain.output;
  }
}

// An adapter of another rank is refused naming its adapter_config.json; so is a target module
// the model does not have, naming the key.
TEST_F(HuggingFace, AnAdapterThatDoesNotFitIsRefusedNamingTheFile) {
  const fs::path out = dir_->path() / "peft_rank";
  fs::create_directories(out);
  ASSERT_EQ(run_shell("'" + kPython.string() + "' tests/hf/peft_reference.py train " +
                          (dir_->path() / "llama_gqa_untied_fp32").string() + " " +
                          (dir_->path() / "tokens.bin").string() + " 16 " + out.string() + " q_proj 1 0.1 2>/dev/null",
                      kSource)
                .status,
            0);
  const ShellResult rank =
      train("llama_gqa_untied_fp32", "llama",
            "run.name=bad_rank lora.rank=8 lora.alpha=8 lora.target_modules=q_proj lora.init_from=" +
                (out / "adapter_start").string());
  EXPECT_EQ(rank.status, 2) << rank.output;
  EXPECT_NE(rank.output.find("adapter_config.json: r is 4 but lora.rank is 8"), std::string::npos) << rank.output;
  const ShellResult module =
      train("llama_gqa_untied_fp32", "llama", "run.name=bad_module lora.rank=4 lora.target_modules=c_attn");
  EXPECT_EQ(module.status, 2) << module.output;
  EXPECT_NE(module.output.find("lora.target_modules: 'c_attn' is no linear layer of this model's blocks"),
            std::string::npos)
      << module.output;
}

// The offline LoRA example (scripts/lora-example): a Hugging Face-format Llama made on the spot,
// fine-tuned with LoRA on recipes/examples/data/instructions.jsonl, exported both ways; the script
// fails unless transformers' merged model and PEFT's adapter give the same loss.
TEST_F(HuggingFace, TheLoraExampleRunsOfflineAndItsExportsLoad) {
  const fs::path out = dir_->path() / "lora_example";
  const ShellResult example =
      run_shell("ENGINE='" ENGINE_BINARY "' scripts/lora-example '" + out.string() + "' 2>&1", kSource);
  ASSERT_EQ(example.status, 0) << example.output;
  EXPECT_NE(example.output.find("merged model loss"), std::string::npos) << example.output;
  EXPECT_TRUE(fs::exists(out / "adapter" / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(out / "merged" / "config.json"));
}

// Export choices: the weights in another dtype (config.json's torch_dtype says which), in shards with
// save_pretrained's index, and the tokenizer files of the directory the run started from carried
// over byte for byte; transformers loads each; an export into a directory that held another
// export's weights leaves only its own.
TEST_F(HuggingFace, ExportInADtypeInShardsWithTheTokenizerFiles) {
  const fs::path start = dir_->path() / "gpt2_with_tokenizer";
  fs::copy(dir_->path() / "gpt2_tied_fp32", start, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const std::string tokenizer = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n";
  std::ofstream(start / "tokenizer.json") << tokenizer;
  std::ofstream(start / "tokenizer_config.json") << "{\"eos_token\": \"<|endoftext|>\"}\n";
  ASSERT_EQ(train("gpt2_with_tokenizer", "gpt", "run.name=with_tokenizer").status, 0);
  const fs::path run = dir_->path() / "runs" / "with_tokenizer";
  const auto export_to = [&](const fs::path& out, const std::string& options) {
    return run_shell("'" ENGINE_BINARY "' export " + run.string() + " " + out.string() + " " + options, kSource);
  };
  const auto loss_of = [&](const fs::path& exported) {
    const ShellResult loaded = run_shell("'" + kPython.string() + "' tests/hf/loss_of.py " + exported.string() + " " +
                                             (dir_->path() / "tokens.bin").string() + " 16 2>/dev/null",
                                         kSource);
    EXPECT_EQ(loaded.status, 0) << loaded.output;
    const nlohmann::json result = nlohmann::json::parse(loaded.output);
    EXPECT_TRUE(result.at("missing").empty() && result.at("unexpected").empty() && result.at("mismatched").empty())
        << exported << ": " << loaded.output;
    return result.at("loss").get<double>();
  };
  const auto config_of = [&](const fs::path& exported) {
    std::ifstream in(exported / "config.json");
    return nlohmann::json::parse(in);
  };
  const fs::path plain = dir_->path() / "export_plain", shaped = dir_->path() / "export_shaped";
  ShellResult r = export_to(plain, "");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(config_of(plain).at("torch_dtype"), "float32");
  std::ifstream copied(plain / "tokenizer.json");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(copied), {}), tokenizer);
  EXPECT_TRUE(fs::exists(plain / "tokenizer_config.json"));
  EXPECT_NE(r.output.find("tokenizer files from " + start.string()), std::string::npos) << r.output;
  const double fp32_loss = loss_of(plain);

  r = export_to(shaped, "--dtype bf16 --max-shard-size 16KiB");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(config_of(shaped).at("torch_dtype"), "bfloat16");
  EXPECT_TRUE(fs::exists(shaped / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(shaped / "model.safetensors"));
  std::ifstream index_file(shaped / "model.safetensors.index.json");
  const nlohmann::json index = nlohmann::json::parse(index_file);
  std::set<std::string> shards;
  for (const auto& [tensor, file] : index.at("weight_map").items()) shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 2u) << index.dump();
  for (const std::string& shard : shards) EXPECT_TRUE(fs::exists(shaped / shard)) << shard;
  // bf16 weights: the loss moves by their rounding, about 2^-9 relative, not more.
  EXPECT_NEAR(loss_of(shaped), fp32_loss, 1e-2 * fp32_loss);

  // Into the same directory as one fp32 file: the shards and their index are gone, the loss is fp32's.
  r = export_to(shaped, "--dtype fp32");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(shaped / "model.safetensors.index.json"));
  for (const std::string& shard : shards) EXPECT_FALSE(fs::exists(shaped / shard)) << shard;
  EXPECT_NEAR(loss_of(shaped), fp32_loss, 1e-7 * fp32_loss);
  for (const auto& entry : fs::directory_iterator(shaped))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

// Data preparation with the model's own tokenizer (scripts/prepare-tokens, the tokenizers package):
// a text file and a JSONL file become llm.c token files holding exactly the tokenizer's ids with
// end-of-text after each document, in uint16 where every id fits and in uint32 (llm.c's version 2)
// for a vocabulary past 65536; instruction and chat data carry the loss mask of what is trained; the
// engine trains on them; a bad end-of-text token, a tokenizer without a chat template or a
// directory without tokenizer.json is refused, and nothing is left behind.
TEST_F(HuggingFace, TextAndJsonlBecomeTokenFilesWithTheModelsTokenizer) {
  const fs::path dir = dir_->path() / "tokenizers";
  const std::string python = "'" + kPython.string() + "' ";
  const ShellResult made = run_shell(python + "tests/hf/make_tokenizers.py '" + dir.string() + "'", kSource);
  ASSERT_EQ(made.status, 0) << made.output;
  std::ifstream in(dir / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const auto prepare = [&](const std::string& tokenizer, const std::string& input, const std::string& out,
                           const std::string& extra = "") {
    return run_shell(python + "scripts/prepare-tokens --tokenizer '" + (dir / tokenizer).string() + "' --out '" +
                         (dir / out).string() + "' '" + (dir / input).string() + "' " + extra,
                     kSource);
  };
  const auto tokens_of = [&](const std::string& file, int version) {
    std::ifstream f(dir / file, std::ios::binary);
    std::vector<int32_t> header(256);
    f.read(reinterpret_cast<char*>(header.data()), 1024);
    EXPECT_EQ(header[0], 20240520) << file;
    EXPECT_EQ(header[1], version) << file;
    std::vector<int64_t> ids(static_cast<size_t>(header[2]));
    for (int64_t& id : ids) {
      uint32_t v = 0;
      f.read(reinterpret_cast<char*>(&v), version == 1 ? 2 : 4);
      id = v;
    }
    EXPECT_EQ(f.peek(), EOF) << file << ": bytes past the header's count";
    return ids;
  };
  for (const auto& [input, tokenizer, out, key, version] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string, int>>{
           {"corpus.txt", "bpe", "corpus.bin", "corpus", 1},
           {"docs.jsonl", "bpe", "docs.bin", "jsonl", 1},
           {"wide.txt", "wide", "wide.bin", "wide", 2}}) {
    const ShellResult prepared = prepare(tokenizer, input, out);
    ASSERT_EQ(prepared.status, 0) << prepared.output;
    EXPECT_EQ(tokens_of(out, version), expected.at(key).get<std::vector<int64_t>>()) << input;
  }
  // Instruction data: the prompt's tokens are in the file and out of the loss mask.
  const ShellResult chat =
      prepare("bpe", "chat.jsonl", "chat.bin",
              "--prompt-field prompt --response-field response --mask-out '" + (dir / "chat.mask").string() + "'");
  ASSERT_EQ(chat.status, 0) << chat.output;
  EXPECT_EQ(tokens_of("chat.bin", 1), expected.at("chat").get<std::vector<int64_t>>());
  const auto mask_of = [&](const std::string& file) {  // one byte per token
    const std::string bytes = read_whole_file(dir / file).value_or("");
    return std::vector<int64_t>(bytes.begin(), bytes.end());
  };
  EXPECT_EQ(mask_of("chat.mask"), expected.at("chat_mask").get<std::vector<int64_t>>());
  // Conversations: the chat template's rendering, as transformers' apply_chat_template encodes it,
  // with only the assistant's turns in the loss mask.
  const ShellResult conversation =
      prepare("bpe", "conversations.jsonl", "conversations.bin",
              "--messages-field messages --mask-out '" + (dir / "conversations.mask").string() + "'");
  ASSERT_EQ(conversation.status, 0) << conversation.output;
  EXPECT_EQ(tokens_of("conversations.bin", 1), expected.at("conversations").get<std::vector<int64_t>>());
  EXPECT_EQ(mask_of("conversations.mask"), expected.at("conversations_mask").get<std::vector<int64_t>>());
  const ShellResult no_template = prepare("wide", "conversations.jsonl", "never.bin", "--messages-field messages");
  EXPECT_NE(no_template.output.find("no chat_template string"), std::string::npos) << no_template.output;
  for (const auto& [file, vocab] : {std::pair{"corpus.bin", 400}, std::pair{"wide.bin", 70001}}) {
    const ShellResult run = run_shell(
        "'" ENGINE_BINARY
        "' train recipes/quickstart.yaml run.device=cpu train.steps=2 train.eval_every=0 "
        "model.context_length=16 model.n_embd=16 model.n_layer=1 model.n_head=2 data.source=tokens ~data.order "
        "data.path=" +
            (dir / file).string() + " model.vocab_size=" + std::to_string(vocab) +
            " run.output_dir=" + (dir / "runs").string() + " run.name=" + file,
        kSource);
    EXPECT_EQ(run.status, 0) << run.output;
  }
  const ShellResult bad_eos = prepare("bpe", "corpus.txt", "never.bin", "--eos '<|nope|>'");
  EXPECT_NE(bad_eos.status, 0);
  EXPECT_NE(bad_eos.output.find("--eos '<|nope|>' is not in the tokenizer's vocabulary"), std::string::npos)
      << bad_eos.output;
  const ShellResult no_tokenizer = prepare(".", "corpus.txt", "never.bin");
  EXPECT_NE(no_tokenizer.output.find("tokenizer.json: not found"), std::string::npos) << no_tokenizer.output;
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".prepare-tokens."), std::string::npos) << entry.path();
  EXPECT_FALSE(fs::exists(dir / "never.bin"));
}

// The engine's own byte-level BPE (data/tokenizer.h, for engine generate) against the tokenizers
// library: the same ids for GPT-2's shape and Llama 3's (its Split regex, ignore_merges) on text
// with non-ASCII letters, emoji, numbers, contractions, whitespace runs and added tokens; decoding
// gives the text back. Then `engine generate --tokenizer` continues a prompt of a model trained
// on that tokenizer's ids, and refuses token data without a tokenizer.
TEST_F(HuggingFace, TheEnginesTokenizerGivesTheLibrarysIdsAndGenerateSpeaksText) {
  const fs::path dir = dir_->path() / "engine-tokenizers";
  const ShellResult made =
      run_shell("'" + kPython.string() + "' tests/hf/make_tokenizers.py '" + dir.string() + "'", kSource);
  ASSERT_EQ(made.status, 0) << made.output;
  std::ifstream in(dir / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  const auto texts = expected.at("round_trip_texts").get<std::vector<std::string>>();
  for (const char* shape : {"bpe", "split"}) {
    const Tokenizer tokenizer = Tokenizer::load(dir / shape / "tokenizer.json");
    const auto ids = expected.at(std::string("round_trip_") + shape).get<std::vector<std::vector<int32_t>>>();
    for (size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(tokenizer.encode(texts[i]), ids[i]) << shape << ": " << texts[i];
      EXPECT_EQ(tokenizer.decode(ids[i]), texts[i]) << shape;
    }
  }
  // A Unicode normalizer (Qwen's NFC; NFKC): the library's ids, and its decoding of them (the text
  // in its normal form).
  for (const char* form : {"nfc", "nfkc"}) {
    const Tokenizer tokenizer = Tokenizer::load(dir / form / "tokenizer.json");
    const nlohmann::json& want = expected.at("normalized").at(form);
    const auto ids = want.at("ids").get<std::vector<std::vector<int32_t>>>();
    const auto decoded = want.at("decoded").get<std::vector<std::string>>();
    for (size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(tokenizer.encode(texts[i]), ids[i]) << form << ": " << texts[i];
      EXPECT_EQ(tokenizer.decode(ids[i]), decoded[i]) << form << ": " << texts[i];
    }
  }
  // SentencePiece's shape (Llama 2's normalizers, or Metaspace): the same ids and decoded text, with
  // byte fallback for the letters and emoji the vocabulary lacks, and <s> from the post-processor.
  const nlohmann::json& sp = expected.at("sentencepiece");
  const auto sp_texts = expected.at("sp_texts").get<std::vector<std::string>>();
  for (const char* shape : {"sp", "metaspace"}) {
    const Tokenizer tokenizer = Tokenizer::load(dir / shape / "tokenizer.json");
    const auto ids = sp.at(shape).get<std::vector<std::vector<int32_t>>>();
    const auto special = sp.at(std::string(shape) + "_special").get<std::vector<std::vector<int32_t>>>();
    const auto decoded = sp.at(std::string(shape) + "_decoded").get<std::vector<std::string>>();
    for (size_t i = 0; i < sp_texts.size(); ++i) {
      EXPECT_EQ(tokenizer.encode(sp_texts[i]), ids[i]) << shape << ": " << sp_texts[i];
      EXPECT_EQ(tokenizer.encode(sp_texts[i], true), special[i]) << shape << ": " << sp_texts[i];
      EXPECT_EQ(tokenizer.decode(ids[i]), decoded[i]) << shape << ": " << sp_texts[i];
    }
  }
  // The post-processor's special tokens (Llama 3's <|begin_of_text|>), as encode() adds them.
  const Tokenizer split = Tokenizer::load(dir / "split" / "tokenizer.json");
  const auto special = expected.at("round_trip_split_special").get<std::vector<std::vector<int32_t>>>();
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(split.encode(texts[i], true), special[i]) << texts[i];
  // Decoding half a character gives U+FFFD, as the library does; text that is not UTF-8 is refused.
  const Tokenizer bpe = Tokenizer::load(dir / "bpe" / "tokenizer.json");
  EXPECT_EQ(bpe.decode({expected.at("half_character_id").get<int32_t>()}),
            expected.at("half_character_decoded").get<std::string>());
  try {
    bpe.encode("caf\xc3 au lait");
    ADD_FAILURE() << "text that is not UTF-8 was encoded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not UTF-8 at byte 3"), std::string::npos) << e.what();
  }
  try {  // word-level: refused by name
    Tokenizer::load(dir / "wide" / "tokenizer.json");
    ADD_FAILURE() << "a WordLevel tokenizer loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model type WordLevel"), std::string::npos) << e.what();
  }

  // The corpus prepared with a tokenizer, a small model trained on its ids, and greedy sampling
  // after "The quick" with that tokenizer: what generate prints.
  auto train_and_generate = [&](const std::string& shape, int steps, int vocab) {
    const fs::path bin = dir / (shape + "-corpus.bin");
    const ShellResult prepared =
        run_shell("'" + kPython.string() + "' scripts/prepare-tokens --tokenizer '" + (dir / shape).string() +
                      "' --out '" + bin.string() + "' '" + (dir / "corpus.txt").string() + "'",
                  kSource);
    EXPECT_EQ(prepared.status, 0) << prepared.output;
    const ShellResult trained = run_shell(
        "'" ENGINE_BINARY "' train recipes/quickstart.yaml run.device=cpu train.steps=" + std::to_string(steps) +
            " train.eval_every=0 model.context_length=32 model.n_embd=32 model.n_layer=1 model.n_head=2 "
            "model.vocab_size=" +
            std::to_string(vocab) + " data.source=tokens ~data.order data.path=" + bin.string() +
            " run.output_dir=" + dir.string() + " run.name=" + shape + "-run",
        kSource);
    EXPECT_EQ(trained.status, 0) << trained.output;
    const ShellResult text =
        run_shell("'" ENGINE_BINARY "' generate '" + (dir / (shape + "-run")).string() +
                      "' --prompt 'The quick' --tokens 6 --temperature 0 --tokenizer '" + (dir / shape).string() + "'",
                  kSource);
    EXPECT_EQ(text.status, 0) << text.output;
    return text.output;
  };
  const std::string text = train_and_generate("bpe", 30, 400);
  EXPECT_EQ(text.rfind("The quick", 0), 0u) << text;
  EXPECT_GT(text.size(), std::string("The quick\n").size()) << text;
  // A SentencePiece tokenizer's model: the prompt and its continuation decoded together, so the
  // space before the continuation's first word stays (decoded alone, Llama 2's Strip drops it).
  const std::string sp_text = train_and_generate("sp", 60, 600);
  EXPECT_EQ(sp_text.rfind("The quick b", 0), 0u) << sp_text;
  const std::string generate = "'" ENGINE_BINARY "' generate '" + (dir / "bpe-run").string() + "' ";
  const ShellResult no_tokenizer = run_shell(generate + "--prompt 'The quick'", kSource);
  EXPECT_NE(no_tokenizer.status, 0);
  EXPECT_NE(no_tokenizer.output.find("trained on token ids: name their tokenizer with --tokenizer"), std::string::npos)
      << no_tokenizer.output;
}

}  // namespace
}  // namespace engine::testing
