// Charts as inline SVG for `engine report`: line charts over steps and horizontal bar charts, with
// axes, ticks, labels and a legend, and nothing a browser would have to fetch or run.
//
// Every drawn series is one element carrying data-series="<chart>/<series>/<run>" and its colour as
// stroke="#rrggbb" (and fill for bars), at full opacity: a screenshot can then be searched for each
// series' exact colour. ColourBook hands out colours unique across a page, in one hue family per run.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace engine::report {

// A value axis: the domain [lo, hi] (nice round bounds), linear or log10, and its tick positions.
struct Scale {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> ticks;
  // Where `value` lands between pixel `from` (at lo) and pixel `to` (at hi).
  double map(double value, double from, double to) const;
};

// Round tick values (1, 2 or 5 times a power of ten apart), about `target` of them, whose first and
// last enclose [lo, hi].
std::vector<double> linear_ticks(double lo, double hi, int target = 5);
// Powers of ten enclosing [lo, hi] (lo > 0); with fewer than three decades also 2x and 5x each.
std::vector<double> log_ticks(double lo, double hi);
// The scale for `values` (non-finite ones ignored; log ignores values <= 0). from_zero: the linear
// domain includes 0 (rates, memory). An empty or constant set still gets a usable domain.
Scale fit_scale(const std::vector<double>& values, bool log, bool from_zero, int target = 5);
// A tick label: as few digits as the tick spacing needs; k/M/G for large values, 3e-4 for small.
std::string format_tick(double value, double spacing);
// Text for attributes and element content.
std::string escape_xml(const std::string& text);

// Colours for a page: run r's series are shades of one hue; each call returns a colour not handed
// out before on this page (a repeat is nudged by one degree of hue).
class ColourBook {
 public:
  std::string take(int run, int shade);

 private:
  std::set<std::string> used_;
};

struct LineSeries {
  std::string id;     // data-series: <chart>/<series>/<run>
  std::string label;  // legend text
  std::string colour;
  std::vector<double> xs, ys;
  bool dashed = false;
  bool markers = false;  // a dot at each point (sparse series such as validation loss)
};

struct ReferenceLine {  // a dashed horizontal line across the plot, e.g. the loss floor
  double y;
  std::string label;
};

struct LineChart {
  std::string title;
  std::string y_label;
  std::string x_label = "step";
  double y_divisor = 1;  // values are drawn divided by this (bytes shown in GiB)
  bool log_y = false;
  bool y_from_zero = false;
  std::vector<LineSeries> series;
  std::vector<ReferenceLine> references;
  std::vector<double> markers_x;  // thin vertical lines (checkpoints)
  std::string markers_label;      // their legend entry; empty: no entry
};

// One category's bars: one value per series (run), with the text printed after each bar.
struct BarRow {
  std::string label;
  std::vector<double> values;
  std::vector<std::string> texts;
};

struct BarChart {
  std::string title;
  std::string value_label;          // the axis under the bars ("ms per step")
  std::vector<std::string> ids;     // data-series per series (run)
  std::vector<std::string> labels;  // legend text per series
  std::vector<std::string> colours;
  std::vector<BarRow> rows;
};

inline constexpr int kChartWidth = 600;
inline constexpr int kChartHeight = 300;

std::string render_line_chart(const LineChart& chart, int width = kChartWidth, int height = kChartHeight);
std::string render_bar_chart(const BarChart& chart, int width = kChartWidth);

}  // namespace engine::report
