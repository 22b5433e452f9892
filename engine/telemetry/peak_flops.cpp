#include "telemetry/peak_flops.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/atomic_file.h"
#include "core/convert.h"
#include "core/whole_file.h"
#include "linalg/gemm.h"
#include "linalg/gemm16.h"
#include "telemetry/hardware_monitor.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown CPU";
}

bool native_16bit(DType compute) { return compute != DType::f32 && ops::matmul_16bit_available(compute); }

std::string kernel_name(DType compute) {
  return native_16bit(compute) ? ops::matmul_16bit_kernel(compute) : std::string("oneDNN sgemm");
}

}  // namespace

std::optional<fs::path> peak_cache_file() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "engine/peak_flops.json";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache/engine/peak_flops.json";
  return std::nullopt;
}

// How long the probe runs: products to warm up, then products to time (it keeps the best).
constexpr double kWarmUpSeconds = 0.25, kProbeSeconds = 1.0;

namespace {

// Seconds `work` takes once.
double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The fastest of at least `runs` runs of `work`, and more until `seconds` have been spent (at most
// `max_runs` in all).
double best_seconds(int runs, double seconds, int max_runs, const std::function<void()>& work) {
  double best = 1e300, spent = 0;
  for (int run = 0; run < runs || (spent < seconds && run < max_runs); ++run) {
    const double one = seconds_of(work);
    best = std::min(best, one);
    spent += one;
  }
  return best;
}

}  // namespace

double measure_gemm_flops(DType compute, int64_t n, int runs) {
  const bool native = native_16bit(compute);
  const size_t elements = size_t(n * n);
  std::vector<float> a(elements), b(elements), c(elements);
  for (size_t i = 0; i < elements; ++i) {
    a[i] = float(i % 13) * 0.01f;
    b[i] = float(i % 7) * 0.02f;
  }
  std::vector<uint16_t> a16, b16;
  if (native) {
    a16.resize(elements);
    b16.resize(elements);
    narrow(a.data(), a16.data(), compute, int64_t(elements));
    narrow(b.data(), b16.data(), compute, int64_t(elements));
  }
  auto product = [&] {
    if (native)
      ops::gemm16({.m = n, .n = n, .k = n, .lda = n, .ldb = n, .ldc = n, .operands = compute, .result = DType::f32},
                  a16.data(), b16.data(), nullptr, c.data());
    else
      ops::sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  // Untimed products first, a quarter of a second of them: primitive creation, first touch, and
  // the cores' clocks ramping up. Counted from a cold start, the best product of the first half
  // second read 134-152 GFLOP/s on a 2-core AVX2 EPYC whose linears then ran at 165-182.
  for (double warm = 0; warm < kWarmUpSeconds;) warm += seconds_of(product);
  return 2.0 * double(n) * double(n) * double(n) / best_seconds(runs, kProbeSeconds, 400, product);
}

namespace {

// A probe's figure, and how busy the rest of the machine kept its cores meanwhile.
struct Probe {
  double value = 0;
  double neighbours_busy_percent = -1;
};

Probe probe(const std::function<double()>& measure) {
  const NeighbourLoad load;
  const double value = measure();
  return {value, load.others_busy_percent()};
}

nlohmann::json read_cache(const fs::path& file) {
  const std::optional<std::string> text = read_whole_file(file);
  if (!text) return nlohmann::json::object();
  nlohmann::json cache = nlohmann::json::parse(*text, nullptr, false);
  return cache.is_object() ? cache : nlohmann::json::object();  // unreadable: probe and rewrite it
}

void write_cache(const fs::path& file, const nlohmann::json& cache) {
  std::error_code error;
  fs::create_directories(file.parent_path(), error);
  try {
    write_file_atomically(file, [&](std::ostream& out) { out << cache.dump(2) << "\n"; });
  } catch (const std::exception&) {
    // A read-only home is no reason to stop a run: the next one probes again.
  }
}

// An entry is {"per_second": v, "neighbours_busy_percent": p}; a bare number (older caches) is a
// figure whose neighbours are not known.
std::optional<Probe> cached_entry(const nlohmann::json& cache, const std::string& key) {
  const auto it = cache.find(key);
  if (it == cache.end()) return std::nullopt;
  Probe entry;
  if (it->is_number()) {
    entry.value = it->get<double>();
  } else if (it->is_object() && it->contains("per_second") && (*it)["per_second"].is_number()) {
    entry.value = (*it)["per_second"].get<double>();
    if (auto busy = it->find("neighbours_busy_percent"); busy != it->end() && busy->is_number())
      entry.neighbours_busy_percent = busy->get<double>();
  }
  if (entry.value > 0) return entry;
  return std::nullopt;
}

struct CachedProbe {
  Probe probe;
  std::string source;
};

// The cached figure under `key`, or `measure()`'s, then kept.
CachedProbe cached_probe(const std::string& key, const std::function<double()>& measure) {
  const std::optional<fs::path> file = peak_cache_file();
  nlohmann::json cache = file ? read_cache(*file) : nlohmann::json::object();
  if (auto entry = cached_entry(cache, key)) return {*entry, "cached in " + file->string()};
  const Probe measured = probe(measure);
  if (file && measured.value > 0) {
    cache[key] = {{"per_second", measured.value}, {"neighbours_busy_percent", measured.neighbours_busy_percent}};
    write_cache(*file, cache);
  }
  return {measured, "measured"};
}

std::string peak_key(DType compute, int threads) {
  return cpu_model() + " | " + std::to_string(threads) + " threads | " + std::string(dtype_name(compute)) + " | " +
         kernel_name(compute);
}

}  // namespace

PeakFlops peak_flops(DType compute, int threads) {
  const CachedProbe found = cached_probe(peak_key(compute, threads), [&] { return measure_gemm_flops(compute); });
  return {found.probe.value, found.source, kernel_name(compute), found.probe.neighbours_busy_percent};
}

bool forget_cached_peak(DType compute, int threads, double flops_per_second) {
  const std::optional<fs::path> file = peak_cache_file();
  if (!file) return false;
  nlohmann::json cache = read_cache(*file);
  const std::string key = peak_key(compute, threads);
  const std::optional<Probe> entry = cached_entry(cache, key);
  if (!entry || entry->value != flops_per_second) return false;
  cache.erase(key);
  write_cache(*file, cache);
  return true;
}

std::string busy_probe_note(double neighbours_busy_percent) {
  if (neighbours_busy_percent < kBusyNeighboursPercent) return "";
  return "probed while other processes kept " + std::to_string(std::lround(neighbours_busy_percent)) +
         "% of the cores busy, so it may read low";
}

double measure_triad_bandwidth(int64_t elements, int runs) {
  std::vector<float> a, b, c;
  try {
    a.resize(size_t(elements));
    b.assign(size_t(elements), 1.0f);
    c.assign(size_t(elements), 2.0f);
  } catch (const std::bad_alloc&) {
    return 0;  // a run under a tight memory limit: the bandwidth stays unknown (and uncached)
  }
  const float scalar = 3.0f;
  auto triad = [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < elements; ++i) a[size_t(i)] = b[size_t(i)] + scalar * c[size_t(i)];
  };
  triad();  // first touch, in the threads' own pages
  // Half a second of triads: long enough for the probe's neighbour load to be read in whole ticks.
  // STREAM's count: two loads and a store of 4 bytes.
  return 12.0 * double(elements) / best_seconds(runs, 0.5, 200, triad);
}

MemoryBandwidth memory_bandwidth(int threads) {
  const std::string key = cpu_model() + " | " + std::to_string(threads) + " threads | triad bytes/s";
  const CachedProbe found = cached_probe(key, [] { return measure_triad_bandwidth(); });
  return {found.probe.value, found.source, found.probe.neighbours_busy_percent};
}

}  // namespace engine
