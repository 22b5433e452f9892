#include <iostream>
#include <map>

#include "cli/commands.h"
#include "core/error.h"
#include "recipe/schema.h"
#include "recipe/suggest.h"

namespace engine::cli {

using namespace engine::recipe;

namespace {

const std::map<std::string, std::string>& topics() {
  static const std::map<std::string, std::string> text = {
      {"recipes",
       "A recipe is a YAML file of sections: run, model, data, train, optimizer, scheduler.\n"
       "`engine help <section>` lists a section's keys, `engine help <section>.<key>` explains one, and\n"
       "docs/recipe-reference.md has them all.\n\n"
       "Composition: `base: path.yaml` or `base: [a.yaml, b.yaml]` (relative to the recipe) loads those\n"
       "recipes first, in order; the recipe's own keys go on top. Maps merge key by key; lists and\n"
       "scalars are replaced whole. Cycles are errors.\n\n"
       "Editor support: start the file with\n"
       "  # yaml-language-server: $schema=<path to>/schemas/recipe.schema.json\n"},
      {"overrides",
       "After the recipe path, each argument overrides one key:\n"
       "  engine validate recipe.yaml train.steps=100 optimizer.betas=[0.9,0.95]\n"
       "  engine validate recipe.yaml ~scheduler.min_lr        (delete: the default applies)\n"
       "Values are parsed as YAML. Overrides apply after all bases, in the order given. Errors in an\n"
       "override are reported at <command line>:N:C, the N-th override, column C.\n"},
      {"batch",
       "global_batch_size = micro_batch_size x gradient_accumulation_steps x world_size.\n"
       "Any two of the three recipe keys determine the third (leave it `auto`); with only\n"
       "micro_batch_size set, gradient_accumulation_steps is 1. world_size comes from --world-size, or\n"
       "from mpirun's environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE), or is 1.\n"},
      {"checkpoints",
       "With checkpoint.every_steps (or every_minutes, or at_end), `engine train` writes checkpoints to\n"
       "checkpoint.dir (default <run dir>/checkpoints): step-N/ holds one rank-NNNNN.bin per rank and\n"
       "manifest.json, written last; a .tmp-step-N/ directory is a write that never finished and is ignored.\n"
       "  engine checkpoint list DIR          every checkpoint in DIR (or a run directory's checkpoints/)\n"
       "  engine checkpoint inspect CKPT      one checkpoint: step, world, training state, files, tensors\n"
       "  engine checkpoint verify CKPT|DIR   check every rank file's size and checksum; exit 2 naming\n"
       "                                      each damaged file\n"
       "  engine export CKPT|DIR OUT.safetensors   a checkpoint's weights (a directory: its latest)\n"
       "  engine train RECIPE --resume [PATH]      continue from one, at any world size and ZeRO stage\n"},
      {"exit-codes",
       "0  success\n"
       "1  internal error: a bug in the engine; please report it with the message\n"
       "2  user error: a recipe, override, file or command-line mistake, explained in the message; also a\n"
       "   run that does not fit in memory (refused before training, or out of memory while it ran)\n"
       "3  regression: `engine golden check` found training behaviour that differs from its golden file\n"
       "4  a rank was lost: a collective did not complete within distributed.timeout\n"
       "75 preempted: SIGTERM, SIGINT or SIGUSR1 stopped training after a checkpoint; requeue the job and it\n"
       "   resumes (--resume, or checkpoint.resume: auto)\n"},
  };
  return text;
}

void print_section(const SectionSpec& section) {
  std::cout << section.name << ": " << section.help << "\n\n";
  for (const auto& key : section.keys) {
    std::cout << "  " << key.name << "  (" << key.expectation();
    if (key.required)
      std::cout << ", required";
    else if (key.default_value && key.default_note.empty())
      std::cout << ", default " << format_value(*key.default_value);
    else if (!key.default_note.empty())
      std::cout << ", default: " << key.default_note;
    std::cout << ")\n      " << key.help << "\n";
  }
}

void print_key(const KeySpec& key) {
  std::cout << key.path() << "\n  " << key.help << "\n  expects: " << key.expectation() << "\n";
  if (!key.unit.empty()) std::cout << "  unit: " << key.unit << "\n";
  if (key.required) std::cout << "  required\n";
  if (key.default_value && key.default_note.empty())
    std::cout << "  default: " << format_value(*key.default_value) << "\n";
  if (!key.default_note.empty()) std::cout << "  default: " << key.default_note << "\n";
  if (key.applies_when) {
    std::cout << "  only when " << key.section << "." << key.applies_when->key << " is";
    for (const auto& v : key.applies_when->values) std::cout << " " << v;
    std::cout << "\n";
  }
}

}  // namespace

int help(const std::string& topic) {
  const Schema& schema = Schema::engine();
  if (topic.empty()) {
    std::cout << "engine: a declarative training engine driven by YAML recipes.\n\n"
                 "commands:\n"
                 "  engine train RECIPE [OVERRIDES...]      train; outputs in <run.output_dir>/<run.name>\n"
                 "  engine plan RECIPE [OVERRIDES...]       parameters, FLOPs and the exact memory plan\n"
                 "    [--host-memory SIZE] [--device-memory SIZE|auto] [--nvme SIZE] [--fit]\n"
                 "                                          every stage/offload/checkpointing/micro-batch against\n"
                 "                                          the budgets; --fit: the fastest that fits as overrides\n"
                 "  engine export RUN_DIR OUT.safetensors   a run's final weights (or a checkpoint's)\n"
                 "  engine checkpoint list|inspect|verify   a run's checkpoints (engine help checkpoints)\n"
                 "  engine golden record|check|update R...  golden-recipe regression tests (observe: other machines)\n"
                 "  engine report RUN_DIR... [--output F]   an HTML report of runs (charts; several: compared)\n"
                 "  engine generate RUN_DIR --prompt TEXT   sample from a model (bytes, or --tokenizer DIR's ids)\n"
                 "  engine eval RECIPE --weights W          the validation loss of weights, without training\n"
                 "  engine validate RECIPE [OVERRIDES...]   check a recipe; all errors at once\n"
                 "  engine config RECIPE [OVERRIDES...]     print the resolved recipe (--diff: only changes)\n"
                 "  engine schema [--markdown]              JSON Schema of recipes (or the reference page)\n"
                 "  engine help TOPIC                       this help, for a topic, section or key\n\n"
                 "topics:";
    for (const auto& [name, text] : topics()) std::cout << " " << name;
    std::cout << "\nsections:";
    for (const auto& section : schema.sections()) std::cout << " " << section.name;
    std::cout << "\n";
    return kExitOk;
  }
  if (auto it = topics().find(topic); it != topics().end()) {
    std::cout << it->second;
    return kExitOk;
  }
  if (const SectionSpec* section = schema.find_section(topic)) {
    print_section(*section);
    return kExitOk;
  }
  if (const KeySpec* key = schema.find_key(topic)) {
    print_key(*key);
    return kExitOk;
  }
  std::vector<std::string> names;
  for (const auto& [name, text] : topics()) names.push_back(name);
  for (const auto& section : schema.sections()) {
    names.push_back(section.name);
    for (const auto& key : section.keys) names.push_back(key.path());
  }
  auto match = closest_match(topic, names);
  throw UserError("no help topic '" + topic + "'" + (match ? "; did you mean '" + *match + "'?" : "") +
                  " (run `engine help` for the list)");
}

}  // namespace engine::cli
