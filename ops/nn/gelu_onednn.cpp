#include "nn/gelu_onednn.h"

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "core/cpu_isa.h"
#include "onednn_util.h"

namespace engine::ops {

namespace {

// Both directions for one length and type; empty when oneDNN has no JIT kernel for them.
struct Primitives {
  std::optional<dnnl::eltwise_forward> forward;
  std::optional<dnnl::eltwise_backward> backward;
  dnnl::memory::desc data;
};

bool jit(const std::string& implementation) { return implementation.find("ref") == std::string::npos; }

Primitives make(DType type, int64_t n) {
  Primitives p;
  if (type != DType::f32 && type != DType::bf16 && type != DType::f16) return p;
  p.data = dnnl::memory::desc({n}, onednn_type(type), dnnl::memory::format_tag::a);
  // The primitives run on whichever thread calls them, so none may lean on oneDNN's own scratchpad
  // (a thread's, sized by what that thread created: ops/linalg/gemm16.cpp): in user mode, a kernel
  // that asks for one is not used. oneDNN's JIT eltwise kernels ask for none.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto usable = [](const auto& pd) { return jit(pd.impl_info_str()) && pd.scratchpad_desc().get_size() == 0; };
  try {
    const auto algorithm = dnnl::algorithm::eltwise_gelu_tanh;
    dnnl::eltwise_forward::primitive_desc forward(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, algorithm, p.data, 0.0f, 0.0f), attr,
        onednn_cpu());
    if (!usable(forward)) return p;
    p.forward.emplace(forward);
    dnnl::eltwise_backward::primitive_desc backward(dnnl::eltwise_backward::desc(algorithm, p.data, p.data, 0.0f, 0.0f),
                                                    attr, onednn_cpu(), forward);
    if (usable(backward)) p.backward.emplace(backward);
  } catch (const dnnl::error&) {
    // No primitive for this type on this CPU: the caller's own loop runs.
  }
  return p;
}

const Primitives& primitives(DType type, int64_t n) {
  static std::map<std::tuple<int, int64_t>, Primitives> cache;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto key = std::make_tuple(int(type), n);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make(type, n)).first;
  return it->second;
}

dnnl::memory bind(const dnnl::memory::desc& desc, const void* data) {
  return dnnl::memory(desc, onednn_cpu(), const_cast<void*>(data));
}

GeluPath chosen_path = GeluPath::automatic;

bool wanted() {
  return chosen_path == GeluPath::automatic ? kernel_isa() == CpuIsa::avx512 : chosen_path == GeluPath::onednn;
}

}  // namespace

void set_gelu_path(GeluPath path) { chosen_path = path; }

bool onednn_gelu_available(DType type, int64_t n) {
  const Primitives& p = primitives(type, n);
  return p.forward && p.backward;
}

bool onednn_gelu_forward(DType type, int64_t n, const void* x, void* y) {
  if (!wanted()) return false;
  const Primitives& p = primitives(type, n);
  if (!p.forward) return false;
  dnnl::stream stream(onednn_cpu());
  p.forward->execute(stream, {{DNNL_ARG_SRC, bind(p.data, x)}, {DNNL_ARG_DST, bind(p.data, y)}});
  stream.wait();
  return true;
}

bool onednn_gelu_backward(DType type, int64_t n, const void* x, const void* dy, void* dx) {
  if (!wanted()) return false;
  const Primitives& p = primitives(type, n);
  if (!p.backward) return false;
  dnnl::stream stream(onednn_cpu());
  p.backward->execute(
      stream,
      {{DNNL_ARG_SRC, bind(p.data, x)}, {DNNL_ARG_DIFF_DST, bind(p.data, dy)}, {DNNL_ARG_DIFF_SRC, bind(p.data, dx)}});
  stream.wait();
  return true;
}

}  // namespace engine::ops
