// `engine report`'s page: one self-contained HTML file (inline SVG and CSS, no script, no external
// resource) with a summary table and the charts of one or more runs, each run in its own colour
// family so that runs compared on one page stay apart; and the short text summary printed per run.
#pragma once

#include <string>
#include <vector>

#include "report/run_data.h"

namespace engine::report {

std::string render_html(const std::vector<RunData>& runs);

// 4 to 8 lines about one run: steps and losses, throughput and utilisation, memory and wall time,
// and where its step time goes when it has a trace.
std::string text_summary(const RunData& run);

}  // namespace engine::report
