// Recipe: the typed, validated form of a recipe file, one struct per section.
//
// Fields carry no defaults here: every key's type, default, range and help text is declared
// once, in recipe/sections/<section>.cpp, and load_recipe() fills every field from the YAML or
// from that declaration. Keys that do not apply (model.n_head for an MLP) keep a zero value.
//
//   Recipe recipe = load_recipe("recipes/quickstart.yaml", {"train.steps=50"}).recipe;
//   for (int64_t step = 0; step < recipe.train.steps; ++step) ...
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/offload_tier.h"

namespace engine::recipe {

enum class RunDevice { auto_detect, cpu, cuda };

struct RunSection {
  std::string name;        // defaults to the recipe file's stem
  std::string output_dir;  // runs are written to <output_dir>/<name>
  int64_t seed;
  RunDevice device;    // auto: cuda when the build has CUDA and a device is present, else cpu
  bool cuda_graphs;    // replay each plan as a CUDA graph after one eager run (cuda only)
  bool fusions;        // fuse op pairs into one kernel where the GPU plan has a fused kernel (cuda only)
  bool deterministic;  // every GPU kernel gives the same bits at every run (false: cuDNN attention's unordered sums)
};

enum class Arch { gpt, llama, mlp };
enum class Activation { relu, gelu, silu };
enum class RopeScalingType { none, linear, llama3 };

struct ModelSection {
  Arch arch;
  int64_t vocab_size;              // gpt, llama
  int64_t context_length;          // gpt, llama: maximum positions
  int64_t n_layer;                 // transformer blocks, or hidden layers of an MLP
  int64_t n_head;                  // gpt, llama
  int64_t n_embd;                  // gpt, llama: model width
  std::optional<int64_t> ffn_dim;  // gpt, llama: hidden width of the MLP block (auto: resolved)
  // llama: key/value heads, each shared by n_head / kv_heads query heads (auto: resolved to n_head)
  std::optional<int64_t> kv_heads;
  double dropout;     // gpt
  bool bias;          // gpt
  double norm_eps;    // gpt, llama
  double rope_theta;  // llama
  bool qkv_bias;      // llama: biases on the q, k and v projections (Qwen2)
  // llama: Hugging Face's rope_scaling (ops/nn/rotary_math.h says what each type does)
  RopeScalingType rope_scaling;
  double rope_factor;                    // linear, llama3
  double rope_low_freq_factor;           // llama3
  double rope_high_freq_factor;          // llama3
  int64_t rope_original_context_length;  // llama3
  bool tie_embeddings;                   // gpt, llama
  int64_t input_dim;                     // mlp
  int64_t hidden_dim;                    // mlp
  int64_t num_classes;                   // mlp
  Activation activation;                 // mlp
  double init_std;
  std::filesystem::path init_from;  // empty: random initialisation
};

enum class DataSource { synthetic_markov, text, tokens, classification };
enum class TokenFormat { auto_detect, llmc, raw_uint16, raw_uint32 };

struct DataSection {
  DataSource source;
  std::optional<int64_t> sequence_length;  // token sources; auto resolves to model.context_length
  std::filesystem::path path;              // text, tokens: resolved relative to the recipe file
  TokenFormat format;                      // tokens
  std::filesystem::path loss_mask;         // tokens: one byte per token, 0 = not trained; empty: none
  std::optional<int64_t> document_end;     // text, tokens: packing; the token that ends a document
  double val_fraction;                     // text, tokens, synthetic_markov, classification
  int64_t order;                           // synthetic_markov
  int64_t branching;                       // synthetic_markov
  std::optional<int64_t> vocab_size;       // synthetic_markov; auto resolves to model.vocab_size
  int64_t num_samples;                     // classification
  double noise;                            // classification
  bool shuffle;
  int64_t prefetch;
};

struct TrainSection {
  int64_t steps;
  std::optional<int64_t> micro_batch_size;             // auto is resolved by the batch rule
  std::optional<int64_t> gradient_accumulation_steps;  // so after loading all three are set
  std::optional<int64_t> global_batch_size;
  double gradient_clipping;
  int64_t eval_every;
  int64_t eval_batches;
  int64_t log_every;
};

enum class OptimizerType { adamw, sgd };

struct OptimizerSection {
  OptimizerType type;
  double lr;
  std::vector<double> betas;  // adamw: (beta1, beta2)
  double eps;                 // adamw
  double weight_decay;
  bool decay_norms_and_biases;
  double momentum;  // sgd
  bool nesterov;    // sgd
};

enum class SchedulerType { constant, linear, cosine };

struct SchedulerSection {
  SchedulerType type;
  int64_t warmup_steps;
  double min_lr;  // linear, cosine
};

enum class PrecisionMode { fp32, bf16, fp16 };
enum class LossScaling { dynamic, fixed };
enum class MinScaleAction { abort, fallback };
enum class GradientDType { fp32, bf16, fp16 };

struct PrecisionSection {
  PrecisionMode mode;
  GradientDType accumulation_dtype;   // parameter gradients across micro-batches
  GradientDType communication_dtype;  // gradient reduction across ranks
  LossScaling loss_scaling;           // fp16
  double static_scale;                // fp16, fixed
  int64_t initial_scale_power;        // fp16, dynamic: the first scale is 2^k
  int64_t growth_interval;            // fp16, dynamic: clean steps before the scale grows
  double scale_factor;                // fp16, dynamic: growth and backoff factor
  int64_t hysteresis;                 // fp16, dynamic: overflows tolerated before a backoff
  double min_scale;                   // fp16, dynamic
  MinScaleAction on_min_scale;        // fp16, dynamic
};

enum class CheckpointPolicy { none, full, every_k, selective };

struct ActivationCheckpointingSection {
  CheckpointPolicy policy;
  int64_t k;               // every_k: every k-th transformer block is checkpointed
  bool cpu_checkpointing;  // full, every_k: kept block inputs move to host memory
};

enum class WrapPolicy { block, size, model };
enum class PipelineSchedule { one_f_one_b, gpipe };
// How a GPU run's ranks reduce their gradients on the device (trainer/device.h).
enum class GpuCollectives { auto_detect, nccl, staged };

struct DistributedSection {
  int64_t zero_stage;              // 0: data parallel, 1: + optimizer state sharded, 2: + gradients, 3: + parameters
  WrapPolicy wrap_policy;          // what one wrap unit (the gather and checkpoint granularity) holds
  int64_t wrap_size;               // size: parameters per unit, at most (a single larger layer is a unit alone)
  int64_t bucket_size;             // gradient elements whose reductions may be in flight at once
  int64_t prefetch;                // stage 3: units gathered ahead of the one in use
  double timeout;                  // seconds a collective may take before the run stops
  GpuCollectives gpu_collectives;  // a resident GPU run's gradient reductions: NCCL or staged through the host
  // Ranks that split each layer between them (Megatron-LM tensor parallelism); world size = this x the
  // data-parallel ranks, ZeRO shards over the latter.
  int64_t tensor_parallel;
  // Stages the model's blocks are cut into, each on its own ranks (world = stages x data-parallel ranks),
  // fed with the step's micro-batches on a pipeline schedule.
  int64_t pipeline_parallel;
  PipelineSchedule pipeline_schedule;
  // Transformer blocks per stage, first to last (whole numbers summing to n_layer); empty: the cut
  // that balances the stages' FLOPs.
  std::vector<double> pipeline_blocks;
};

enum class ResumeMode { never, auto_resume };
enum class CheckpointErrorAction { stop, keep_training };

struct CheckpointSection {
  int64_t every_steps;   // 0: no step-based checkpoints
  double every_minutes;  // 0: no time-based checkpoints
  int64_t keep_last;     // committed checkpoints kept (0: all)
  std::string dir;       // empty: <run dir>/checkpoints
  bool async;            // written from a snapshot while training continues
  bool at_end;           // one more after the last step
  ResumeMode resume;     // auto: continue from the latest complete checkpoint, if any
  CheckpointErrorAction on_error;
  double preemption_budget;  // seconds from a stop signal to a durable checkpoint
};

// Where a kind of state lives: in memory as today, in host memory through the offload path, or
// in a swap file on a local disk (NVMe).

struct OffloadSection {
  OffloadTier optimizer;   // fp32 master weights and optimizer state
  OffloadTier parameters;  // zero_stage 3: each rank's parameter shard, fetched before its gather
  std::string nvme_path;   // the swap directory (one file per rank and kind)
  int64_t queue_depth;     // I/O requests in flight
  int64_t block_size;      // bytes per I/O request
  int64_t chunk_size;      // parameters per chunk of the streamed optimizer step
};

// LoRA (Hu et al. 2021, as PEFT builds it): each targeted linear layer's weight W is frozen and
// y = x W^T + (alpha / rank) * (dropout(x) A^T) B^T trains A (rank, in) and B (out, rank) instead;
// every other weight of the model is frozen too. rank 0: off.
struct LoraSection {
  int64_t rank;
  double alpha;
  double dropout;
  std::string target_modules;       // comma-separated module names (PEFT's), or all-linear
  std::filesystem::path init_from;  // a PEFT adapter to start from; empty: A uniform, B zero
};

// What a run records about itself besides metrics.jsonl (docs/telemetry.md).
struct TelemetrySection {
  bool tensorboard;         // event files in <run dir>/tensorboard
  bool histograms;          // per wrap unit parameter and gradient norms, at log steps
  int64_t trace_start;      // the first traced step (1-based)
  int64_t trace_steps;      // consecutive steps traced into <run dir>/trace.json (0: none)
  bool op_table;            // time per op, printed at the end and kept in <run dir>/op_table.json
  double peak_flops;        // per rank, for MFU (0: measured once by a GEMM probe and cached)
  double monitor_interval;  // seconds between hardware samples (0: no monitoring)
};

struct YamlNode;

// One entry of `plugins:`: a Lua plugin (engine/lua/plugin.h) and the arguments the recipe gives it.
struct PluginEntry {
  std::filesystem::path path;            // resolved relative to the recipe that names it
  std::string name;                      // the path as written, for messages
  std::shared_ptr<const YamlNode> node;  // the entry as written ({path, args} or a path), with marks
};

struct Recipe {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainSection train;
  OptimizerSection optimizer;
  SchedulerSection scheduler;
  std::vector<PluginEntry> plugins;  // in recipe order: hooks run in this order
  PrecisionSection precision;
  ActivationCheckpointingSection activation_checkpointing;
  DistributedSection distributed;
  CheckpointSection checkpoint;
  OffloadSection offload;
  TelemetrySection telemetry;
  LoraSection lora;
};

}  // namespace engine::recipe
