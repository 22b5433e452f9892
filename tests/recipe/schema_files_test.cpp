// The committed schema and reference page are exactly what the engine generates, and every recipe
// shipped in recipes/ validates.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../temp_dir.h"
#include "recipe/export.h"
#include "recipe_test_util.h"

namespace engine::recipe::testing {
namespace {

namespace fs = std::filesystem;
const fs::path kSource = ENGINE_SOURCE_DIR;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SchemaFiles, CommittedJsonSchemaIsGenerated) {
  EXPECT_EQ(read_file(kSource / "schemas/recipe.schema.json"), json_schema(Schema::engine()))
      << "regenerate with: build/engine schema > schemas/recipe.schema.json";
}

TEST(SchemaFiles, CommittedReferencePageIsGenerated) {
  EXPECT_EQ(read_file(kSource / "docs/recipe-reference.md"), markdown_reference(Schema::engine()))
      << "regenerate with: build/engine schema --markdown > docs/recipe-reference.md";
}

TEST(SchemaFiles, EveryShippedRecipeValidates) {
  int count = 0;
  for (const auto& entry : fs::recursive_directory_iterator(kSource / "recipes")) {
    // recipes/common/ holds partial recipes meant only as bases.
    if (entry.path().extension() != ".yaml" || entry.path().parent_path().filename() == "common") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_recipe(entry.path())) << [&] {
      try {
        load_recipe(entry.path());
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string();
    }();
    ++count;
  }
  EXPECT_GE(count, 4);
}

TEST(SchemaFiles, EveryKeyIsDocumented) {
  for (const auto& section : Schema::engine().sections()) {
    EXPECT_FALSE(section.help.empty()) << section.name;
    for (const auto& key : section.keys) {
      EXPECT_FALSE(key.help.empty()) << key.path();
      EXPECT_TRUE(key.required || key.default_value || !key.default_note.empty()) << key.path() << " has no default";
      if (key.kind == ValueKind::Enum) {
        EXPECT_FALSE(key.choices.empty()) << key.path();
      }
      if (key.applies_when) {
        const KeySpec* selector = section.find(key.applies_when->key);
        ASSERT_NE(selector, nullptr) << key.path();
        for (const auto& value : key.applies_when->values)
          EXPECT_NE(std::find(selector->choices.begin(), selector->choices.end(), value), selector->choices.end())
              << key.path() << " names unknown " << value;
      }
    }
  }
}

TEST(SchemaFiles, ConfigOutputLoadsBackUnderAnotherWorldSize) {
  LoadOptions four;
  four.world = WorldSize{4, "test"};
  LoadedRecipe first = load_recipe(kSource / "recipes/examples/gpt-engine-readme.yaml", four);
  const ::engine::testing::TempDir scratch("config_world");
  fs::path dumped = scratch / "config.yaml";  // elsewhere: paths must be absolute
  std::ofstream(dumped) << dump_recipe(first, Schema::engine(), false);
  LoadedRecipe second = load_recipe(dumped);
  EXPECT_EQ(*second.recipe.train.global_batch_size, 32);  // micro 16 x accumulation 2 x 1 rank
  EXPECT_EQ(second.recipe.data.path, first.recipe.data.path.lexically_normal());
}

TEST(SchemaFiles, ConfigOutputLoadsBackToTheSameRecipe) {
  LoadedRecipe first = load_recipe(kSource / "recipes/quickstart.yaml");
  const ::engine::testing::TempDir scratch("config_roundtrip");
  fs::path dumped = scratch / "config.yaml";
  std::ofstream(dumped) << dump_recipe(first, Schema::engine(), false);
  LoadedRecipe second = load_recipe(dumped);
  EXPECT_EQ(dump_recipe(first, Schema::engine(), false), dump_recipe(second, Schema::engine(), false));
}

}  // namespace
}  // namespace engine::recipe::testing
