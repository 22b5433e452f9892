#include "linalg/gemm16.h"

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <tuple>

#include "core/error.h"
#include "onednn_util.h"

namespace engine::ops {

namespace {

struct Primitive {
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c, bias, scratchpad;
  std::string implementation;  // oneDNN's name for the kernel it chose ("ref:any" for the slow C++ one)
};

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, bool, float>;

// A thread's handle on a shared primitive: its own memory objects, pointed at each call's data,
// and its own scratchpad. With the scratchpad managed by oneDNN (2.6, built without concurrent
// execution), a primitive runs in the calling thread's buffer, sized by the primitives that thread
// created: a thread of attention's parallel loop running a primitive another thread created wrote
// its copies of the operands past its own smaller buffer (a wrong dV on an AVX512-BF16 machine). In
// user mode each call hands oneDNN a buffer of the primitive's own size: one per thread
// (thread_scratchpad), grown to the largest need of the shapes it runs.
struct Bound {
  const Primitive* primitive;
  dnnl::memory a, b, c, bias, scratchpad;
  dnnl::stream stream;
};

// The calling thread's scratchpad of at least `bytes` (64-byte aligned), shared by every primitive
// the thread runs: it runs one at a time. Replaced, not copied, when it grows.
void* thread_scratchpad(size_t bytes) {
  struct Free {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  static thread_local std::unique_ptr<std::byte[], Free> buffer;
  static thread_local size_t size = 0;
  if (size < bytes) {
    buffer.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t(64))));
    size = bytes;
  }
  return buffer.get();
}

Primitive make(const Gemm16& s, bool with_bias) {
  using dims = dnnl::memory::dims;
  dnnl::memory::desc a({s.m, s.k}, onednn_type(s.operands), s.transa ? dims{1, s.lda} : dims{s.lda, 1});
  dnnl::memory::desc b({s.k, s.n}, onednn_type(s.operands), s.transb ? dims{1, s.ldb} : dims{s.ldb, 1});
  dnnl::memory::desc c({s.m, s.n}, onednn_type(s.result), dims{s.ldc, 1});
  dnnl::memory::desc bias;
  if (with_bias) bias = dnnl::memory::desc({1, s.n}, onednn_type(s.operands), dims{s.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (s.scale != 1.0f) attr.set_output_scales(0, {s.scale});
  if (s.accumulate) {
    dnnl::post_ops post;
    post.append_sum(1.0f);
    attr.set_post_ops(post);
  }
  auto desc = with_bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c);
  dnnl::matmul::primitive_desc pd(desc, attr, onednn_cpu());
  return {dnnl::matmul(pd), a, b, c, bias, pd.scratchpad_desc(), pd.impl_info_str()};
}

}  // namespace

std::string matmul_16bit_kernel(DType type) {
  static std::map<DType, std::string> probed;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (auto it = probed.find(type); it != probed.end()) return it->second;
  std::string kernel;
  try {
    // oneDNN also offers reference (non-JIT) kernels; those are far slower than sgemm on widened copies.
    // The shape is a linear's (and the peak probe's, telemetry/peak_flops.h): oneDNN picks its kernel
    // by shape, and a tiny product gets AVX-512 where a large one gets AMX.
    Gemm16 probe{false, true, 1024, 1024, 1024, 1024, 1024, 1024, type, type, false};
    kernel = make(probe, true).implementation;
    if (kernel.find("ref") != std::string::npos) kernel.clear();
  } catch (const dnnl::error&) {
    kernel.clear();
  }
  probed[type] = kernel;
  return kernel;
}

bool matmul_16bit_available(DType type) { return !matmul_16bit_kernel(type).empty(); }

namespace {

// The primitive for `key`, made on first use; shared by every thread (thread-safe to execute with a
// scratchpad of the caller's own).
const Primitive& primitive(const Key& key, const Gemm16& s, bool with_bias) {
  static std::map<Key, Primitive> cache;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    try {
      it = cache.emplace(key, make(s, with_bias)).first;
    } catch (const dnnl::error& e) {
      ENGINE_CHECK(false, std::string("oneDNN matmul: ") + e.what());
    }
  }
  return it->second;
}

Key key_of(const Gemm16& s, bool with_bias) {
  return {s.transa, s.transb,        s.m,           s.n,          s.k,       s.lda,  s.ldb,
          s.ldc,    int(s.operands), int(s.result), s.accumulate, with_bias, s.scale};
}

}  // namespace

std::string gemm16_kernel(const Gemm16& s, bool with_bias) {
  return primitive(key_of(s, with_bias), s, with_bias).implementation;
}

size_t gemm16_scratchpad_bytes(const Gemm16& s) { return primitive(key_of(s, false), s, false).scratchpad.get_size(); }

void gemm16(const Gemm16& s, const void* a, const void* b, const void* bias, void* c) {
  const Key key = key_of(s, bias != nullptr);
  // Memory objects are bound per thread: set_data_handle on a shared one would race.
  static thread_local std::map<Key, Bound> bound;
  auto it = bound.find(key);
  if (it == bound.end()) {
    const Primitive& p = primitive(key, s, bias != nullptr);
    const dnnl::engine& cpu = onednn_cpu();
    Bound fresh{&p,
                dnnl::memory(p.a, cpu, DNNL_MEMORY_NONE),
                dnnl::memory(p.b, cpu, DNNL_MEMORY_NONE),
                dnnl::memory(p.c, cpu, DNNL_MEMORY_NONE),
                {},
                dnnl::memory(p.scratchpad, cpu, DNNL_MEMORY_NONE),
                dnnl::stream(cpu)};
    if (bias) fresh.bias = dnnl::memory(p.bias, cpu, DNNL_MEMORY_NONE);
    it = bound.emplace(key, std::move(fresh)).first;
  }
  Bound& t = it->second;
  t.a.set_data_handle(const_cast<void*>(a));
  t.b.set_data_handle(const_cast<void*>(b));
  t.c.set_data_handle(c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, t.a}, {DNNL_ARG_WEIGHTS, t.b}, {DNNL_ARG_DST, t.c}};
  if (const size_t bytes = t.primitive->scratchpad.get_size(); bytes > 0) {
    t.scratchpad.set_data_handle(thread_scratchpad(bytes));
    args.emplace(DNNL_ARG_SCRATCHPAD, t.scratchpad);
  }
  if (bias) {
    t.bias.set_data_handle(const_cast<void*>(bias));
    args.emplace(DNNL_ARG_BIAS, t.bias);
  }
  t.primitive->matmul.execute(t.stream, args);
  t.stream.wait();
}

}  // namespace engine::ops
