// The vector ISA of the engine's own CPU kernels.
//
// The build targets x86-64-v3 (AVX2 + FMA), so the binary runs on any x86-64 machine of the last
// decade. The hottest loops the engine writes itself (cross-entropy's exponentials, ...) are also
// compiled for AVX-512 (x86-64-v4) inside the same binary, with ENGINE_TARGET_AVX512 on a function
// whose body is a shared always-inline template, and the op picks one per call:
//
//   float row_avx2(...) { return row<...>(...); }
//   ENGINE_TARGET_AVX512 float row_avx512(...) { return row<...>(...); }
//   ... kernel_isa() == CpuIsa::avx512 ? row_avx512(...) : row_avx2(...)
//
// Only the wrapper carries the target, so nothing compiled for AVX-512 can end up in code that
// runs elsewhere (a whole translation unit built with -march=x86-64-v4 would emit AVX-512 copies of
// inline library functions, and the linker may keep those for everyone).
//
// kernel_isa() is AVX-512 when the CPU has AVX512F/BW/DQ/VL and ONEDNN_MAX_CPU_ISA does not cap
// oneDNN below AVX-512: one setting caps every kernel in the process, which is how the golden
// bands' AVX2 variant (golden/variants.h) stands for an AVX2 machine.
#pragma once

#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENGINE_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,avx2,bmi2")))
#define ENGINE_HAS_AVX512_KERNELS 1
#else
#define ENGINE_TARGET_AVX512
#define ENGINE_HAS_AVX512_KERNELS 0
#endif

namespace engine {

enum class CpuIsa { avx2, avx512 };

// The ISA the kernels use in this process (detected once).
CpuIsa kernel_isa();
const char* cpu_isa_name(CpuIsa isa);

// Whether a value of ONEDNN_MAX_CPU_ISA ("AVX2", "avx512_core", "ALL", ...) allows AVX-512.
bool max_cpu_isa_allows_avx512(std::string_view value);

// Tests run both variants of a kernel on one machine: while one of these lives, kernel_isa() is
// `isa` (capped at what the CPU has). Not thread-safe; for tests only.
class ScopedKernelIsa {
 public:
  explicit ScopedKernelIsa(CpuIsa isa);
  ~ScopedKernelIsa();
  ScopedKernelIsa(const ScopedKernelIsa&) = delete;
  ScopedKernelIsa& operator=(const ScopedKernelIsa&) = delete;

 private:
  int previous_;
};

}  // namespace engine
