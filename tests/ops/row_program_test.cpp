// The row programs (nn/row_programs.h) that the CUDA row kernels run, here on the CPU through
// SerialLanes (the same phases and the same reduction tree as the device's BlockLanes): each
// against a double-precision reference and against the CPU kernel of its op (norm_cpu,
// norm_backward_cpu, softmax_cpu, softmax_backward_cpu, cross_entropy_cpu), on the lane counts the
// CUDA kernels launch, with ragged widths, wide rows, overflowing and -inf rows; add_norm's program
// against the add and the norm run in turn, on bf16 rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "loss/cross_entropy.h"
#include "nn/layernorm.h"
#include "nn/row_launch.h"
#include "nn/row_programs.h"
#include "nn/softmax.h"
#include "random_values.h"

namespace engine {
namespace {

using ops::SerialLanes;

std::vector<float> floats_of(const test_util::RandomValues& values, ValueId id) {
  const std::vector<char>& bytes = values.bytes(id);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}
void set_floats(test_util::RandomValues& values, ValueId id, const std::vector<float>& v) {
  std::memcpy(values.memory[size_t(id)].data(), v.data(), v.size() * sizeof(float));
}

// Every element of `got` within `tolerance` (floor + |want|) of `want`; NaN matches NaN. floor 1
// for values of order 1, near 0 for a relative comparison of small ones (probabilities).
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tolerance,
                  const std::string& what, double floor = 1.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    const double error = std::isnan(got[i]) || std::isnan(want[i])
                             ? INFINITY
                             : std::abs(double(got[i]) - want[i]) / (floor + std::abs(want[i]));
    if (!(error <= worst)) worst = error, at = i;
  }
  if (std::getenv("ROW_PROGRAM_PRINT")) std::printf("%-70s worst %.3g\n", what.c_str(), worst);
  EXPECT_LE(worst, tolerance) << what << ": element " << at << " is " << got[at] << ", want " << want[at];
}
std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The tree: lanes 0..31 pair by 16, 8, 4, 2, 1, then the groups' totals the same way; 2^k values
// whose sum depends on the order show it (the tree adds 1 to 2^24 only after the 1s are paired).
TEST(RowProgram, LanesReduceInTheWarpTree) {
  SerialLanes<64> lanes;
  SerialLanes<64>::Local<float> v;
  for (int l = 0; l < 64; ++l) v[l] = l == 0 ? 16777216.0f : 1.0f;
  // Lane 0 takes 1 (2^24 + 1 rounds to even: 2^24), then 2, 4, 8, 16 (exact): 2^24 + 30; the other
  // group's 32 makes 2^24 + 62. A sequential sum would stay at 2^24.
  EXPECT_EQ(lanes.sum(v), 16777216.0f + 62.0f);
  SerialLanes<64>::Local<float> m;
  for (int l = 0; l < 64; ++l) m[l] = float(l % 7) + (l == 41 ? 10.0f : 0.0f);
  EXPECT_EQ(lanes.max(m), 16.0f);
}

// ---- norms -----------------------------------------------------------------------------------------

struct NormCase {
  int64_t rows, c;
  bool rms, shift;
  float magnitude = 1.0f;  // 1e20: float sums overflow, the double fallback runs
};

// The GPU's column sum of the groups' partial sums (layernorm.cu: norm_slice_sums_kernel, then
// norm_parameter_totals_kernel): 16 slices of consecutive groups, within a slice 8 warps each adding
// every 8th group, the warps' sums in order, then the slices' sums in order.
double column_sum(const std::vector<float>& groups, int64_t count, int64_t c, int64_t col) {
  constexpr int warps = 8, slices = 16;
  const int64_t per_slice = (count + slices - 1) / slices;
  double total = 0;
  for (int s = 0; s < slices; ++s) {
    const int64_t first = s * per_slice, last = std::min(count, first + per_slice);
    double warp_sums[warps] = {};
    for (int k = 0; k < warps; ++k)
      for (int64_t g = first + k; g < last; g += warps) warp_sums[k] += groups[size_t(g * c + col)];
    double slice = 0;
    for (double w : warp_sums) slice += w;
    total += slice;
  }
  return total;
}

void check_norm(const NormCase& nc) {
  const int64_t rows = nc.rows, c = nc.c;
  Graph g;
  const ValueId x = g.add_activation("x", Shape{rows, c}), w = g.add_activation("w", Shape{c}),
                b = g.add_activation("b", Shape{c}), y = g.add_activation("y", Shape{rows, c}),
                mean = g.add_activation("mean", Shape{rows}), rstd = g.add_activation("rstd", Shape{rows}),
                dy = g.add_activation("dy", Shape{rows, c}), dx = g.add_activation("dx", Shape{rows, c}),
                dw = g.add_activation("dw", Shape{c}), db = g.add_activation("db", Shape{c});
  const Attrs attrs{{nc.rms ? 1 : 0, nc.shift ? 1 : 0}, {1e-5}};
  std::vector<ValueId> inputs{x, w};
  if (nc.shift) inputs.push_back(b);
  const Node forward{nc.rms ? &ops::kRmsNorm : &ops::kLayerNorm, inputs, {y, mean, rstd}, attrs, false, false, "ln"};
  std::vector<ValueId> grads{dx, dw};
  if (nc.shift) grads.push_back(db);
  const Node backward{nc.rms ? &ops::kRmsNormBackward : &ops::kLayerNormBackward,
                      {dy, x, w, mean, rstd},
                      grads,
                      attrs,
                      true,  // dx accumulates into its random start, as the gradients do
                      true,
                      "ln"};
  test_util::RandomValues values(g, uint32_t(rows * 131 + c));
  std::vector<float> xs = floats_of(values, x);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = xs[i] * nc.magnitude + (i % 3 == 0 ? 3.0f * nc.magnitude : 0.0f);
  set_floats(values, x, xs);
  const std::vector<float> ws = floats_of(values, w), bs = floats_of(values, b), dys = floats_of(values, dy),
                           dx0 = floats_of(values, dx), dw0 = floats_of(values, dw), db0 = floats_of(values, db);
  forward.op->cpu(forward, values.ctx);
  backward.op->cpu(backward, values.ctx);
  const std::string what = std::string(nc.rms ? "rmsnorm" : "layernorm") + (nc.shift ? " with shift" : "") + " " +
                           std::to_string(rows) + "x" + std::to_string(c) +
                           (nc.magnitude != 1.0f ? " magnitude " + std::to_string(nc.magnitude) : "");

  // The programs, as the CUDA kernels run them: a row per warp forward, groups of rows backward.
  SerialLanes<ops::kNormLanes> lanes;
  SerialLanes<ops::kNormBackwardLanes> backward_lanes;
  std::vector<float> py(static_cast<size_t>(rows * c)), pmean(static_cast<size_t>(rows)),
      prstd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    ops::norm_forward_row(lanes, xs.data() + r * c, c, nc.rms, 1e-5, ws.data(), nc.shift ? bs.data() : nullptr,
                          py.data() + r * c, &pmean[size_t(r)], &prstd[size_t(r)]);
  // The backward from the CPU kernel's statistics, so that it is compared alone.
  const std::vector<float> cpu_mean = floats_of(values, mean), cpu_rstd = floats_of(values, rstd);
  const int64_t group_rows = ops::kNormGroupRows, groups = (rows + group_rows - 1) / group_rows;
  std::vector<float> pdx = dx0, dw_groups(static_cast<size_t>(groups * c)), db_groups(static_cast<size_t>(groups * c));
  for (int64_t k = 0; k < groups; ++k)
    ops::norm_backward_rows(backward_lanes, dys.data(), xs.data(), ws.data(), cpu_mean.data(), cpu_rstd.data(), c,
                            nc.rms, k * group_rows, std::min(rows, (k + 1) * group_rows), dw_groups.data() + k * c,
                            nc.shift ? db_groups.data() + k * c : nullptr, pdx.data(), pdx.data(), true);
  std::vector<float> pdw(static_cast<size_t>(c)), pdb(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) {
    pdw[size_t(i)] = dw0[size_t(i)] + float(column_sum(dw_groups, groups, c, i));
    pdb[size_t(i)] = db0[size_t(i)] + float(column_sum(db_groups, groups, c, i));
  }
  // The packed forms the kernels run where the row allows: the forward in packs, the backward's
  // running sums in registers (one warp a group). The same math within a few roundings; the
  // backward in registers gives the workspace form's bits for the same rows and pack of 1.
  if (c % 8 == 0) {
    std::vector<float> packed_y(py.size()), packed_mean(pmean.size()), packed_rstd(prstd.size());
    for (int64_t r = 0; r < rows; ++r)
      ops::norm_forward_row<8>(lanes, xs.data() + r * c, c, nc.rms, 1e-5, ws.data(), nc.shift ? bs.data() : nullptr,
                               packed_y.data() + r * c, &packed_mean[size_t(r)], &packed_rstd[size_t(r)]);
    expect_close(packed_y, widen(py), 1e-6, what + " y in packs of 8");
    expect_close(packed_rstd, widen(prstd), 1e-6, what + " rstd in packs of 8", 0.0);
  }
  // The double reference.
  std::vector<double> ry(static_cast<size_t>(rows * c)), rmean(static_cast<size_t>(rows)),
      rrstd(static_cast<size_t>(rows)), rdx(static_cast<size_t>(rows * c)), rdw(dw0.begin(), dw0.end()),
      rdb(db0.begin(), db0.end());
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xs.data() + r * c;
    double m = 0, sq = 0;
    if (!nc.rms) {
      for (int64_t i = 0; i < c; ++i) m += xr[i];
      m /= double(c);
    }
    for (int64_t i = 0; i < c; ++i) sq += (xr[i] - m) * (xr[i] - m);
    const double s = 1 / std::sqrt(sq / double(c) + 1e-5);
    rmean[size_t(r)] = m;
    rrstd[size_t(r)] = s;
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < c; ++i) {
      const double xhat = (xr[i] - m) * s, gi = double(dys[size_t(r * c + i)]) * ws[size_t(i)];
      ry[size_t(r * c + i)] = xhat * ws[size_t(i)] + (nc.shift ? bs[size_t(i)] : 0.0);
      mg += gi / double(c);
      mgx += gi * xhat / double(c);
      rdw[size_t(i)] += dys[size_t(r * c + i)] * xhat;
      rdb[size_t(i)] += dys[size_t(r * c + i)];
    }
    if (nc.rms) mg = 0;
    for (int64_t i = 0; i < c; ++i) {
      const double xhat = (xr[i] - m) * s, gi = double(dys[size_t(r * c + i)]) * ws[size_t(i)];
      rdx[size_t(r * c + i)] = dx0[size_t(r * c + i)] + s * (gi - mg - xhat * mgx);
    }
  }
  // Against the reference: statistics relative to their size (the mean of a 1e20 row, 1 / its deviation).
  std::vector<double> mean_scaled(rmean), rstd_scaled(rrstd);
  std::vector<float> pmean_scaled(pmean), prstd_scaled(prstd);
  for (int64_t r = 0; r < rows; ++r) {
    mean_scaled[size_t(r)] /= nc.magnitude;
    pmean_scaled[size_t(r)] /= nc.magnitude;
    rstd_scaled[size_t(r)] *= nc.magnitude;
    prstd_scaled[size_t(r)] *= nc.magnitude;
  }
  expect_close(py, ry, 2e-6, what + " y");
  expect_close(pmean_scaled, mean_scaled, 1e-6, what + " mean");
  expect_close(prstd_scaled, rstd_scaled, 1e-6, what + " rstd");
  if (nc.magnitude != 1.0f) return;  // the backward of a 1e20 row is 1e-20 times dy: nothing to learn
  expect_close(pdx, rdx, 4e-6, what + " dx");
  expect_close(pdw, rdw, 1e-5, what + " dw");
  if (nc.shift) expect_close(pdb, rdb, 1e-5, what + " db");
  if (c <= 8 * ops::kNormLanes * 4 && c % 4 == 0) {
    const int64_t packed_groups = (rows + ops::kNormRegisterGroupRows - 1) / ops::kNormRegisterGroupRows;
    std::vector<float> rdx_packed = dx0, rdw_groups(static_cast<size_t>(packed_groups * c)),
                       rdb_groups(static_cast<size_t>(packed_groups * c));
    for (int64_t k = 0; k < packed_groups; ++k)
      ops::norm_backward_rows_in_registers<4, 8>(
          lanes, dys.data(), xs.data(), ws.data(), cpu_mean.data(), cpu_rstd.data(), c, nc.rms,
          k * ops::kNormRegisterGroupRows, std::min(rows, (k + 1) * ops::kNormRegisterGroupRows),
          rdw_groups.data() + k * c, nc.shift ? rdb_groups.data() + k * c : nullptr, rdx_packed.data(),
          rdx_packed.data(), true);
    std::vector<float> rdw_packed(static_cast<size_t>(c)), rdb_packed(static_cast<size_t>(c));
    for (int64_t i = 0; i < c; ++i) {
      rdw_packed[size_t(i)] = dw0[size_t(i)] + float(column_sum(rdw_groups, packed_groups, c, i));
      rdb_packed[size_t(i)] = db0[size_t(i)] + float(column_sum(rdb_groups, packed_groups, c, i));
    }
    expect_close(rdx_packed, rdx, 4e-6, what + " dx in registers");
    expect_close(rdw_packed, rdw, 1e-5, what + " dw in registers");
    if (nc.shift) expect_close(rdb_packed, rdb, 1e-5, what + " db in registers");
  }
  {
    // Pack 1, groups as the workspace form's: the same bits.
    std::vector<float> same_dx = dx0, same_dw(static_cast<size_t>(groups * c)),
                       same_db(static_cast<size_t>(groups * c));
    if (c <= 8 * ops::kNormBackwardLanes) {
      for (int64_t k = 0; k < groups; ++k)
        ops::norm_backward_rows_in_registers<1, 8>(
            backward_lanes, dys.data(), xs.data(), ws.data(), cpu_mean.data(), cpu_rstd.data(), c, nc.rms,
            k * group_rows, std::min(rows, (k + 1) * group_rows), same_dw.data() + k * c,
            nc.shift ? same_db.data() + k * c : nullptr, same_dx.data(), same_dx.data(), true);
      EXPECT_EQ(same_dx, pdx) << what;
      // Onto another gradient (the GPU plan's fused copy, nn/layernorm.h): dx = base + the result
      // gives the in-place accumulation's bits, whatever dx held before.
      std::vector<float> onto(dx0.size(), 12345.0f), base = dx0, onto_dw(same_dw.size()), onto_db(same_db.size());
      for (int64_t k = 0; k < groups; ++k)
        ops::norm_backward_rows_in_registers<1, 8>(
            backward_lanes, dys.data(), xs.data(), ws.data(), cpu_mean.data(), cpu_rstd.data(), c, nc.rms,
            k * group_rows, std::min(rows, (k + 1) * group_rows), onto_dw.data() + k * c,
            nc.shift ? onto_db.data() + k * c : nullptr, onto.data(), base.data(), true);
      EXPECT_EQ(onto, pdx) << what << " onto a separate gradient";
      EXPECT_EQ(same_dw, dw_groups) << what;
      if (nc.shift) {
        EXPECT_EQ(same_db, db_groups) << what;
      }
    }
  }

  // Against the CPU kernel (its 16 lanes against the program's kNormLanes: a few float roundings apart).
  expect_close(py, widen(floats_of(values, y)), 1e-6, what + " y against norm_cpu");
  expect_close(pmean, widen(floats_of(values, mean)), 1e-6, what + " mean against norm_cpu");
  expect_close(prstd, widen(floats_of(values, rstd)), 1e-6, what + " rstd against norm_cpu");
  expect_close(pdx, widen(floats_of(values, dx)), 2e-6, what + " dx against norm_backward_cpu");
  // The column sums: the program rounds each product (as the device does, -fmad=false), the CPU
  // kernel contracts them into FMAs, so 40 to 70 rows' sums part by a few units in the last place.
  expect_close(pdw, widen(floats_of(values, dw)), 2e-6, what + " dw against norm_backward_cpu");
  if (nc.shift) expect_close(pdb, widen(floats_of(values, db)), 2e-6, what + " db against norm_backward_cpu");
}

TEST(RowProgram, NormsMatchTheReferenceAndTheCpuKernel) {
  for (const NormCase& nc :
       {NormCase{40, 150, false, true}, NormCase{40, 150, false, false}, NormCase{40, 150, true, false},
        NormCase{70, 768, false, true}, NormCase{33, 7, false, true}, NormCase{5, 1000, true, false},
        NormCase{3, 2304, false, true}, NormCase{1, 256, false, true}, NormCase{20, 1024, true, false}})
    check_norm(nc);
}

TEST(RowProgram, NormsFallBackToDoubleWhereFloatSumsOverflow) {
  check_norm({4, 768, false, true, 1e20f});
  check_norm({4, 300, true, false, 1e20f});
}

// ---- add_norm (nn/add_norm.h) ------------------------------------------------------------------------

// A bf16 row as the CUDA kernels' FloatArray reads and writes it: widened exactly, each store
// rounded once to nearest even (found by the row programs' unqualified row_load / row_store).
struct Bf16Row {
  uint16_t* p;
  explicit operator bool() const { return p != nullptr; }
  Bf16Row operator+(int64_t k) const { return {p + k}; }
};
float row_load(const Bf16Row& r, int64_t i) { return bf16_to_float(r.p[i]); }
void row_store(const Bf16Row& r, int64_t i, float v) { r.p[i] = float_to_bf16(v); }
float row_stored(const Bf16Row&, float v) { return bf16_to_float(float_to_bf16(v)); }

template <int P>
void check_add_norm(int64_t rows, int64_t c, bool rms) {
  std::mt19937 rng(uint32_t(rows * 7 + c));
  std::normal_distribution<float> normal;
  std::vector<uint16_t> a(size_t(rows * c)), b(a.size()), s(a.size()), y(a.size()), s_ref(a.size()), y_ref(a.size()),
      y_unrounded(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float_to_bf16(normal(rng) * 4.0f + 1.0f);  // a residual stream, and a sublayer's smaller output
    b[i] = float_to_bf16(normal(rng) * 0.3f);
  }
  std::vector<float> w(static_cast<size_t>(c)), shift(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) w[size_t(k)] = 1.0f + 0.1f * normal(rng), shift[size_t(k)] = 0.1f * normal(rng);
  const float* sh = rms ? nullptr : shift.data();
  SerialLanes<ops::kNormLanes> lanes;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = r * c;
    float mean = 0, rstd = 0, mean_ref = 0, rstd_ref = 0, m = 0, v = 0;
    ops::add_norm_forward_row<P>(lanes, Bf16Row{a.data() + at}, Bf16Row{b.data() + at}, Bf16Row{s.data() + at}, c, rms,
                                 1e-5, w.data(), sh, Bf16Row{y.data() + at}, &mean, &rstd);
    // Unfused: the add's kernel stores its rounded sums, the norm's reads them.
    std::vector<float> sums(static_cast<size_t>(c));
    for (int64_t k = 0; k < c; ++k) {
      sums[size_t(k)] = bf16_to_float(a[size_t(at + k)]) + bf16_to_float(b[size_t(at + k)]);
      s_ref[size_t(at + k)] = float_to_bf16(sums[size_t(k)]);
    }
    ops::norm_forward_row<P>(lanes, Bf16Row{s_ref.data() + at}, c, rms, 1e-5, w.data(), sh, Bf16Row{y_ref.data() + at},
                             &mean_ref, &rstd_ref);
    EXPECT_EQ(mean, mean_ref);
    EXPECT_EQ(rstd, rstd_ref);
    // A norm of the sums before their rounding: what a fusion that kept them in registers would give.
    ops::norm_forward_row<P>(lanes, sums.data(), c, rms, 1e-5, w.data(), sh, Bf16Row{y_unrounded.data() + at}, &m, &v);
  }
  const std::string what = std::to_string(rows) + "x" + std::to_string(c) + (rms ? " rmsnorm" : " layernorm") +
                           " packs of " + std::to_string(P);
  EXPECT_EQ(s, s_ref) << what << ": the sums, each rounded once";
  EXPECT_EQ(y, y_ref) << what << ": the norm of the rounded sums";
  EXPECT_NE(y, y_unrounded) << what << ": (the rounding shows in the output, so the comparison above can see it)";
}

TEST(RowProgram, AddNormNormalisesTheStoredSumsAsTheAddAndTheNormDo) {
  check_add_norm<1>(6, 768, false);
  check_add_norm<8>(6, 768, false);
  check_add_norm<1>(5, 100, true);
  check_add_norm<4>(5, 100, true);
  check_add_norm<1>(4, 33, false);
}

// ---- the norm backward's column sums of dx (fuse_norm_bias_gradients, nn/layernorm.h) --------------

// Groups of bf16 rows through both backward programs, onto a separate base as the GPU plan runs them:
// with dx's column sums, dx and the scale's and shift's sums keep the bits of the backward without
// them, and each group's sums are its stored (rounded) dx summed in float in row order, as the
// linear backward's bias gradient sums the dx it reads. Without the shift's running sums (kShift
// false, rmsnorm) the rest keeps its bits too.
template <int P, int K>
void check_norm_dx_sums(int64_t rows, int64_t c, bool rms, int64_t group_rows) {
  std::mt19937 rng(uint32_t(rows * 5 + c));
  std::normal_distribution<float> normal;
  const size_t n = size_t(rows * c);
  std::vector<uint16_t> dy(n), x(n), base(n);
  for (size_t i = 0; i < n; ++i) {
    dy[i] = float_to_bf16(normal(rng));
    x[i] = float_to_bf16(normal(rng) * 2.0f + 0.5f);
    base[i] = float_to_bf16(normal(rng) * 3.0f);
  }
  std::vector<float> w(static_cast<size_t>(c)), mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  for (float& v : w) v = 1.0f + 0.1f * normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, sq = 0;
    for (int64_t k = 0; k < c; ++k) m += rms ? 0.0 : bf16_to_float(x[size_t(r * c + k)]) / double(c);
    for (int64_t k = 0; k < c; ++k) sq += std::pow(bf16_to_float(x[size_t(r * c + k)]) - m, 2) / double(c);
    mean[size_t(r)] = float(m);
    rstd[size_t(r)] = float(1 / std::sqrt(sq + 1e-5));
  }
  const int64_t groups = (rows + group_rows - 1) / group_rows;
  const bool shift = !rms;
  struct Run {
    std::vector<uint16_t> dx;
    std::vector<float> dw, db, sums;
  };
  auto fresh = [&] {
    return Run{std::vector<uint16_t>(n, 0x7fc0), std::vector<float>(size_t(groups * c), -1.0f),
               std::vector<float>(size_t(groups * c), -1.0f), std::vector<float>(size_t(groups * c), -1.0f)};
  };
  SerialLanes<ops::kNormLanes> warp;
  SerialLanes<ops::kNormBackwardLanes> block;
  Run plain = fresh(), registers = fresh(), no_shift = fresh(), plain_blocks = fresh(), blocks = fresh();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * group_rows, end = std::min(rows, begin + group_rows), at = g * c;
    auto run = [&]<bool kShift, bool kDxSums>(Run& out) {
      ops::norm_backward_rows_in_registers<P, K, kShift, kDxSums>(
          warp, Bf16Row{dy.data()}, Bf16Row{x.data()}, w.data(), mean.data(), rstd.data(), c, rms, begin, end,
          out.dw.data() + at, kShift && shift ? out.db.data() + at : nullptr, Bf16Row{out.dx.data()},
          Bf16Row{base.data()}, true, kDxSums ? out.sums.data() + at : nullptr);
    };
    run.template operator()<true, false>(plain);
    run.template operator()<true, true>(registers);
    if (rms) run.template operator()<false, false>(no_shift);
    for (Run* out : {&plain_blocks, &blocks})
      ops::norm_backward_rows(block, Bf16Row{dy.data()}, Bf16Row{x.data()}, w.data(), mean.data(), rstd.data(), c, rms,
                              begin, end, out->dw.data() + at, shift ? out->db.data() + at : nullptr,
                              Bf16Row{out->dx.data()}, Bf16Row{base.data()}, true,
                              out == &blocks ? out->sums.data() + at : nullptr);
  }
  const std::string what = std::to_string(rows) + "x" + std::to_string(c) + (rms ? " rmsnorm" : " layernorm") +
                           ", packs of " + std::to_string(P) + ", groups of " + std::to_string(group_rows);
  // Each group's sums of the stored dx, in row order.
  auto sums_of = [&](const std::vector<uint16_t>& dx) {
    std::vector<float> sums(size_t(groups * c), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < c; ++k) sums[size_t(r / group_rows * c + k)] += bf16_to_float(dx[size_t(r * c + k)]);
    return sums;
  };
  for (auto [run, without] : {std::pair{&registers, &plain}, std::pair{&blocks, &plain_blocks}}) {
    const std::string which = run == &blocks ? " (workspace form)" : " (registers)";
    EXPECT_NE(without->dx, std::vector<uint16_t>(n, 0x7fc0)) << what << which;
    EXPECT_EQ(run->dx, without->dx) << what << which;
    EXPECT_EQ(run->dw, without->dw) << what << which;
    EXPECT_EQ(run->db, without->db) << what << which;
    EXPECT_EQ(run->sums, sums_of(without->dx)) << what << which;
  }
  if (rms) {
    EXPECT_EQ(no_shift.dx, plain.dx) << what << " without the shift's registers";
    EXPECT_EQ(no_shift.dw, plain.dw) << what << " without the shift's registers";
  }
}

TEST(RowProgram, NormBackwardSumsItsStoredOutputsColumnsAsTheBiasGradientDoes) {
  check_norm_dx_sums<8, 3>(20, 768, false, ops::kNormRegisterGroupRows);  // GPT-2's width, three packs a lane
  check_norm_dx_sums<8, 4>(9, 1024, false, 4);
  check_norm_dx_sums<8, 8>(9, 2048, true, 8);  // the Llama's RMS norm: no shift's registers at 8 packs a lane
  check_norm_dx_sums<1, 8>(7, 200, false, 3);
  check_norm_dx_sums<1, 8>(7, 200, true, 32);
}

// ---- softmax ---------------------------------------------------------------------------------------

void check_softmax(int64_t rows, int64_t n) {
  Graph g;
  const ValueId x = g.add_activation("x", Shape{rows, n}), y = g.add_activation("y", Shape{rows, n}),
                dy = g.add_activation("dy", Shape{rows, n}), dx = g.add_activation("dx", Shape{rows, n});
  const Node forward{&ops::kSoftmax, {x}, {y}, {}, false, false, "sm"};
  const Node backward{&ops::kSoftmaxBackward, {y, dy}, {dx}, {}, true, true, "sm"};
  test_util::RandomValues values(g, uint32_t(rows + 7 * n));
  std::vector<float> xs = floats_of(values, x);
  for (float& v : xs) v *= 4.0f;
  if (rows > 1) xs[size_t(n)] = -INFINITY;  // a -inf logit in row 1
  set_floats(values, x, xs);
  const std::vector<float> dys = floats_of(values, dy), dx0 = floats_of(values, dx);
  forward.op->cpu(forward, values.ctx);
  backward.op->cpu(backward, values.ctx);
  const std::vector<float> cpu_y = floats_of(values, y);

  SerialLanes<ops::kSoftmaxLanes> lanes;
  std::vector<float> py(xs.size()), pdx = dx0;
  for (int64_t r = 0; r < rows; ++r) ops::softmax_row(lanes, xs.data() + r * n, n, py.data() + r * n);
  for (int64_t r = 0; r < rows; ++r)
    ops::softmax_backward_row(lanes, cpu_y.data() + r * n, dys.data() + r * n, n, pdx.data() + r * n, true);

  std::vector<double> ry(xs.size()), rdx(xs.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0, dot = 0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(xs[size_t(r * n + i)]));
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(xs[size_t(r * n + i)]) - mx);
    for (int64_t i = 0; i < n; ++i) ry[size_t(r * n + i)] = std::exp(double(xs[size_t(r * n + i)]) - mx) / sum;
    for (int64_t i = 0; i < n; ++i) dot += double(cpu_y[size_t(r * n + i)]) * dys[size_t(r * n + i)];
    for (int64_t i = 0; i < n; ++i)
      rdx[size_t(r * n + i)] =
          dx0[size_t(r * n + i)] + double(cpu_y[size_t(r * n + i)]) * (dys[size_t(r * n + i)] - dot);
  }
  const std::string what = "softmax " + std::to_string(rows) + "x" + std::to_string(n);
  expect_close(py, ry, 2e-7, what + " y", 1e-30);
  expect_close(pdx, rdx, 1e-6, what + " dx");
  // The CPU kernel computes the same double sums in another order: the same floats, or one rounding apart.
  expect_close(py, widen(cpu_y), 2e-7, what + " y against softmax_cpu", 1e-30);
  expect_close(pdx, widen(floats_of(values, dx)), 1e-7, what + " dx against softmax_backward_cpu");
}

TEST(RowProgram, SoftmaxMatchesTheReferenceAndTheCpuKernel) {
  check_softmax(6, 1);
  check_softmax(6, 77);
  check_softmax(4, 1024);
  check_softmax(3, 3001);
}

// ---- cross-entropy ---------------------------------------------------------------------------------

template <int N, int P = 1>
void check_cross_entropy(int64_t rows, int64_t vocab, bool edges) {
  Graph g;
  const ValueId logits = g.add_activation("logits", Shape{rows, vocab});
  const ValueId targets = g.add_activation("targets", Shape{rows}, DType::i32);
  const ValueId losses = g.add_activation("losses", Shape{rows});
  const double scale = 0.25;
  const Node node{&ops::kSoftmaxCrossEntropy, {logits, targets}, {losses}, Attrs{{}, {scale}}, false, false, "loss"};
  test_util::RandomValues values(g, uint32_t(rows * 3 + vocab), vocab);
  values.ctx.loss_scale = 2.0f;
  const float full_scale = float(scale) * 2.0f;
  std::vector<float> z = floats_of(values, logits);
  for (float& v : z) v *= 3.0f;
  if (edges && rows >= 3) {
    // Row 0: its largest logit last (every lane's max rises late); row 1: -inf logits, not the
    // target's; row 2: a logit of 80 (exp overflows float without its shift).
    for (int64_t i = 0; i < vocab; ++i) z[size_t(i)] = float(i) * 1e-3f;
    for (int64_t i = 0; i < vocab; i += 3) z[size_t(vocab + i)] = -INFINITY;
    z[size_t(2 * vocab + vocab / 2)] = 80.0f;
  }
  set_floats(values, logits, z);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::memcpy(tokens.data(), values.bytes(targets).data(), tokens.size() * sizeof(int32_t));
  if (edges && rows >= 3 && tokens[1] % 3 == 0) tokens[1] = (tokens[1] + 1) % int32_t(vocab);
  std::memcpy(values.memory[size_t(targets)].data(), tokens.data(), tokens.size() * sizeof(int32_t));
  node.op->cpu(node, values.ctx);

  SerialLanes<N> lanes;
  std::vector<float> pz = z, ploss(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    ploss[size_t(r)] = ops::cross_entropy_row<P>(lanes, pz.data() + r * vocab, vocab, tokens[size_t(r)], full_scale);

  std::vector<double> rloss(static_cast<size_t>(rows)), rgrad(z.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* zr = z.data() + r * vocab;
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, double(zr[i]));
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(zr[i] - mx);
    rloss[size_t(r)] = mx + std::log(sum) - zr[tokens[size_t(r)]];
    for (int64_t i = 0; i < vocab; ++i)
      rgrad[size_t(r * vocab + i)] = full_scale * (std::exp(zr[i] - mx) / sum - (i == tokens[size_t(r)] ? 1 : 0));
  }
  const std::string what = "cross-entropy " + std::to_string(rows) + "x" + std::to_string(vocab) + ", " +
                           std::to_string(N) + " lanes, packs of " + std::to_string(P);
  expect_close(ploss, rloss, 1e-6, what + " loss");
  // Relative, to the rounding of z - max in float (as the CPU's): 2^-24 |z - max| ~ 4e-6 at z - max = -60.
  expect_close(pz, rgrad, 5e-6, what + " gradient", 1e-30);
  expect_close(ploss, widen(floats_of(values, losses)), 1e-6, what + " loss against cross_entropy_cpu");
  expect_close(pz, widen(floats_of(values, logits)), 5e-6, what + " gradient against cross_entropy_cpu", 1e-30);
}

// A target of -1 (kIgnoredTarget) trains nothing: loss 0 and a zero gradient row, in the program
// (every lane count and pack) as in the CPU kernel.
TEST(RowProgram, AnIgnoredTargetHasNoLossAndNoGradient) {
  const int64_t vocab = 1104;
  std::vector<float> z(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) z[size_t(i)] = float(i % 17) - 8.0f;
  std::vector<float> packed = z, single = z;
  SerialLanes<ops::kCrossEntropyLanes> lanes;
  EXPECT_EQ(ops::cross_entropy_row<8>(lanes, packed.data(), vocab, ops::kIgnoredTarget, 0.5f), 0.0f);
  EXPECT_EQ(ops::cross_entropy_row(lanes, single.data(), vocab, ops::kIgnoredTarget, 0.5f), 0.0f);
  EXPECT_EQ(packed, std::vector<float>(size_t(vocab), 0.0f));
  EXPECT_EQ(single, std::vector<float>(size_t(vocab), 0.0f));

  Graph g;
  const ValueId logits = g.add_activation("logits", Shape{2, vocab});
  const ValueId targets = g.add_activation("targets", Shape{2}, DType::i32);
  const ValueId losses = g.add_activation("losses", Shape{2});
  const Node node{&ops::kSoftmaxCrossEntropy, {logits, targets}, {losses}, Attrs{{}, {0.5}}, false, false, "loss"};
  test_util::RandomValues values(g, 7, vocab);
  const int32_t tokens[2] = {ops::kIgnoredTarget, 3};
  std::memcpy(values.memory[size_t(targets)].data(), tokens, sizeof tokens);
  node.op->cpu(node, values.ctx);
  const std::vector<float> grad = floats_of(values, logits), loss = floats_of(values, losses);
  EXPECT_EQ(loss[0], 0.0f);
  EXPECT_GT(loss[1], 0.0f);
  EXPECT_EQ(std::vector<float>(grad.begin(), grad.begin() + vocab), std::vector<float>(size_t(vocab), 0.0f));
}

TEST(RowProgram, CrossEntropyMatchesTheReferenceAndTheCpuKernel) {
  check_cross_entropy<ops::kCrossEntropyLanes>(5, 7, false);
  check_cross_entropy<ops::kCrossEntropyLanes>(4, 1100, true);
  check_cross_entropy<ops::kCrossEntropyLanes>(3, 50304, true);
  check_cross_entropy<32>(4, 1100, true);
  check_cross_entropy<1024>(3, 5000, true);
  // In packs, as the kernel reads 16-bit (8) and f32 (4) rows.
  check_cross_entropy<ops::kCrossEntropyLanes, 8>(4, 1104, true);
  check_cross_entropy<ops::kCrossEntropyLanes, 8>(3, 50304, true);
  check_cross_entropy<ops::kCrossEntropyLanes, 4>(4, 1100, true);
  check_cross_entropy<32, 8>(5, 8, false);
}

}  // namespace
}  // namespace engine
