#include "core/cpu_isa.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

namespace engine {

namespace {

bool cpu_has_avx512() {
#if ENGINE_HAS_AVX512_KERNELS
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

CpuIsa detect() {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap && *cap && !max_cpu_isa_allows_avx512(cap)) return CpuIsa::avx2;
  return cpu_has_avx512() ? CpuIsa::avx512 : CpuIsa::avx2;
}

// -1: none; else the CpuIsa a test asked for.
int override_isa = -1;

}  // namespace

bool max_cpu_isa_allows_avx512(std::string_view value) {
  std::string lower(value);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  // oneDNN's names: sse41, avx, avx2, avx2_vnni, avx2_vnni_2, avx512_core, avx512_core_vnni,
  // avx512_core_bf16, avx512_core_fp16, avx512_core_amx, avx10_1_512..., all.
  return lower == "all" || lower.rfind("avx512", 0) == 0 || lower.rfind("avx10", 0) == 0;
}

CpuIsa kernel_isa() {
  static const CpuIsa detected = detect();
  if (override_isa >= 0) return static_cast<CpuIsa>(std::min(override_isa, int(detected == CpuIsa::avx512)));
  return detected;
}

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx512 ? "avx512" : "avx2"; }

ScopedKernelIsa::ScopedKernelIsa(CpuIsa isa) : previous_(override_isa) { override_isa = int(isa); }
ScopedKernelIsa::~ScopedKernelIsa() { override_isa = previous_; }

}  // namespace engine
