// The engine's command line: every subcommand's options (CLI11), each bound to its arguments and
// paired with the function that runs it (cli/commands.h). main.cpp calls run_command_line and maps
// what it throws to exit codes.
//
//   return engine::cli::run_command_line(argc, argv, launch, threads);
#pragma once

#include "core/cpu_budget.h"
#include "core/launcher.h"

namespace engine::cli {

int run_command_line(int argc, char** argv, const Launch& launch, const ThreadChoice& threads);

}  // namespace engine::cli
