#include "loss/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/convert.h"
#include "core/cpu_isa.h"
#include "cuda_kernels.h"
#include "nn/softmax_rows.h"

namespace engine::ops {

namespace {

// A row is streamed in chunks of at least this many logits (a widened 16-bit chunk stays in L1);
// longer rows get longer chunks so that a row never has more than kMaxChunks.
constexpr int64_t kMinLogitChunk = 512;
constexpr int64_t kMaxChunks = 1024;

int64_t chunk_length(int64_t vocab) {
  const int64_t needed = (vocab + kMaxChunks - 1) / kMaxChunks;
  return std::max(kMinLogitChunk, (needed + 15) / 16 * 16);
}

// The read pass of one row, an online log-sum-exp. `work` holds the row's logits as floats (the
// fp32 row itself, or `widen(begin, n, work + begin)` fills it chunk by chunk from 16-bit storage).
// Each chunk c is overwritten with exp(z - shift[c]), shift[c] the running max after the chunk, and
// the sum of exponentials is rescaled to the new max as it rises: one exp per logit. The chunks'
// float partial sums are added in order into a double, so the result does not depend on threads.
// Returns log(sum exp(z)).
template <bool wide, class Widen>
[[gnu::always_inline]] inline double exp_pass(float* work, int64_t vocab, int64_t chunk, float* shift, Widen widen) {
  float running = -INFINITY, last_shift = 0.0f;
  double sum = 0;
  for (int64_t c = 0, begin = 0; begin < vocab; ++c, begin += chunk) {
    const int64_t n = std::min(chunk, vocab - begin);
    float* w = work + begin;
    widen(begin, n, w);
    const float top = std::max(running, row_max(w, n));
    // While every logit so far is -inf, exponentials are taken from 0 (exp(-inf - 0) = 0, not NaN).
    const float s = top == -INFINITY ? 0.0f : top;
    float partial;
    if constexpr (wide)
      partial = exp_row_sum16(w, n, s);
    else
      partial = exp_row_sum(w, n, s);
    if (running != -INFINITY) sum *= std::exp(double(running) - double(s));
    sum += partial;
    running = top;
    // The chunk's factor is taken from the true running max: while it is -inf, exp(-inf - log_sum)
    // gives the chunk's (zero) gradient, where exp(0 - log_sum) could overflow to inf and 0 * inf.
    shift[c] = top;
    last_shift = s;
  }
  return double(last_shift) + std::log(sum);
}

// The factor that turns chunk c's exponentials into scale * softmax: exp(shift[c] - log_sum) * scale.
float chunk_factor(float shift, double log_sum, float scale) {
  return float(std::exp(double(shift) - log_sum) * double(scale));
}

// fp32 row: the loss; the row overwritten in place with (softmax - onehot) * scale.
template <bool wide>
[[gnu::always_inline]] inline float cross_entropy_row(float* z, int64_t vocab, int32_t target, float scale) {
  const int64_t chunk = chunk_length(vocab);
  float shift[kMaxChunks];
  const float z_target = z[target];
  const double log_sum = exp_pass<wide>(z, vocab, chunk, shift, [](int64_t, int64_t, float*) {});
  for (int64_t c = 0, begin = 0; begin < vocab; ++c, begin += chunk) {
    const int64_t n = std::min(chunk, vocab - begin);
    const float factor = chunk_factor(shift[c], log_sum, scale);
    float* w = z + begin;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) w[i] *= factor;
  }
  z[target] -= scale;
  return float(log_sum - double(z_target));
}

// 16-bit row: the same, its exponentials held in `work` (vocab floats, in cache for the write
// pass) and the gradient rounded to the storage type once, the target's after its -scale.
template <bool wide>
[[gnu::always_inline]] inline float cross_entropy_row16(uint16_t* z, DType type, float* work, int64_t vocab,
                                                        int32_t target, float scale) {
  const int64_t chunk = chunk_length(vocab);
  float shift[kMaxChunks];
  float z_target;
  widen_serial(z + target, type, &z_target, 1);
  const double log_sum = exp_pass<wide>(
      work, vocab, chunk, shift, [&](int64_t begin, int64_t n, float* w) { widen_serial(z + begin, type, w, n); });
  for (int64_t c = 0, begin = 0; begin < vocab; ++c, begin += chunk) {
    const int64_t n = std::min(chunk, vocab - begin);
    const float factor = chunk_factor(shift[c], log_sum, scale);
    float* w = work + begin;
    const bool has_target = target >= begin && target < begin + n;
    const float target_exp = has_target ? w[target - begin] : 0.0f;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) w[i] *= factor;
    // The one-hot is subtracted before rounding, so the target's gradient is rounded once.
    if (has_target) w[target - begin] = target_exp * factor - scale;
    narrow_serial(w, z + begin, type, n);
  }
  return float(log_sum - double(z_target));
}

// The rows at each ISA (core/cpu_isa.h): the same code, the same bits.
float row_avx2(float* z, int64_t vocab, int32_t target, float scale) {
  return cross_entropy_row<false>(z, vocab, target, scale);
}
float row16_avx2(uint16_t* z, DType type, float* work, int64_t vocab, int32_t target, float scale) {
  return cross_entropy_row16<false>(z, type, work, vocab, target, scale);
}
ENGINE_TARGET_AVX512 float row_avx512(float* z, int64_t vocab, int32_t target, float scale) {
  return cross_entropy_row<true>(z, vocab, target, scale);
}
ENGINE_TARGET_AVX512 float row16_avx512(uint16_t* z, DType type, float* work, int64_t vocab, int32_t target,
                                        float scale) {
  return cross_entropy_row16<true>(z, type, work, vocab, target, scale);
}

void cross_entropy_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& ls = ctx.shape(node.inputs[0]);
  int64_t rows = ls.rows(), vocab = ls.last();
  const int32_t* targets = ctx.i32(node.inputs[1]);
  float* losses = ctx.f32(node.outputs[0]);
  // The gradient of the mean loss, times the loss scale of fp16 training.
  const float scale = float(node.attrs.floats[0]) * ctx.loss_scale;
  const DType type = ctx.dtype(node.inputs[0]);
  // Small inputs (tests, tiny models) are not worth a parallel region.
  const bool parallel = rows > 1 && rows * vocab > kSerialElements;
  const bool avx512 = kernel_isa() == CpuIsa::avx512;
  if (type == DType::f32) {
    float* logits = ctx.f32(node.inputs[0]);
    auto* row = avx512 ? row_avx512 : row_avx2;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == kIgnoredTarget) {  // no loss, no gradient
        std::fill_n(logits + r * vocab, vocab, 0.0f);
        losses[r] = 0.0f;
        continue;
      }
      losses[r] = row(logits + r * vocab, vocab, targets[r], scale);
    }
    return;
  }
  auto* row16 = avx512 ? row16_avx512 : row16_avx2;
  auto* logits = static_cast<uint16_t*>(ctx.data(node.inputs[0]));
#pragma omp parallel if (parallel)
  {
    // Each thread's exponentials of one row, kept between calls (a row of the largest vocabulary
    // seen; 200 KB for 50257).
    static thread_local std::vector<float> work;
    if (work.size() < size_t(vocab)) work.resize(size_t(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == kIgnoredTarget) {  // no loss, no gradient (+0 in both 16-bit types)
        std::fill_n(logits + r * vocab, vocab, uint16_t(0));
        losses[r] = 0.0f;
        continue;
      }
      losses[r] = row16(logits + r * vocab, type, work.data(), vocab, targets[r], scale);
    }
  }
}

// The logits buffer now holds their gradient: hand it to the op that produced them.
void cross_entropy_grad(GradBuilder& gb, const Node& node) {
  gb.pass_through(node.inputs[0], node.inputs[0], node.name);
}

}  // namespace

const OpDef kSoftmaxCrossEntropy{
    .name = "softmax_cross_entropy",
    .cpu = cross_entropy_cpu,
    .cuda = cuda::cross_entropy,
    .grad = cross_entropy_grad,
    .flops = [](const Graph& g, const Node& n) { return 5.0 * double(g.value(n.inputs[0]).shape.numel()); },
    .native_16bit = "16-bit logits and their gradient, fp32 softmax and loss",
    .fp32_outputs = 0b1,        // output 0: the per-row losses
    .overwritten_inputs = 0b1,  // input 0: the logits, overwritten by their gradient
    .cuda_16bit = "16-bit logits read and their gradient written directly, fp32 softmax and loss"};

ValueId softmax_cross_entropy(Graph& g, ValueId logits, ValueId targets, double scale, const std::string& name) {
  const Shape& ls = g.value(logits).shape;
  const Shape& ts = g.value(targets).shape;
  if (g.value(targets).dtype != DType::i32 || ts.numel() != ls.rows())
    shape_error(name, "targets " + ts.str() + " do not match logits " + ls.str());
  ValueId losses = g.add_activation(name + ".losses", Shape{ls.rows()});
  g.add_node(Node{&kSoftmaxCrossEntropy, {logits, targets}, {losses}, Attrs{{}, {scale}}, false, false, name});
  return losses;
}

}  // namespace engine::ops
