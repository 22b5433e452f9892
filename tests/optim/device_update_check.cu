// GPU check of engine/optim/update_kernels.cu against the CPU math, bit for bit (update_math.h,
// which tests/optim/update_math_test.cpp proves equal to every CPU path, and core/dtype.cpp's
// rounding): the multi-tensor update (AdamW and SGD, the factor, the 16-bit copies, a skipped
// decision), the step's decision from the norm's partial sums, the norm's partial sums and the
// micro-batch sum, on lengths and alignments that take every path. Built as build/tests/optim/device_update_check
// (ctest label cuda); exits 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "optim/device_update.h"
#include "optim/optimizer.h"
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
  // AdamW's scalars at step 7 (betas 0.9/0.95, eps 1e-8, weight decay 0.1, lr 3e-4).
  recipe::OptimizerSection adamw;
  adamw.type = recipe::OptimizerType::adamw;
  adamw.betas = {0.9, 0.95};
  adamw.eps = 1e-8;
  adamw.weight_decay = 0.1;
  auto adamw_scalars_for = [&](bool decay) { return adamw_scalars(adamw, 3e-4, 7, decay); };
  const long lengths[] = {1, 3, 4, 5, 17, 1001, 65536 + 7, 300001};
  for (long n : lengths)
    for (int off : {0, 1, 2, 3}) {
      for (int mis : {0, 1})  // mis: g at a different offset from w (no packs)
        for (int variant = 0; variant < 6; ++variant) {
          // The multi-tensor update (update_chunks.h) against the CPU's step: scale_gradients'
          // product, the update per segment, the 16-bit copies rounded from the new weights.
          const bool adamw = variant < 3, momentum = variant != 5;
          const DType copy_type = variant == 0 || variant == 3 ? DType::bf16 : variant == 1 ? DType::f16 : DType::f32;
          const double factor = variant % 2 ? 0.37 : 1.0;
          // The gradients in their own type: a 16-bit run's update reads its gradient sum there.
          const DType grad_type = variant == 0 || variant == 4 ? DType::bf16 : variant == 1 ? DType::f16 : DType::f32;
          const bool skip = n == 17 && variant == 0;
          MultiTensorScalars sc{};
          sc.adamw[1] = adamw_scalars_for(true);
          sc.adamw[0] = adamw_scalars_for(false);
          sc.sgd[0] =
              SgdScalars{.lr = 0.05f, .decay = 0.0f, .momentum = 0.9f, .nesterov = variant == 4, .first = variant == 3};
          sc.sgd[1] = sc.sgd[0];
          sc.sgd[1].decay = 0.01f;
          sc.decision.factor = factor;
          sc.decision.skip = skip ? 1 : 0;
          auto w = randoms(n, rng, 1), g = randoms(n, rng, 1e-2f), m = randoms(n, rng, 1e-2f),
               v = randoms(n, rng, 1e-4f, true);
          std::vector<uint16_t> copy(n), g16(n);
          for (long k = 0; k < n; ++k)
            if (grad_type != DType::f32) {
              g16[k] = grad_type == DType::bf16 ? float_to_bf16(g[k]) : float_to_f16(g[k]);
              g[k] = grad_type == DType::bf16 ? bf16_to_float(g16[k]) : f16_to_float(g16[k]);
            }
          Dev<float> dw(w, off), dg(g, off + mis), dm(m, off), dv(v, off);
          Dev<uint16_t> dg16(g16, off + mis);
          Dev<uint16_t> dc(copy, variant == 3 ? (off + 1) % 4 : off);  // the copies' packs aligned, and not
          const std::vector<Segment> segments = {{0, 0, n / 3, true}, {0, n / 3, n, false}};
          const void* gradients = grad_type == DType::f32 ? static_cast<const void*>(dg.p) : dg16.p;
          const UpdateArrays arrays{dw.p, gradients, adamw || momentum ? dm.p : nullptr, adamw ? dv.p : nullptr,
                                    copy_type == DType::f32 ? nullptr : reinterpret_cast<std::byte*>(dc.p)};
          const std::vector<UpdateChunk> table =
              plan_update_chunks(segments, {arrays}, copy_type == DType::f32 ? 4 : 2, int64_t(dtype_size(grad_type)));
          Dev<UpdateChunk> dt(table, 0);
          Dev<MultiTensorScalars> ds(std::vector<MultiTensorScalars>{sc}, 0);
          cuda::update_chunks(dt.p, int64_t(table.size()), adamw, ds.p, copy_type, grad_type, stream);
          if (!skip) {
            if (factor != 1.0)
              for (float& x : g) x *= float(factor);
            for (const Segment& seg : segments)
              for (long k = seg.begin; k < seg.end; ++k)
                if (adamw)
                  adamw_element(w[k], g[k], m[k], v[k], sc.adamw[seg.decay ? 1 : 0]);
                else
                  sgd_element(w[k], g[k], momentum ? &m[k] : nullptr, sc.sgd[seg.decay ? 1 : 0]);
            if (copy_type != DType::f32)
              for (long k = 0; k < n; ++k)
                copy[k] = copy_type == DType::bf16 ? float_to_bf16(w[k]) : float_to_f16(w[k]);
          }
          CK(cudaStreamSynchronize(stream));
          const std::string what = "update_chunks variant " + std::to_string(variant) + " mis " + std::to_string(mis);
          compare(w, dw.get(), (what + " w").c_str(), n, off);
          if (adamw || momentum) compare(m, dm.get(), (what + " m").c_str(), n, off);
          if (adamw) compare(v, dv.get(), (what + " v").c_str(), n, off);
          compare(copy, dc.get(), (what + " copy").c_str(), n, off);
        }
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
    cuda::norm_partials(dx.p, DType::f32, blocks, dp.p, stream);
    // The same partial sums from bf16 values read in their type as from their fp32 widening.
    CK(cudaStreamSynchronize(stream));
    compare(p, dp.get(), "norm_partials", blocks, 0);
    for (DType type : {DType::bf16, DType::f16}) {
      std::vector<uint16_t> x16(x.size());
      std::vector<float> widened(x.size());
      for (size_t k = 0; k < x.size(); ++k) {
        x16[k] = type == DType::bf16 ? float_to_bf16(x[k]) : float_to_f16(x[k]);
        widened[k] = type == DType::bf16 ? bf16_to_float(x16[k]) : f16_to_float(x16[k]);
      }
      std::vector<double> p16(blocks);
      for (long b = 0; b < blocks; ++b) p16[b] = block_squares(widened.data() + b * kShardBlock);
      Dev<uint16_t> dx16(x16, 0);
      Dev<double> dp16(pd, 0);
      cuda::norm_partials(dx16.p, type, blocks, dp16.p, stream);
      CK(cudaStreamSynchronize(stream));
      compare(p16, dp16.get(), type == DType::bf16 ? "norm_partials bf16" : "norm_partials f16", blocks, 0);
    }
  }
  // The step's decision from the partial sums against the host's (sum_norm_partials, decide_update).
  const double inf = std::numeric_limits<double>::infinity();
  for (long count : {1L, 255L, 256L, 257L, 121000L})
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<double> p(count);
      for (double& x : p) x = std::exp2(double(rng() % 40) - 20.0) * (1.0 + double(rng() % 1000) / 1000.0);
      if (variant >= 2) p[count / 2] = inf;
      const StepPolicy policy{
          .loss_scale = variant % 2 ? 1024.0 : 1.0, .max_norm = 1.0, .skip_non_finite = variant == 3 ? 1 : 0};
      const UpdateDecision host = decide_update(sum_norm_partials(p), policy);
      MultiTensorScalars sc{};
      sc.policy = policy;
      Dev<double> dp(p, 0), dsums(std::vector<double>(size_t(norm_chunks(count)) + 1), 0);
      Dev<MultiTensorScalars> ds(std::vector<MultiTensorScalars>{sc}, 0);
      cuda::decide_update(dp.p, count, dsums.p, ds.p, stream);
      CK(cudaStreamSynchronize(stream));
      const UpdateDecision device = ds.get()[0].decision;
      if (std::memcmp(&host.scaled_norm, &device.scaled_norm, 8) != 0 ||
          std::memcmp(&host.grad_norm, &device.grad_norm, 8) != 0 ||
          std::memcmp(&host.factor, &device.factor, 8) != 0 || host.skip != device.skip) {
        std::printf("FAIL decide_update count=%ld variant=%d: host %.17g %.17g %.17g %d, device %.17g %.17g %.17g %d\n",
                    count, variant, host.scaled_norm, host.grad_norm, host.factor, host.skip, device.scaled_norm,
                    device.grad_norm, device.factor, device.skip);
        ++failures;
      }
    }
  CK(cudaGetLastError());
  std::printf(failures ? "FAILED (%d)\n" : "PASSED\n", failures);
  return failures ? 1 : 0;
}
