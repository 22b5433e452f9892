// engine: the entry point. Sets up the process (floating-point mode, threads, logging), runs the
// command line (cli/command_line.h) and maps failures to the documented exit codes: 2 for user
// errors, 1 for internal errors (see cli/commands.h).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <new>
#include <string>

#include <unistd.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "cli/command_line.h"
#include "cli/commands.h"
#include "core/cpu_budget.h"
#include "core/error.h"
#include "core/launcher.h"
#include "core/log.h"
#include "core/memory_limit.h"
#include "core/openmp_wait.h"
#include "recipe/diagnostic.h"

namespace {

// The error went to stderr; where stdout goes elsewhere (a log file, a pipe), its last line would
// otherwise be whatever the command printed before it failed ("recipe.yaml: ok: ..."), so it gets
// the failure's first line too. On one terminal the user already sees the error.
int failed(int code, const std::string& message) {
  if (!(isatty(STDOUT_FILENO) && isatty(STDERR_FILENO))) {
    std::cout.flush();
    std::printf("failed (exit %d): %s\n", code, message.substr(0, message.find('\n')).c_str());
    std::fflush(stdout);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
#if defined(__x86_64__)
  // Flush denormals to zero (FTZ) and treat denormal inputs as zero (DAZ): tiny optimizer moments
  // and gradients would otherwise run ~100x slower. Set before any thread starts, so the OpenMP
  // and loader threads inherit it.
  _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
  engine::limit_openmp_spinning(argv);  // may re-execute: libgomp reads its settings when loaded
  // Before any OpenMP region: one share of this machine's cores per rank (see docs/threads.md).
  const engine::ThreadChoice threads = engine::apply_cpu_budget();
  const engine::Launch launch = engine::launch_from_environment();
  engine::log::init_logging(launch.rank, launch.world_size, engine::log::Level::info);  // until --log-level is read
  using engine::log::Level, engine::log::verbatim;
  try {
    return engine::cli::run_command_line(argc, argv, launch, threads);
  } catch (const engine::recipe::RecipeError& e) {
    size_t count = e.diagnostics().size();
    verbatim(Level::error, std::string(e.what()) + "\n" + std::to_string(count) + (count == 1 ? " error" : " errors"));
    return failed(engine::cli::kExitUser, e.what());
  } catch (const engine::UserError& e) {
    spdlog::error("{}", e.what());
    return failed(engine::cli::kExitUser, e.what());
  } catch (const std::bad_alloc&) {
    // Not a bug: the machine, its cgroup or ulimit gave less memory than the run needed.
    try {
      spdlog::error("{}", engine::out_of_memory_message());
    } catch (...) {  // too little memory even for the message
      std::fputs("error: out of memory (std::bad_alloc)\n", stderr);
    }
    return failed(engine::cli::kExitUser, "out of memory");
  } catch (const std::exception& e) {
    verbatim(Level::error,
             std::string("internal error: ") + e.what() + "\nThis is a bug in the engine; please report it.");
    return failed(engine::cli::kExitInternal, std::string("internal error: ") + e.what());
  }
}
