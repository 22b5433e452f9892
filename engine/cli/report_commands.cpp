// engine report: an HTML page of one or more runs' metrics and a few lines per run on stdout.
#include <iostream>

#include "cli/commands.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "report/html_report.h"
#include "report/run_data.h"

namespace engine::cli {

int report(const std::vector<std::filesystem::path>& run_dirs, const std::filesystem::path& output) {
  if (run_dirs.empty()) throw UserError("engine report: name at least one run directory");
  std::vector<report::RunData> runs;
  for (const auto& dir : run_dirs) runs.push_back(report::read_run(dir));
  const std::filesystem::path destination = output.empty() ? run_dirs.front() / "report.html" : output;
  if (destination.has_parent_path() && !std::filesystem::is_directory(destination.parent_path()))
    throw UserError("cannot write " + destination.string() + ": no directory " + destination.parent_path().string());
  const std::string html = report::render_html(runs);
  write_file_atomically(destination, [&](std::ostream& out) { out << html; });
  std::cout << "report: " << destination.string() << "\n";
  for (const auto& run : runs) std::cout << report::text_summary(run);
  return kExitOk;
}

}  // namespace engine::cli
