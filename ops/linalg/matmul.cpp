#include "linalg/matmul.h"

#include "cuda_kernels.h"
#include "linalg/gemm.h"

namespace engine::ops {

namespace {

struct ProductDims {
  int64_t batch, m, n, k;
};

// attrs.ints = {transpose_a, transpose_b}
ProductDims product_dims(const Shape& a, const Shape& b, bool ta, bool tb) {
  const size_t r = a.rank();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < r; ++i) batch *= a[i];
  return {batch, ta ? a[r - 1] : a[r - 2], tb ? b[r - 2] : b[r - 1], ta ? a[r - 2] : a[r - 1]};
}

void matmul_cpu(const Node& node, const KernelContext& ctx) {
  const bool ta = node.attrs.ints[0] != 0, tb = node.attrs.ints[1] != 0;
  const Shape& as = ctx.shape(node.inputs[0]);
  const Shape& bs = ctx.shape(node.inputs[1]);
  ProductDims d = product_dims(as, bs, ta, tb);
  const float* a = ctx.f32(node.inputs[0]);
  const float* b = ctx.f32(node.inputs[1]);
  float* c = ctx.f32(node.outputs[0]);
  const float beta = ctx.accumulates(node, 0) ? 1.0f : 0.0f;
  const int64_t lda = as.last(), ldb = bs.last();
  for (int64_t i = 0; i < d.batch; ++i)
    sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', d.m, d.n, d.k, 1.0f, a + i * d.m * d.k, lda, b + i * d.k * d.n, ldb, beta,
          c + i * d.m * d.n, d.n);
}

// C = op(A) op(B): dA = dC op(B)^T (stored as A is), dB = op(A)^T dC (stored as B is).
void matmul_grad(GradBuilder& gb, const Node& node) {
  ValueId dc = gb.grad(node.outputs[0]);
  if (dc == kNoValue) return;
  const bool ta = node.attrs.ints[0] != 0, tb = node.attrs.ints[1] != 0;
  ValueId a = node.inputs[0], b = node.inputs[1];
  if (gb.wants(a)) {
    auto t = gb.target(a);
    // A stored (M, K): dA = dC op(B)^T.  A stored (K, M): dA = op(B) dC^T.
    if (!ta)
      gb.emit(kMatmul, {dc, b}, {t.value}, t, Attrs{{0, tb ? 0 : 1}, {}}, node.name);
    else
      gb.emit(kMatmul, {b, dc}, {t.value}, t, Attrs{{tb ? 1 : 0, 1}, {}}, node.name);
  }
  if (gb.wants(b)) {
    auto t = gb.target(b);
    // B stored (K, N): dB = op(A)^T dC.  B stored (N, K): dB = dC^T op(A).
    if (!tb)
      gb.emit(kMatmul, {a, dc}, {t.value}, t, Attrs{{ta ? 0 : 1, 0}, {}}, node.name);
    else
      gb.emit(kMatmul, {dc, a}, {t.value}, t, Attrs{{1, ta ? 1 : 0}, {}}, node.name);
  }
}

double matmul_flops(const Graph& g, const Node& n) {
  ProductDims d =
      product_dims(g.value(n.inputs[0]).shape, g.value(n.inputs[1]).shape, n.attrs.ints[0] != 0, n.attrs.ints[1] != 0);
  return 2.0 * double(d.batch) * double(d.m) * double(d.n) * double(d.k);
}

}  // namespace

const OpDef kMatmul{.name = "matmul",
                    .cpu = matmul_cpu,
                    .cuda = cuda::matmul,
                    .grad = matmul_grad,
                    .flops = matmul_flops,
                    .matmul = true};

ValueId matmul(Graph& g, ValueId a, ValueId b, bool transpose_a, bool transpose_b, const std::string& name) {
  const Shape& as = g.value(a).shape;
  const Shape& bs = g.value(b).shape;
  if (as.rank() < 2 || as.rank() != bs.rank()) shape_error(name, "cannot multiply " + as.str() + " by " + bs.str());
  for (size_t i = 0; i + 2 < as.rank(); ++i)
    if (as[i] != bs[i]) shape_error(name, "batch dimensions differ: " + as.str() + " and " + bs.str());
  ProductDims d = product_dims(as, bs, transpose_a, transpose_b);
  const size_t r = as.rank();
  int64_t kb = transpose_b ? bs[r - 1] : bs[r - 2];
  if (kb != d.k) shape_error(name, "inner dimensions differ: " + as.str() + " and " + bs.str());
  std::vector<int64_t> dims(as.dims.begin(), as.dims.end() - 2);
  dims.push_back(d.m);
  dims.push_back(d.n);
  ValueId c = g.add_activation(name + ".out", Shape(dims));
  g.add_node(Node{&kMatmul, {a, b}, {c}, Attrs{{transpose_a ? 1 : 0, transpose_b ? 1 : 0}, {}}, false, false, name});
  return c;
}

}  // namespace engine::ops
