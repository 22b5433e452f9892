// Chart scaling and drawing: round ticks, log and linear axes, tick labels, unique colours and the
// attributes a screenshot test finds series by.
#include "report/svg_chart.h"

#include <gtest/gtest.h>

#include <regex>

namespace engine::report {
namespace {

TEST(Ticks, LinearTicksAreRoundAndEncloseTheData) {
  EXPECT_EQ(linear_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(linear_ticks(1, 400, 6), (std::vector<double>{0, 100, 200, 300, 400}));
  EXPECT_EQ(linear_ticks(2.13, 5.41, 5), (std::vector<double>{2, 3, 4, 5, 6}));
  const auto small = linear_ticks(-0.3, 0.25, 5);
  ASSERT_EQ(small.size(), 5u);
  EXPECT_DOUBLE_EQ(small.front(), -0.4);
  EXPECT_DOUBLE_EQ(small.back(), 0.4);
  EXPECT_EQ(small[2], 0.0);  // exactly zero, not 5.5e-17
}

TEST(Ticks, LogTicksArePowersOfTenWithInBetweensForNarrowRanges) {
  EXPECT_EQ(log_ticks(3, 4000), (std::vector<double>{1, 10, 100, 1000, 10000}));
  EXPECT_EQ(log_ticks(3, 40), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
}

TEST(Scale, MapsLinearAndLog) {
  const Scale lin = fit_scale({1, 7}, false, true);
  EXPECT_EQ(lin.lo, 0);
  EXPECT_EQ(lin.hi, 8);
  EXPECT_DOUBLE_EQ(lin.map(4, 100, 200), 150);
  const Scale log = fit_scale({0.5, 20, -1, 0}, true, false);  // non-positive values ignored
  EXPECT_DOUBLE_EQ(log.lo, 0.1);
  EXPECT_DOUBLE_EQ(log.hi, 100);
  EXPECT_DOUBLE_EQ(log.map(1, 0, 300), 100);
  EXPECT_DOUBLE_EQ(log.map(10, 0, 300), 200);
}

TEST(Scale, ConstantAndEmptyDataStillGetAnAxis) {
  const Scale constant = fit_scale({5, 5}, false, false);
  EXPECT_LT(constant.lo, 5);
  EXPECT_GT(constant.hi, 5);
  const Scale empty = fit_scale({}, false, false);
  EXPECT_LT(empty.lo, empty.hi);
}

TEST(Ticks, LabelsUseTheDigitsTheSpacingNeeds) {
  EXPECT_EQ(format_tick(0, 1), "0");
  EXPECT_EQ(format_tick(2.5, 0.5), "2.5");
  EXPECT_EQ(format_tick(3, 1), "3");
  EXPECT_EQ(format_tick(20000, 5000), "20k");
  EXPECT_EQ(format_tick(22500, 2500), "22.5k");
  EXPECT_EQ(format_tick(1.5e6, 5e5), "1.5M");
  EXPECT_EQ(format_tick(3e-4, 1e-4), "3e-4");
  EXPECT_EQ(format_tick(2.5e-4, 5e-5), "2.5e-4");
}

TEST(ColourBook, EveryColourOnAPageIsUnique) {
  ColourBook book;
  std::set<std::string> seen;
  for (int chart = 0; chart < 20; ++chart)
    for (int run = 0; run < 3; ++run)
      for (int shade = 0; shade < 3; ++shade) {
        const std::string c = book.take(run, shade);
        EXPECT_TRUE(std::regex_match(c, std::regex("#[0-9a-f]{6}"))) << c;
        EXPECT_TRUE(seen.insert(c).second) << c;
      }
}

TEST(LineChart, EachSeriesIsOneTaggedElementWithItsColour) {
  LineChart chart;
  chart.title = "Loss <nats>";
  chart.series.push_back({"loss/loss/run a", "loss", "#123456", {1, 2, 3}, {3, 2, 1}});
  chart.series.push_back({"loss/val_loss/run a", "val", "#654321", {2}, {2.5}, false, true});
  chart.references.push_back({1.5, "floor"});
  const std::string svg = render_line_chart(chart);
  EXPECT_NE(svg.find("<g data-series=\"loss/loss/run a\" stroke=\"#123456\" stroke-width=\"2.5\""), std::string::npos);
  EXPECT_NE(svg.find("<g data-series=\"loss/val_loss/run a\" stroke=\"#654321\""), std::string::npos);
  EXPECT_NE(svg.find("Loss &lt;nats&gt;"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray=\"6 4\""), std::string::npos);  // the reference line
  EXPECT_NE(svg.find("<circle"), std::string::npos);                   // the single validation point
  EXPECT_EQ(svg.find("opacity"), std::string::npos);
}

}  // namespace
}  // namespace engine::report
