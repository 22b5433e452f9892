// Logging: the rank prefix, the level words, and quiet non-zero ranks.
#include "core/log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <map>
#include <sstream>

#include "core/error.h"
#include "core/launcher.h"

namespace engine::log {
namespace {

// Sets up logging into a string and restores a plain single-process logger afterwards.
class LogTest : public ::testing::Test {
 protected:
  std::ostringstream out;
  void init(int rank, int world, Level level) {
    init_logging(rank, world, level, std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  }
  void TearDown() override { init_logging(0, 1, Level::info); }
};

TEST_F(LogTest, ASingleProcessWritesInfoBareAndNamesOtherLevels) {
  init(0, 1, Level::info);
  spdlog::info("loss floor {:.2f}", 2.5);
  spdlog::warn("a warning");
  spdlog::error("a failure");
  spdlog::debug("not shown at info");
  EXPECT_EQ(out.str(), "loss floor 2.50\nwarning: a warning\nerror: a failure\n");
}

TEST_F(LogTest, SeveralRanksNameTheRankOnEveryLine) {
  init(1, 4, Level::info);
  spdlog::info("note");
  spdlog::warn("careful");
  verbatim(Level::error, "recipe.yaml:3:5: error: bad key");
  EXPECT_EQ(out.str(), "[rank 1/4] note\n[rank 1/4] warning: careful\n[rank 1/4] recipe.yaml:3:5: error: bad key\n");
  EXPECT_EQ(pattern(1, 4), "[rank 1/4] %*%v");
  EXPECT_EQ(pattern(0, 1), "%*%v");
}

TEST_F(LogTest, VerbatimTextHasNoLevelPrefix) {
  init(0, 1, Level::info);
  verbatim(Level::error, "internal error: x\nThis is a bug in the engine; please report it.");
  EXPECT_EQ(out.str(), "internal error: x\nThis is a bug in the engine; please report it.\n");
}

TEST_F(LogTest, DebugLevelShowsDebugLines) {
  init(0, 1, Level::debug);
  spdlog::debug("2 threads");
  spdlog::trace("hidden");
  EXPECT_EQ(out.str(), "debug: 2 threads\n");
}

TEST(LogLevel, ParsesTheFiveWords) {
  EXPECT_EQ(parse_level("trace", "--log-level"), Level::trace);
  EXPECT_EQ(parse_level("debug", "--log-level"), Level::debug);
  EXPECT_EQ(parse_level("info", "--log-level"), Level::info);
  EXPECT_EQ(parse_level("warning", "--log-level"), Level::warning);
  EXPECT_EQ(parse_level("warn", "--log-level"), Level::warning);
  EXPECT_EQ(parse_level("error", "--log-level"), Level::error);
}

TEST(LogLevel, ABadLevelNamesItsSourceAndTheChoices) {
  try {
    parse_level("loud", "ENGINE_LOG_LEVEL");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "ENGINE_LOG_LEVEL \"loud\" is not a log level: expected trace, debug, info, warning or error");
  }
  EXPECT_THROW(parse_level("", "--log-level"), UserError);
  EXPECT_THROW(parse_level("INFO", "--log-level"), UserError);
}

TEST(LogLevel, NonZeroRanksDefaultToWarnings) {
  EXPECT_EQ(level_for_rank(0, "", nullptr), Level::info);
  EXPECT_EQ(level_for_rank(1, "", nullptr), Level::warning);
  EXPECT_EQ(level_for_rank(3, "info", nullptr), Level::info);    // asked for: every rank follows
  EXPECT_EQ(level_for_rank(3, "", "debug"), Level::debug);       // ENGINE_LOG_LEVEL too
  EXPECT_EQ(level_for_rank(0, "error", "debug"), Level::error);  // the option wins
  EXPECT_THROW(level_for_rank(0, "", "chatty"), UserError);
}

TEST_F(LogTest, AQuietRankStillWarns) {
  init(2, 4, level_for_rank(2, "", nullptr));
  spdlog::info("note every rank would print");
  spdlog::warn("disk almost full");
  EXPECT_EQ(out.str(), "[rank 2/4] warning: disk almost full\n");
}

TEST(Launch, RankAndWorldFromTheLauncher) {
  auto env = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  Launch none = launch_from_environment(env({}));
  EXPECT_EQ(none.rank, 0);
  EXPECT_EQ(none.world_size, 1);
  Launch ompi = launch_from_environment(env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_EQ(ompi.rank, 3);
  EXPECT_EQ(ompi.world_size, 4);
  Launch pmi = launch_from_environment(env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  EXPECT_EQ(pmi.rank, 1);
  EXPECT_EQ(pmi.world_size, 2);
  EXPECT_EQ(launch_from_environment(env({{"OMPI_COMM_WORLD_SIZE", "abc"}})).world_size, 1);
}

}  // namespace
}  // namespace engine::log
