// engine export, engine generate and engine eval: using a finished run's weights, or a checkpoint's
// (eval: any weights the recipe's model can load).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/adapters.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_state.h"
#include "checkpoint/weights.h"
#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/format.h"
#include "core/rng.h"
#include "core/whole_file.h"
#include "data/tokenizer.h"
#include "graph/autodiff.h"
#include "graph/precision.h"
#include "models/model.h"
#include "plan/plan.h"
#include "runtime/executor.h"
#include "trainer/session.h"

namespace engine::cli {

namespace fs = std::filesystem;
using namespace engine::recipe;

namespace {

fs::path weights_of(const fs::path& run_dir) {
  fs::path weights = run_dir / "model.safetensors";
  if (!fs::exists(weights))
    throw UserError(run_dir.string() + ": not a finished run (no model.safetensors); train it with `engine train`");
  return weights;
}

}  // namespace

namespace {

// A checkpoint's fp32 master weights under Hugging Face names. The model graph comes from the
// recipe stored in its manifest (only its model section matters, so no data file needs to exist);
// each parameter's pieces are gathered from whichever rank files hold them, at any world size and
// ZeRO stage the checkpoint was written with, and every file read is checked against its checksum.
Recipe recipe_of_checkpoint(const fs::path& checkpoint, const Manifest& manifest) {
  MemorySourceReader reader;
  const fs::path recipe_path = checkpoint / (std::string(kManifestName) + "#recipe");
  reader.add(recipe_path, manifest.recipe);
  LoadOptions options;
  options.reader = &reader;
  options.check_files = false;
  options.world = {manifest.world_size, "the checkpoint's world size"};
  return load_recipe(recipe_path, options).recipe;
}

// Weights to export: Hugging Face's tensors (fp32) and the file's metadata.
struct ExportedWeights {
  std::vector<SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string what;  // "step 100 of <checkpoint>", or the run's weights file
};

// `with_base`: a LoRA checkpoint's frozen base too (from where the run started, checked against the
// digest the checkpoint recorded); without it, only the adapters are meaningful.
ExportedWeights weights_of_checkpoint(const fs::path& checkpoint, bool with_base) {
  const Manifest manifest = read_manifest(checkpoint);
  const Recipe r = recipe_of_checkpoint(checkpoint, manifest);
  ModelGraph model = build_model(r, 1, 1.0);
  const bool lora = !model.graph.frozen().empty();
  // The frozen base is held in the run's compute type, as training held it.
  if (lora) apply_precision(model.graph, compute_dtype(r), DType::f32);
  // One rank at stage 0 holds every parameter whole; the masters are all it needs.
  ParameterStore store(model.graph);
  if (lora && with_base) {
    store.initialize(uint64_t(r.run.seed));
    if (!r.model.init_from.empty()) load_weights(r.model.init_from, store, r.model.arch);
    // The whole base's digest, as the run took it before training (whatever its layout); a
    // checkpoint from before it names its one rank's buffer after any fp16 -> bf16 fall-back.
    const nlohmann::json base = manifest.state.value("frozen_weights", nlohmann::json::object());
    const std::string digest = ParameterStore::hash_text(store.frozen_hash({}, nullptr));
    const std::string saved = manifest.state.value("compute_dtype", std::string());
    if (saved == "bf16" && model.graph.param_dtype() == DType::f16) store.retype(DType::f16, DType::bf16);
    if (base.contains("digest") ? base.value("digest", "") != digest : base.value("xxh3", "") != store.frozen_digest())
      throw UserError(checkpoint.string() +
                      ": its adapters were trained over other base weights than model.init_from " +
                      (r.model.init_from.empty() ? std::string("(none: the seed's)") : r.model.init_from.string()) +
                      " holds now; export the adapter alone (--adapter), or restore the base the run started from");
  }
  StateKind master{"master", {}};
  for (size_t u = 0; u < model.graph.units().size(); ++u) master.units.push_back(store.master(u));
  load_sharded_state(checkpoint, manifest, store, {master});
  const std::string arch = r.model.arch == Arch::gpt ? "gpt" : r.model.arch == Arch::llama ? "llama" : "mlp";
  std::map<std::string, std::string> metadata{{"arch", arch}, {"steps", std::to_string(manifest.step)}};
  if (lora) metadata.merge(lora_metadata(r));
  return {hugging_face_tensors(model.graph, r.model.arch, store_weights(store)), metadata,
          "step " + std::to_string(manifest.step) + " of " + checkpoint.string()};
}

ExportedWeights weights_of_run(const fs::path& run_dir) {
  // Read (which validates every tensor) before anything is written: a bad or truncated run file is
  // refused rather than copied.
  const fs::path path = weights_of(run_dir);
  SafetensorsFile weights = read_safetensors(path);
  ExportedWeights out{{}, std::move(weights.metadata), path.string()};
  for (auto& [name, tensor] : weights.tensors) out.tensors.push_back(std::move(tensor));
  return out;
}

// Each fp32 tensor rounded to `type` (to nearest even).
void convert_tensors(std::vector<SafeTensor>& tensors, DType type) {
  if (type == DType::f32) return;
  for (SafeTensor& t : tensors) {
    if (t.dtype != DType::f32) continue;
    const int64_t n = int64_t(t.data.size() / sizeof(float));
    std::vector<std::byte> narrowed(size_t(n) * dtype_size(type));
    narrow(reinterpret_cast<const float*>(t.data.data()), narrowed.data(), type, n);
    t.data = std::move(narrowed);
    t.dtype = type;
  }
}

// A PEFT adapter directory: adapter_model.safetensors and adapter_config.json.
void write_peft_adapter(const fs::path& directory, const ExportedWeights& weights, const LoraSettings& lora,
                        DType type) {
  std::vector<SafeTensor> tensors = peft_adapter_tensors(weights.tensors, lora);
  convert_tensors(tensors, type);
  write_safetensors(directory / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  write_file_atomically(directory / "adapter_config.json",
                        [&](std::ostream& out) { out << peft_adapter_config(lora); });
  std::cout << "exported the LoRA adapter of " << weights.what << " to " << directory.string() << ": "
            << tensors.size() / 2 << " adapters of rank " << lora.rank << ", " << dtype_name(type)
            << "; peft's PeftModel.from_pretrained loads it over the base model\n";
}

constexpr const char* kShardIndex = "model.safetensors.index.json";

// The files of an earlier export into `directory` that this one does not write: shards and their
// index, or a single file (from_pretrained would read the index, or the file, first).
void remove_stale_weights(const fs::path& directory, const std::vector<std::string>& written) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const bool weights = name == "model.safetensors" || name == kShardIndex ||
                         (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                          entry.path().extension() == ".safetensors");
    if (weights && std::find(written.begin(), written.end(), name) == written.end()) fs::remove(entry.path(), error);
  }
}

// The tokenizer's files a Hugging Face model directory carries, copied from where the run started.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
    "merges.txt",     "tokenizer.model",       "added_tokens.json",       "generation_config.json"};

// A model directory from_pretrained loads as it is: the weights in `type`, in one model.safetensors
// or, above `shard_bytes`, in shards listed by model.safetensors.index.json (as save_pretrained
// writes them); the run's config.json; the tokenizer's files of the directory the run started from.
void write_model_directory(const fs::path& directory, const Recipe& r, ExportedWeights weights, DType type,
                           int64_t shard_bytes) {
  convert_tensors(weights.tensors, type);
  weights.metadata["format"] = "pt";
  std::vector<std::vector<SafeTensor>> shards(1);
  int64_t total = 0, in_shard = 0;
  for (SafeTensor& t : weights.tensors) {
    const auto bytes = int64_t(t.data.size());
    if (in_shard > 0 && in_shard + bytes > shard_bytes) shards.emplace_back(), in_shard = 0;
    in_shard += bytes;
    total += bytes;
    shards.back().push_back(std::move(t));
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    written.push_back("model.safetensors");
    write_safetensors(directory / written.back(), shards[0], weights.metadata);
  } else {
    nlohmann::json map = nlohmann::json::object();
    char name[64];
    for (size_t i = 0; i < shards.size(); ++i) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      written.push_back(name);
      write_safetensors(directory / name, shards[i], weights.metadata);
      for (const SafeTensor& t : shards[i]) map[t.name] = name;
    }
    written.push_back(kShardIndex);
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    write_file_atomically(directory / kShardIndex, [&](std::ostream& out) { out << index.dump(2) << "\n"; });
  }
  remove_stale_weights(directory, written);
  write_file_atomically(directory / "config.json",
                        [&](std::ostream& out) { out << hugging_face_config(r.model, type); });
  int carried = 0;
  const fs::path start = r.model.init_from;
  if (!start.empty() && fs::is_directory(start))
    for (const char* file : kTokenizerFiles)
      if (fs::is_regular_file(start / file)) {
        const std::optional<std::string> bytes = read_whole_file(start / file);
        if (!bytes) throw UserError((start / file).string() + ": cannot read");
        write_file_atomically(directory / file, [&](std::ostream& out) { out << *bytes; });
        ++carried;
      }
  std::cout << "exported " << weights.what << " to " << directory.string() << ": " << dtype_name(type) << ", "
            << format_bytes(total) << (shards.size() > 1 ? " in " + std::to_string(shards.size()) + " shards" : "")
            << ", config.json (" << (r.model.arch == Arch::gpt ? "gpt2" : "llama") << ")"
            << (carried ? ", " + std::to_string(carried) + " tokenizer files from " + start.string() : "")
            << "; transformers' from_pretrained loads it\n";
}

}  // namespace

int export_weights(const ExportArgs& args) {
  const fs::path& source = args.source;
  const fs::path& destination = args.destination;
  const bool directory = destination.extension() != ".safetensors";
  fs::path checkpoint;
  if (fs::exists(source / kManifestName)) {
    checkpoint = source;
  } else if (!fs::exists(source / "model.safetensors") && fs::is_directory(source)) {
    // A directory of checkpoints, or a run without final weights (preempted): its latest checkpoint.
    const std::vector<fs::path> found = committed_checkpoints(checkpoints_in(source));
    if (found.empty())
      throw UserError(source.string() + ": neither a finished run (no model.safetensors), a checkpoint (no " +
                      kManifestName + ") nor a directory of complete checkpoints");
    checkpoint = found.back();
  }
  // The recipe first, so that a model no config.json can describe is refused before anything is
  // written (and the export's default type is the run's).
  Recipe recipe;
  if (!checkpoint.empty()) {
    recipe = recipe_of_checkpoint(checkpoint, read_manifest(checkpoint));
  } else {
    LoadOptions options;
    options.check_files = false;
    options.world = {1, "export"};
    recipe = load_recipe(source / "recipe.yaml", options).recipe;
  }
  DType type = directory ? compute_dtype(recipe) : DType::f32;
  if (!args.dtype.empty()) {
    const std::optional<DType> named = parse_dtype(args.dtype == "fp32"   ? "f32"
                                                   : args.dtype == "fp16" ? "f16"
                                                                          : args.dtype);
    if (!named || !is_floating(*named))
      throw UserError("--dtype " + args.dtype + ": the weights are exported in fp32, bf16 or fp16");
    type = *named;
  }
  if (directory) {
    hugging_face_config(recipe.model, type);
    std::error_code error;
    fs::create_directories(destination, error);
    if (error) throw UserError(destination.string() + ": cannot create the directory: " + error.message());
  }
  ExportedWeights weights =
      checkpoint.empty() ? weights_of_run(source) : weights_of_checkpoint(checkpoint, !args.adapter);
  const LoraSettings lora = lora_settings(weights.metadata);
  if (args.adapter) {
    if (lora.rank == 0)
      throw UserError(source.string() + ": --adapter exports a LoRA run's adapter; this run has none");
    if (!directory) throw UserError(destination.string() + ": --adapter writes a directory (a PEFT adapter)");
    write_peft_adapter(destination, weights, lora, type);
    return kExitOk;
  }
  if (lora.rank > 0) {  // the merged model: a plain Hugging Face model
    merge_adapters(weights.tensors, lora);
    for (const char* key : {"lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules"})
      weights.metadata.erase(key);
    weights.what += " (LoRA adapters merged)";
  }
  if (directory) {
    write_model_directory(destination, recipe, std::move(weights), type, args.max_shard_bytes);
  } else {
    convert_tensors(weights.tensors, type);
    weights.metadata["format"] = "pt";
    write_safetensors(destination, weights.tensors, weights.metadata);
    std::cout << "exported " << weights.what << " to " << destination.string() << " (" << dtype_name(type) << ")\n";
  }
  return kExitOk;
}

int generate(const GenerateArgs& args) {
  require_single_process(world_size_from_environment(), "generate");
  // The run's recipe, without requiring its data files: generation reads only the weights.
  LoadOptions options;
  options.check_files = false;
  LoadedRecipe loaded = load_recipe(args.run_dir / "recipe.yaml", options);
  const Recipe& r = loaded.recipe;
  // Text data is bytes; token data needs its tokenizer: --tokenizer, else that of the Hugging Face
  // directory the run started from.
  fs::path tokenizer_path = args.tokenizer;
  const fs::path model_directory = r.model.init_from;
  if (tokenizer_path.empty() && r.data.source != DataSource::text && !model_directory.empty() &&
      fs::is_regular_file(model_directory / "tokenizer.json"))
    tokenizer_path = model_directory;
  if (fs::is_directory(tokenizer_path)) tokenizer_path /= "tokenizer.json";
  std::optional<Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    tokenizer = Tokenizer::load(tokenizer_path);
    if (tokenizer->id_limit() > r.model.vocab_size)
      throw UserError(tokenizer_path.string() + " has ids up to " + std::to_string(tokenizer->id_limit() - 1) +
                      ", past the model's vocab_size " + std::to_string(r.model.vocab_size) +
                      ": it is not this model's tokenizer");
  } else if (r.data.source != DataSource::text) {
    throw UserError("engine generate: " + args.run_dir.string() +
                    " was trained on token ids: name their tokenizer with --tokenizer DIR (a directory with "
                    "tokenizer.json, as a Hugging Face model has)");
  }
  const int64_t context = r.model.context_length;
  ModelGraph model = build_model(r, 1, 1.0);
  // Everything up to the logits; the loss would overwrite them with their gradient.
  std::vector<size_t> nodes = forward_nodes(model.graph);
  nodes.pop_back();
  ParameterStore store(model.graph);
  load_weights(weights_of(args.run_dir), store, r.model.arch);
  Executor exec(model.graph, store, uint64_t(args.seed));
  Plan plan = plan_step(model.graph, nodes, {model.logits});
  plan.training = false;
  exec.add_plan("generate", std::move(plan));

  std::vector<int32_t> tokens;
  if (tokenizer) {
    tokens = tokenizer->encode(args.prompt, true);  // with the special tokens the model was trained to see first
    if (tokens.empty()) throw UserError("engine generate: give a --prompt to continue (it encodes to no tokens)");
  } else {
    for (unsigned char byte : args.prompt) tokens.push_back(byte);
    if (tokens.empty()) tokens.push_back('\n');
  }
  const size_t prompt_length = tokens.size();
  RandomStream stream(uint64_t(args.seed), RandomPurpose::sampling);
  const int64_t vocab = r.model.vocab_size;
  const int64_t sequence = model.sequence;
  std::string output;
  // A run trained on packed documents learned to end one with data.document_end: generation stops
  // there, the end token not printed (as Hugging Face's generate stops at eos).
  const std::optional<int64_t> document_end = r.data.document_end;
  for (int64_t n = 0; n < args.tokens; ++n) {
    // The last `sequence` tokens, left-aligned; causal attention makes the padding irrelevant.
    int64_t start = std::max<int64_t>(0, int64_t(tokens.size()) - sequence);
    int64_t length = int64_t(tokens.size()) - start;
    if (model.positions != kNoValue) {  // one document: positions 0 .. T-1
      auto* positions = static_cast<int32_t*>(exec.input(model.positions));
      for (int64_t t = 0; t < sequence; ++t) positions[t] = int32_t(t);
    }
    auto* input = static_cast<int32_t*>(exec.input(model.inputs));
    std::fill_n(input, sequence, 0);
    std::copy(tokens.begin() + start, tokens.end(), input);
    exec.run("generate", 0, 0);
    const float* logits = exec.value_f32("generate", model.logits) + (length - 1) * vocab;
    std::vector<std::pair<float, int32_t>> candidates;
    const int64_t sampled = tokenizer ? tokenizer->id_limit() : std::min<int64_t>(vocab, 256);
    for (int64_t v = 0; v < sampled; ++v) candidates.emplace_back(logits[v], int32_t(v));
    // Only the top k need ordering (a tokenizer's vocabulary is up to 128k ids); (logit, id) pairs
    // are all distinct, so the order is the full sort's.
    if (args.top_k > 0 && size_t(args.top_k) < candidates.size()) {
      std::partial_sort(candidates.begin(), candidates.begin() + args.top_k, candidates.end(), std::greater<>());
      candidates.resize(size_t(args.top_k));
    } else {
      std::sort(candidates.begin(), candidates.end(), std::greater<>());
    }
    int32_t next = candidates.front().second;
    if (args.temperature > 0) {
      double total = 0;
      std::vector<double> weights;
      for (const auto& [logit, token] : candidates) {
        weights.push_back(std::exp((logit - candidates.front().first) / args.temperature));
        total += weights.back();
      }
      double u = stream.uniform() * total;
      for (size_t i = 0; i < weights.size(); ++i) {
        next = candidates[i].second;
        if ((u -= weights[i]) <= 0) break;
      }
    }
    if (document_end && next == *document_end) break;
    tokens.push_back(next);
  }
  (void)context;
  if (tokenizer) {
    // The prompt's ids and the continuation decoded together: a SentencePiece tokenizer's decoder
    // drops the space its encoding put first, which a continuation decoded alone would lose.
    // The post-processor's special tokens around the prompt are the model's context, not its text.
    std::vector<int32_t> text(tokens.begin() + std::ptrdiff_t(tokenizer->special_prefix().size()),
                              tokens.begin() + std::ptrdiff_t(prompt_length - tokenizer->special_suffix().size()));
    text.insert(text.end(), tokens.begin() + std::ptrdiff_t(prompt_length), tokens.end());
    output = tokenizer->decode(text);
  } else {
    output = args.prompt;
    for (auto it = tokens.begin() + std::ptrdiff_t(prompt_length); it != tokens.end(); ++it)
      output.push_back(char(*it));
  }
  std::cout << output << "\n";
  return kExitOk;
}

int evaluate(const EvalArgs& args) {
  require_single_process(args.recipe.load_options().world, "eval");
  LoadedRecipe loaded = load_recipe(args.recipe.recipe, args.recipe.load_options());
  Recipe r = loaded.recipe;
  if (r.data.val_fraction <= 0)
    throw UserError(
        "engine eval reads the validation split, and data.val_fraction is 0: set it (for example "
        "data.val_fraction=0.05)");
  // The data checks the validation split as for a run that evaluates.
  r.train.eval_every = std::max<int64_t>(r.train.eval_every, 1);
  fs::path weights = args.weights.empty() ? r.model.init_from : args.weights;
  if (weights.empty())
    throw UserError(
        "engine eval needs weights: name them with --weights (a run directory, a safetensors file "
        "or a Hugging Face model directory) or set model.init_from");
  if (fs::is_directory(weights) && fs::exists(weights / "model.safetensors") && fs::exists(weights / "recipe.yaml"))
    weights = weights_of(weights);  // a run directory: its final weights
  const int64_t batches = args.batches > 0 ? args.batches : r.train.eval_batches;
  Session session(r);
  session.initialize(uint64_t(r.run.seed));
  // A LoRA recipe's adapters: from the weights when they hold them (a LoRA run's), else lora.init_from.
  if (!load_weights(weights, session.store, r.model.arch) && r.lora.rank > 0 && !r.lora.init_from.empty())
    load_adapters(r.lora.init_from, session.store, r);
  session.host_changed();
  const double loss = session.evaluate(batches);
  std::cout << "eval: loss " << format_fixed(loss, 6) << " (perplexity " << format_fixed(std::exp(loss), 3) << ") over "
            << batches << " validation batches of " << session.micro_batch << " x " << session.model.sequence
            << " from " << weights.string() << "\n";
  return kExitOk;
}

}  // namespace engine::cli
