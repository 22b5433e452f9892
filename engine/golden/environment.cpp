#include "golden/environment.h"

#include <omp.h>

#include <oneapi/dnnl/dnnl.h>

#include "core/build_flags.h"
#include "core/dtype.h"
#include "linalg/gemm16.h"

namespace engine {

namespace {

std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(int(isa));
  }
}

std::string sixteen_bit_kernel(DType type) {
  std::string kernel = ops::matmul_16bit_kernel(type);
  return kernel.empty() ? "dnnl_sgemm on widened copies" : kernel;
}

}  // namespace

NumericEnvironment current_environment() {
  NumericEnvironment env;
  env.compiler = kCompiler;
  env.compiler_flags = kCompilerFlags;
  const dnnl_version_t* v = dnnl_version();
  env.onednn = std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  env.cpu_isa = isa_name(dnnl_get_effective_cpu_isa());
  // dnnl_sgemm has no query for its kernel; it dispatches on the effective ISA alone.
  env.matmul_kernels["f32"] = "dnnl_sgemm (" + env.cpu_isa + ")";
  env.matmul_kernels["bf16"] = sixteen_bit_kernel(DType::bf16);
  env.matmul_kernels["f16"] = sixteen_bit_kernel(DType::f16);
  env.threads = omp_get_max_threads();
  return env;
}

std::vector<std::string> NumericEnvironment::differences(const NumericEnvironment& other) const {
  std::vector<std::string> lines;
  auto field = [&](const std::string& name, const std::string& mine, const std::string& theirs) {
    if (mine != theirs) lines.push_back(name + " " + mine + " vs " + theirs);
  };
  field("compiler", compiler, other.compiler);
  field("compiler flags", "'" + compiler_flags + "'", "'" + other.compiler_flags + "'");
  field("oneDNN", onednn, other.onednn);
  field("CPU ISA", cpu_isa, other.cpu_isa);
  for (const char* path : {"f32", "bf16", "f16"}) {
    auto mine = matmul_kernels.find(path), theirs = other.matmul_kernels.find(path);
    field(std::string("oneDNN ") + path + " matmul kernel", mine == matmul_kernels.end() ? "?" : mine->second,
          theirs == other.matmul_kernels.end() ? "?" : theirs->second);
  }
  field("threads", std::to_string(threads), std::to_string(other.threads));
  return lines;
}

}  // namespace engine
