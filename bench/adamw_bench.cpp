// Times the optimizer update kernels (engine/optim/update_kernels.h) against the machine's memory
// bandwidth: the STREAM triad a[i] = b[i] + s * c[i] (12 bytes per element, as STREAM counts), then
// AdamW (28 bytes per parameter: w, g, m, v read; w, m, v written) on each instruction-set path, and
// SGD with momentum (20 bytes). Threads: OMP_NUM_THREADS. Each figure is the best of --repeats runs
// over arrays far larger than the caches.
//
//   OMP_NUM_THREADS=2 build/adamw_bench --params 67108864 --triad-mib 256 --repeats 5
//
// Prints one tab-separated line per kernel: name, elements per second, GB/s.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "optim/update_kernels.h"
#include "optim/update_kernels_isa.h"

namespace {

using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Array = std::unique_ptr<float[], FreeDeleter>;

// 64-byte aligned, and first touched by the threads that will stream it (their NUMA node).
Array make_array(int64_t n, float value) {
  const size_t bytes = (size_t(n) * sizeof(float) + 63) / 64 * 64;
  Array a(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (!a) {
    std::fprintf(stderr, "adamw_bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  float* p = a.get();
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < n; ++k) p[k] = value;
  return a;
}

template <class F>
double best_seconds(int repeats, const F& run) {
  run();  // warm: page faults, thread start
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

void report(const char* name, int64_t elements, double bytes_per_element, double seconds) {
  std::printf("%s\t%.4g\t%.2f\n", name, double(elements) / seconds,
              double(elements) * bytes_per_element / seconds / 1e9);
  std::fflush(stdout);
}

void triad(int64_t n, int repeats) {
  Array a = make_array(n, 0.0f), b = make_array(n, 1.0f), c = make_array(n, 2.0f);
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
  const float scalar = 3.0f;
  const double s = best_seconds(repeats, [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t k = 0; k < n; ++k) pa[k] = pb[k] + scalar * pc[k];
  });
  report("triad", n, 12, s);
}

void adamw(int64_t n, int repeats) {
  using engine::update_isa::Isa;
  Array w = make_array(n, 1.0f), g = make_array(n, 1e-3f), m = make_array(n, 0.0f), v = make_array(n, 0.0f);
  const engine::AdamWScalars s{.beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .one_minus_beta1 = 1.0f - 0.9f,
                               .one_minus_beta2 = 1.0f - 0.95f,
                               .eps = 1e-8f,
                               .step_size = 3e-4f,
                               .denom_scale = 1.0f,
                               .decay = 3e-5f};
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::scalar}) {
    if (!engine::update_isa::supported(isa)) continue;
    const double seconds =
        best_seconds(repeats, [&] { engine::update_isa::adamw(isa, w.get(), g.get(), m.get(), v.get(), n, s); });
    report((std::string("adamw_") + engine::update_isa::name(isa)).c_str(), n, 28, seconds);
  }
  // SGD with momentum reuses w, g and m (as the buffer): reads w, g, buf; writes w, buf.
  const engine::SgdScalars sgd{.lr = 1e-3f, .decay = 1e-4f, .momentum = 0.9f, .nesterov = false, .first = false};
  const double seconds = best_seconds(repeats, [&] { engine::sgd_update(w.get(), g.get(), m.get(), n, sgd); });
  report((std::string("sgd_momentum_") + engine::update_isa::name(engine::update_isa::best())).c_str(), n, 20, seconds);
}

int64_t number(const char* text, const char* flag) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value <= 0) {
    std::fprintf(stderr, "adamw_bench: %s wants a positive integer, not '%s'\n", flag, text);
    std::exit(2);
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = int64_t(1) << 26, triad_mib = 256;
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc || (flag != "--params" && flag != "--triad-mib" && flag != "--repeats")) {
      std::fprintf(stderr, "usage: adamw_bench [--params N] [--triad-mib MiB per array] [--repeats R]\n");
      return 2;
    }
    const int64_t value = number(argv[++i], flag.c_str());
    if (flag == "--params") params = value;
    if (flag == "--triad-mib") triad_mib = value;
    if (flag == "--repeats") repeats = int(value);
  }
  std::printf("threads\t%d\n", omp_get_max_threads());
  triad(triad_mib * (1 << 20) / int64_t(sizeof(float)), repeats);
  adamw(params, repeats);
  return 0;
}
