// GPU check of engine/optim/update_kernels.cu against the CPU math, bit for bit (update_math.h,
// which tests/optim/update_math_test.cpp proves equal to every CPU path, and core/dtype.cpp's
// rounding): AdamW, SGD, scaling, the norm's partial sums and the micro-batch sum, on lengths and
// alignments that take every path. Built as build/tests/optim/device_update_check (ctest label
// cuda); exits 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "optim/device_update.h"
#include "optim/update_math.h"

using namespace engine;

static int failures = 0;
#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

template <class T>
static void compare(const std::vector<T>& a, const std::vector<T>& b, const char* what, long n, int off) {
  for (size_t k = 0; k < a.size(); ++k)
    if (std::memcmp(&a[k], &b[k], sizeof(T)) != 0) {
      std::printf("FAIL %s n=%ld off=%d at %zu\n", what, n, off, k);
      ++failures;
      return;
    }
}

static std::vector<float> randoms(size_t n, std::mt19937& rng, float scale, bool pos = false) {
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) {
    const unsigned r = rng() % 64;
    x = r == 0   ? 0.0f
        : r == 1 ? -0.0f
        : r == 2 ? 1e-41f * float(1 + rng() % 100)
                 : normal(rng) * scale * std::exp2(float(int(rng() % 17) - 8));
    if (pos) x = std::abs(x);
  }
  return v;
}

// Device array of n elements at element offset `off` from a 256-byte aligned allocation.
template <class T>
struct Dev {
  T* base = nullptr;
  T* p = nullptr;
  size_t n;
  Dev(const std::vector<T>& h, int off) : n(h.size()) {
    CK(cudaMalloc(&base, (n + 64) * sizeof(T)));
    p = base + off;
    CK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  ~Dev() { cudaFree(base); }
};

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device here (the optimizer kernels' check runs on a GPU machine)\n");
    return 77;
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  std::mt19937 rng(1);
  // adamw_scalars(betas 0.9/0.95, eps 1e-8, wd 0.1, lr 3e-4, t 7), without linking update_kernels.cpp
  auto adamw_scalars_for = [](bool decay) {
    const double lr = 3e-4, b1 = 0.9, b2 = 0.95;
    return AdamWScalars{.beta1 = float(b1),
                        .beta2 = float(b2),
                        .one_minus_beta1 = 1.0f - float(b1),
                        .one_minus_beta2 = 1.0f - float(b2),
                        .eps = 1e-8f,
                        .step_size = float(lr / (1.0 - std::pow(b1, 7.0))),
                        .denom_scale = float(1.0 / std::sqrt(1.0 - std::pow(b2, 7.0))),
                        .decay = decay ? float(lr * 0.1) : 0.0f};
  };
  const long lengths[] = {1, 3, 4, 5, 17, 1001, 65536 + 7, 300001};
  for (long n : lengths)
    for (int off : {0, 1, 2, 3}) {
      for (int mis : {0, 1}) {  // mis: g at a different offset from w (no packs)
        const AdamWScalars s = adamw_scalars_for((n + off) % 2 == 0);
        auto w = randoms(n, rng, 1), g = randoms(n, rng, 1e-2f), m = randoms(n, rng, 1e-2f),
             v = randoms(n, rng, 1e-4f, true);
        Dev<float> dw(w, off), dg(g, off + mis), dm(m, off), dv(v, off);
        // The same step again with its scalars read from device memory (a CUDA graph's update).
        Dev<float> dw_d(w, off), dg_d(g, off + mis), dm_d(m, off), dv_d(v, off);
        Dev<AdamWScalars> ds(std::vector<AdamWScalars>{s}, 0);
        for (long k = 0; k < n; ++k) adamw_element(w[k], g[k], m[k], v[k], s);
        cuda::adamw_update(dw.p, dg.p, dm.p, dv.p, n, s, stream);
        cuda::adamw_update(dw_d.p, dg_d.p, dm_d.p, dv_d.p, n, ds.p, stream);
        CK(cudaStreamSynchronize(stream));
        compare(w, dw.get(), "adamw w", n, off);
        compare(m, dm.get(), "adamw m", n, off);
        compare(v, dv.get(), "adamw v", n, off);
        compare(w, dw_d.get(), "adamw w (device scalars)", n, off);
        compare(v, dv_d.get(), "adamw v (device scalars)", n, off);
        for (int variant = 0; variant < 5; ++variant) {
          const bool momentum = variant > 0;
          const SgdScalars ss{
              .lr = 0.05f, .decay = 0.01f, .momentum = 0.9f, .nesterov = variant >= 3, .first = variant % 2 == 0};
          auto w2 = randoms(n, rng, 1), g2 = randoms(n, rng, 1e-2f), b2 = randoms(n, rng, 1e-2f);
          Dev<float> dw2(w2, off), dg2(g2, off + mis), db2(b2, off);
          Dev<float> dw2_d(w2, off), dg2_d(g2, off + mis), db2_d(b2, off);
          Dev<SgdScalars> dss(std::vector<SgdScalars>{ss}, 0);
          for (long k = 0; k < n; ++k) sgd_element(w2[k], g2[k], momentum ? &b2[k] : nullptr, ss);
          cuda::sgd_update(dw2.p, dg2.p, momentum ? db2.p : nullptr, n, ss, stream);
          cuda::sgd_update(dw2_d.p, dg2_d.p, momentum ? db2_d.p : nullptr, n, dss.p, stream);
          CK(cudaStreamSynchronize(stream));
          compare(w2, dw2.get(), "sgd w", n, off);
          compare(b2, db2.get(), "sgd buf", n, off);
          compare(w2, dw2_d.get(), "sgd w (device scalars)", n, off);
          compare(b2, db2_d.get(), "sgd buf (device scalars)", n, off);
        }
      }
      auto x = randoms(n, rng, 1);
      Dev<float> dx(x, off), dx_d(x, off);
      const float f = float(0.7 / 3.1);
      Dev<float> df(std::vector<float>{f}, 0);
      for (float& e : x) e *= f;
      cuda::scale(dx.p, n, f, stream);
      cuda::scale(dx_d.p, n, df.p, stream);
      CK(cudaStreamSynchronize(stream));
      compare(x, dx.get(), "scale", n, off);
      compare(x, dx_d.get(), "scale (device factor)", n, off);
      // Micro-batch sums in each type (NaN-free inputs: NaN payloads follow each device's adder).
      for (int mis : {0, 1}) {
        auto a = randoms(n, rng, 1), b = randoms(n, rng, 1);
        std::vector<float> sf = a;
        Dev<float> dsf(a, off), dbf(b, off + mis);
        for (long k = 0; k < n; ++k) sf[k] = sf[k] + b[k];
        cuda::accumulate_gradients(dsf.p, dbf.p, DType::f32, n, stream);
        std::vector<uint16_t> a16(n), b16(n), h16(n), ah(n), bh(n), hh(n);
        for (long k = 0; k < n; ++k) {
          a16[k] = float_to_bf16(a[k]);
          b16[k] = float_to_bf16(b[k]);
          h16[k] = float_to_bf16(bf16_to_float(a16[k]) + bf16_to_float(b16[k]));
          ah[k] = float_to_f16(a[k]);
          bh[k] = float_to_f16(b[k] * 1e-3f);
          hh[k] = float_to_f16(f16_to_float(ah[k]) + f16_to_float(bh[k]));
        }
        Dev<uint16_t> da16(a16, off), db16(b16, off + mis), dah(ah, off), dbh(bh, off + mis);
        cuda::accumulate_gradients(da16.p, db16.p, DType::bf16, n, stream);
        cuda::accumulate_gradients(dah.p, dbh.p, DType::f16, n, stream);
        CK(cudaStreamSynchronize(stream));
        compare(sf, dsf.get(), "accumulate f32", n, off);
        compare(h16, da16.get(), "accumulate bf16", n, off);
        compare(hh, dah.get(), "accumulate f16", n, off);
      }
    }
  for (long blocks : {1L, 2L, 3L, 33L, 1000L, 40000L}) {
    auto x = randoms(size_t(blocks * kShardBlock), rng, 10);
    Dev<float> dx(x, 0);
    std::vector<double> p(blocks), pd(blocks, -1.0);
    for (long b = 0; b < blocks; ++b) p[b] = block_squares(x.data() + b * kShardBlock);
    Dev<double> dp(pd, 0);
    cuda::norm_partials(dx.p, blocks, dp.p, stream);
    CK(cudaStreamSynchronize(stream));
    compare(p, dp.get(), "norm_partials", blocks, 0);
  }
  CK(cudaGetLastError());
  std::printf(failures ? "FAILED (%d)\n" : "PASSED\n", failures);
  return failures ? 1 : 0;
}
