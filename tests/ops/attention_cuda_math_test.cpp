// causal_attention's CUDA kernels (nn/attention.cu) emulated on the CPU: the same tiles, the same
// 256 "threads" run one after another between the block's barriers, the same tile math
// (nn/attention_math.h), the row reductions as the warp shuffles' butterflies. Their out, lse and
// dqkv agree with the CPU kernels' (nn/attention.cpp) to fp32 rounding for odd head sizes and
// lengths, grouped-query heads, every compiled head capacity and accumulating gradients, so the
// kernels' indexing, masking and online softmax are checked where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/attention_math.h"
#include "random_values.h"

namespace engine {
namespace {

namespace at = ops::attention_tiles;
using at::Geometry;
using at::kPer;
using at::kScoreStride;
using at::kSide;
using at::kThreads;
using at::kTile;
using at::owned;

// The row reductions of attention.cu: lane t combines its value with lane t ^ m's, m from `first`
// halving to 1, all lanes at once (as __shfl_xor_sync). `lanes` holds one value per thread.
template <typename Combine>
void butterfly(std::vector<float>& lanes, int first, Combine combine) {
  for (int m = first; m >= 1; m /= 2) {
    const std::vector<float> before = lanes;
    for (size_t t = 0; t < lanes.size(); ++t) lanes[t] = combine(before[t], before[t ^ size_t(m)]);
  }
}

struct Thread {
  int tid, ty, tx;
};
std::vector<Thread> threads() {
  std::vector<Thread> all;
  for (int tid = 0; tid < kThreads; ++tid) all.push_back({tid, tid / kSide, tid % kSide});
  return all;
}

// forward_kernel<kCap>, every block.
template <int kCap>
void emulate_forward(const Geometry& g, const float* qkv, float* out, float* lse, float scale) {
  constexpr int ld = at::tile_stride(kCap), kCols = kCap / kSide;
  const int hd = int(g.head_size);
  std::vector<float> sq(kTile * ld), skv(kTile * ld), sp(kTile * kScoreStride);
  struct State {
    float run_max[kPer], run_sum[kPer], acc[kPer][kCols], s[kPer][kPer], rescale[kPer];
  };
  std::vector<State> state(kThreads);
  std::vector<float> lanes(kThreads);
  for (int64_t bh = 0; bh < g.batch * g.heads; ++bh) {
    for (int64_t qb = 0; qb < at::tiles(g.time); ++qb) {
      const int64_t b = bh / g.heads, h = bh % g.heads, kvh = h / g.group(), q0 = qb * kTile;
      const float* base = qkv + b * g.time * g.row;
      for (const Thread& t : threads()) {
        at::load_tile<kCap>(sq.data(), base + q0 * g.row + g.q(h), g.row, at::tile_rows(g.time, q0), hd, t.tid);
        State& st = state[size_t(t.tid)];
        for (int i = 0; i < kPer; ++i) {
          st.run_max[i] = -INFINITY;
          st.run_sum[i] = 0.0f;
          for (int k = 0; k < kCols; ++k) st.acc[i][k] = 0.0f;
        }
      }
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t k0 = kb * kTile;
        const int valid = at::tile_rows(g.time, k0);
        for (const Thread& t : threads())
          at::load_tile<kCap>(skv.data(), base + k0 * g.row + g.k(kvh), g.row, valid, hd, t.tid);
        for (const Thread& t : threads()) {
          State& st = state[size_t(t.tid)];
          at::dot_tile<kCap>(sq.data(), skv.data(), t.ty, t.tx, st.s);
          at::forward_scores(st.s, scale, q0, k0, g.time, t.ty, t.tx);
        }
        for (int i = 0; i < kPer; ++i) {
          for (const Thread& t : threads()) lanes[size_t(t.tid)] = at::partial_max(state[size_t(t.tid)].s, i);
          butterfly(lanes, kSide / 2, at::combine_max);
          std::vector<float> partials(kThreads);
          for (const Thread& t : threads()) {
            State& st = state[size_t(t.tid)];
            st.rescale[i] = at::softmax_step(st.s, i, lanes[size_t(t.tid)], st.run_max[i], partials[size_t(t.tid)]);
          }
          butterfly(partials, kSide / 2, at::combine_sum);
          for (const Thread& t : threads()) {
            State& st = state[size_t(t.tid)];
            st.run_sum[i] = st.run_sum[i] * st.rescale[i] + partials[size_t(t.tid)];
            for (int j = 0; j < kPer; ++j) sp[size_t(owned(t.ty, i) * kScoreStride + owned(t.tx, j))] = st.s[i][j];
          }
        }
        for (const Thread& t : threads())
          at::load_tile<kCap>(skv.data(), base + k0 * g.row + g.v(kvh), g.row, valid, hd, t.tid);
        for (const Thread& t : threads()) {
          State& st = state[size_t(t.tid)];
          at::rescale_rows(st.acc, st.rescale);
          at::product_tile<kCap>(sp.data(), skv.data(), t.ty, t.tx, st.acc);
        }
      }
      for (const Thread& t : threads()) {
        const State& st = state[size_t(t.tid)];
        for (int i = 0; i < kPer; ++i) {
          const int64_t row = q0 + owned(t.ty, i);
          if (row >= g.time) continue;
          const float inv = at::row_inverse(st.run_sum[i]);
          for (int k = 0; k < kCols; ++k)
            if (owned(t.tx, k) < hd)
              out[(b * g.time + row) * g.channels + g.q(h) + owned(t.tx, k)] = st.acc[i][k] * inv;
          if (t.tx == 0) lse[(b * g.heads + h) * g.time + row] = at::row_lse(st.run_max[i], st.run_sum[i]);
        }
      }
    }
  }
}

// delta_kernel: one warp of 32 lanes per row.
void emulate_delta(const Geometry& g, const float* dout, const float* out, float* delta) {
  std::vector<float> lanes(32);
  for (int64_t r = 0; r < g.batch * g.time * g.heads; ++r) {
    const int64_t h = r % g.heads, bt = r / g.heads, b = bt / g.time, t = bt % g.time;
    const int64_t at_row = bt * g.channels + h * g.head_size;
    for (int lane = 0; lane < 32; ++lane)
      lanes[size_t(lane)] = at::delta_partial(dout + at_row, out + at_row, int(g.head_size), lane);
    butterfly(lanes, 16, at::combine_sum);
    delta[(b * g.heads + h) * g.time + t] = lanes[0];
  }
}

// dq_kernel<kCap>, every block.
template <int kCap>
void emulate_dq(const Geometry& g, const float* dout, const float* qkv, const float* lse, const float* delta,
                float* dqkv, float scale, bool accumulate) {
  constexpr int ld = at::tile_stride(kCap), kCols = kCap / kSide;
  const int hd = int(g.head_size);
  std::vector<float> sq(kTile * ld), sdo(kTile * ld), sk(kTile * ld), sv(kTile * ld), sds(kTile * kScoreStride);
  struct State {
    float lse[kPer], delta[kPer], acc[kPer][kCols];
  };
  std::vector<State> state(kThreads);
  for (int64_t bh = 0; bh < g.batch * g.heads; ++bh) {
    for (int64_t qb = 0; qb < at::tiles(g.time); ++qb) {
      const int64_t b = bh / g.heads, h = bh % g.heads, kvh = h / g.group(), q0 = qb * kTile;
      const int q_valid = at::tile_rows(g.time, q0);
      const float* base = qkv + b * g.time * g.row;
      for (const Thread& t : threads()) {
        at::load_tile<kCap>(sq.data(), base + q0 * g.row + g.q(h), g.row, q_valid, hd, t.tid);
        at::load_tile<kCap>(sdo.data(), dout + (b * g.time + q0) * g.channels + g.q(h), g.channels, q_valid, hd, t.tid);
        State& st = state[size_t(t.tid)];
        for (int i = 0; i < kPer; ++i) {
          const int64_t row = q0 + owned(t.ty, i), at_row = (b * g.heads + h) * g.time + row;
          st.lse[i] = row < g.time ? lse[at_row] : 0.0f;
          st.delta[i] = row < g.time ? delta[at_row] : 0.0f;
          for (int k = 0; k < kCols; ++k) st.acc[i][k] = 0.0f;
        }
      }
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t k0 = kb * kTile;
        const int valid = at::tile_rows(g.time, k0);
        for (const Thread& t : threads()) {
          at::load_tile<kCap>(sk.data(), base + k0 * g.row + g.k(kvh), g.row, valid, hd, t.tid);
          at::load_tile<kCap>(sv.data(), base + k0 * g.row + g.v(kvh), g.row, valid, hd, t.tid);
        }
        for (const Thread& t : threads()) {
          const State& st = state[size_t(t.tid)];
          float s[kPer][kPer], dp[kPer][kPer];
          at::dot_tile<kCap>(sq.data(), sk.data(), t.ty, t.tx, s);
          at::dot_tile<kCap>(sdo.data(), sv.data(), t.ty, t.tx, dp);
          for (int i = 0; i < kPer; ++i)
            for (int j = 0; j < kPer; ++j) {
              const bool seen = at::visible(q0 + owned(t.ty, i), k0 + owned(t.tx, j), g.time);
              const float p = at::probability(s[i][j], scale, st.lse[i], seen);
              sds[size_t(owned(t.ty, i) * kScoreStride + owned(t.tx, j))] =
                  at::score_gradient(p, dp[i][j], st.delta[i]);
            }
        }
        for (const Thread& t : threads())
          at::product_tile<kCap>(sds.data(), sk.data(), t.ty, t.tx, state[size_t(t.tid)].acc);
      }
      for (const Thread& t : threads()) {
        const State& st = state[size_t(t.tid)];
        for (int i = 0; i < kPer; ++i) {
          const int64_t row = q0 + owned(t.ty, i);
          if (row >= g.time) continue;
          float* dq = dqkv + (b * g.time + row) * g.row + g.q(h);
          for (int k = 0; k < kCols; ++k) {
            if (owned(t.tx, k) >= hd) continue;
            const float v = st.acc[i][k] * scale;
            dq[owned(t.tx, k)] = accumulate ? dq[owned(t.tx, k)] + v : v;
          }
        }
      }
    }
  }
}

// dkv_kernel<kCap>, every block.
template <int kCap>
void emulate_dkv(const Geometry& g, const float* dout, const float* qkv, const float* lse, const float* delta,
                 float* dqkv, float scale, bool accumulate) {
  constexpr int ld = at::tile_stride(kCap), kCols = kCap / kSide;
  const int hd = int(g.head_size);
  std::vector<float> sk(kTile * ld), sv(kTile * ld), sq(kTile * ld), sdo(kTile * ld);
  std::vector<float> sp(kTile * kScoreStride), sds(kTile * kScoreStride), slse(kTile), sdelta(kTile);
  struct State {
    float dk[kPer][kCols], dv[kPer][kCols];
  };
  std::vector<State> state(kThreads);
  const int64_t blocks = at::tiles(g.time);
  for (int64_t bg = 0; bg < g.batch * g.kv_heads; ++bg) {
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t b = bg / g.kv_heads, kvh = bg % g.kv_heads, k0 = kb * kTile;
      const float* base = qkv + b * g.time * g.row;
      const int k_valid = at::tile_rows(g.time, k0);
      for (const Thread& t : threads()) {
        at::load_tile<kCap>(sk.data(), base + k0 * g.row + g.k(kvh), g.row, k_valid, hd, t.tid);
        at::load_tile<kCap>(sv.data(), base + k0 * g.row + g.v(kvh), g.row, k_valid, hd, t.tid);
        State& st = state[size_t(t.tid)];
        for (int i = 0; i < kPer; ++i)
          for (int k = 0; k < kCols; ++k) st.dk[i][k] = st.dv[i][k] = 0.0f;
      }
      for (int64_t h = kvh * g.group(); h < (kvh + 1) * g.group(); ++h) {
        for (int64_t qb = kb; qb < blocks; ++qb) {
          const int64_t q0 = qb * kTile;
          const int valid = at::tile_rows(g.time, q0);
          for (const Thread& t : threads()) {
            at::load_tile<kCap>(sq.data(), base + q0 * g.row + g.q(h), g.row, valid, hd, t.tid);
            at::load_tile<kCap>(sdo.data(), dout + (b * g.time + q0) * g.channels + g.q(h), g.channels, valid, hd,
                                t.tid);
            if (t.tid < kTile) {
              const int64_t at_row = (b * g.heads + h) * g.time + q0 + t.tid;
              slse[size_t(t.tid)] = t.tid < valid ? lse[at_row] : 0.0f;
              sdelta[size_t(t.tid)] = t.tid < valid ? delta[at_row] : 0.0f;
            }
          }
          for (const Thread& t : threads()) {
            float s[kPer][kPer], dp[kPer][kPer];
            at::dot_tile<kCap>(sk.data(), sq.data(), t.ty, t.tx, s);
            at::dot_tile<kCap>(sv.data(), sdo.data(), t.ty, t.tx, dp);
            for (int i = 0; i < kPer; ++i)
              for (int j = 0; j < kPer; ++j) {
                const int query = owned(t.tx, j), idx = owned(t.ty, i) * kScoreStride + query;
                const bool seen = at::visible(q0 + query, k0 + owned(t.ty, i), g.time);
                const float p = at::probability(s[i][j], scale, slse[size_t(query)], seen);
                sp[size_t(idx)] = p;
                sds[size_t(idx)] = at::score_gradient(p, dp[i][j], sdelta[size_t(query)]);
              }
          }
          for (const Thread& t : threads()) {
            State& st = state[size_t(t.tid)];
            at::product_tile<kCap>(sp.data(), sdo.data(), t.ty, t.tx, st.dv);
            at::product_tile<kCap>(sds.data(), sq.data(), t.ty, t.tx, st.dk);
          }
        }
      }
      for (const Thread& t : threads()) {
        const State& st = state[size_t(t.tid)];
        for (int i = 0; i < kPer; ++i) {
          const int64_t row = k0 + owned(t.ty, i);
          if (row >= g.time) continue;
          float* r = dqkv + (b * g.time + row) * g.row;
          for (int k = 0; k < kCols; ++k) {
            const int c = owned(t.tx, k);
            if (c >= hd) continue;
            const float gk = st.dk[i][k] * scale, gv = st.dv[i][k];
            r[g.k(kvh) + c] = accumulate ? r[g.k(kvh) + c] + gk : gk;
            r[g.v(kvh) + c] = accumulate ? r[g.v(kvh) + c] + gv : gv;
          }
        }
      }
    }
  }
}

// The worst of |a - b| / (atol + rtol |b|) over two arrays: at most 1 passes.
double worst(const float* a, const float* b, size_t n, double atol, double rtol) {
  double w = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::abs(double(a[i]) - double(b[i])) / (atol + rtol * std::abs(double(b[i])));
    w = std::isnan(e) ? INFINITY : std::max(w, e);
  }
  return w;
}

struct Case {
  int64_t batch, time, heads, kv_heads, head_size;
  bool accumulate;
};

// The CPU kernels' forward and backward (the backward reading the CPU forward's out and lse) against
// the emulation's, whose backward reads the same out and lse.
void check(const Case& c) {
  const std::string what = "B " + std::to_string(c.batch) + " T " + std::to_string(c.time) + " H " +
                           std::to_string(c.heads) + " KV " + std::to_string(c.kv_heads) + " hd " +
                           std::to_string(c.head_size) + (c.accumulate ? " accumulating" : "");
  const int64_t B = c.batch, T = c.time, H = c.heads, KV = c.kv_heads, hd = c.head_size;
  Graph graph;
  const ValueId qkv = graph.add_activation("qkv", Shape{B, T, (H + 2 * KV) * hd});
  const ValueId out = graph.add_activation("out", Shape{B, T, H * hd});
  const ValueId lse = graph.add_activation("lse", Shape{B, H, T});
  const ValueId dout = graph.add_activation("dout", Shape{B, T, H * hd});
  const ValueId dqkv = graph.add_activation("dqkv", Shape{B, T, (H + 2 * KV) * hd});
  const Node forward{&ops::kCausalAttention, {qkv}, {out, lse}, Attrs{{H, KV}, {}}, false, false, "a"};
  const Node backward{
      &ops::kCausalAttentionBackward, {dout, qkv, out, lse}, {dqkv}, Attrs{{H, KV}, {}}, c.accumulate, false, "a"};
  test_util::RandomValues values(graph, 11);
  const KernelContext& ctx = values.ctx;
  const size_t n_qkv = size_t(B * T * (H + 2 * KV) * hd), n_out = size_t(B * T * H * hd), n_lse = size_t(B * H * T);
  std::vector<float> dqkv_emulated(ctx.f32(dqkv), ctx.f32(dqkv) + n_qkv);  // the random start accumulated onto
  forward.op->cpu(forward, ctx);
  backward.op->cpu(backward, ctx);

  const Geometry g{B, T, H, KV, hd, (H + 2 * KV) * hd, H * hd};
  std::vector<float> out_emulated(n_out), lse_emulated(n_lse);
  // The emulated forward into its own out and lse; the emulated backward reads the CPU's.
  const float *q = ctx.f32(qkv), *d = ctx.f32(dout);
  switch (at::head_capacity(hd)) {
    case 16:
      emulate_forward<16>(g, q, out_emulated.data(), lse_emulated.data(), 1.0f / std::sqrt(float(hd)));
      break;
    case 32:
      emulate_forward<32>(g, q, out_emulated.data(), lse_emulated.data(), 1.0f / std::sqrt(float(hd)));
      break;
    case 64:
      emulate_forward<64>(g, q, out_emulated.data(), lse_emulated.data(), 1.0f / std::sqrt(float(hd)));
      break;
    default:
      emulate_forward<128>(g, q, out_emulated.data(), lse_emulated.data(), 1.0f / std::sqrt(float(hd)));
  }
  EXPECT_LE(worst(out_emulated.data(), ctx.f32(out), n_out, 1e-6, 1e-5), 1.0) << what << ": out";
  EXPECT_LE(worst(lse_emulated.data(), ctx.f32(lse), n_lse, 1e-6, 1e-6), 1.0) << what << ": lse";

  const float scale = 1.0f / std::sqrt(float(hd));
  std::vector<float> delta(n_lse);
  emulate_delta(g, d, ctx.f32(out), delta.data());
  const float* cpu_lse = ctx.f32(lse);
  switch (at::head_capacity(hd)) {
    case 16:
      emulate_dq<16>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      emulate_dkv<16>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      break;
    case 32:
      emulate_dq<32>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      emulate_dkv<32>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      break;
    case 64:
      emulate_dq<64>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      emulate_dkv<64>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      break;
    default:
      emulate_dq<128>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
      emulate_dkv<128>(g, d, q, cpu_lse, delta.data(), dqkv_emulated.data(), scale, c.accumulate);
  }
  EXPECT_LE(worst(dqkv_emulated.data(), ctx.f32(dqkv), n_qkv, 1e-5, 1e-4), 1.0) << what << ": dqkv";
}

TEST(CausalAttentionCudaTiles, EmulationMatchesTheCpuKernels) {
  for (const Case& c : {
           Case{2, 150, 4, 2, 8, true},     // three query tiles, the last partial; GQA; capacity 16
           Case{1, 64, 2, 2, 20, false},    // one full tile; capacity 32
           Case{2, 65, 3, 1, 7, false},     // a tile of one row; three heads on one kv head
           Case{1, 130, 4, 4, 64, true},    // capacity 64, exactly full
           Case{1, 100, 2, 1, 128, false},  // capacity 128
           Case{1, 70, 6, 3, 33, false},    // 33 in capacity 64
           Case{3, 1, 2, 1, 5, true},       // one step
       })
    check(c);
}

// The kernels' head capacities: the smallest compiled one that holds the head; none past 128.
TEST(CausalAttentionCudaTiles, HeadCapacities) {
  EXPECT_EQ(at::head_capacity(1), 16);
  EXPECT_EQ(at::head_capacity(16), 16);
  EXPECT_EQ(at::head_capacity(17), 32);
  EXPECT_EQ(at::head_capacity(64), 64);
  EXPECT_EQ(at::head_capacity(65), 128);
  EXPECT_EQ(at::head_capacity(128), 128);
  EXPECT_EQ(at::head_capacity(129), 0);
}

}  // namespace
}  // namespace engine
