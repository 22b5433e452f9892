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
template <class L, class X, class W, class B, class Y, class S>
ENGINE_HOST_DEVICE void norm_forward_row(L& lanes, X x, int64_t c, bool rms, double eps, W w, B b, Y y, S mean_out,
                                         S rstd_out) {
  constexpr int n = L::kCount;
  typename L::template Local<float> acc;
  float mean = 0.0f;
  if (!rms) {
    lanes.each([&](int l) {
      float s = 0.0f;
      for (int64_t i = l; i < c; i += n) s += row_load(x, i);
      acc[l] = s;
    });
    mean = lanes.sum(acc) / float(c);
  }
  lanes.each([&](int l) {
    float s = 0.0f;
    for (int64_t i = l; i < c; i += n) {
      const float v = row_load(x, i);
      s += (v - mean) * (v - mean);
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
        for (int64_t i = l; i < c; i += n) s += row_load(x, i);
        wide[l] = s;
      });
      wide_mean = lanes.sum(wide) / double(c);
    }
    lanes.each([&](int l) {
      double s = 0.0;
      for (int64_t i = l; i < c; i += n) {
        const float v = row_load(x, i);
        s += (v - wide_mean) * (v - wide_mean);
      }
      wide[l] = s;
    });
    squares = lanes.sum(wide);
    mean = float(wide_mean);
  }
  const float rstd = float(1.0 / ::sqrt(squares / double(c) + eps));
  lanes.each([&](int l) {
    if (b)
      for (int64_t i = l; i < c; i += n)
        row_store(y, i, (row_load(x, i) - mean) * rstd * row_load(w, i) + row_load(b, i));
    else
      for (int64_t i = l; i < c; i += n) row_store(y, i, (row_load(x, i) - mean) * rstd * row_load(w, i));
    if (l == 0) {
      row_store(mean_out, 0, mean);
      row_store(rstd_out, 0, rstd);
    }
  });
}

// Rows [begin, end) of the backward: dx (= or +=) rstd (g - mean(g) - xhat mean(g xhat)), g = dy w
// (rmsnorm: no mean(g) term); the rows' scale (and shift) gradients summed in float, in row order,
// into dw_sum (and db_sum): c floats each, set here, every column written by the lane that owns it.
template <class L, class DY, class X, class W, class S, class DX>
ENGINE_HOST_DEVICE void norm_backward_rows(L& lanes, DY dy, X x, W w, S mean, S rstd, int64_t c, bool rms,
                                           int64_t begin, int64_t end, float* dw_sum, float* db_sum, DX dx,
                                           bool accumulate) {
  constexpr int n = L::kCount;
  lanes.each([&](int l) {
    for (int64_t i = l; i < c; i += n) {
      dw_sum[i] = 0.0f;
      if (db_sum) db_sum[i] = 0.0f;
    }
  });
  typename L::template Local<float> sum_g, sum_gx;
  const float inv_c = 1.0f / float(c);
  for (int64_t r = begin; r < end; ++r) {
    const auto dyr = dy + r * c;
    const auto xr = x + r * c;
    const auto dxr = dx + r * c;
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
        const float v = s * (row_load(dyr, i) * row_load(w, i) - mean_g - (row_load(xr, i) - m) * s * mean_gx);
        row_store(dxr, i, accumulate ? row_load(dxr, i) + v : v);
      }
    });
  }
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
// exponentials (rescaled as its max rises), the lanes' sums are rescaled to the row's max and added
// in double; then z = exp(z - max) * factor, factor = exp(max - log_sum) * scale as the CPU's
// chunk_factor. A target outside [0, vocab) gives a NaN loss and no one-hot (the CPU does not check).
template <class L, class Z>
ENGINE_HOST_DEVICE float cross_entropy_row(L& lanes, Z z, int64_t vocab, int32_t target, float scale) {
  constexpr int n = L::kCount;
  const bool has_target = target >= 0 && target < vocab;
  const float z_target = has_target ? row_load(z, target) : NAN;  // read before any lane overwrites it
  typename L::template Local<float> top, sum;
  lanes.each([&](int l) {
    float m = -INFINITY, s = 0.0f;
    for (int64_t i = l; i < vocab; i += n) {
      const float v = row_load(z, i);
      if (v > m) {
        s = m == -INFINITY ? 0.0f : s * fast_exp(m - v);
        m = v;
        s += 1.0f;
      } else {
        s += fast_exp(v - (m == -INFINITY ? 0.0f : m));
      }
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
    for (int64_t i = l; i < vocab; i += n) {
      const float g = fast_exp(row_load(z, i) - shift) * factor;
      row_store(z, i, i == target ? g - scale : g);  // the one-hot subtracted once the softmax is scaled
    }
  });
  return float(log_sum - double(z_target));
}

}  // namespace engine::ops
