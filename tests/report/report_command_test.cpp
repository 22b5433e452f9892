// `engine report` end to end: the command's output and errors, and a screenshot of the page in
// headless Chromium in which every declared series must appear in its exact colour.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "../temp_dir.h"
#include "run_fixture.h"
#include "screenshot.h"

namespace engine::testing {
namespace {

// A series counts as drawn from this many pixels of its exact colour on: more than its legend
// swatch alone (a 20 x 3 line) can make.
constexpr int64_t kMinPixels = 200;
constexpr int kPageHeight = 4000;

struct Result {
  int status;
  std::string output;
};

Result engine(const std::string& args) {
  const std::string command = std::string(ENGINE_BINARY) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ReportCommand, WritesNextToTheFirstRunAndPrintsASummary) {
  TempDir dir("report_cmd");
  write_run(dir / "a");
  const Result r = engine("report " + (dir / "a").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("report: " + (dir / "a" / "report.html").string()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("steps 400, final loss 2.2500 (floor 2.2000)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step time 100.0 ms: op "), std::string::npos) << r.output;
  const std::string html = read(dir / "a" / "report.html");
  EXPECT_NE(html.find("<h1>Run report: " + (dir / "a").string() + "</h1>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://www.w3.org/2000/svg\" width"), html.find("http://www.w3.org/2000/svg"));  // only xmlns
  EXPECT_EQ(std::regex_search(html, std::regex("(src|href)=\"https?:")), false);
  EXPECT_NE(html.find("<details><summary>"), std::string::npos);
}

TEST(ReportCommand, ErrorsAreUserErrorsWithExitTwo) {
  TempDir dir("report_errors");
  Result r = engine("report " + (dir / "missing").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("run directory not found: " + (dir / "missing").string()), std::string::npos) << r.output;
  r = engine("report " + dir.path().string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("no metrics.jsonl in"), std::string::npos) << r.output;
  std::ofstream(dir / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": }\n";
  r = engine("report " + dir.path().string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find((dir / "metrics.jsonl").string() + ":2: not a JSON line"), std::string::npos) << r.output;
  EXPECT_EQ(engine("report").status, 2);  // no run directory
}

class Screenshot : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(find_chromium().empty())
        << "chromium is not installed: run scripts/setup (it installs the apt package chromium)";
  }
  ScreenshotCheck shoot(const std::string& html, const std::string& name, std::vector<SeriesColour> extra = {}) {
    const auto page = dir_ / (name + ".html");
    const auto png = dir_ / (name + ".png");
    std::ofstream(page) << html;
    std::string log;
    EXPECT_TRUE(screenshot(page, png, kPageHeight, dir_.path(), log)) << log;
    if (const char* keep = std::getenv("REPORT_SCREENSHOT_DIR"))
      std::filesystem::copy_file(png, std::filesystem::path(keep) / (name + ".png"),
                                 std::filesystem::copy_options::overwrite_existing);
    auto series = series_in(html);
    series.insert(series.end(), extra.begin(), extra.end());
    return check_screenshot(series, png, kMinPixels);
  }
  TempDir dir_{"report_shot"};
};

TEST_F(Screenshot, EverySeriesOfTwoComparedRunsIsDrawnInItsOwnColour) {
  write_run(dir_ / "run-a", 0);
  write_run(dir_ / "run-b", 1);
  const Result r = engine("report " + (dir_ / "run-a").string() + " " + (dir_ / "run-b").string() + " --output " +
                          (dir_ / "compare.html").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string html = read(dir_ / "compare.html");
  const auto series = series_in(html);
  // 14 line series and 2 breakdowns per run, each with a colour of its own.
  ASSERT_EQ(series.size(), 32u);
  std::set<std::string> colours, ids;
  for (const auto& s : series) {
    EXPECT_TRUE(colours.insert(s.colour).second) << s.id << " shares " << s.colour;
    EXPECT_TRUE(ids.insert(s.id).second) << s.id;
    EXPECT_TRUE(s.id.ends_with("/" + (dir_ / "run-a").string()) || s.id.ends_with("/" + (dir_ / "run-b").string()))
        << s.id;
  }
  const ScreenshotCheck check = shoot(html, "compare");
  EXPECT_TRUE(check.missing.empty()) << ::testing::PrintToString(check.missing) << "\n"
                                     << ::testing::PrintToString(check.pixels);
  EXPECT_GT(check.ink, 0.05);  // not a blank page
}

TEST_F(Screenshot, TheCheckFindsASeriesThatIsNotDrawn) {
  write_run(dir_ / "run", 0);
  ASSERT_EQ(engine("report " + (dir_ / "run").string()).status, 0);
  std::string html = read(dir_ / "run" / "report.html");
  const std::string lr = "lr/lr/" + (dir_ / "run").string();
  // A colour the page never uses, and a series whose line is removed (its legend swatch stays).
  const std::regex line("(<g data-series=\"" + lr + "\"[^>]*>)<polyline[^>]*>");
  ASSERT_TRUE(std::regex_search(html, line));
  html = std::regex_replace(html, line, "$1");
  const ScreenshotCheck check = shoot(html, "undrawn", {{"fake/series/none", "#010203"}});
  EXPECT_EQ(check.missing, (std::vector<std::string>{lr, "fake/series/none"}))
      << ::testing::PrintToString(check.pixels);
  EXPECT_GT(check.pixels.at(lr), 0);  // the swatch is there, under the minimum
  EXPECT_EQ(check.pixels.at("fake/series/none"), 0);
}

}  // namespace
}  // namespace engine::testing
