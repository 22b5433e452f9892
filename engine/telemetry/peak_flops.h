// Peak FLOP/s: the denominator of MFU, and with the memory bandwidth the roofline's limits. A rank's peak in its
// compute type is measured once per machine by a short GEMM probe (a 1024^3 product through the same oneDNN kernels the
// linears use, on the rank's threads: a quarter of a second of untimed products while the clocks ramp up, then the
// best of the products run in a second: a busy neighbour rarely holds the cores that long) and cached, so later runs
// start without probing.
//
//   PeakFlops peak = peak_flops(DType::bf16, threads);   // measured, or read from the cache
//   mfu = model_flops_per_second / peak.flops_per_second;
//
// The cache is one JSON object in $XDG_CACHE_HOME/engine/peak_flops.json (else ~/.cache/...),
// keyed by CPU model, thread count, type and kernel: a different machine or setting probes anew.
// Each entry keeps how busy the rest of the machine was while it was probed (below).
// A probe measures what the GEMM reaches, not the datasheet figure: MFU against it says how much
// of the achievable matmul rate the whole step keeps.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "core/dtype.h"

namespace engine {

struct PeakFlops {
  double flops_per_second = 0;
  std::string source;                   // "measured", "cached in <file>", or kRecipePeak
  std::string kernel;                   // what computed the probe ("oneDNN sgemm", "brg:avx512_core_bf16", ...)
  double neighbours_busy_percent = -1;  // other processes' share of the cores during the probe (-1: not known)
};

inline constexpr const char* kRecipePeak = "telemetry.peak_flops";  // the source of a peak the recipe gives

PeakFlops peak_flops(DType compute, int threads);
// Drops the cached peak of this type and thread count if it is still `flops_per_second`, so that
// the next run probes again: a run whose step beat it has shown that it read low. False when the
// cache holds no such figure (none, or one that another run has probed since).
bool forget_cached_peak(DType compute, int threads, double flops_per_second);
// The probe alone: FLOP/s of the best of at least `runs` n^3 products (more, up to 1 s of them), after the warm-up.
double measure_gemm_flops(DType compute, int64_t n = 1024, int runs = 3);
// The memory bandwidth a rank reaches: the best of the STREAM triads (a = b + s c) run in half a
// second (at least `runs` of them) over three 64 MiB arrays on the rank's threads, counted as
// STREAM counts (12 bytes per element), cached beside the peaks. The roof of memory-bound ops
// (telemetry/roofline.h).
struct MemoryBandwidth {
  double bytes_per_second = 0;
  std::string source;
  double neighbours_busy_percent = -1;
};
MemoryBandwidth memory_bandwidth(int threads);  // 0 when its arrays cannot be allocated
double measure_triad_bandwidth(int64_t elements = int64_t(16) << 20, int runs = 5);

// A probe reads low when other processes held the cores meanwhile (telemetry/hardware_monitor.h's
// NeighbourLoad measures how much). The figure is cached all the same, with that share beside it, and
// every run that uses it says so: "probed while other processes kept 45% of the cores busy, so it
// may read low" (empty below kBusyNeighboursPercent).
inline constexpr double kBusyNeighboursPercent = 10;
std::string busy_probe_note(double neighbours_busy_percent);

// Where the cache lives (nullopt when neither XDG_CACHE_HOME nor HOME is set).
std::optional<std::filesystem::path> peak_cache_file();

}  // namespace engine
