// Hostile input: every file in tests/recipe/hostile/ plus generated monsters (10^5-deep nesting, a
// 100 MB file, a directory) must give a clear user error: no crash, no hang, bounded memory. The
// same test binary runs under ASan/UBSan in the `fuzz` build.
#include <filesystem>
#include <fstream>

#include "../temp_dir.h"
#include "recipe_test_util.h"

namespace engine::recipe::testing {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(ENGINE_SOURCE_DIR) / "tests/recipe/hostile";

// Loads `path` and returns the user-facing message; fails if it loads or fails any other way.
std::string user_error_of(const fs::path& path) {
  try {
    load_recipe(path);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " loaded without error";
  return "";
}

fs::path scratch_dir() {
  static const ::engine::testing::TempDir dir("hostile");
  return dir.path();
}

struct CorpusCase {
  const char* file;
  const char* message;
};

class HostileCorpus : public ::testing::TestWithParam<CorpusCase> {};

TEST_P(HostileCorpus, GivesAClearError) {
  const CorpusCase& c = GetParam();
  std::string message = user_error_of(kCorpus / c.file);
  EXPECT_NE(message.find(c.message), std::string::npos) << message;
  EXPECT_NE(message.find(c.file), std::string::npos) << "the message should name the file: " << message;
}

INSTANTIATE_TEST_SUITE_P(
    Files, HostileCorpus,
    ::testing::Values(CorpusCase{"billion_laughs.yaml", "alias bomb"}, CorpusCase{"cyclic_alias.yaml", "cyclic alias"},
                      CorpusCase{"cyclic_alias_flow.yaml", "cyclic alias"}, CorpusCase{"empty.yaml", "recipe is empty"},
                      CorpusCase{"comment_only.yaml", "recipe is empty"}, CorpusCase{"garbage.bin", "not a text file"},
                      CorpusCase{"invalid_utf8.yaml", "invalid UTF-8 at offset 19"},
                      CorpusCase{"two_documents.yaml", "one YAML document"},
                      CorpusCase{"foreign_tag.yaml", "tags such as"},
                      CorpusCase{"complex_key.yaml", "keys must be plain names"},
                      CorpusCase{"merge_key.yaml", "merge keys"}, CorpusCase{"unclosed.yaml", "invalid YAML"},
                      CorpusCase{"top_level_list.yaml", "a recipe is a map of sections"},
                      CorpusCase{"top_level_scalar.yaml", "a recipe is a map of sections"}),
    [](const auto& param_info) {
      std::string name = param_info.param.file;
      for (char& ch : name)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return name;
    });

TEST(HostileGenerated, HundredThousandDeepFlowSequence) {
  fs::path path = scratch_dir() / "deep_seq.yaml";
  std::ofstream(path) << "model: " << std::string(100'000, '[') << std::string(100'000, ']') << "\n";
  EXPECT_NE(user_error_of(path).find("nesting deeper than"), std::string::npos);
}

TEST(HostileGenerated, HundredThousandDeepFlowMap) {
  fs::path path = scratch_dir() / "deep_map.yaml";
  std::ofstream out(path);
  for (int i = 0; i < 100'000; ++i) out << "{a: ";
  out << "1";
  for (int i = 0; i < 100'000; ++i) out << "}";
  out << "\n";
  out.close();
  EXPECT_NE(user_error_of(path).find("nesting deeper than"), std::string::npos);
}

TEST(HostileGenerated, DeepBlockNestingJustPastTheLimit) {
  fs::path path = scratch_dir() / "deep_block.yaml";
  std::ofstream out(path);
  for (int i = 0; i < 70; ++i) out << std::string(static_cast<size_t>(2 * i), ' ') << "k:\n";
  out.close();
  std::string message = user_error_of(path);
  EXPECT_NE(message.find("nesting deeper than 64 levels"), std::string::npos) << message;
  EXPECT_NE(message.find(":65:"), std::string::npos) << "should point at the line that is too deep: " << message;
}

TEST(HostileGenerated, HundredMegabyteFileIsRefusedBeforeReading) {
  fs::path path = scratch_dir() / "huge.yaml";
  {
    std::ofstream out(path);
    std::string line = "key: value value value value value value value value value value value\n";
    for (size_t written = 0; written < 100u << 20; written += line.size()) out << line;
  }
  std::string message = user_error_of(path);
  EXPECT_NE(message.find("recipes are limited to 1048576 bytes"), std::string::npos) << message;
  fs::remove(path);
}

TEST(HostileGenerated, DirectoryInsteadOfAFile) {
  EXPECT_NE(user_error_of(scratch_dir()).find("is a directory"), std::string::npos);
}

TEST(HostileGenerated, MissingFile) {
  EXPECT_NE(user_error_of(scratch_dir() / "nope.yaml").find("no such file"), std::string::npos);
}

TEST(HostileGenerated, ManyKeysInOneMapStayFast) {
  fs::path path = scratch_dir() / "wide.yaml";
  std::ofstream out(path);
  out << "model:\n";
  for (int i = 0; i < 40'000; ++i) out << "  k" << i << ": 1\n";
  out.close();
  std::string message = user_error_of(path);  // 40k unknown keys: reported, capped in the rendering
  EXPECT_NE(message.find("more errors"), std::string::npos);
}

TEST(HostileGenerated, ManyErrorsAreCappedWhenRendered) {
  std::string text;
  for (int i = 0; i < 500; ++i) text += "x" + std::to_string(i) + ": 1\n";
  auto errors = recipe(text).errors();
  EXPECT_GE(errors.size(), 500u);
  std::string rendered = RecipeError(errors).what();
  EXPECT_NE(rendered.find("... and"), std::string::npos);
}

TEST(HostileGenerated, AliasExpansionWithinBudgetIsFine) {
  Files files = recipe(std::string(kValidRecipe) + "optimizer: &o {lr: 0.001}\n");
  EXPECT_DOUBLE_EQ(files.load().recipe.optimizer.lr, 0.001);
}

}  // namespace
}  // namespace engine::recipe::testing
