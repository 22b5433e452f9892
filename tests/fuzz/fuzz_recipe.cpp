// libFuzzer target over the whole load-and-validate path: YAML parsing, bases, overrides, schema
// validation and cross-field rules. The input is split into up to three parts by lines holding
// only "#%%": the recipe, a base it may name as `base: base.yaml`, and overrides (one per line).
// A UserError (including RecipeError) is the expected answer to bad input; anything else (a crash,
// a sanitizer report, an InternalError or another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "recipe/export.h"
#include "recipe/load.h"

namespace {

std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (parts.size() < 2) {
    size_t at = text.find(separator, start);
    if (at == std::string::npos) break;
    parts.push_back(text.substr(start, at - start));
    start = at + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace engine::recipe;
  std::vector<std::string> parts = split(std::string(reinterpret_cast<const char*>(data), size), "\n#%%\n");
  MemorySourceReader reader;
  reader.add("main.yaml", parts[0]);
  if (parts.size() > 1) reader.add("base.yaml", parts[1]);
  LoadOptions options;
  options.reader = &reader;
  if (parts.size() > 2) {
    size_t start = 0;
    while (start <= parts[2].size() && options.overrides.size() < 16) {
      size_t end = parts[2].find('\n', start);
      if (end == std::string::npos) end = parts[2].size();
      if (end > start) options.overrides.push_back(parts[2].substr(start, end - start));
      start = end + 1;
    }
  }
  try {
    LoadedRecipe loaded = load_recipe("main.yaml", options);
    (void)dump_recipe(loaded, Schema::engine(), false);  // a loaded recipe must always print
  } catch (const engine::UserError&) {
    // the expected answer to bad input
  }
  return 0;
}
