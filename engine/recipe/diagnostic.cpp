#include "recipe/diagnostic.h"

#include <algorithm>
#include <tuple>

namespace engine::recipe {

int Mark::character_column() const {
  if (!origin || !origin->text || offset < 0 || size_t(offset) > origin->text->size()) return column;
  const std::string& text = *origin->text;
  size_t line_start = size_t(offset) - size_t(std::max(0, column - 1));
  if (line_start > size_t(offset)) return column;
  int characters = 1;
  for (size_t i = line_start; i < size_t(offset); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++characters;
  return characters;
}

std::string Mark::str() const {
  std::string out = origin ? origin->name : std::string("<unknown>");
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(character_column());
  return out;
}

std::string Diagnostic::str() const {
  std::string out = mark.str() + ": error: ";
  if (!key.empty()) out += key + ": ";
  out += message;
  for (const auto& note : notes) out += "\n  note: " + note;
  if (mark.origin && !mark.origin->included_from.empty())
    out += "\n  note: " + mark.origin->name + " is a base of " + mark.origin->included_from;
  return out;
}

std::string render_diagnostics(const std::vector<Diagnostic>& diagnostics, size_t limit) {
  std::string out;
  for (size_t i = 0; i < diagnostics.size() && i < limit; ++i) {
    if (i) out += "\n";
    out += diagnostics[i].str();
  }
  if (diagnostics.size() > limit) out += "\n... and " + std::to_string(diagnostics.size() - limit) + " more errors";
  return out;
}

RecipeError::RecipeError(std::vector<Diagnostic> diagnostics)
    : UserError(render_diagnostics(diagnostics)), diagnostics_(std::move(diagnostics)) {}

void DiagnosticSink::error(const Mark& mark, std::string key, std::string message, std::vector<std::string> notes) {
  diagnostics_.push_back({mark, std::move(key), std::move(message), std::move(notes)});
}

void DiagnosticSink::throw_if_any() {
  if (diagnostics_.empty()) return;
  // In reading order: by file, then position. The command line (line = override number) sorts apart.
  std::stable_sort(diagnostics_.begin(), diagnostics_.end(), [](const Diagnostic& a, const Diagnostic& b) {
    auto name = [](const Diagnostic& d) { return d.mark.origin ? d.mark.origin->name : std::string(); };
    return std::tuple(name(a), a.mark.line, a.mark.column) < std::tuple(name(b), b.mark.line, b.mark.column);
  });
  throw RecipeError(std::move(diagnostics_));
}

}  // namespace engine::recipe
