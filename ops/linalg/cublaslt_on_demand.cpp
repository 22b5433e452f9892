// cuBLASLt loaded when a GPU run first asks for it, not when a program starts. The engine calls
// cuBLASLt's C API as <cublasLt.h> declares it; this file defines those functions, and each one
// forwards to the library's own, found with dlopen/dlsym on first use. Nothing links libcublasLt.
//
// Why: libcublasLt's start-up (its static initialisers) costs about 0.1 s of CPU in every process
// that merely loads it, GPU or not: every `engine validate`, every MPI rank of a CPU run, every
// test program. The CPU path never calls it.
//
// A new cuBLASLt function the engine calls needs its line here; without one the link fails naming
// the function. A machine without the library gets a clear error at the first GPU matmul instead
// of a program that does not start.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace {

void* cublaslt_library() {
  static void* const handle = [] {
    // The soname first (LD_LIBRARY_PATH, the program's run path, the loader's cache), then the
    // library this build was configured against.
    const std::string soname = ENGINE_CUBLASLT_SONAME;
    void* opened = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!opened) opened = dlopen((std::string(ENGINE_CUBLASLT_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!opened)
      throw engine::UserError("cuBLASLt could not be loaded (" + soname + ": " + dlerror() +
                              "): a GPU run needs the CUDA toolkit's cuBLAS; install it or add its lib "
                              "directory to LD_LIBRARY_PATH");
    return opened;
  }();
  return handle;
}

template <class Function>
Function entry(const char* name) {
  void* found = dlsym(cublaslt_library(), name);
  if (!found)
    throw engine::UserError(std::string("the loaded cuBLASLt has no ") + name + " (" + ENGINE_CUBLASLT_SONAME +
                            " is older than this build's <cublasLt.h>)");
  return reinterpret_cast<Function>(found);
}

// The library's own definition of `function`, looked up once.
#define ENGINE_CUBLASLT_ENTRY(function) static const auto real = entry<decltype(&::function)>(#function)

}  // namespace

extern "C" {

size_t CUBLASWINAPI cublasLtGetVersion(void) {
  ENGINE_CUBLASLT_ENTRY(cublasLtGetVersion);
  return real();
}

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  ENGINE_CUBLASLT_ENTRY(cublasLtCreate);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
  ENGINE_CUBLASLT_ENTRY(cublasLtDestroy);
  return real(handle);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatrixLayoutCreate);
  return real(layout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatrixLayoutDestroy);
  return real(layout);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                             cublasLtMatrixLayoutAttribute_t attribute,
                                                             const void* value, size_t size) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatrixLayoutSetAttribute);
  return real(layout, attribute, value, size);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulDescCreate);
  return real(desc, compute, scale);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulDescDestroy);
  return real(desc);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attribute, const void* value,
                                                           size_t size) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulDescSetAttribute);
  return real(desc, attribute, value, size);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulPreferenceCreate);
  return real(preference);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulPreferenceDestroy);
  return real(preference);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                                 cublasLtMatmulPreferenceAttributes_t attribute,
                                                                 const void* value, size_t size) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulPreferenceSetAttribute);
  return real(preference, attribute, value, size);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t preference, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* returned) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmulAlgoGetHeuristic);
  return real(handle, op, a, b, c, d, preference, requested, results, returned);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha,
                                           const void* a, cublasLtMatrixLayout_t a_layout, const void* b,
                                           cublasLtMatrixLayout_t b_layout, const void* beta, const void* c,
                                           cublasLtMatrixLayout_t c_layout, void* d, cublasLtMatrixLayout_t d_layout,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_size,
                                           cudaStream_t stream) {
  ENGINE_CUBLASLT_ENTRY(cublasLtMatmul);
  return real(handle, op, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout, algo, workspace,
              workspace_size, stream);
}

}  // extern "C"
