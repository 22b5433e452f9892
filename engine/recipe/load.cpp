#include "recipe/load.h"

#include <cstdlib>

#include "recipe/compose.h"
#include "recipe/rules.h"
#include "recipe/validate.h"

namespace engine::recipe {

WorldSize world_size_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    if (!value) continue;
    char* end = nullptr;
    long long size = std::strtoll(value, &end, 10);
    if (end && *end == '\0' && size >= 1)
      return WorldSize{size, std::string("the environment (") + name + "=" + value + ")"};
  }
  return WorldSize{};
}

LoadedRecipe load_recipe(const std::filesystem::path& path, const LoadOptions& options) {
  FileSourceReader files;
  const SourceReader& reader = options.reader ? *options.reader : files;

  LoadedRecipe loaded;
  loaded.path = path;
  loaded.world = options.world;
  YamlNode root = compose_recipe(path, reader);
  std::vector<DeletedKey> deleted = apply_overrides(root, options.overrides);
  loaded.document = Mark{std::make_shared<Origin>(Origin{path.string(), ""}), 1, 1};

  DiagnosticSink sink;
  validate_tree(root, Schema::engine(), deleted, loaded, sink);
  std::set<std::string> broken_sections;
  for (const Diagnostic& d : sink.diagnostics()) broken_sections.insert(d.key.substr(0, d.key.find('.')));
  apply_rules(loaded, sink, broken_sections);
  sink.throw_if_any();
  return loaded;
}

}  // namespace engine::recipe
