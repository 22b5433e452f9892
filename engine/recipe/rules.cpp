#include "recipe/rules.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <type_traits>

#include "recipe/lora_targets.h"
#include "recipe/schema.h"

namespace engine::recipe {

namespace {

struct RuleContext {
  LoadedRecipe& loaded;
  DiagnosticSink& sink;
  Recipe& r;

  // The mark of the first of `keys` the user wrote, else the start of the recipe.
  Mark where(std::initializer_list<const char*> keys) const {
    for (const char* key : keys) {
      auto it = loaded.marks.find(key);
      if (it != loaded.marks.end()) return it->second;
    }
    return loaded.document;
  }
  // The first of `keys` the user wrote (where to report), else the first one.
  std::string blame(std::initializer_list<const char*> keys) const {
    for (const char* key : keys)
      if (loaded.given(key)) return key;
    return *keys.begin();
  }
  void error(std::initializer_list<const char*> keys, std::string message, std::vector<std::string> notes = {}) {
    sink.error(where(keys), blame(keys), std::move(message), std::move(notes));
  }
  void note(std::string text) { loaded.notes.push_back(std::move(text)); }
};

bool is_transformer(const Recipe& r) { return r.model.arch == Arch::gpt || r.model.arch == Arch::llama; }
bool is_token_source(const Recipe& r) { return r.data.source != DataSource::classification; }
std::string str(int64_t v) { return std::to_string(v); }

void resolve_run_name(RuleContext& c) {
  if (c.r.run.name.empty()) c.r.run.name = c.loaded.path.stem().string();
}

std::ostream& operator<<(std::ostream& out, RopeScalingType type) {
  return out << (type == RopeScalingType::linear ? "linear" : type == RopeScalingType::llama3 ? "llama3" : "none");
}

// config.json's rope_scaling (rope_type, or the older type): linear and llama3 fill the model's
// rope_* keys; none, or rope_type default, leaves the recipe's (a run may stretch a model's context
// itself); any other type is refused.
template <class Adopt, class Refuse>
void adopt_rope_scaling(const nlohmann::json& scaling, ModelSection& m, Adopt& adopt, Refuse& refuse) {
  if (scaling.is_null()) return;
  const std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  if (type == "default") return;
  if (type != "linear" && type != "llama3") return refuse("rope_scaling of rope_type " + type);
  adopt("rope_scaling", "rope_scaling.rope_type", m.rope_scaling,
        type == "linear" ? RopeScalingType::linear : RopeScalingType::llama3);
  adopt("rope_factor", "rope_scaling.factor", m.rope_factor, scaling.at("factor").get<double>());
  if (type != "llama3") return;
  adopt("rope_low_freq_factor", "rope_scaling.low_freq_factor", m.rope_low_freq_factor,
        scaling.at("low_freq_factor").get<double>());
  adopt("rope_high_freq_factor", "rope_scaling.high_freq_factor", m.rope_high_freq_factor,
        scaling.at("high_freq_factor").get<double>());
  adopt("rope_original_context_length", "rope_scaling.original_max_position_embeddings", m.rope_original_context_length,
        scaling.at("original_max_position_embeddings").get<int64_t>());
}

// A Hugging Face model directory as model.init_from: its config.json's sizes fill the model
// section (GPT-2, and the Llama family: Llama, Mistral, Qwen2), a size the recipe gives that
// contradicts it is an error naming both, and a configuration the engine's model cannot express is
// refused.
void adopt_pretrained_config(RuleContext& c) {
  namespace fs = std::filesystem;
  ModelSection& m = c.r.model;
  if (m.init_from.empty() || !fs::is_directory(m.init_from)) return;
  const fs::path file = m.init_from / "config.json";
  if (!fs::exists(file)) return;
  nlohmann::json j;
  try {
    std::ifstream in(file);
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    c.error({"model.init_from"}, file.string() + " is not JSON: " + e.what());
    return;
  }
  const std::string type = j.value("model_type", "");
  // Mistral and Qwen2 are Llama's architecture (Qwen2 with biases on q, k and v); without a sliding
  // window their attention is Llama's too.
  const bool llama_like = type == "llama" || type == "mistral" || type == "qwen2";
  const std::optional<Arch> arch = type == "gpt2" ? std::optional(Arch::gpt)
                                   : llama_like   ? std::optional(Arch::llama)
                                                  : std::nullopt;
  if (!arch) {
    c.error({"model.init_from"},
            file.string() + ": model_type '" + type +
                "' is not an architecture this engine trains (gpt2, llama, mistral and qwen2 are)");
    return;
  }
  if (m.arch != *arch) {
    c.error({"model.arch", "model.init_from"},
            "model.arch " + std::string(*arch == Arch::gpt ? "llama" : "gpt") + " but " + file.string() +
                " describes model_type " + type,
            {"set model.arch: " + std::string(*arch == Arch::gpt ? "gpt" : "llama")});
    return;
  }
  bool refused = false;
  const auto refuse = [&](const std::string& why) {
    c.error({"model.init_from"}, file.string() + ": " + why + ", which this engine's " + type + " does not have");
    refused = true;
  };
  // Each size from its config.json field; one the recipe gives must agree.
  const auto adopt = [&](const char* key, const char* field, auto& target, auto value) {
    using T = std::decay_t<decltype(value)>;
    const std::string full = std::string("model.") + key;
    T current{};
    bool set = true;  // an optional key written as auto is not a contradiction
    if constexpr (std::is_same_v<std::decay_t<decltype(target)>, std::optional<T>>) {
      set = target.has_value();
      current = target.value_or(T{});
    } else {
      current = target;
    }
    if (c.loaded.given(full) && set && current != value) {
      std::ostringstream text;
      text << std::boolalpha;
      text << full << " is " << current << " but " << file.string() << " says " << field << " = " << value;
      c.error({full.c_str()}, text.str(), {"leave " + full + " out to take the checkpoint's, or fix the recipe"});
      refused = true;
      return;
    }
    target = value;
  };
  try {
    if (*arch == Arch::gpt) {
      const int64_t width = j.at("n_embd").get<int64_t>();
      adopt("vocab_size", "vocab_size", m.vocab_size, j.at("vocab_size").get<int64_t>());
      adopt("context_length", "n_positions", m.context_length, j.at("n_positions").get<int64_t>());
      adopt("n_layer", "n_layer", m.n_layer, j.at("n_layer").get<int64_t>());
      adopt("n_head", "n_head", m.n_head, j.at("n_head").get<int64_t>());
      adopt("n_embd", "n_embd", m.n_embd, width);
      const nlohmann::json inner = j.value("n_inner", nlohmann::json());
      adopt("ffn_dim", "n_inner", m.ffn_dim, inner.is_null() ? 4 * width : inner.get<int64_t>());
      adopt("norm_eps", "layer_norm_epsilon", m.norm_eps, j.value("layer_norm_epsilon", 1e-5));
      adopt("tie_embeddings", "tie_word_embeddings", m.tie_embeddings, j.value("tie_word_embeddings", true));
      adopt("bias", "(GPT-2's biases)", m.bias, true);
      const std::string act = j.value("activation_function", "gelu_new");
      if (act != "gelu_new" && act != "gelu_pytorch_tanh") refuse("activation_function " + act);
    } else {
      const int64_t heads = j.at("num_attention_heads").get<int64_t>(), width = j.at("hidden_size").get<int64_t>();
      adopt("vocab_size", "vocab_size", m.vocab_size, j.at("vocab_size").get<int64_t>());
      adopt("context_length", "max_position_embeddings", m.context_length,
            j.at("max_position_embeddings").get<int64_t>());
      adopt("n_layer", "num_hidden_layers", m.n_layer, j.at("num_hidden_layers").get<int64_t>());
      adopt("n_head", "num_attention_heads", m.n_head, heads);
      adopt("kv_heads", "num_key_value_heads", m.kv_heads, j.value("num_key_value_heads", heads));
      adopt("n_embd", "hidden_size", m.n_embd, width);
      adopt("ffn_dim", "intermediate_size", m.ffn_dim, j.at("intermediate_size").get<int64_t>());
      adopt("norm_eps", "rms_norm_eps", m.norm_eps, j.value("rms_norm_eps", 1e-6));
      adopt("rope_theta", "rope_theta", m.rope_theta, j.value("rope_theta", 10000.0));
      adopt("tie_embeddings", "tie_word_embeddings", m.tie_embeddings, j.value("tie_word_embeddings", false));
      if (j.value("hidden_act", "silu") != "silu") refuse("hidden_act " + j.value("hidden_act", std::string()));
      if (j.value("attention_bias", false)) refuse("attention_bias true");
      if (j.value("mlp_bias", false)) refuse("mlp_bias true");
      adopt("qkv_bias", type == "qwen2" ? "(Qwen2's q, k and v biases)" : "(no q, k or v biases)", m.qkv_bias,
            type == "qwen2");
      if (j.value("use_sliding_window", false)) refuse("use_sliding_window true");
      adopt_rope_scaling(j.value("rope_scaling", nlohmann::json()), m, adopt, refuse);
      const nlohmann::json window = j.value("sliding_window", nlohmann::json());
      if (type == "mistral" && !window.is_null() && window.get<int64_t>() < m.context_length)
        refuse("sliding_window " + window.dump() + " (attention over the last " + window.dump() +
               " positions only, shorter than max_position_embeddings)");
      if (j.contains("head_dim") && !j["head_dim"].is_null() && j["head_dim"].get<int64_t>() * heads != width)
        refuse("head_dim " + j["head_dim"].dump() + " other than hidden_size / num_attention_heads");
    }
  } catch (const nlohmann::json::exception& e) {
    c.error({"model.init_from"}, file.string() + ": " + e.what());
    return;
  }
  if (!refused) c.note("model: sizes from " + file.string() + " (model_type " + type + ")");
}

void resolve_model_auto(RuleContext& c) {
  if (!is_transformer(c.r)) return;
  if (c.r.model.arch == Arch::llama && !c.r.model.kv_heads) c.r.model.kv_heads = c.r.model.n_head;
  if (c.r.model.ffn_dim) return;
  int64_t width = 4 * c.r.model.n_embd;
  if (c.r.model.arch == Arch::llama) width = (2 * width / 3 + 63) / 64 * 64;
  c.r.model.ffn_dim = width;
}

void check_attention_shape(RuleContext& c) {
  if (!is_transformer(c.r)) return;
  const auto& m = c.r.model;
  if (m.n_embd % m.n_head != 0) {
    c.error({"model.n_head", "model.n_embd"},
            "n_embd " + str(m.n_embd) + " is not divisible by n_head " + str(m.n_head),
            {"each head gets n_embd / n_head channels"});
  } else if (m.arch == Arch::llama && (m.n_embd / m.n_head) % 2 != 0) {
    c.error({"model.n_head", "model.n_embd"}, "head size n_embd / n_head = " + str(m.n_embd / m.n_head) +
                                                  " is odd; rotary embeddings need an even head size");
  }
  if (m.arch == Arch::llama && m.kv_heads && m.n_head % *m.kv_heads != 0)
    c.error({"model.kv_heads", "model.n_head"},
            "kv_heads " + str(*m.kv_heads) + " does not divide n_head " + str(m.n_head),
            {"each key/value head is shared by n_head / kv_heads query heads"});
}

// llama3 interpolates between two wavelengths, the high-frequency bound being the shorter.
void check_rope_scaling(RuleContext& c) {
  const ModelSection& m = c.r.model;
  if (m.arch != Arch::llama || m.rope_scaling != RopeScalingType::llama3) return;
  if (m.rope_high_freq_factor <= m.rope_low_freq_factor)
    c.error({"model.rope_high_freq_factor", "model.rope_low_freq_factor"},
            (std::ostringstream() << "rope_high_freq_factor " << m.rope_high_freq_factor
                                  << " is not above rope_low_freq_factor " << m.rope_low_freq_factor)
                .str(),
            {"llama3 interpolates between the two wavelengths they set (Llama 3.1: 1 and 4)"});
}

void check_model_matches_data(RuleContext& c) {
  bool mlp = c.r.model.arch == Arch::mlp;
  if (mlp && is_token_source(c.r)) {
    c.error({"data.source", "model.arch"}, "model.arch mlp trains on data.source classification, not token data");
  } else if (!mlp && !is_token_source(c.r)) {
    c.error({"data.source", "model.arch"}, "data.source classification feeds model.arch mlp, not a language model");
  }
}

void resolve_data_auto(RuleContext& c) {
  if (!is_transformer(c.r) || !is_token_source(c.r)) return;
  auto& d = c.r.data;
  if (!d.sequence_length) d.sequence_length = c.r.model.context_length;
  if (*d.sequence_length > c.r.model.context_length)
    c.error({"data.sequence_length", "model.context_length"}, "sequence_length " + str(*d.sequence_length) +
                                                                  " exceeds model.context_length " +
                                                                  str(c.r.model.context_length));
  if (d.source == DataSource::synthetic_markov && d.order > *d.sequence_length)
    c.error({"data.order", "data.sequence_length"}, "a Markov source of order " + str(d.order) +
                                                        " needs sequences of at least " + str(d.order) +
                                                        " tokens; sequence_length is " + str(*d.sequence_length));
  if (d.source == DataSource::synthetic_markov) {
    if (!d.vocab_size) d.vocab_size = c.r.model.vocab_size;
    if (*d.vocab_size > c.r.model.vocab_size)
      c.error({"data.vocab_size", "model.vocab_size"}, "the Markov source emits " + str(*d.vocab_size) +
                                                           " tokens but model.vocab_size is " +
                                                           str(c.r.model.vocab_size));
  }
  if (d.document_end && *d.document_end >= c.r.model.vocab_size)
    c.error({"data.document_end", "model.vocab_size"}, "the document end token " + str(*d.document_end) +
                                                           " is not below model.vocab_size " +
                                                           str(c.r.model.vocab_size));
  if (d.document_end && c.r.run.device == RunDevice::cuda)
    c.error({"data.document_end", "run.device"},
            "packed documents (data.document_end) run on CPU only for now: the GPU attention kernels do not "
            "keep documents apart yet; use run.device: cpu, or leave data.document_end out");
  if (d.source == DataSource::text && c.r.model.vocab_size < 256)
    c.error({"model.vocab_size"},
            "text data is tokenised as bytes and needs vocab_size >= 256, found " + str(c.r.model.vocab_size));
}

// a x b, or nullopt when it does not fit in 64 bits.
std::optional<int64_t> product(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// global_batch_size = micro_batch_size x gradient_accumulation_steps x world_size; any two give the third.
// With tensor or pipeline parallelism, world_size here is the data-parallel ranks: the world /
// (tensor_parallel x pipeline_parallel).
void resolve_batch(RuleContext& c) {
  auto& t = c.r.train;
  const int64_t tensor = c.r.distributed.tensor_parallel, stages = c.r.distributed.pipeline_parallel;
  const int64_t model_ranks = tensor * stages;
  const std::string split = stages == 1   ? "distributed.tensor_parallel " + str(tensor)
                            : tensor == 1 ? "distributed.pipeline_parallel " + str(stages)
                                          : "distributed.tensor_parallel x pipeline_parallel " + str(model_ranks);
  // Without a launcher or --world-size (a world of 1): one data-parallel rank.
  if (c.loaded.world.size > 1 && c.loaded.world.size % model_ranks != 0) {
    c.error(
        {stages == 1 ? "distributed.tensor_parallel" : "distributed.pipeline_parallel"},
        split + " does not divide the world size " + str(c.loaded.world.size) + " (from " + c.loaded.world.source + ")",
        {"the world size is tensor_parallel x pipeline_parallel x the data-parallel ranks: launch a multiple of " +
         str(model_ranks) + " ranks"});
    return;
  }
  const int64_t world = std::max<int64_t>(1, c.loaded.world.size / model_ranks);
  const std::string world_note = model_ranks == 1 ? "world_size " + str(world) + " comes from " + c.loaded.world.source
                                                  : "world_size " + str(world) +
                                                        " is the data-parallel ranks: " + str(c.loaded.world.size) +
                                                        " (from " + c.loaded.world.source + ") / " + split;
  auto& micro = t.micro_batch_size;
  auto& accum = t.gradient_accumulation_steps;
  auto& global = t.global_batch_size;

  if (!micro && !global) {
    c.error({"train.micro_batch_size", "train.global_batch_size", "train.gradient_accumulation_steps"},
            "set micro_batch_size or global_batch_size (the batch size is undetermined)",
            {"global_batch_size = micro_batch_size x gradient_accumulation_steps x world_size; any two determine the "
             "third"});
    return;
  }
  // Keys are bounded by their declarations, but their product may still not fit.
  for (const auto& value : {micro, accum}) {
    if (value && !product(*value, world)) {
      c.error({"train.micro_batch_size", "train.gradient_accumulation_steps"}, "batch sizes are too large (overflow)");
      return;
    }
  }
  if (micro && accum && !product(*micro * world, *accum)) {
    c.error({"train.micro_batch_size", "train.gradient_accumulation_steps"}, "batch sizes are too large (overflow)");
    return;
  }
  if (micro && global && accum) {
    if (*micro * *accum * world != *global)
      c.error({"train.global_batch_size", "train.micro_batch_size", "train.gradient_accumulation_steps"},
              "global_batch_size " + str(*global) + " != micro_batch_size " + str(*micro) +
                  " x gradient_accumulation_steps " + str(*accum) + " x world_size " + str(world) +
                  " (= " + str(*micro * *accum * world) + ")",
              {world_note, "set one of the three to auto to derive it"});
    return;
  }
  if (micro && global) {
    int64_t per_step = *micro * world;
    if (*global % per_step != 0) {
      c.error({"train.global_batch_size", "train.micro_batch_size"},
              "global_batch_size " + str(*global) + " is not a multiple of micro_batch_size " + str(*micro) +
                  " x world_size " + str(world) + " (= " + str(per_step) +
                  "), so gradient_accumulation_steps cannot be derived",
              {world_note});
      return;
    }
    accum = *global / per_step;
    return;
  }
  if (!accum) accum = 1;
  if (micro) {
    global = *micro * *accum * world;
    return;
  }
  int64_t per_sample = *accum * world;
  if (*global % per_sample != 0) {
    c.error({"train.global_batch_size", "train.gradient_accumulation_steps"},
            "global_batch_size " + str(*global) + " is not a multiple of gradient_accumulation_steps " + str(*accum) +
                " x world_size " + str(world) + " (= " + str(per_sample) + "), so micro_batch_size cannot be derived",
            {world_note});
    return;
  }
  micro = *global / per_sample;
}

void check_schedule(RuleContext& c) {
  // A run shortened from the command line (train.steps=20) keeps its schedule: the warmup is cut to
  // the run, so the learning rate reaches optimizer.lr at the last step (see warmup_steps' help).
  if (c.r.scheduler.warmup_steps > c.r.train.steps) {
    c.note("scheduler.warmup_steps " + str(c.r.scheduler.warmup_steps) + " clamped to train.steps " +
           str(c.r.train.steps) + ": the learning rate reaches optimizer.lr at the last step");
    c.r.scheduler.warmup_steps = c.r.train.steps;
  }
  if (c.r.scheduler.type != SchedulerType::constant && c.r.scheduler.min_lr > c.r.optimizer.lr)
    c.error({"scheduler.min_lr", "optimizer.lr"},
            "min_lr " + format_value(c.r.scheduler.min_lr) + " exceeds optimizer.lr " + format_value(c.r.optimizer.lr));
}

void check_optimizer(RuleContext& c) {
  if (c.r.optimizer.type == OptimizerType::sgd && c.r.optimizer.nesterov && c.r.optimizer.momentum <= 0)
    c.error({"optimizer.nesterov", "optimizer.momentum"}, "nesterov needs momentum > 0");
}

void check_evaluation(RuleContext& c) {
  // The Markov source draws its validation sequences from a stream of their own.
  if (c.r.data.source == DataSource::synthetic_markov) return;
  const auto& d = c.r.data;
  if (c.r.train.eval_every > 0 && d.source == DataSource::classification && d.val_fraction > 0 &&
      double(d.num_samples) * d.val_fraction < 1)
    c.error({"data.val_fraction", "data.num_samples"}, "validation needs at least one sample; num_samples " +
                                                           str(d.num_samples) + " x val_fraction " +
                                                           format_value(d.val_fraction) + " is less than one");
  if (c.r.train.eval_every > 0 && c.r.data.val_fraction <= 0)
    c.error({"train.eval_every", "data.val_fraction"},
            "evaluation every " + str(c.r.train.eval_every) + " steps needs validation data; data.val_fraction is 0");
}

void check_precision(RuleContext& c) {
  const auto& p = c.r.precision;
  const char* mode = p.mode == PrecisionMode::fp32 ? "fp32" : p.mode == PrecisionMode::bf16 ? "bf16" : "fp16";
  const bool matches = (p.accumulation_dtype == GradientDType::bf16 && p.mode == PrecisionMode::bf16) ||
                       (p.accumulation_dtype == GradientDType::fp16 && p.mode == PrecisionMode::fp16);
  if (p.accumulation_dtype != GradientDType::fp32 && !matches)
    c.error({"precision.accumulation_dtype", "precision.mode"},
            std::string("gradients accumulate in fp32 or in the 16-bit type of precision.mode (") + mode + ")");
}

void check_offload(RuleContext& c) {
  const OffloadSection& o = c.r.offload;
  if (o.parameters != OffloadTier::none && c.r.distributed.zero_stage != 3)
    c.error({"offload.parameters", "distributed.zero_stage"},
            std::string("offload.parameters ") + offload_tier_name(o.parameters) +
                " moves each rank's parameter shard, which exists at zero_stage 3 (now " +
                str(c.r.distributed.zero_stage) + ")",
            {"set distributed.zero_stage: 3, or offload only the optimizer state (offload.optimizer) at stages 0-2"});
  if ((o.optimizer == OffloadTier::nvme || o.parameters == OffloadTier::nvme) && o.nvme_path.empty())
    c.error({"offload.nvme_path", "offload.optimizer", "offload.parameters"},
            "offload to nvme needs offload.nvme_path, the directory of the swap files");
  if (o.block_size % 4096 != 0)
    c.error({"offload.block_size"}, "block_size " + str(o.block_size) + " is not a multiple of 4096 (direct I/O)");
  if (o.chunk_size % 2048 != 0)
    c.error({"offload.chunk_size"},
            "chunk_size " + str(o.chunk_size) + " is not a multiple of 2048 (a 4 KiB block of 16-bit parameters)");
  // A CPU run computes in host memory already (a GPU run is what cpu offload is for).
  for (auto [key, device] : {std::pair{"optimizer", o.optimizer}, std::pair{"parameters", o.parameters}})
    if (device == OffloadTier::cpu && c.r.run.device != RunDevice::cuda)
      c.note(std::string("offload.") + key +
             " cpu: on a CPU run that state already lives in host memory, so memory use does not change; it takes "
             "the offload path (the chunked CPU update a GPU run uses). Use nvme to hold it outside memory");
}

// Gradients are reduced in the type they accumulate in, so that every ZeRO stage and world size sums
// the same bits: across ranks the two types agree (one process reduces nothing).
void check_communication_dtype(RuleContext& c) {
  const PrecisionSection& p = c.r.precision;
  const int64_t world = c.loaded.world.size;
  if (world <= 1 || p.communication_dtype == p.accumulation_dtype) return;
  c.error({"precision.communication_dtype", "precision.accumulation_dtype"},
          "communication_dtype differs from accumulation_dtype at world_size " + str(world) +
              ": gradients are reduced in the type they accumulate in, so that every ZeRO stage and world size "
              "sums the same bits",
          {"world_size " + str(world) + " comes from " + c.loaded.world.source,
           "set communication_dtype to the accumulation_dtype (or accumulation_dtype to the type to communicate in)"});
}

void check_telemetry(RuleContext& c) {
  const TelemetrySection& t = c.r.telemetry;
  if (t.trace_steps > 0 && t.trace_start > c.r.train.steps)
    c.error(
        {"telemetry.trace_start", "telemetry.trace_steps"},
        "trace_start " + str(t.trace_start) + " is past the last step (train.steps " + str(c.r.train.steps) +
            "): nothing would be traced",
        {"trace a step the run reaches, e.g. telemetry.trace_start: " + str(std::min<int64_t>(3, c.r.train.steps))});
}

// LoRA: target modules that exist in the model's blocks, a transformer, and the CPU for now.
void check_lora(RuleContext& c) {
  const LoraSection& l = c.r.lora;
  if (l.rank == 0) {
    if (!l.init_from.empty())
      c.error({"lora.init_from", "lora.rank"},
              "lora.init_from names adapters, but lora.rank is 0 (no LoRA): set the "
              "adapter's rank");
    return;
  }
  if (!is_transformer(c.r)) {
    c.error({"lora.rank", "model.arch"}, "LoRA adapts a transformer's linear layers; model.arch mlp has none to adapt");
    return;
  }
  std::string problem;
  if (lora_targets(c.r.model.arch, l.target_modules, &problem).empty()) c.error({"lora.target_modules"}, problem);
  if (c.r.run.device == RunDevice::cuda)
    c.error({"lora.rank", "run.device"},
            "LoRA runs on CPU only for now: the GPU runner does not hold frozen weights yet; use run.device: cpu, "
            "or set lora.rank: 0");
}

// `what` (at `key`) does not run with `layout` (`layout_key` > 1) yet: refused by name, with the fix
// and the way back to one rank.
void refuse_with(RuleContext& c, const char* key, const char* layout_key, const std::string& layout,
                 const std::string& what, const std::string& fix) {
  c.error({key, layout_key}, what + " does not run with " + layout + " yet",
          {fix + ", or set " + std::string(layout_key) + ": 1"});
}

// What neither tensor nor pipeline parallelism runs with yet: the GPU.
void refuse_unsupported(RuleContext& c, const char* layout_key, const std::string& layout) {
  if (c.r.run.device == RunDevice::cuda)
    refuse_with(c, "run.device", layout_key, layout, "the GPU", "use run.device: cpu");
}

// Tensor parallelism: a transformer whose heads, MLP width and vocabulary divide among the ranks,
// and what runs with it so far.
void check_tensor_parallel(RuleContext& c) {
  const int64_t t = c.r.distributed.tensor_parallel;
  if (t == 1) return;
  const ModelSection& m = c.r.model;
  const std::string ranks = "distributed.tensor_parallel " + str(t);
  if (!is_transformer(c.r)) {
    c.error({"distributed.tensor_parallel", "model.arch"},
            "tensor parallelism splits a transformer's layers; model.arch mlp has none to split",
            {"set distributed.tensor_parallel: 1"});
    return;
  }
  auto divides = [&](const char* key, int64_t value, const std::string& what) {
    if (value % t != 0)
      c.error({key, "distributed.tensor_parallel"}, ranks + " does not divide " + key + " " + str(value) + " (" + what +
                                                        " are split evenly across the ranks)");
  };
  divides("model.n_head", m.n_head, "attention heads");
  if (m.kv_heads) divides("model.kv_heads", *m.kv_heads, "key/value heads");
  if (m.ffn_dim) divides("model.ffn_dim", *m.ffn_dim, "the MLP's hidden columns");
  divides("model.vocab_size", m.vocab_size, "the vocabulary's rows");
  refuse_unsupported(c, "distributed.tensor_parallel", "tensor parallelism");
}

// Pipeline parallelism: a transformer with a block per stage at least, and what runs with it so far.
void check_pipeline_parallel(RuleContext& c) {
  const int64_t p = c.r.distributed.pipeline_parallel;
  if (p == 1) {
    if (!c.r.distributed.pipeline_blocks.empty())
      c.error({"distributed.pipeline_blocks", "distributed.pipeline_parallel"},
              "distributed.pipeline_blocks cuts pipeline stages, but distributed.pipeline_parallel is 1",
              {"set pipeline_parallel to the number of stages it lists, or leave pipeline_blocks empty"});
    return;
  }
  if (!is_transformer(c.r)) {
    c.error({"distributed.pipeline_parallel", "model.arch"},
            "pipeline parallelism cuts a transformer's blocks into stages; model.arch mlp has none",
            {"set distributed.pipeline_parallel: 1"});
    return;
  }
  if (c.r.model.n_layer < p)
    c.error({"distributed.pipeline_parallel", "model.n_layer"},
            "distributed.pipeline_parallel " + str(p) + " needs a block per stage at least, and model.n_layer is " +
                str(c.r.model.n_layer));
  const std::vector<double>& blocks = c.r.distributed.pipeline_blocks;
  if (!blocks.empty()) {
    double sum = 0;
    bool whole = true;
    for (double b : blocks) {
      sum += b;
      whole = whole && b == std::floor(b);
    }
    if (int64_t(blocks.size()) != p || !whole || sum != double(c.r.model.n_layer))
      c.error({"distributed.pipeline_blocks", "distributed.pipeline_parallel"},
              "distributed.pipeline_blocks must list the whole blocks of each of the " + str(p) +
                  " stages, summing to model.n_layer " + str(c.r.model.n_layer) + " (it lists " +
                  str(int64_t(blocks.size())) + " numbers summing to " + nlohmann::json(sum).dump() + ")",
              {"leave it empty to balance the stages by FLOPs"});
  }
  refuse_unsupported(c, "distributed.pipeline_parallel", "pipeline parallelism");
  if (c.r.distributed.wrap_policy != WrapPolicy::block)
    refuse_with(c, "distributed.wrap_policy", "distributed.pipeline_parallel", "pipeline parallelism",
                "a wrap policy other than block", "set distributed.wrap_policy: block");
}

}  // namespace

void apply_rules(LoadedRecipe& loaded, DiagnosticSink& sink, const std::set<std::string>& broken_sections) {
  // Each rule with the sections it reads; a rule runs only when all of them validated, so it never
  // reasons about a value that was rejected (and left unset) or reports a consequence of it.
  struct Rule {
    std::vector<std::string> sections;
    void (*apply)(RuleContext&);
  };
  static const std::vector<Rule> rules = {
      {{"run"}, resolve_run_name},
      {{"model"}, adopt_pretrained_config},
      {{"model"}, resolve_model_auto},
      {{"model"}, check_attention_shape},
      {{"model"}, check_rope_scaling},
      {{"model", "data"}, check_model_matches_data},
      {{"model", "data"}, resolve_data_auto},
      {{"train", "distributed"}, resolve_batch},
      {{"train", "scheduler", "optimizer"}, check_schedule},
      {{"optimizer"}, check_optimizer},
      {{"train", "data"}, check_evaluation},
      {{"precision"}, check_precision},
      {{"precision"}, check_communication_dtype},
      {{"offload", "distributed"}, check_offload},
      {{"telemetry", "train"}, check_telemetry},
      {{"lora", "model", "run"}, check_lora},
      {{"distributed", "model", "run"}, check_tensor_parallel},
      {{"distributed", "model", "run"}, check_pipeline_parallel},
  };
  RuleContext context{loaded, sink, loaded.recipe};
  for (const Rule& rule : rules) {
    bool runnable = std::none_of(rule.sections.begin(), rule.sections.end(),
                                 [&](const std::string& section) { return broken_sections.count(section) != 0; });
    if (runnable) rule.apply(context);
  }
}

}  // namespace engine::recipe
