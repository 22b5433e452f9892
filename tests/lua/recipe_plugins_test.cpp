// `plugins:` in recipes: paths relative to the recipe, arguments checked against the parameters a
// plugin declares, every mistake with file:line:column and the key path.
#include "lua_test_util.h"
#include "recipe/export.h"

namespace engine::lua {
namespace {

using testing::temp_dir;
using testing::write_file;

const char* kBase =
    "model: {arch: mlp, n_layer: 1, input_dim: 4, hidden_dim: 8, num_classes: 3}\n"
    "data: {source: classification, num_samples: 64}\n"
    "train: {steps: 3, micro_batch_size: 4}\n";

const char* kPlugin =
    "params = {patience = {type = 'integer', default = 5, min = 1, help = 'Evaluations to wait.'},\n"
    "          metric = {type = 'string', choices = {'val_loss', 'loss'}}}\n"
    "function on_eval(state, metrics) end\n";

// Writes r.yaml (the base plus `plugins`) and plugins/p.lua; returns the recipe's path.
std::filesystem::path recipe_with(const std::string& plugins, const std::string& plugin = kPlugin) {
  auto dir = temp_dir();
  write_file(dir / "plugins" / "p.lua", plugin);
  return write_file(dir / "r.yaml", std::string(kBase) + plugins);
}

std::string load_error(const std::filesystem::path& recipe, std::vector<std::string> overrides = {}) {
  try {
    recipe::LoadOptions options;
    options.overrides = overrides;
    recipe::load_recipe(recipe, options);
  } catch (const recipe::RecipeError& e) {
    return e.what();
  }
  ADD_FAILURE() << "the recipe loaded";
  return "";
}

TEST(RecipePlugins, PathsAreRelativeToTheRecipe) {
  auto path = recipe_with("plugins:\n  - path: plugins/p.lua\n    args: {metric: loss}\n");
  auto loaded = recipe::load_recipe(path);
  ASSERT_EQ(loaded.recipe.plugins.size(), 1u);
  EXPECT_EQ(loaded.recipe.plugins[0].path, path.parent_path() / "plugins" / "p.lua");
  EXPECT_EQ(loaded.recipe.plugins[0].name, "plugins/p.lua");
}

TEST(RecipePlugins, ABarePathIsAnEntry) {
  auto path = recipe_with("plugins: [plugins/p.lua]\n", "function on_eval(state, m) end");
  EXPECT_EQ(recipe::load_recipe(path).recipe.plugins.size(), 1u);
}

TEST(RecipePlugins, MissingFileIsARecipeError) {
  auto message = load_error(recipe_with("plugins:\n  - path: plugins/nope.lua\n"));
  EXPECT_NE(message.find("r.yaml:5:11: error: plugins[0].path: file not found: "), std::string::npos) << message;
  EXPECT_NE(message.find("(relative to the recipe that names it)"), std::string::npos) << message;
}

TEST(RecipePlugins, ArgumentsAreCheckedAgainstDeclaredParameters) {
  auto message = load_error(recipe_with("plugins:\n  - path: plugins/p.lua\n    args: {patiense: 3, metric: los}\n"));
  EXPECT_NE(message.find("r.yaml:6:12: error: plugins[0].args.patiense: unknown plugin parameter"), std::string::npos)
      << message;
  EXPECT_NE(message.find("did you mean 'patience'?"), std::string::npos) << message;
  EXPECT_NE(message.find("r.yaml:6:33: error: plugins[0].args.metric: expected one of val_loss, loss, found \"los\""),
            std::string::npos)
      << message;

  message = load_error(recipe_with("plugins:\n  - path: plugins/p.lua\n    args: {patience: 0, metric: loss}\n"));
  EXPECT_NE(message.find("plugins[0].args.patience: expected an integer >= 1, found 0"), std::string::npos) << message;
  EXPECT_NE(message.find("note: Evaluations to wait."), std::string::npos) << message;

  message = load_error(recipe_with("plugins:\n  - path: plugins/p.lua\n"));
  EXPECT_NE(message.find("plugins[0].args.metric: missing required plugin parameter (one of val_loss, loss)"),
            std::string::npos)
      << message;
}

TEST(RecipePlugins, EntryMistakes) {
  auto message = load_error(recipe_with("plugins:\n  - path: plugins/p.lua\n    agrs: {}\n"));
  EXPECT_NE(message.find("r.yaml:6:5: error: plugins[0].agrs: unknown key"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'args'?"), std::string::npos) << message;
  message = load_error(recipe_with("plugins: {path: plugins/p.lua}\n"));
  EXPECT_NE(message.find("plugins: expected a list of plugins"), std::string::npos) << message;
  message = load_error(recipe_with("plugins:\n  - args: {}\n"));
  EXPECT_NE(message.find("plugins[0].path: missing required key"), std::string::npos) << message;
}

TEST(RecipePlugins, BrokenPluginsAreRecipeErrors) {
  auto message = load_error(recipe_with("plugins: [plugins/p.lua]\n", "function on_eval(\n"));
  EXPECT_NE(message.find("r.yaml:4:11: error: plugins[0].path: the plugin does not load: plugin plugins/p.lua, load: "
                         "plugins/p.lua:2:"),
            std::string::npos)
      << message;
  message = load_error(recipe_with("plugins: [plugins/p.lua]\n", "function on_evall(state) end\n"));
  EXPECT_NE(message.find("plugins/p.lua defines on_evall, which is not a hook"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean 'on_eval'?"), std::string::npos) << message;
}

TEST(RecipePlugins, OnlyOnePluginMayReplaceTheSchedule) {
  auto dir = temp_dir();
  write_file(dir / "a.lua", "function lr(step, base, state) return base end");
  write_file(dir / "b.lua", "function lr(step, base, state) return base end");
  auto message = load_error(write_file(dir / "r.yaml", std::string(kBase) + "plugins: [a.lua, b.lua]\n"));
  EXPECT_NE(message.find("plugins[1].path: b.lua defines lr, and so does a.lua"), std::string::npos) << message;
}

TEST(RecipePlugins, OverridesSetAndDeletePlugins) {
  auto path = recipe_with("plugins: [plugins/p.lua]\n", "function on_eval(state, m) end");
  recipe::LoadOptions options;
  options.overrides = {"~plugins"};
  EXPECT_TRUE(recipe::load_recipe(path, options).recipe.plugins.empty());
  auto message = load_error(path, {"plugins=[nowhere.lua]"});
  EXPECT_NE(message.find("<command line>:1:"), std::string::npos) << message;
  EXPECT_NE(message.find("(relative to the working directory)"), std::string::npos) << message;
}

TEST(RecipePlugins, ConfigWritesPluginsThatLoadBack) {
  auto path = recipe_with("plugins:\n  - path: plugins/p.lua\n    args: {metric: loss, patience: 2}\n");
  auto loaded = recipe::load_recipe(path);
  std::string dumped = recipe::dump_recipe(loaded, recipe::Schema::engine(), true);
  EXPECT_NE(dumped.find("plugins:\n  - path: " + (path.parent_path() / "plugins" / "p.lua").string() +
                        "\n    args: {metric: loss, patience: 2}"),
            std::string::npos)
      << dumped;
  auto again = write_file(path.parent_path() / "elsewhere" / "again.yaml",
                          recipe::dump_recipe(loaded, recipe::Schema::engine(), false));
  EXPECT_EQ(recipe::load_recipe(again).recipe.plugins.size(), 1u);
}

TEST(RecipePlugins, OnRecipeChangesAreValidatedLikeAnyRecipe) {
  auto path = recipe_with("plugins: [plugins/p.lua]\n",
                          "function on_recipe(r) return {train = {steps = r.train.steps * 2}} end");
  auto loaded = recipe::load_recipe(path);
  PluginSet set = PluginSet::from_recipe(loaded);
  std::vector<std::string> applied;
  auto changed = set.apply_on_recipe(loaded, &applied);
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->recipe.train.steps, 6);
  EXPECT_EQ(applied, (std::vector<std::string>{"plugins/p.lua: train.steps=6"}));

  auto bad = recipe_with("plugins: [plugins/p.lua]\n", "function on_recipe(r) return {train = {steps = -1}} end");
  auto bad_loaded = recipe::load_recipe(bad);
  PluginSet bad_set = PluginSet::from_recipe(bad_loaded);
  std::string message = testing::plugin_error([&] { bad_set.apply_on_recipe(bad_loaded); });
  EXPECT_NE(message.find("the recipe as changed by on_recipe (train.steps=-1) is not valid"), std::string::npos)
      << message;
  EXPECT_NE(message.find("train.steps: expected an integer >= 1, found '-1'"), std::string::npos) << message;
}

// Paths belong to the user: on_recipe cannot point the run's outputs, its data, its initial weights,
// its bases or its plugins somewhere else, by any spelling of the key. The error names the plugin
// and the key.
TEST(RecipePlugins, OnRecipeCannotMovePaths) {
  struct Case {
    const char* changes;  // what on_recipe returns
    const char* key;      // named in the error
  };
  const Case cases[] = {
      {"{run = {output_dir = '/srv/elsewhere'}}", "run.output_dir"},
      {"{['run.output_dir'] = '/srv/elsewhere'}", "run.output_dir"},
      {"{run = {output_dir = {nested = 1}}}", "run.output_dir"},
      {"{run = {name = '../../elsewhere'}}", "run.name"},
      {"{data = {path = '/etc/passwd'}}", "data.path"},
      {"{model = {init_from = '/srv/weights.safetensors'}}", "model.init_from"},
      {"{run = 'x'}", "'run' replaces the whole section, and run.name names a file"},
      {"{base = 'other.yaml'}", "base"},
      {"{plugins = {}}", "plugins"},
      // Override text in a key: would read as run.output_dir="evil" with the rest a YAML comment.
      {"{['run.output_dir=\"evil\" #'] = 1}", "'run.output_dir=\"evil\" #' is not a recipe key"},
      {"{['run.output_dir '] = 'x'}", "'run.output_dir ' is not a recipe key"},
  };
  for (const auto& c : cases) {
    auto path =
        recipe_with("plugins: [plugins/p.lua]\n", std::string("function on_recipe(r) return ") + c.changes + " end");
    auto loaded = recipe::load_recipe(path);
    PluginSet set = PluginSet::from_recipe(loaded);
    std::string message = testing::plugin_error([&] { set.apply_on_recipe(loaded); });
    EXPECT_NE(message.find("plugin plugins/p.lua, on_recipe: "), std::string::npos) << c.changes << ": " << message;
    EXPECT_NE(message.find(c.key), std::string::npos) << c.changes << ": " << message;
  }
}

// Every key that names a file is declared so; the declaration, not a list in the plugin host,
// decides what on_recipe may not touch.
TEST(RecipePlugins, PathKeysAreDeclaredFileSystem) {
  std::vector<std::string> keys;
  for (const auto& section : recipe::Schema::engine().sections())
    for (const auto& key : section.keys) {
      if (key.kind == recipe::ValueKind::Path) {
        EXPECT_TRUE(key.file_system) << key.path();
      }
      if (key.file_system) keys.push_back(key.path());
    }
  EXPECT_EQ(keys, (std::vector<std::string>{"run.name", "run.output_dir", "model.init_from", "data.path",
                                            "data.loss_mask", "checkpoint.dir", "offload.nvme_path", "lora.init_from"}));
}

// The last line of defence: any difference in a path between the recipe before and after on_recipe.
TEST(RecipePlugins, MovedPathsComparesEveryFileSystemKey) {
  auto path = recipe_with("");
  auto load = [&](std::vector<std::string> overrides) {
    recipe::LoadOptions options;
    options.overrides = std::move(overrides);
    return recipe::load_recipe(path, options).recipe;
  };
  const auto original = load({});
  EXPECT_TRUE(moved_paths(original, load({"train.steps=9"})).empty());
  EXPECT_EQ(moved_paths(original, load({"run.output_dir=/srv/x", "run.name=y"})),
            (std::vector<std::string>{"run.name: 'r' -> 'y'", "run.output_dir: 'runs' -> '/srv/x'"}));
  const auto weights = write_file(path.parent_path() / "w.safetensors", "");
  auto moved = moved_paths(original, load({"model.init_from=" + weights.string()}));
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].rfind("model.init_from: '' -> '", 0), 0u) << moved[0];
}

}  // namespace
}  // namespace engine::lua
