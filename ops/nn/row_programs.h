// Row programs: the per-row math of the row ops (norms, softmax, cross-entropy) written once for
// the CUDA kernels and the CPU tests that check them, as phases over a fixed number of lanes.
//
// A program is a function templated on a Lanes policy. Lane l of N owns the elements l, l + N,
// l + 2N, ... of a row; a phase is `lanes.each([&](int l) { ... })`; a lane-local variable is a
// `typename L::template Local<T>` indexed by the lane; `lanes.sum(v)` / `lanes.max(v)` combine
// the lanes' values in one fixed tree and give every lane the total (they are also the barriers
// between phases). Two policies run the same program:
//   SerialLanes<N> (here): a loop over the N lanes on the CPU, the tree as loops;
//   BlockLanes<N> (nn/block_lanes.cuh): the block's N threads, __syncthreads() between phases,
//   the tree as warp shuffles then one shuffle over the warps' totals.
// The tree, for N a power of two from 32 to 1024: within each group of 32 lanes, v[l] (+)= v[l + o]
// for o = 16, 8, 4, 2, 1 (a warp's __shfl_down), then the same over the groups' totals for
// o = N/64, ..., 1. Same operations in the same order, so the CPU run of a program gives the
// device's bits, except where the CPU build contracts a*b+c into an FMA (CUDA sources are compiled
// with -fmad=false) and where a double exp/log of libm and of CUDA differ in their last bit.
//
// Packs: a program instantiated with P > 1 gives lane l the packs l, l + N, l + 2N, ... of P
// consecutive elements (P = 1: the elements themselves), read and written a pack at a time
// through row_load_pack<P> / row_store_pack<P>, so that a CUDA thread moves 16 bytes in one access;
// a lane's own sums run over its packs' elements in order. The row's length is a multiple of P (the
// caller's check; P = 1 otherwise).
//
// Rows are read and written through row_load(row, i) / row_store(row, i, v), in float: float
// pointers here; the CUDA kernels pass their typed arrays (cuda::FloatArray, cuda_util.cuh: 16-bit
// elements widened exactly and rounded once to nearest even), found by argument-dependent lookup.
// Every element is loaded as float and stored once, so a program gives the same bits on 16-bit rows
// as on their f32 widening followed by one rounding of each output.
//
//   SerialLanes<256> lanes;
//   norm_forward_row(lanes, x, c, /*rms=*/false, 1e-5, w, b, y, &mean, &rstd);
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"
#include "elementwise/add_math.h"
#include "nn/fast_math.h"

namespace engine::ops {

// ---- Scalar math shared by both policies (and fast_exp, nn/fast_math.h) --------------------------

ENGINE_HOST_DEVICE inline bool row_finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// The combining steps of the trees (the same expression on both sides, NaN handling included).
struct RowSum {
  template <class T>
  ENGINE_HOST_DEVICE T operator()(T a, T b) const {
    return a + b;
  }
};
struct RowMax {
  template <class T>
  ENGINE_HOST_DEVICE T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

ENGINE_HOST_DEVICE inline float row_load(const float* p, int64_t i) { return p[i]; }
ENGINE_HOST_DEVICE inline void row_store(float* p, int64_t i, float v) { p[i] = v; }
// What row_store(row, i, v) leaves in the row, as row_load would read it back: v rounded to the
// row's type (the CUDA arrays' overload rounds to 16 bits), without touching memory.
ENGINE_HOST_DEVICE inline float row_stored(const float* /*row*/, float v) { return v; }

// Pack `pack` (elements pack * P ... pack * P + P - 1) of a row, element by element; the CUDA
// arrays overload these with one 16-byte access (cuda_util.cuh).
template <int P, class R>
ENGINE_HOST_DEVICE void row_load_pack(const R& row, int64_t pack, float (&v)[P]) {
  for (int j = 0; j < P; ++j) v[j] = row_load(row, pack * P + j);
}
template <int P, class R>
ENGINE_HOST_DEVICE void row_store_pack(const R& row, int64_t pack, const float (&v)[P]) {
  for (int j = 0; j < P; ++j) row_store(row, pack * P + j, v[j]);
}

// ---- The CPU policy ------------------------------------------------------------------------------

template <int N>
struct SerialLanes {
  static_assert(N >= 32 && N <= 1024 && (N & (N - 1)) == 0, "lanes: a power of two from 32 to 1024");
  static constexpr int kCount = N;

  template <class T>
  struct Local {
    T value[N];
    T& operator[](int l) { return value[l]; }
  };

  template <class F>
  void each(F&& phase) const {
    for (int l = 0; l < N; ++l) phase(l);
  }
  void barrier() const {}

  template <class T, class Op>
  T reduce(Local<T>& v, Op op) const {
    constexpr int groups = N / 32;
    T totals[groups];
    for (int g = 0; g < groups; ++g) {
      T* w = v.value + g * 32;
      for (int o = 16; o > 0; o /= 2)
        for (int l = 0; l < o; ++l) w[l] = op(w[l], w[l + o]);
      totals[g] = w[0];
    }
    for (int o = groups / 2; o > 0; o /= 2)
      for (int l = 0; l < o; ++l) totals[l] = op(totals[l], totals[l + o]);
    return totals[0];
  }
  template <class T>
  T sum(Local<T>& v) const {
    return reduce(v, RowSum{});
  }
  template <class T>
  T max(Local<T>& v) const {
    return reduce(v, RowMax{});
  }
};

// ---- layernorm / rmsnorm (nn/layernorm.cpp) ------------------------------------------------------

// One row of the forward: y = (x - mean) rstd w (+ b), mean 0 for rmsnorm; rstd from the float sum
// of squared deviations, or from double sums where the float ones overflow (as norm_cpu does).
template <int P = 1, class L, class X, class W, class B, class Y, class S>
ENGINE_HOST_DEVICE void norm_forward_row(L& lanes, X x, int64_t c, bool rms, double eps, W w, B b, Y y, S mean_out,
                                         S rstd_out) {
  constexpr int n = L::kCount;
  const int64_t packs = c / P;
  typename L::template Local<float> acc;
  float mean = 0.0f;
  if (!rms) {
    lanes.each([&](int l) {
      float s = 0.0f;
      for (int64_t p = l; p < packs; p += n) {
        float v[P];
        row_load_pack<P>(x, p, v);
        for (int j = 0; j < P; ++j) s += v[j];
      }
      acc[l] = s;
    });
    mean = lanes.sum(acc) / float(c);
  }
  lanes.each([&](int l) {
    float s = 0.0f;
    for (int64_t p = l; p < packs; p += n) {
      float v[P];
      row_load_pack<P>(x, p, v);
      for (int j = 0; j < P; ++j) s += (v[j] - mean) * (v[j] - mean);
    }
    acc[l] = s;
  });
  const float float_squares = lanes.sum(acc);
  double squares = float_squares;
  if (!row_finite(mean) || !row_finite(float_squares)) {
    typename L::template Local<double> wide;
    double wide_mean = 0.0;
    if (!rms) {
      lanes.each([&](int l) {
        double s = 0.0;
        for (int64_t p = l; p < packs; p += n)
          for (int j = 0; j < P; ++j) s += row_load(x, p * P + j);
        wide[l] = s;
      });
      wide_mean = lanes.sum(wide) / double(c);
    }
    lanes.each([&](int l) {
      double s = 0.0;
      for (int64_t p = l; p < packs; p += n)
        for (int j = 0; j < P; ++j) {
          const float v = row_load(x, p * P + j);
          s += (v - wide_mean) * (v - wide_mean);
        }
      wide[l] = s;
    });
    squares = lanes.sum(wide);
    mean = float(wide_mean);
  }
  const float rstd = float(1.0 / ::sqrt(squares / double(c) + eps));
  lanes.each([&](int l) {
    for (int64_t p = l; p < packs; p += n) {
      float v[P], wv[P], out[P];
      row_load_pack<P>(x, p, v);
      row_load_pack<P>(w, p, wv);
      if (b) {
        float bv[P];
        row_load_pack<P>(b, p, bv);
        for (int j = 0; j < P; ++j) out[j] = (v[j] - mean) * rstd * wv[j] + bv[j];
      } else {
        for (int j = 0; j < P; ++j) out[j] = (v[j] - mean) * rstd * wv[j];
      }
      row_store_pack<P>(y, p, out);
    }
    if (l == 0) {
      row_store(mean_out, 0, mean);
      row_store(rstd_out, 0, rstd);
    }
  });
}

// add_norm (nn/add_norm.h): s = a + b, each sum rounded once as add's (elementwise/add_math.h) and
// stored, then norm_forward_row over s as stored. Lane l writes the packs l, l + N, ... of s and
// the norm's lane l reads exactly those back, so no barrier is needed between the two: the norm
// reads the rounded sums, the unfused add's and norm's bits.
template <int P = 1, class L, class A, class X, class W, class B, class Y, class S>
ENGINE_HOST_DEVICE void add_norm_forward_row(L& lanes, A a, A b, X s, int64_t c, bool rms, double eps, W w, B shift,
                                             Y y, S mean_out, S rstd_out) {
  constexpr int n = L::kCount;
  const int64_t packs = c / P;
  lanes.each([&](int l) {
    for (int64_t p = l; p < packs; p += n) {
      float va[P], vb[P];
      row_load_pack<P>(a, p, va);
      row_load_pack<P>(b, p, vb);
      for (int j = 0; j < P; ++j) va[j] = add_values(va[j], vb[j]);
      row_store_pack<P>(s, p, va);
    }
  });
  norm_forward_row<P>(lanes, s, c, rms, eps, w, shift, y, mean_out, rstd_out);
}

// One element of the backward's input gradient, rstd (dy w - mean(g) - xhat mean(g xhat)) with
// xhat = (x - mean) rstd: the one expression both backward programs round, so their bits agree.
ENGINE_HOST_DEVICE inline float norm_input_gradient(float d, float w, float x, float m, float s, float mean_g,
                                                    float mean_gx) {
  return s * (d * w - mean_g - (x - m) * s * mean_gx);
}

// Rows [begin, end) of the backward: dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w (rmsnorm:
// no mean(g) term), or with `accumulate` dx = base + that (base: dx itself, or another gradient the
// result starts from); the rows' scale (and shift) gradients summed in float, in row order, into
// dw_sum (and db_sum): c floats each, set here, every column written by the lane that owns it.
// With dx_sum, also dx's column sums as stored (row_stored): the bias gradient of the linear layer
// whose output gradient dx is (fuse_norm_bias_gradients, nn/layernorm.h).
template <class L, class DY, class X, class W, class S, class DX>
ENGINE_HOST_DEVICE void norm_backward_rows(L& lanes, DY dy, X x, W w, S mean, S rstd, int64_t c, bool rms,
                                           int64_t begin, int64_t end, float* dw_sum, float* db_sum, DX dx, DX base,
                                           bool accumulate, float* dx_sum = nullptr) {
  constexpr int n = L::kCount;
  lanes.each([&](int l) {
    for (int64_t i = l; i < c; i += n) {
      dw_sum[i] = 0.0f;
      if (db_sum) db_sum[i] = 0.0f;
      if (dx_sum) dx_sum[i] = 0.0f;
    }
  });
  typename L::template Local<float> sum_g, sum_gx;
  const float inv_c = 1.0f / float(c);
  for (int64_t r = begin; r < end; ++r) {
    const auto dyr = dy + r * c;
    const auto xr = x + r * c;
    const auto dxr = dx + r * c;
    const auto baser = base + r * c;
    const float m = row_load(mean, r), s = row_load(rstd, r);
    lanes.each([&](int l) {
      float a = 0.0f, ax = 0.0f;
      for (int64_t i = l; i < c; i += n) {
        const float d = row_load(dyr, i);
        const float g = d * row_load(w, i), xhat = (row_load(xr, i) - m) * s;
        a += g;
        ax += g * xhat;
        dw_sum[i] += d * xhat;
        if (db_sum) db_sum[i] += d;
      }
      sum_g[l] = a;
      sum_gx[l] = ax;
    });
    const float mean_g = rms ? 0.0f : lanes.sum(sum_g) * inv_c;
    const float mean_gx = lanes.sum(sum_gx) * inv_c;
    lanes.each([&](int l) {
      for (int64_t i = l; i < c; i += n) {
        const float v = norm_input_gradient(row_load(dyr, i), row_load(w, i), row_load(xr, i), m, s, mean_g, mean_gx);
        const float out = accumulate ? row_load(baser, i) + v : v;
        row_store(dxr, i, out);
        if (dx_sum) dx_sum[i] += row_stored(dxr, out);
      }
    });
  }
}

// The same backward with each lane's share of the scale and shift gradients' running sums in
// registers (K packs of P columns per lane at most: c <= K N P, a multiple of P), and dy, x and w
// read a pack at a time (w again for each row: it stays in cache, and registers are what limits
// how many warps run at once). The sums run in row order as above, so the two give the same bits
// for the same rows; this one moves no running sum through memory between rows. The registers a
// lane holds are the kernel's limit, so what it sums is fixed at compile time: kShift, the shift's
// running sums (false: none, db_sum must be null: rmsnorm, or a layernorm without shift), and
// kDxSums, dx's column sums as stored into dx_sum (true: dx_sum must not be null).
template <int P, int K>
struct PackRegisters {
  float v[K][P];
};
template <int P, int K, bool kShift = true, bool kDxSums = false, class L, class DY, class X, class W, class S,
          class DX>
ENGINE_HOST_DEVICE void norm_backward_rows_in_registers(L& lanes, DY dy, X x, W w, S mean, S rstd, int64_t c, bool rms,
                                                        int64_t begin, int64_t end, float* dw_sum, float* db_sum, DX dx,
                                                        DX base, bool accumulate, float* dx_sum = nullptr) {
  constexpr int n = L::kCount;
  constexpr int kShiftK = kShift ? K : 1, kDxK = kDxSums ? K : 1;  // (1: an unused register set, never read)
  const int64_t packs = c / P;
  typename L::template Local<PackRegisters<P, K>> dw_acc;
  typename L::template Local<PackRegisters<P, kShiftK>> db_acc;
  typename L::template Local<PackRegisters<P, kDxK>> dx_acc;
  lanes.each([&](int l) {
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < P; ++j) {
        dw_acc[l].v[k][j] = 0.0f;
        if constexpr (kShift) db_acc[l].v[k][j] = 0.0f;
        if constexpr (kDxSums) dx_acc[l].v[k][j] = 0.0f;
      }
  });
  typename L::template Local<float> sum_g, sum_gx;
  const float inv_c = 1.0f / float(c);
  for (int64_t r = begin; r < end; ++r) {
    const auto dyr = dy + r * c;
    const auto xr = x + r * c;
    const auto dxr = dx + r * c;
    const auto baser = base + r * c;
    const float m = row_load(mean, r), s = row_load(rstd, r);
    lanes.each([&](int l) {
      float a = 0.0f, ax = 0.0f;
      for (int k = 0; k < K; ++k) {
        const int64_t p = l + int64_t(k) * n;
        if (p >= packs) break;
        float d[P], xv[P], wv[P];
        row_load_pack<P>(dyr, p, d);
        row_load_pack<P>(xr, p, xv);
        row_load_pack<P>(w, p, wv);
        for (int j = 0; j < P; ++j) {
          const float g = d[j] * wv[j], xhat = (xv[j] - m) * s;
          a += g;
          ax += g * xhat;
          dw_acc[l].v[k][j] += d[j] * xhat;
          if constexpr (kShift) db_acc[l].v[k][j] += d[j];
        }
      }
      sum_g[l] = a;
      sum_gx[l] = ax;
    });
    const float mean_g = rms ? 0.0f : lanes.sum(sum_g) * inv_c;
    const float mean_gx = lanes.sum(sum_gx) * inv_c;
    lanes.each([&](int l) {
      for (int k = 0; k < K; ++k) {
        const int64_t p = l + int64_t(k) * n;
        if (p >= packs) break;
        float d[P], xv[P], wv[P], out[P];
        row_load_pack<P>(dyr, p, d);
        row_load_pack<P>(xr, p, xv);
        row_load_pack<P>(w, p, wv);
        if (accumulate) row_load_pack<P>(baser, p, out);
        for (int j = 0; j < P; ++j) {
          const float v = norm_input_gradient(d[j], wv[j], xv[j], m, s, mean_g, mean_gx);
          out[j] = accumulate ? out[j] + v : v;
          if constexpr (kDxSums) dx_acc[l].v[k][j] += row_stored(dxr, out[j]);
        }
        row_store_pack<P>(dxr, p, out);
      }
    });
  }
  lanes.each([&](int l) {
    for (int k = 0; k < K; ++k) {
      const int64_t p = l + int64_t(k) * n;
      if (p >= packs) break;
      for (int j = 0; j < P; ++j) {
        dw_sum[p * P + j] = dw_acc[l].v[k][j];
        if constexpr (kShift)
          if (db_sum) db_sum[p * P + j] = db_acc[l].v[k][j];
        if constexpr (kDxSums) dx_sum[p * P + j] = dx_acc[l].v[k][j];
      }
    }
  });
}

// ---- softmax (nn/softmax.cpp) ----------------------------------------------------------------------

// y = exp(x - max) / sum, the exponentials and their sum in double (as softmax_cpu).
template <class L, class X, class Y>
ENGINE_HOST_DEVICE void softmax_row(L& lanes, X x, int64_t cols, Y y) {
  constexpr int n = L::kCount;
  typename L::template Local<float> top;
  lanes.each([&](int l) {
    float m = -INFINITY;
    for (int64_t i = l; i < cols; i += n) {
      const float v = row_load(x, i);
      m = m > v ? m : v;
    }
    top[l] = m;
  });
  const float mx = lanes.max(top);
  typename L::template Local<double> partial;
  lanes.each([&](int l) {
    double s = 0.0;
    for (int64_t i = l; i < cols; i += n) s += ::exp(double(row_load(x, i)) - mx);
    partial[l] = s;
  });
  const double sum = lanes.sum(partial);
  lanes.each([&](int l) {
    for (int64_t i = l; i < cols; i += n) row_store(y, i, float(::exp(double(row_load(x, i)) - mx) / sum));
  });
}

// dx (= or +=) y (dy - sum(y dy)), the dot product in double (as softmax_backward_cpu).
template <class L, class Y, class DY, class DX>
ENGINE_HOST_DEVICE void softmax_backward_row(L& lanes, Y y, DY dy, int64_t cols, DX dx, bool accumulate) {
  constexpr int n = L::kCount;
  typename L::template Local<double> partial;
  lanes.each([&](int l) {
    double s = 0.0;
    for (int64_t i = l; i < cols; i += n) s += double(row_load(y, i)) * row_load(dy, i);
    partial[l] = s;
  });
  const double dot = lanes.sum(partial);
  lanes.each([&](int l) {
    for (int64_t i = l; i < cols; i += n) {
      const float v = float(row_load(y, i) * (row_load(dy, i) - dot));
      row_store(dx, i, accumulate ? row_load(dx, i) + v : v);
    }
  });
}

// ---- softmax cross-entropy (loss/cross_entropy.cpp) ------------------------------------------------

// One row: returns the loss log(sum exp(z)) - z[target] and overwrites z with its gradient,
// scale * (softmax - onehot). Two passes: each lane keeps an online max and a float sum of
// exponentials (rescaled as its max rises, once per pack: the pack's max first), the lanes' sums
// are rescaled to the row's max and added in double; then z = exp(z - max) * factor, factor =
// exp(max - log_sum) * scale as the CPU's chunk_factor. A target of -1 (loss/cross_entropy.h's
// kIgnoredTarget) is not trained: the loss is 0 and the row's gradient 0. Any other target outside
// [0, vocab) gives a NaN loss and no one-hot. A NaN logit makes the sum, and so the loss, NaN.
template <int P = 1, class L, class Z>
ENGINE_HOST_DEVICE float cross_entropy_row(L& lanes, Z z, int64_t vocab, int32_t target, float scale) {
  constexpr int n = L::kCount;
  const int64_t packs = vocab / P;
  if (target == -1) {
    lanes.each([&](int l) {
      float zeros[P] = {};
      for (int64_t p = l; p < packs; p += n) row_store_pack<P>(z, p, zeros);
    });
    lanes.barrier();
    return 0.0f;
  }
  const bool has_target = target >= 0 && target < vocab;
  const float z_target = has_target ? row_load(z, target) : NAN;  // read before any lane overwrites it
  typename L::template Local<float> top, sum;
  lanes.each([&](int l) {
    float m = -INFINITY, s = 0.0f;
    for (int64_t p = l; p < packs; p += n) {
      float v[P];
      row_load_pack<P>(z, p, v);
      float pack_max = v[0];
      for (int j = 1; j < P; ++j) pack_max = v[j] > pack_max ? v[j] : pack_max;
      if (pack_max > m) {
        s = m == -INFINITY ? 0.0f : s * fast_exp(m - pack_max);
        m = pack_max;
      }
      const float base = m == -INFINITY ? 0.0f : m;
      for (int j = 0; j < P; ++j) s += fast_exp(v[j] - base);
    }
    top[l] = m;
    sum[l] = s;
  });
  typename L::template Local<float> tops;  // reduce() consumes its argument: keep each lane's max
  lanes.each([&](int l) { tops[l] = top[l]; });
  const float row_max = lanes.max(tops);
  const float shift = row_max == -INFINITY ? 0.0f : row_max;
  typename L::template Local<double> rescaled;
  lanes.each([&](int l) {
    rescaled[l] = top[l] == -INFINITY ? double(sum[l]) : double(sum[l]) * ::exp(double(top[l]) - double(shift));
  });
  const double log_sum = double(shift) + ::log(lanes.sum(rescaled));
  const float factor = float(::exp(double(row_max) - log_sum) * double(scale));
  lanes.each([&](int l) {
    for (int64_t p = l; p < packs; p += n) {
      float v[P];
      row_load_pack<P>(z, p, v);
      for (int j = 0; j < P; ++j) {
        const float g = fast_exp(v[j] - shift) * factor;
        v[j] = p * P + j == target ? g - scale : g;  // the one-hot subtracted once the softmax is scaled
      }
      row_store_pack<P>(z, p, v);
    }
  });
  return float(log_sum - double(z_target));
}

}  // namespace engine::ops
