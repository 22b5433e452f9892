#include "recipe/load.h"

#include <cerrno>
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
    errno = 0;
    long long size = std::strtoll(value, &end, 10);
    if (errno != 0 || end == value || *end != '\0' || size < 1 || size > kMaxWorldSize)
      throw UserError(std::string("environment variable ") + name + "=" + value + " is not a world size (1 to " +
                      std::to_string(kMaxWorldSize) + ")");
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
  loaded.overrides = options.overrides;
  std::vector<Diagnostic> soft_errors;
  YamlNode root = compose_recipe(path, reader, soft_errors);
  DiagnosticSink sink;
  for (auto& d : soft_errors) sink.error(d.mark, d.key, d.message, d.notes);
  std::vector<DeletedKey> deleted = apply_overrides(root, options.overrides, sink);
  loaded.document = Mark{std::make_shared<Origin>(Origin{path.string(), "", nullptr}), 1, 1};

  validate_tree(root, Schema::engine(), deleted, loaded, sink, options.check_files);
  std::set<std::string> broken_sections;
  for (const Diagnostic& d : sink.diagnostics()) broken_sections.insert(d.key.substr(0, d.key.find('.')));
  apply_rules(loaded, sink, broken_sections);
  sink.throw_if_any();
  return loaded;
}

}  // namespace engine::recipe
