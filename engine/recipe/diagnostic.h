// Diagnostic: one mistake in a recipe, with the place it was written.
//
// Every recipe error names where the offending text lives (file:line:column, or `<command line>`
// for an override), the key path it concerns, and what was expected against what was found:
//
//   recipes/gpt.yaml:12:23: error: train.micro_batch_size: expected an integer >= 1, found -4
//     note: recipes/gpt.yaml is the base of recipes/gpt-big.yaml:2:7
//
// Loading collects every diagnostic of a recipe and throws them together as a RecipeError, so a
// user sees all mistakes at once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace engine::recipe {

// Where a document came from: a file path as the user would write it, or "<command line>".
struct Origin {
  std::string name;
  std::string included_from;                // "child.yaml:2:7" when this file is a base of another; else empty
  std::shared_ptr<const std::string> text;  // the document, to count columns in characters
};

// A position in a document; line and column are 1-based, 0 when unknown. `column` counts bytes;
// str() reports characters (UTF-8 code points) when the document text is known.
struct Mark {
  std::shared_ptr<const Origin> origin;
  int line = 0;
  int column = 0;
  int offset = -1;  // byte offset in the document, -1 when unknown

  std::string str() const;  // "file:line:column"
  int character_column() const;
};

struct Diagnostic {
  Mark mark;
  std::string key;      // dotted key path ("train.steps"); empty for whole-document problems
  std::string message;  // "expected an integer >= 1, found -4"
  std::vector<std::string> notes;

  std::string str() const;
};

// All diagnostics of one recipe. what() renders them one per line, in the order found.
class RecipeError : public UserError {
 public:
  explicit RecipeError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

// Collects diagnostics while a recipe is processed; throw_if_any() raises them together.
class DiagnosticSink {
 public:
  void error(const Mark& mark, std::string key, std::string message, std::vector<std::string> notes = {});
  bool empty() const { return diagnostics_.empty(); }
  size_t size() const { return diagnostics_.size(); }
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }
  void throw_if_any();

 private:
  std::vector<Diagnostic> diagnostics_;
};

// Renders at most `limit` diagnostics followed by "... and N more errors".
std::string render_diagnostics(const std::vector<Diagnostic>& diagnostics, size_t limit = 50);

}  // namespace engine::recipe
