// cuBLASLt is opened at its first call (ops/linalg/cublaslt_on_demand.cpp), so a process that never
// multiplies on a GPU never pays the library's start-up. No device needed: cublasLtGetVersion asks
// the library, not the GPU.
#include <cublasLt.h>
#include <gtest/gtest.h>
#include <link.h>

#include <string>

namespace {

bool cublaslt_is_loaded() {
  bool found = false;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name && std::string(info->dlpi_name).find("libcublasLt.so") != std::string::npos)
          *static_cast<bool*>(out) = true;
        return 0;
      },
      &found);
  return found;
}

TEST(CudaBuild, CublasLtLoadsAtItsFirstCallNotWhenTheProgramStarts) {
  // ctest runs this case in a process of its own, in which nothing has multiplied on a GPU.
  EXPECT_FALSE(cublaslt_is_loaded()) << "the program loaded libcublasLt before anything called it";
  const size_t version = cublasLtGetVersion();
  EXPECT_EQ(version / 10000, size_t(CUBLAS_VER_MAJOR)) << "the library this build's <cublasLt.h> describes";
  EXPECT_TRUE(cublaslt_is_loaded());
}

}  // namespace
