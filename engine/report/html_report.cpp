#include "report/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "core/format.h"
#include "core/version.h"
#include "report/svg_chart.h"

namespace engine::report {

namespace {

std::string fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

std::string duration(double seconds) {
  const auto s = int64_t(std::lround(seconds));
  char text[48];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lldh %02lldm %02llds", (long long)(s / 3600), (long long)(s / 60 % 60),
                  (long long)(s % 60));
  else if (s >= 60)
    std::snprintf(text, sizeof text, "%lldm %02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(text, sizeof text, "%.1fs", seconds);
  return text;
}

std::string rate(double tokens_per_second) {
  if (tokens_per_second >= 1e6) return fixed(tokens_per_second / 1e6, 2) + "M";
  if (tokens_per_second >= 1e4) return fixed(tokens_per_second / 1e3, 1) + "k";
  return fixed(tokens_per_second, 0);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Utilisations may be logged as fractions (0.42) or percents (42); shown as percents.
double percent_scale(const Series& s) {
  return *std::max_element(s.values.begin(), s.values.end()) <= 1.0 ? 100.0 : 1.0;
}

// The numbers of the summary table and the printed summary; absent ones stay empty.
struct Facts {
  std::optional<double> steps, final_loss, floor, median_rate, mfu, peak_rss, wall, parameters;
  std::optional<std::pair<double, double>> best_val;  // (loss, step)
};

Facts facts(const RunData& run) {
  Facts f;
  const Series* loss = run.find("loss");
  f.steps = run.summary_number("steps");
  if (!f.steps && loss) f.steps = loss->steps.back();
  f.final_loss = run.summary_number("final_loss");
  if (!f.final_loss && loss) f.final_loss = loss->values.back();
  if (auto floor = run.summary_number("loss_floor"); floor && *floor > 0) f.floor = floor;
  if (!run.val_loss.empty()) {
    auto best = std::min_element(run.val_loss.values.begin(), run.val_loss.values.end());
    f.best_val = {{*best, run.val_loss.steps[size_t(best - run.val_loss.values.begin())]}};
  }
  if (const Series* s = run.find("tokens_per_second")) f.median_rate = median(s->values);
  if (const Series* s = run.find("mfu")) f.mfu = median(s->values) * percent_scale(*s);
  f.peak_rss = run.summary_number("peak_rss_bytes");
  if (const Series* s = run.find("rss_bytes"); !f.peak_rss && s)
    f.peak_rss = *std::max_element(s->values.begin(), s->values.end());
  if (const Series* s = run.find("elapsed_s")) f.wall = s->values.back();
  f.parameters = run.summary_number("parameters");
  return f;
}

// A series of one chart: which metrics key, its legend name, and how it is drawn.
struct SeriesSpec {
  std::string key;  // metrics key; "val_loss" reads the validation lines
  std::string name;
  int shade = 0;
  bool dashed = false;
  bool markers = false;
  bool as_percent = false;  // fractions drawn as percents
};

struct ChartSpec {
  std::string id, title, y_label;
  std::vector<SeriesSpec> series;
  bool from_zero = false;
  bool bytes = false;     // y in GiB or MiB
  bool auto_log = false;  // log y when the values span more than two decades
};

class Page {
 public:
  explicit Page(const std::vector<RunData>& runs) : runs_(runs) {
    for (size_t i = 0; i < runs.size(); ++i) {
      std::string id = runs[i].label;
      for (size_t j = 0; j < i; ++j)
        if (runs[j].label == runs[i].label) id += "#" + std::to_string(i + 1);
      ids_.push_back(id);
      swatches_.push_back(book_.take(int(i), 3));
    }
    // Legends name runs by their directory's own name when that tells them apart: full paths made
    // a legend entry wider than its chart.
    std::set<std::string> names;
    for (const auto& run : runs) names.insert(run.dir.lexically_normal().filename().string());
    for (const auto& run : runs) {
      const std::string name = run.dir.lexically_normal().filename().string();
      short_.push_back(names.size() == runs.size() && !name.empty() ? name : run.label);
    }
  }

  std::optional<std::string> line_chart(const ChartSpec& spec) {
    LineChart chart;
    chart.title = spec.title;
    chart.y_label = spec.y_label;
    chart.y_from_zero = spec.from_zero;
    const bool many = runs_.size() > 1;
    double max_y = 0, min_positive = INFINITY;
    for (size_t r = 0; r < runs_.size(); ++r) {
      for (const auto& s : spec.series) {
        const Series* data =
            s.key == "val_loss" ? (runs_[r].val_loss.empty() ? nullptr : &runs_[r].val_loss) : runs_[r].find(s.key);
        if (!data) continue;
        LineSeries line;
        line.id = spec.id + "/" + s.key + "/" + ids_[r];
        line.label = spec.series.size() == 1 && many ? runs_[r].label : many ? s.name + " · " + runs_[r].label : s.name;
        line.colour = book_.take(int(r), s.shade);
        line.xs = data->steps;
        line.ys = data->values;
        if (s.as_percent)
          for (double& y : line.ys) y *= percent_scale(*data);
        line.dashed = s.dashed;
        line.markers = s.markers;
        for (double y : line.ys) {
          max_y = std::max(max_y, y);
          if (y > 0) min_positive = std::min(min_positive, y);
        }
        chart.series.push_back(std::move(line));
      }
      if (spec.id == "loss") {
        chart.markers_x.insert(chart.markers_x.end(), runs_[r].checkpoint_steps.begin(),
                               runs_[r].checkpoint_steps.end());
        if (auto floor = runs_[r].summary_number("loss_floor"); floor && *floor > 0) {
          const bool seen = std::any_of(chart.references.begin(), chart.references.end(),
                                        [&](const ReferenceLine& l) { return std::fabs(l.y - *floor) < 1e-9; });
          if (!seen) chart.references.push_back({*floor, "loss floor " + fixed(*floor, 3)});
        }
      }
    }
    if (chart.series.empty()) return std::nullopt;
    if (!chart.markers_x.empty()) chart.markers_label = "checkpoint";
    if (spec.bytes) {
      const bool gib = max_y >= double(1 << 30);
      chart.y_divisor = gib ? double(1 << 30) : double(1 << 20);
      chart.y_label += gib ? " (GiB)" : " (MiB)";
    }
    chart.log_y = spec.auto_log && min_positive > 0 && max_y / min_positive > 100;
    return render_line_chart(chart);
  }

  // Rank 0's step time by category and by op, one bar per run.
  std::optional<std::string> breakdown_chart(bool ops) {
    BarChart chart;
    chart.title = ops ? "Step time by op (trace, rank 0)" : "Step time by category (trace, rank 0)";
    chart.value_label = "ms per step";
    std::vector<std::string> order;  // row names: the first run's order, then any others
    for (size_t r = 0; r < runs_.size(); ++r) {
      if (!runs_[r].breakdown) continue;
      chart.ids.push_back(std::string(ops ? "op-breakdown/ops/" : "step-breakdown/categories/") + ids_[r]);
      chart.labels.push_back(short_[r] + " (" + fixed(runs_[r].breakdown->step_ms, 1) + " ms/step, " +
                             std::to_string(runs_[r].breakdown->steps) + " steps)");
      chart.colours.push_back(book_.take(int(r), 0));
      for (const auto& row : ops ? runs_[r].breakdown->ops : runs_[r].breakdown->categories)
        if (std::find(order.begin(), order.end(), row.name) == order.end()) order.push_back(row.name);
    }
    if (order.empty()) return std::nullopt;
    // "other ops" and "untraced" go last whatever their size.
    std::stable_partition(order.begin(), order.end(),
                          [](const std::string& n) { return n != "other ops" && n != "untraced"; });
    for (const auto& name : order) {
      BarRow row{name, {}, {}};
      for (size_t r = 0; r < runs_.size(); ++r) {
        if (!runs_[r].breakdown) continue;
        const auto& rows = ops ? runs_[r].breakdown->ops : runs_[r].breakdown->categories;
        auto it = std::find_if(rows.begin(), rows.end(), [&](const BreakdownRow& b) { return b.name == name; });
        row.values.push_back(it == rows.end() ? 0 : it->ms_per_step);
        row.texts.push_back(it == rows.end() ? "–"
                                             : fixed(it->ms_per_step, 2) + " ms · " + fixed(it->percent, 1) + "%");
      }
      chart.rows.push_back(std::move(row));
    }
    return render_bar_chart(chart);
  }

  const std::string& swatch(size_t run) const { return swatches_[run]; }

 private:
  const std::vector<RunData>& runs_;
  ColourBook book_;
  std::vector<std::string> ids_, swatches_, short_;
};

constexpr const char* kStyle = R"(
body { margin: 0; background: #f4f5f7; color: #202124; font-family: sans-serif; font-size: 14px; }
main { width: 1240px; margin: 0 auto; padding: 20px 0 40px; }
h1 { font-size: 24px; font-weight: 600; margin: 4px 0 4px; }
h2 { font-size: 17px; font-weight: 600; margin: 28px 0 12px; }
.sub { color: #5f6368; margin: 0 0 18px; }
table.summary { border-collapse: collapse; background: #fff; border: 1px solid #dadce0; }
table.summary th, table.summary td { padding: 7px 16px; text-align: right; border-bottom: 1px solid #eceef1; }
table.summary th:first-child, table.summary td:first-child { text-align: left; color: #5f6368; font-weight: normal; }
table.summary thead th { font-weight: 600; border-bottom: 1px solid #dadce0; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 7px; vertical-align: -1px; }
.grid { display: grid; grid-template-columns: 600px 600px; gap: 18px; justify-content: space-between; }
.card { background: #fff; border: 1px solid #dadce0; border-radius: 6px; line-height: 0; }
details { background: #fff; border: 1px solid #dadce0; border-radius: 6px; margin: 8px 0; padding: 8px 14px; }
summary { cursor: pointer; font-family: monospace; }
pre { font-size: 12px; line-height: 1.4; overflow-x: auto; }
)";

std::string cell(const std::optional<double>& v, const std::function<std::string(double)>& show) {
  return v ? show(*v) : "<span style=\"color:#9aa0a6\">–</span>";
}

}  // namespace

std::string render_html(const std::vector<RunData>& runs) {
  Page page(runs);
  std::string names;
  for (size_t i = 0; i < runs.size(); ++i) names += (i ? " vs " : "") + runs[i].label;
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
       << "<meta name=\"viewport\" content=\"width=1280\"><title>Run report: " << escape_xml(names) << "</title><style>"
       << kStyle << "</style></head><body><main>\n";
  html << "<h1>Run report: " << escape_xml(names) << "</h1>\n<p class=\"sub\">" << runs.size()
       << (runs.size() == 1 ? " run" : " runs") << " · engine " << kVersion << "</p>\n";

  // Summary table: a row per fact, a column per run.
  std::vector<Facts> all;
  for (const auto& run : runs) all.push_back(facts(run));
  html << "<table class=\"summary\"><thead><tr><th></th>";
  for (size_t i = 0; i < runs.size(); ++i)
    html << "<th><span class=\"swatch\" style=\"background:" << page.swatch(i) << "\"></span>"
         << escape_xml(runs[i].label) << "</th>";
  html << "</tr></thead><tbody>\n";
  auto row = [&](const std::string& name, const std::function<std::string(const Facts&)>& show) {
    html << "<tr><td>" << name << "</td>";
    for (const auto& f : all) html << "<td>" << show(f) << "</td>";
    html << "</tr>\n";
  };
  auto number = [](int digits) { return [digits](double v) { return fixed(v, digits); }; };
  row("steps", [&](const Facts& f) { return cell(f.steps, number(0)); });
  row("parameters", [&](const Facts& f) { return cell(f.parameters, [](double v) { return rate(v); }); });
  row("final loss", [&](const Facts& f) { return cell(f.final_loss, number(4)); });
  row("best validation loss", [&](const Facts& f) {
    if (!f.best_val) return cell(std::nullopt, number(0));
    return fixed(f.best_val->first, 4) + " <span style=\"color:#5f6368\">(step " + fixed(f.best_val->second, 0) +
           ")</span>";
  });
  row("loss floor", [&](const Facts& f) { return cell(f.floor, number(4)); });
  row("median tokens/s", [&](const Facts& f) { return cell(f.median_rate, [](double v) { return rate(v); }); });
  if (std::any_of(all.begin(), all.end(), [](const Facts& f) { return bool(f.mfu); }))
    row("median MFU", [&](const Facts& f) { return cell(f.mfu, [](double v) { return fixed(v, 1) + "%"; }); });
  row("peak RSS", [&](const Facts& f) { return cell(f.peak_rss, [](double v) { return format_bytes(int64_t(v)); }); });
  row("wall time", [&](const Facts& f) { return cell(f.wall, duration); });
  html << "</tbody></table>\n";

  const std::vector<ChartSpec> specs = {
      {"loss", "Loss", "loss (nats)", {{"loss", "loss", 0}, {"val_loss", "validation loss", 1, false, true}}},
      {"lr", "Learning rate", "learning rate", {{"lr", "lr", 0}}, true},
      {"throughput", "Throughput", "tokens/s", {{"tokens_per_second", "tokens/s", 0}}, true},
      {"mfu",
       "FLOPs utilisation",
       "% of peak",
       {{"mfu", "MFU", 0, false, false, true}, {"hfu", "HFU", 1, true, false, true}},
       true},
      {"step-time", "Step time", "seconds", {{"step_time_s", "step time", 0}}, true},
      // Apart: the machine's available memory is often a thousand times the process's.
      {"memory", "Resident memory", "bytes", {{"rss_bytes", "resident (RSS)", 0}}, true, true},
      {"available", "Available memory", "bytes", {{"mem_available_bytes", "available", 0}}, true, true},
      {"cpu",
       "CPU utilisation",
       "%",
       {{"cpu_util", "all cores", 0}, {"process_cpu_util", "this process", 1, true}},
       true},
      {"temperature", "Temperature", "°C", {{"temperature_c", "temperature", 0}}},
      {"grad-norm", "Gradient norm", "norm", {{"grad_norm", "grad norm", 0}}, false, false, true},
      {"loss-scale", "Loss scale (fp16)", "scale", {{"loss_scale", "loss scale", 0}}, false, false, true},
  };
  html << "<h2>Training</h2>\n<div class=\"grid\">\n";
  for (const auto& spec : specs)
    if (auto svg = page.line_chart(spec)) html << "<div class=\"card\">" << *svg << "</div>\n";
  html << "</div>\n";

  auto categories = page.breakdown_chart(false);
  auto ops = page.breakdown_chart(true);
  if (categories || ops) {
    html << "<h2>Where the step time goes</h2>\n<div class=\"grid\">\n";
    for (const auto& svg : {categories, ops})
      if (svg) html << "<div class=\"card\">" << *svg << "</div>\n";
    html << "</div>\n";
  }

  html << "<h2>Recipes</h2>\n";
  for (const auto& run : runs) {
    html << "<details><summary>" << escape_xml((run.dir / "recipe.yaml").string()) << "</summary><pre>"
         << (run.recipe_text.empty() ? "(no recipe.yaml in the run directory)" : escape_xml(run.recipe_text))
         << "</pre></details>\n";
  }
  html << "</main></body></html>\n";
  return html.str();
}

std::string text_summary(const RunData& run) {
  const Facts f = facts(run);
  std::ostringstream out;
  out << run.label << "\n";
  out << "  steps " << (f.steps ? fixed(*f.steps, 0) : "?") << ", final loss "
      << (f.final_loss ? fixed(*f.final_loss, 4) : "?");
  if (f.floor) out << " (floor " << fixed(*f.floor, 4) << ")";
  out << "\n";
  if (f.best_val)
    out << "  best validation loss " << fixed(f.best_val->first, 4) << " at step " << fixed(f.best_val->second, 0)
        << "\n";
  if (f.median_rate) {
    out << "  median " << rate(*f.median_rate) << " tokens/s";
    if (f.mfu) out << ", MFU " << fixed(*f.mfu, 1) << "%";
    out << "\n";
  }
  out << "  peak RSS " << (f.peak_rss ? format_bytes(int64_t(*f.peak_rss)) : "?") << ", wall time "
      << (f.wall ? duration(*f.wall) : "?") << "\n";
  if (run.breakdown && !run.breakdown->categories.empty()) {
    out << "  step time " << fixed(run.breakdown->step_ms, 1) << " ms:";
    for (size_t i = 0; i < run.breakdown->categories.size() && i < 4; ++i)
      out << (i ? ", " : " ") << run.breakdown->categories[i].name << " "
          << fixed(run.breakdown->categories[i].percent, 0) << "%";
    out << "\n";
  }
  return out.str();
}

}  // namespace engine::report
