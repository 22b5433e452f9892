// The numeric environment: everything outside the engine's source that decides the last bits of a
// training run. Two runs of the same commit in the same environment are bitwise identical; in
// different environments (another oneDNN kernel, ISA, compiler or thread count) they agree only
// to rounding, and the golden check switches from bitwise to its tolerance band.
//
//   NumericEnvironment here = current_environment();
//   for (const std::string& d : recorded.differences(here)) std::cout << d << "\n";
//   // "oneDNN bf16 matmul kernel brg:avx512_core_bf16 vs brg:avx512_core_amx"
#pragma once

#include <map>
#include <string>
#include <vector>

namespace engine {

struct NumericEnvironment {
  std::string compiler;        // "GNU 12.2.0"
  std::string compiler_flags;  // "-O3 -DNDEBUG -march=x86-64-v3"
  std::string onednn;          // oneDNN version "2.6.3"
  std::string cpu_isa;         // the ISA oneDNN dispatches to ("avx512_core_bf16"); ONEDNN_MAX_CPU_ISA caps it
  // The kernel each matmul path runs: "f32" (dnnl_sgemm), "bf16" and "f16" (oneDNN matmul
  // primitives, or fp32 sgemm on widened copies where the CPU has none).
  std::map<std::string, std::string> matmul_kernels;
  int threads = 1;  // OpenMP threads of the step

  // One line per field that differs, naming both values (this first, then `other`); empty when equal.
  std::vector<std::string> differences(const NumericEnvironment& other) const;
};

// This process's environment (probes oneDNN once).
NumericEnvironment current_environment();

}  // namespace engine
