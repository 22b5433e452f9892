#include "core/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "core/error.h"

namespace engine::log {

namespace {

constexpr const char* kVerbatimLogger = "verbatim";

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace:
      return spdlog::level::trace;
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warning:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

// %*: the level as the messages before spdlog wrote it ("warning: "), nothing for info, so a
// single process's notes look as they always did; nothing for the verbatim logger either.
class LevelPrefix : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    if (msg.logger_name == kVerbatimLogger) return;
    std::string_view prefix;
    switch (msg.level) {
      case spdlog::level::trace:
        prefix = "trace: ";
        break;
      case spdlog::level::debug:
        prefix = "debug: ";
        break;
      case spdlog::level::warn:
        prefix = "warning: ";
        break;
      case spdlog::level::err:
        prefix = "error: ";
        break;
      case spdlog::level::critical:
        prefix = "critical: ";
        break;
      default:
        break;
    }
    dest.append(prefix.data(), prefix.data() + prefix.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<LevelPrefix>(); }
};

}  // namespace

Level parse_level(std::string_view text, std::string_view source) {
  if (text == "trace") return Level::trace;
  if (text == "debug") return Level::debug;
  if (text == "info") return Level::info;
  if (text == "warning" || text == "warn") return Level::warning;
  if (text == "error") return Level::error;
  throw UserError(std::string(source) + " \"" + std::string(text) +
                  "\" is not a log level: expected trace, debug, info, warning or error");
}

Level level_for_rank(int rank, std::string_view option, const char* environment) {
  if (!option.empty()) return parse_level(option, "--log-level");
  if (environment) return parse_level(environment, "ENGINE_LOG_LEVEL");
  return rank == 0 ? Level::info : Level::warning;
}

std::string pattern(int rank, int world_size) {
  if (world_size <= 1) return "%*%v";
  return "[rank " + std::to_string(rank) + "/" + std::to_string(world_size) + "] %*%v";
}

void init_logging(int rank, int world_size, Level level, spdlog::sink_ptr sink) {
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<LevelPrefix>('*').set_pattern(pattern(rank, world_size));
  sink->set_formatter(std::move(formatter));
  sink->set_level(spdlog::level::trace);  // the loggers decide

  // Both loggers share the sink (one lock, one formatter), so their lines never interleave.
  auto logger = std::make_shared<spdlog::logger>("", sink);
  auto plain = std::make_shared<spdlog::logger>(kVerbatimLogger, sink);
  for (auto* l : {&logger, &plain}) {
    (*l)->set_level(to_spdlog(level));
    (*l)->flush_on(spdlog::level::trace);
  }
  spdlog::drop(kVerbatimLogger);
  spdlog::register_logger(plain);
  spdlog::set_default_logger(logger);
}

void verbatim(Level level, std::string_view text) {
  std::shared_ptr<spdlog::logger> plain = spdlog::get(kVerbatimLogger);
  if (!plain) {  // logging was never set up: behave as a single process at info level
    init_logging(0, 1, Level::info);
    plain = spdlog::get(kVerbatimLogger);
  }
  plain->log(to_spdlog(level), "{}", text);
}

}  // namespace engine::log
