#include "screenshot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "png.h"

namespace engine::testing {

std::string find_chromium() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin");
  for (std::string dir; std::getline(dirs, dir, ':');)
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::filesystem::path candidate = std::filesystem::path(dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  return "";
}

bool screenshot(const std::filesystem::path& html, const std::filesystem::path& png, int height,
                const std::filesystem::path& scratch, std::string& log) {
  const std::filesystem::path output = scratch / "chromium.log";
  // --no-sandbox: Chromium refuses to start as root otherwise; the profile in scratch keeps runs
  // apart; no first-run, extensions or background networking: the page is a local file.
  const std::string command =
      "HOME='" + scratch.string() + "' timeout 120 '" + find_chromium() +
      "' --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --no-default-browser-check "
      "--disable-extensions --disable-background-networking --force-device-scale-factor=1 "
      "--force-color-profile=srgb --user-data-dir='" +
      (scratch / "profile").string() + "' --window-size=1280," + std::to_string(height) + " --screenshot='" +
      png.string() + "' 'file://" + std::filesystem::absolute(html).string() + "' > '" + output.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(output);
  std::stringstream text;
  text << in.rdbuf();
  log = text.str();
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && std::filesystem::exists(png);
}

std::vector<SeriesColour> series_in(const std::string& html) {
  std::vector<SeriesColour> found;
  static const std::regex tag("<[^>]*data-series=\"([^\"]+)\"[^>]*>");
  static const std::regex stroke("stroke=\"(#[0-9a-fA-F]{6})\"");
  for (std::sregex_iterator it(html.begin(), html.end(), tag), end; it != end; ++it) {
    const std::string element = (*it)[0];
    std::smatch colour;
    if (std::regex_search(element, colour, stroke)) found.push_back({(*it)[1], colour[1]});
  }
  return found;
}

ScreenshotCheck check_screenshot(const std::vector<SeriesColour>& series, const std::filesystem::path& png,
                                 int64_t min_pixels) {
  const Image image = read_png(png);
  std::unordered_map<uint32_t, int64_t> counts;
  for (size_t i = 0; i + 2 < image.rgb.size(); i += 3)
    ++counts[uint32_t(image.rgb[i]) << 16 | uint32_t(image.rgb[i + 1]) << 8 | image.rgb[i + 2]];
  ScreenshotCheck check;
  for (const auto& s : series) {
    const uint32_t rgb = uint32_t(std::stoul(s.colour.substr(1), nullptr, 16));
    const int64_t n = counts.count(rgb) ? counts[rgb] : 0;
    check.pixels[s.id] = n;
    if (n < min_pixels) check.missing.push_back(s.id);
  }
  // The background is the most common colour; ink is everything else.
  int64_t background = 0;
  for (const auto& [rgb, n] : counts) background = std::max(background, n);
  const double total = double(image.rgb.size() / 3);
  check.ink = total > 0 ? 1.0 - double(background) / total : 0;
  return check;
}

}  // namespace engine::testing
