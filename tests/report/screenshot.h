// Screenshots of report pages with headless Chromium, and the check that every series the page
// declares (data-series + stroke="#rrggbb") shows up in the picture in its exact colour.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace engine::testing {

// Chromium's path; empty when it is not installed.
std::string find_chromium();

// Renders `html` at 1280 x `height` into `png`; returns Chromium's output when it fails.
// `scratch`: a directory for Chromium's profile.
bool screenshot(const std::filesystem::path& html, const std::filesystem::path& png, int height,
                const std::filesystem::path& scratch, std::string& log);

struct SeriesColour {
  std::string id, colour;  // "loss/loss/runs/a", "#1f77b4"
};

// Every element of the page with data-series and a stroke colour, in page order.
std::vector<SeriesColour> series_in(const std::string& html);

struct ScreenshotCheck {
  std::map<std::string, int64_t> pixels;  // per series: pixels of exactly its colour
  std::vector<std::string> missing;       // series with fewer than the minimum
  double ink = 0;                         // share of pixels that are not the page background
};

ScreenshotCheck check_screenshot(const std::vector<SeriesColour>& series, const std::filesystem::path& png,
                                 int64_t min_pixels);

}  // namespace engine::testing
