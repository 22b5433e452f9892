// Logging: the engine's diagnostics on stderr through spdlog's default logger.
//
// A single process writes messages as it always has: info lines bare, others prefixed with their
// level ("warning: ...", "error: ..."). With more than one rank every line names its rank, and
// ranks other than 0 show only warnings and errors unless a level was asked for, so that N ranks
// do not print N copies of every note:
//
//   log::init_logging(launch.rank, launch.world_size, log::level_for_rank(launch.rank, option, env));
//   spdlog::info("loss floor {:.4f}", floor);     // "loss floor 2.1042"
//   spdlog::warn("{} is deprecated", key);         // "[rank 1/4] warning: train.x is deprecated"
//   log::verbatim(log::Level::error, report);      // text that carries its own "file:line: error:"
//
// Command output (summaries, tables, the progress line) stays on stdout and is not logged.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string>
#include <string_view>

namespace engine::log {

enum class Level { trace, debug, info, warning, error };

// "trace", "debug", "info", "warning" (or "warn"), "error"; anything else is a UserError that
// names `source` ("--log-level", "ENGINE_LOG_LEVEL") and the accepted words.
Level parse_level(std::string_view text, std::string_view source);

// The level a rank runs at: the --log-level option when given (non-empty), else ENGINE_LOG_LEVEL
// when set (`environment` is its value or nullptr), else info on rank 0 and warning on the others.
Level level_for_rank(int rank, std::string_view option, const char* environment);

// The spdlog pattern for this rank: "%*%v" for a single process, "[rank 1/4] %*%v" otherwise
// (%* is the level prefix: empty for info and for verbatim text, "warning: " and so on otherwise).
std::string pattern(int rank, int world_size);

// Makes spdlog's default logger write to `sink` (stderr when null) with pattern(rank, world_size)
// at `level`. Call again to change any of them; messages are flushed line by line.
void init_logging(int rank, int world_size, Level level, spdlog::sink_ptr sink = nullptr);

// Writes `text` at `level` without a level prefix (the rank prefix stays when world_size > 1).
void verbatim(Level level, std::string_view text);

}  // namespace engine::log
