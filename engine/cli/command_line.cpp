// The command line (cli/command_line.h): one function per subcommand declares its options, bound
// to arguments it owns, and returns what runs when that subcommand is chosen.
#include "cli/command_line.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/device_info.h"
#include "core/log.h"
#include "core/memory_limit.h"
#include "core/version.h"

namespace engine::cli {
namespace {

// A subcommand (or a sub-subcommand) and what runs when the command line chose it.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

// Arguments outlive the parse: CLI11 writes into them, the chosen command reads them.
template <class T>
std::shared_ptr<T> owned() {
  return std::make_shared<T>();
}

void add_recipe_args(CLI::App* command, RecipeArgs& args) {
  command->add_option("recipe", args.recipe, "Recipe file (YAML)")->required();
  command->add_option("overrides", args.overrides, "Overrides: section.key=value or ~section.key");
  command->add_option("--world-size", args.world_size, "Plan for this many ranks (default: from mpirun, else 1)")
      ->check(CLI::Range(1, 1 << 20));
}

std::string version_text() {
  return std::string("engine ") + kVersion + " (" + kGitRevision + ", " + kBuildType + ")\n" + accelerator_summary() +
         "\nrun.device auto trains on: " +
         (cuda_device_count() > 0 ? "cuda:0 (" + cuda_device_name(0) + ")" : std::string("cpu"));
}

// `--resume` takes an optional value: `--resume`, `--resume PATH` and `--resume=PATH` all work, and an
// override or the recipe after a bare --resume stays what it is. Returned as CLI11 wants: reversed.
std::vector<std::string> resume_with_its_value(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg != "--resume") {
      args.push_back(arg);
      continue;
    }
    const std::string next = i + 1 < argc ? argv[i + 1] : "";
    auto ends_with = [&](const char* suffix) {
      const std::string s = suffix;
      return next.size() >= s.size() && next.compare(next.size() - s.size(), s.size(), s) == 0;
    };
    const bool value = !next.empty() && next[0] != '-' && next.find('=') == std::string::npos && !ends_with(".yaml") &&
                       !ends_with(".yml");
    args.push_back("--resume=" + (value ? next : std::string("latest")));
    if (value) ++i;
  }
  std::reverse(args.begin(), args.end());
  return args;
}

void add_validate_and_config(CLI::App& app, Commands& commands) {
  auto args = owned<RecipeArgs>();
  auto* validate_command =
      app.add_subcommand("validate", "Check a recipe and print a one-line summary, or every error");
  add_recipe_args(validate_command, *args);
  commands.push_back({validate_command, [args] { return validate(*args); }});

  auto only_changed = std::make_shared<bool>(false);
  auto* config_command = app.add_subcommand("config", "Print the fully resolved recipe, defaults included");
  add_recipe_args(config_command, *args);
  config_command->add_flag("--diff", *only_changed, "Only the keys whose value differs from the default");
  commands.push_back({config_command, [args, only_changed] { return config(*args, *only_changed); }});
}

void add_train(CLI::App& app, Commands& commands) {
  auto args = owned<RecipeArgs>();
  auto* command =
      app.add_subcommand("train", "Train a recipe: progress, metrics.jsonl and weights in the run directory");
  add_recipe_args(command, *args);
  command->add_option("--dump-first-gradients", args->first_gradients,
                      "Write the first step's gradients (before clipping) to this safetensors file, in the "
                      "names and layout of the exported weights; in fp16 they are still multiplied by "
                      "the step's loss scale");
  command
      ->add_option("--dump-gradients-at", args->gradients_at,
                   "Write step STEP's gradients (1-based, as in metrics.jsonl; before clipping) to the "
                   "safetensors file PATH, in the names and layout of the exported weights; in fp16 they are "
                   "still multiplied by the step's loss scale; repeatable, once per step")
      ->type_name("STEP PATH");
  command
      ->add_option("--resume", args->resume,
                   "Continue from a checkpoint: the latest complete one in checkpoint.dir (no value, or "
                   "`latest`), a checkpoint directory, or a directory of checkpoints (its latest). The word "
                   "after --resume is its value unless it is an override (has '='), an option or a .yaml file")
      ->type_name("[PATH]");
  command
      ->add_option("--stop-after", args->stop_after,
                   "Stop after this step with a checkpoint (exit 0), to train in slices; --resume continues")
      ->check(CLI::PositiveNumber);
  commands.push_back({command, [args] { return train(*args); }});
}

void add_plan(CLI::App& app, Commands& commands) {
  auto args = owned<RecipeArgs>();
  auto fit = owned<FitArgs>();
  auto* command = app.add_subcommand("plan", "Print parameters per wrap unit, FLOPs and the exact memory plan");
  add_recipe_args(command, *args);
  command
      ->add_option("--host-memory", fit->host_memory,
                   "Host memory budget for the ranks on this machine (16GiB, 400MB, bytes; default: the memory "
                   "limit in force: MemAvailable, the cgroup's or ulimit's): prints every ZeRO stage x offload x "
                   "activation checkpointing x micro-batch against the budgets")
      ->type_name("SIZE");
  command
      ->add_option("--device-memory", fit->device_memory,
                   "Device memory budget per GPU for a run on CUDA (run.device cuda, or auto with a GPU here); "
                   "auto: what is free on the GPU now. On a CPU run the device is the host and this is a host budget")
      ->type_name("SIZE|auto");
  command
      ->add_option("--nvme", fit->nvme,
                   "Swap space budget for offload to nvme (default: free space of offload.nvme_path, else of the "
                   "temporary directory the proposal uses)")
      ->type_name("SIZE");
  command->add_flag("--fit", fit->fit,
                    "Propose the fastest configuration that fits the budgets, as overrides for `engine train`");
  command
      ->add_option("--flops-per-second", fit->flops_per_second,
                   "--fit's cost model: the compute rate (default 5e10 on the CPU; on a GPU 4e14, fp32 4e13)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--swap-bandwidth", fit->swap_bandwidth,
                   "--fit's cost model: swap bytes read and written per second (default 1GB)")
      ->type_name("SIZE");
  commands.push_back({command, [args, fit] { return plan(*args, *fit); }});
}

void add_export_and_generate(CLI::App& app, Commands& commands) {
  auto export_args = owned<ExportArgs>();
  auto max_shard = std::make_shared<std::string>();
  auto* export_command = app.add_subcommand(
      "export",
      "Write a run's final weights, or a checkpoint's, as a Hugging Face model directory or a safetensors file");
  export_command
      ->add_option("source", export_args->source,
                   "Run directory (<output_dir>/<name>: its final weights, else its latest checkpoint), a "
                   "checkpoint (a step-N directory) or a directory of checkpoints (the latest)")
      ->required();
  export_command
      ->add_option("destination", export_args->destination,
                   "Output: a model directory (the weights, config.json and the tokenizer files of the directory "
                   "the run started from, which transformers' from_pretrained loads as it is), or a .safetensors "
                   "file")
      ->required();
  export_command
      ->add_option("--dtype", export_args->dtype,
                   "fp32, bf16 or fp16 (default: the run's precision for a model directory, fp32 for a file)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  export_command
      ->add_option("--max-shard-size", *max_shard,
                   "A model directory's weights in shards of at most this size (default 5GB, as save_pretrained)")
      ->type_name("SIZE");
  export_command->add_flag("--adapter", export_args->adapter,
                           "A LoRA run: its adapter alone, as a PEFT adapter directory (adapter_model.safetensors, "
                           "adapter_config.json); without it the adapters are merged into the exported weights");
  commands.push_back({export_command, [export_args, max_shard] {
                        if (!max_shard->empty())
                          export_args->max_shard_bytes = parse_byte_size(*max_shard, "--max-shard-size");
                        return export_weights(*export_args);
                      }});

  auto args = owned<GenerateArgs>();
  auto* generate_command = app.add_subcommand(
      "generate", "Sample text from a model: bytes for text data, a Hugging Face tokenizer for token data");
  generate_command->add_option("run_dir", args->run_dir, "Run directory (<output_dir>/<name>)")->required();
  generate_command->add_option("--prompt", args->prompt, "Text to continue");
  generate_command->add_option("--tokenizer", args->tokenizer,
                               "tokenizer.json or its directory (default: the model directory the run started from)");
  generate_command
      ->add_option("--tokens", args->tokens,
                   "Tokens to sample at most (a run trained on packed documents stops at data.document_end)")
      ->check(CLI::Range(1, 100000));
  generate_command->add_option("--temperature", args->temperature, "0 picks the most likely token")
      ->check(CLI::Range(0.0, 100.0));
  generate_command->add_option("--top-k", args->top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(0, 1 << 24));
  generate_command->add_option("--seed", args->seed, "Sampling seed");
  commands.push_back({generate_command, [args] { return generate(*args); }});

  auto eval_args = owned<EvalArgs>();
  auto* eval_command = app.add_subcommand(
      "eval", "The validation loss of a model's weights over the recipe's validation split, without training");
  add_recipe_args(eval_command, eval_args->recipe);
  eval_command
      ->add_option("--weights", eval_args->weights,
                   "A run directory (its final weights), a safetensors file or a Hugging Face model directory "
                   "(default: the recipe's model.init_from)")
      ->type_name("PATH");
  eval_command
      ->add_option("--batches", eval_args->batches, "Validation batches to average (default: train.eval_batches)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  commands.push_back({eval_command, [eval_args] { return evaluate(*eval_args); }});
}

void add_golden(CLI::App& app, Commands& commands) {
  auto args = owned<GoldenArgs>();
  auto* golden_command = app.add_subcommand("golden", "Golden-recipe regression tests: record, check, update");
  golden_command->require_subcommand(1);
  using Action = GoldenArgs::Action;
  auto action = [&](const char* name, const char* description, Action chosen) {
    CLI::App* sub = golden_command->add_subcommand(name, description);
    commands.push_back({sub, [args, chosen] {
                          args->action = chosen;
                          return golden(*args);
                        }});
    return sub;
  };
  auto* record = action("record", "Run recipes and store their trajectories next to them", Action::record);
  record->add_option("recipes", args->recipes, "Recipe files")->required();
  record
      ->add_option("--world-size", args->world_size,
                   "Train on this many ranks, each run under mpirun (check and update read it from the golden file)")
      ->check(CLI::Range(1, 1 << 20));
  auto* check = action("check", "Rerun recipes and compare; exit 3 on a regression", Action::check);
  check->add_option("recipes", args->recipes, "Recipe files")->required();
  auto* update = action("update", "Rerun recipes and rewrite their golden files", Action::update);
  update->add_option("recipes", args->recipes, "Recipe files")->required();
  for (auto* writer : {record, update}) {
    writer
        ->add_option("--safety-factor", args->safety_factor,
                     "Band = this factor x the spread measured across forced ISAs and thread counts")
        ->check(CLI::Range(1.0, 1000.0));
    writer->add_flag("!--no-band", args->variants,
                     "Skip the reruns: the golden can then only be checked bitwise where it was recorded");
  }
  auto* trajectory =
      action("trajectory", "Run one recipe in this environment and write its trajectory (a golden file without a band)",
             Action::trajectory);
  trajectory->add_option("recipe", args->recipes, "Recipe file")->required()->expected(1);
  trajectory->add_option("--out", args->out, "Where to write the trajectory")->required();
  trajectory->add_flag("--gradient-noise", args->gradient_noise,
                       "Move every fp32 gradient element by up to one ulp each step (a band variant)");
  auto* observe = action(
      "observe", "Widen golden bands to cover trajectories run on another machine (engine golden trajectory there)",
      Action::observe);
  observe->add_option("recipes", args->recipes, "Recipe files")->required();
  observe->add_option("--from", args->from, "Directory holding each recipe's trajectory as <recipe stem>.json")
      ->required();
}

void add_checkpoint(CLI::App& app, Commands& commands) {
  auto path = std::make_shared<std::filesystem::path>();
  auto* checkpoint = app.add_subcommand("checkpoint", "Checkpoints: list, inspect and verify them");
  checkpoint->require_subcommand(1);
  auto* list = checkpoint->add_subcommand(
      "list", "One line per complete checkpoint (step, world size, ZeRO stage, size, created); unfinished writes");
  list->add_option("dir", *path, "A directory of checkpoints (checkpoint.dir) or a run directory")->required();
  commands.push_back({list, [path] { return checkpoint_list(*path); }});
  auto* inspect = checkpoint->add_subcommand(
      "inspect", "One checkpoint's manifest: step, world, training state, files and checksums, tensors");
  inspect->add_option("checkpoint", *path, "A checkpoint directory (step-N)")->required();
  commands.push_back({inspect, [path] { return checkpoint_inspect(*path); }});
  auto* verify = checkpoint->add_subcommand(
      "verify", "Read every rank file and check its size and checksum; exit 2 naming each damaged file");
  verify
      ->add_option("path", *path, "A checkpoint, or a directory of checkpoints or a run directory (verifies every one)")
      ->required();
  commands.push_back({verify, [path] { return checkpoint_verify(*path); }});
}

void add_reference_commands(CLI::App& app, Commands& commands) {
  auto markdown = std::make_shared<bool>(false);
  auto* schema_command = app.add_subcommand("schema", "Print the recipe JSON Schema (draft 2020-12)");
  schema_command->add_flag("--markdown", *markdown, "Print the reference page (docs/recipe-reference.md) instead");
  commands.push_back({schema_command, [markdown] { return schema(*markdown); }});

  auto plugin_file = std::make_shared<std::filesystem::path>();
  auto* plugin = app.add_subcommand("plugin", "Lua plugins: what one declares");
  plugin->require_subcommand(1);
  auto* info = plugin->add_subcommand("info", "Print a plugin's description, parameters and hooks");
  info->add_option("file", *plugin_file, "The plugin's .lua file")->required();
  commands.push_back({info, [plugin_file] { return plugin_info(*plugin_file); }});

  auto runs = std::make_shared<std::pair<std::vector<std::filesystem::path>, std::filesystem::path>>();
  auto* report_command = app.add_subcommand(
      "report", "An HTML report of one or more runs (charts, summary table); several runs share the charts");
  report_command->add_option("run_dirs", runs->first, "Run directories (<output_dir>/<name>), compared on one page")
      ->required();
  report_command->add_option("--output,-o", runs->second, "The HTML file (default: <first run dir>/report.html)");
  commands.push_back({report_command, [runs] { return report(runs->first, runs->second); }});

  auto topic = std::make_shared<std::string>();
  auto* help_command = app.add_subcommand("help", "Explain a topic, a section or a key");
  help_command->add_option("topic", *topic,
                           "recipes, overrides, batch, checkpoints, exit-codes, a section or section.key");
  commands.push_back({help_command, [topic] { return help(*topic); }});
}

}  // namespace

int run_command_line(int argc, char** argv, const Launch& launch, const ThreadChoice& threads) {
  CLI::App app{"engine: a declarative training engine driven by YAML recipes"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and build information");
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warning or error (default: ENGINE_LOG_LEVEL, else info on rank 0 and "
                 "warning on the other ranks)");
  Commands commands;
  add_validate_and_config(app, commands);
  add_train(app, commands);
  add_plan(app, commands);
  add_export_and_generate(app, commands);
  add_golden(app, commands);
  add_checkpoint(app, commands);
  add_reference_commands(app, commands);

  try {
    app.parse(resume_with_its_value(argc, argv));
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUser;
  }
  log::init_logging(launch.rank, launch.world_size,
                    log::level_for_rank(launch.rank, log_level, std::getenv("ENGINE_LOG_LEVEL")));
  spdlog::debug("{}", threads.note);
  if (show_version) {
    std::cout << version_text() << "\n";
    return kExitOk;
  }
  for (const Command& command : commands)
    if (*command.app) return command.run();
  std::cout << app.help();
  return kExitOk;
}

}  // namespace engine::cli
