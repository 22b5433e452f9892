#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace engine::report {

namespace {

constexpr double kCharWidth = 6.6;  // mean advance of a 12px sans-serif glyph: legend and label layout
constexpr const char* kGrid = "#e6e8eb";
constexpr const char* kAxis = "#5f6368";
constexpr const char* kText = "#202124";
constexpr const char* kMuted = "#5f6368";

std::string num(double v) {  // a coordinate
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

double text_width(const std::string& text, double char_width = kCharWidth) { return double(text.size()) * char_width; }

std::string hsl_hex(double h, double s, double l) {
  h = std::fmod(std::fmod(h, 360.0) + 360.0, 360.0);
  const double c = (1 - std::fabs(2 * l - 1)) * s, x = c * (1 - std::fabs(std::fmod(h / 60.0, 2.0) - 1)), m = l - c / 2;
  double r = 0, g = 0, b = 0;
  if (h < 60)
    r = c, g = x;
  else if (h < 120)
    r = x, g = c;
  else if (h < 180)
    g = c, b = x;
  else if (h < 240)
    g = x, b = c;
  else if (h < 300)
    r = x, b = c;
  else
    r = c, b = x;
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", int(std::lround((r + m) * 255)), int(std::lround((g + m) * 255)),
                int(std::lround((b + m) * 255)));
  return text;
}

// A legend laid out in rows under the title; returns the y below it.
struct LegendEntry {
  std::string label, colour;
  bool dashed = false, marker = false, bar = false, grey = false;
};

double draw_legend(std::ostringstream& svg, const std::vector<LegendEntry>& entries, double x0, double y0,
                   double width) {
  double x = x0, y = y0;
  for (const auto& e : entries) {
    const double w = 26 + text_width(e.label) + 18;
    if (x > x0 && x + w > width) {
      x = x0;
      y += 18;
    }
    const std::string stroke = e.grey ? std::string(kMuted) : e.colour;
    if (e.bar)
      svg << "<rect x=\"" << num(x) << "\" y=\"" << num(y - 9) << "\" width=\"18\" height=\"10\" fill=\"" << stroke
          << "\"/>";
    else
      svg << "<line x1=\"" << num(x) << "\" y1=\"" << num(y - 4) << "\" x2=\"" << num(x + 20) << "\" y2=\""
          << num(y - 4) << "\" stroke=\"" << stroke << "\" stroke-width=\"" << (e.grey ? "1.5" : "3") << "\""
          << (e.dashed ? " stroke-dasharray=\"5 3\"" : "") << "/>";
    if (e.marker)
      svg << "<circle cx=\"" << num(x + 10) << "\" cy=\"" << num(y - 4) << "\" r=\"3\" fill=\"" << stroke << "\"/>";
    svg << "<text x=\"" << num(x + 26) << "\" y=\"" << num(y) << "\" fill=\"" << kText << "\">" << escape_xml(e.label)
        << "</text>";
    x += w;
  }
  return y + 10;
}

void open_svg(std::ostringstream& svg, int width, int height, const std::string& title) {
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">"
      << "<title>" << escape_xml(title) << "</title>"
      << "<text x=\"12\" y=\"22\" font-size=\"15\" font-weight=\"600\" fill=\"" << kText << "\">" << escape_xml(title)
      << "</text>";
}

// The decimals that write multiples of `spacing` exactly: 0 for 5000, 1 for 0.5 or 2.5.
int digits_for(double spacing, int most) {
  if (!(spacing > 0)) return most;
  for (int d = 0; d < most; ++d) {
    const double scaled = spacing * std::pow(10.0, d);
    if (std::fabs(scaled - std::round(scaled)) < 1e-6 * scaled) return d;
  }
  return most;
}

}  // namespace

double Scale::map(double value, double from, double to) const {
  double a = lo, b = hi, v = value;
  if (log) a = std::log10(lo), b = std::log10(hi), v = std::log10(value);
  if (b == a) return (from + to) / 2;
  return from + (v - a) / (b - a) * (to - from);
}

std::vector<double> linear_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * power * (1 + 1e-9)) {
      step = m * power;
      break;
    }
  const double first = std::floor(lo / step + 1e-9) * step, last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (double k = 0;; ++k) {
    double t = first + k * step;
    if (std::fabs(t) < step * 1e-9) t = 0;  // no "-0" or 1e-17
    ticks.push_back(t);
    if (t >= last - step * 1e-9) break;
  }
  return ticks;
}

std::vector<double> log_ticks(double lo, double hi) {
  const int a = int(std::floor(std::log10(lo) + 1e-9)), b = std::max(a + 1, int(std::ceil(std::log10(hi) - 1e-9)));
  std::vector<double> ticks;
  const bool fine = b - a < 3;
  for (int e = a; e <= b; ++e) {
    const double p = std::pow(10.0, e);
    ticks.push_back(p);
    if (fine && e < b) {
      ticks.push_back(2 * p);
      ticks.push_back(5 * p);
    }
  }
  return ticks;
}

Scale fit_scale(const std::vector<double>& values, bool log, bool from_zero, int target) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (!std::isfinite(v) || (log && v <= 0)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  Scale scale;
  scale.log = log;
  if (!(lo <= hi)) {  // nothing to draw
    lo = log ? 1 : 0;
    hi = log ? 10 : 1;
  }
  if (log) {
    scale.ticks = log_ticks(lo, hi);
  } else {
    if (from_zero) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
    if (hi == lo) {  // a constant: a band around it
      const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
      lo -= pad;
      hi += pad;
      if (from_zero && lo < 0 && values.size() && hi > 0) lo = 0;
    }
    scale.ticks = linear_ticks(lo, hi, target);
  }
  scale.lo = scale.ticks.front();
  scale.hi = scale.ticks.back();
  return scale;
}

std::string format_tick(double value, double spacing) {
  char text[48];
  const double a = std::fabs(value);
  if (value == 0) return "0";
  const struct {
    double at, unit;
    const char* suffix;
  } big[] = {{1e9, 1e9, "G"}, {1e6, 1e6, "M"}, {1e4, 1e3, "k"}};  // 9500 stays 9500
  for (const auto& [at, unit, suffix] : big)
    if (a >= at) {
      std::snprintf(text, sizeof text, "%.*f%s", digits_for(spacing / unit, 3), value / unit, suffix);
      return text;
    }
  if (a < 1e-3) {  // 3e-4: the mantissa with as many digits as the spacing resolves
    const int exponent = int(std::floor(std::log10(a) + 1e-9));
    const int digits = std::clamp(exponent - int(std::floor(std::log10(spacing) + 1e-9)), 0, 3);
    std::snprintf(text, sizeof text, "%.*fe%d", digits, value / std::pow(10.0, exponent), exponent);
    return text;
  }
  std::snprintf(text, sizeof text, "%.*f", digits_for(spacing, 6), value);
  return text;
}

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string ColourBook::take(int run, int shade) {
  // Well separated hues for runs (blue, orange, green, red, purple, ...); shades darker and lighter.
  static constexpr double kHues[] = {212, 28, 140, 355, 272, 48, 185, 320};
  static constexpr double kLightness[] = {0.42, 0.28, 0.56, 0.36};
  const double hue = kHues[run % 8] + 9.0 * (run / 8);
  const double lightness = kLightness[shade % 4];
  for (int nudge = 0;; ++nudge) {
    const double h = hue + (nudge % 2 ? -1 : 1) * double((nudge + 1) / 2);
    std::string colour = hsl_hex(h, 0.72, lightness);
    if (used_.insert(colour).second) return colour;
  }
}

std::string render_line_chart(const LineChart& chart, int width, int height) {
  std::ostringstream svg;
  open_svg(svg, width, height, chart.title);

  std::vector<LegendEntry> legend;
  for (const auto& s : chart.series) legend.push_back({s.label, s.colour, s.dashed, s.markers});
  for (const auto& r : chart.references) legend.push_back({r.label, "", true, false, false, true});
  if (!chart.markers_x.empty() && !chart.markers_label.empty())
    legend.push_back({chart.markers_label, "", false, false, false, true});
  const double left = 66, right = width - 18, bottom = height - 44;
  const double top = draw_legend(svg, legend, 12, 44, width - 12) + 6;

  std::vector<double> xs, ys;
  for (const auto& s : chart.series) {
    xs.insert(xs.end(), s.xs.begin(), s.xs.end());
    for (double y : s.ys) ys.push_back(y / chart.y_divisor);
  }
  for (const auto& r : chart.references) ys.push_back(r.y / chart.y_divisor);
  const Scale sx = fit_scale(xs, false, false, 6);
  const Scale sy = fit_scale(ys, chart.log_y, chart.y_from_zero, 5);
  auto px = [&](double x) { return sx.map(x, left, right); };
  auto py = [&](double y) { return sy.map(y, bottom, top); };

  // Grid, ticks and tick labels.
  const double x_spacing = sx.ticks.size() > 1 ? sx.ticks[1] - sx.ticks[0] : 1;
  for (double t : sx.ticks) {
    svg << "<line x1=\"" << num(px(t)) << "\" y1=\"" << num(top) << "\" x2=\"" << num(px(t)) << "\" y2=\""
        << num(bottom) << "\" stroke=\"" << kGrid << "\"/>";
    svg << "<text x=\"" << num(px(t)) << "\" y=\"" << num(bottom + 17) << "\" text-anchor=\"middle\" fill=\"" << kMuted
        << "\">" << format_tick(t, x_spacing) << "</text>";
  }
  for (size_t i = 0; i < sy.ticks.size(); ++i) {
    const double t = sy.ticks[i];
    const double spacing = sy.log ? t : sy.ticks.size() > 1 ? sy.ticks[1] - sy.ticks[0] : 1;
    svg << "<line x1=\"" << num(left) << "\" y1=\"" << num(py(t)) << "\" x2=\"" << num(right) << "\" y2=\""
        << num(py(t)) << "\" stroke=\"" << kGrid << "\"/>";
    svg << "<text x=\"" << num(left - 7) << "\" y=\"" << num(py(t) + 4) << "\" text-anchor=\"end\" fill=\"" << kMuted
        << "\">" << format_tick(t, spacing) << "</text>";
  }
  svg << "<line x1=\"" << num(left) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(right) << "\" y2=\""
      << num(bottom) << "\" stroke=\"" << kAxis << "\"/>";
  svg << "<line x1=\"" << num(left) << "\" y1=\"" << num(top) << "\" x2=\"" << num(left) << "\" y2=\"" << num(bottom)
      << "\" stroke=\"" << kAxis << "\"/>";
  svg << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num(height - 8) << "\" text-anchor=\"middle\" fill=\""
      << kText << "\">" << escape_xml(chart.x_label) << "</text>";
  svg << "<text transform=\"translate(16 " << num((top + bottom) / 2)
      << ") rotate(-90)\" text-anchor=\"middle\" fill=\"" << kText << "\">" << escape_xml(chart.y_label) << "</text>";

  for (double x : chart.markers_x)
    svg << "<line x1=\"" << num(px(x)) << "\" y1=\"" << num(top) << "\" x2=\"" << num(px(x)) << "\" y2=\""
        << num(bottom) << "\" stroke=\"" << kMuted << "\" stroke-width=\"1\" stroke-dasharray=\"2 3\"/>";
  for (const auto& r : chart.references) {
    const double y = py(r.y / chart.y_divisor);
    svg << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(right) << "\" y2=\"" << num(y)
        << "\" stroke=\"" << kMuted << "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>";
  }

  for (const auto& s : chart.series) {
    svg << "<g data-series=\"" << escape_xml(s.id) << "\" stroke=\"" << s.colour
        << "\" stroke-width=\"2.5\" fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\""
        << (s.dashed ? " stroke-dasharray=\"7 4\"" : "") << ">";
    std::string points;
    auto flush = [&] {
      if (!points.empty()) svg << "<polyline points=\"" << points << "\"/>";
      points.clear();
    };
    for (size_t i = 0; i < s.xs.size() && i < s.ys.size(); ++i) {
      const double y = s.ys[i] / chart.y_divisor;
      if (!std::isfinite(y) || (sy.log && y <= 0)) {  // a gap in the line
        flush();
        continue;
      }
      points += num(px(s.xs[i])) + "," + num(py(y)) + " ";
    }
    flush();
    if (s.markers)
      for (size_t i = 0; i < s.xs.size() && i < s.ys.size(); ++i) {
        const double y = s.ys[i] / chart.y_divisor;
        if (!std::isfinite(y) || (sy.log && y <= 0)) continue;
        svg << "<circle cx=\"" << num(px(s.xs[i])) << "\" cy=\"" << num(py(y)) << "\" r=\"3.5\" fill=\"" << s.colour
            << "\" stroke-dasharray=\"none\"/>";
      }
    svg << "</g>";
  }
  svg << "</svg>";
  return svg.str();
}

std::string render_bar_chart(const BarChart& chart, int width) {
  const double bar = 14, gap = 3, group_gap = 10;
  const size_t n = chart.ids.size();
  double label_width = 60;
  for (const auto& row : chart.rows) label_width = std::max(label_width, text_width(row.label) + 16);
  label_width = std::min(label_width, 190.0);
  double text_room = 40;
  for (const auto& row : chart.rows)
    for (const auto& t : row.texts) text_room = std::max(text_room, text_width(t, 6.2) + 12);

  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < n; ++i) legend.push_back({chart.labels[i], chart.colours[i], false, false, true});
  // The legend's height first (drawn into a scratch stream), then the chart's.
  std::ostringstream scratch;
  const double top = draw_legend(scratch, legend, 12, 44, width - 12) + 8;
  const double rows_height =
      double(chart.rows.size()) * (double(n) * (bar + gap) - gap + group_gap) - (chart.rows.empty() ? 0 : group_gap);
  const int height = int(std::ceil(top + rows_height + 50));

  std::ostringstream svg;
  open_svg(svg, width, height, chart.title);
  draw_legend(svg, legend, 12, 44, width - 12);

  const double left = label_width, right = width - text_room, bottom = top + rows_height + 6;
  double max_value = 0;
  for (const auto& row : chart.rows)
    for (double v : row.values) max_value = std::max(max_value, v);
  const Scale sx = fit_scale({max_value}, false, true, 5);
  const double spacing = sx.ticks.size() > 1 ? sx.ticks[1] - sx.ticks[0] : 1;
  for (double t : sx.ticks) {
    const double x = sx.map(t, left, right);
    svg << "<line x1=\"" << num(x) << "\" y1=\"" << num(top - 4) << "\" x2=\"" << num(x) << "\" y2=\"" << num(bottom)
        << "\" stroke=\"" << kGrid << "\"/>";
    svg << "<text x=\"" << num(x) << "\" y=\"" << num(bottom + 16) << "\" text-anchor=\"middle\" fill=\"" << kMuted
        << "\">" << format_tick(t, spacing) << "</text>";
  }
  svg << "<line x1=\"" << num(left) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(right) << "\" y2=\""
      << num(bottom) << "\" stroke=\"" << kAxis << "\"/>";
  svg << "<text x=\"" << num((left + right) / 2) << "\" y=\"" << num(height - 6) << "\" text-anchor=\"middle\" fill=\""
      << kText << "\">" << escape_xml(chart.value_label) << "</text>";

  // Row labels, then one group per series so each series is one element.
  double y = top;
  for (const auto& row : chart.rows) {
    const double group = double(n) * (bar + gap) - gap;
    std::string label = row.label;
    const size_t fits = size_t((label_width - 16) / kCharWidth);
    if (label.size() > fits && fits > 1) label = label.substr(0, fits - 1) + "…";
    svg << "<text x=\"" << num(left - 8) << "\" y=\"" << num(y + group / 2 + 4) << "\" text-anchor=\"end\" fill=\""
        << kText << "\">" << escape_xml(label) << "</text>";
    y += group + group_gap;
  }
  for (size_t i = 0; i < n; ++i) {
    svg << "<g data-series=\"" << escape_xml(chart.ids[i]) << "\" stroke=\"" << chart.colours[i] << "\" fill=\""
        << chart.colours[i] << "\" stroke-width=\"0\">";
    double row_y = top + double(i) * (bar + gap);
    for (const auto& row : chart.rows) {
      const double v = i < row.values.size() ? row.values[i] : 0;
      const double w = std::max(0.0, sx.map(v, left, right) - left);
      if (w > 0)
        svg << "<rect x=\"" << num(left) << "\" y=\"" << num(row_y) << "\" width=\"" << num(w) << "\" height=\""
            << num(bar) << "\"/>";
      if (i < row.texts.size())
        svg << "<text x=\"" << num(left + w + 6) << "\" y=\"" << num(row_y + bar - 3) << "\" fill=\"" << kText
            << "\" font-size=\"11\">" << escape_xml(row.texts[i]) << "</text>";
      row_y += double(n) * (bar + gap) - gap + group_gap;
    }
    svg << "</g>";
  }
  svg << "</svg>";
  return svg.str();
}

}  // namespace engine::report
