// cuBLASLt is opened at its first call (ops/linalg/cublaslt_on_demand.cpp), so a process that never
// multiplies on a GPU never pays the library's start-up. No device needed: cublasLtGetVersion asks
// the library, not the GPU.
#include <cublasLt.h>
#include <gtest/gtest.h>
#include <link.h>

#include <cstdlib>
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
  // A fresh process (a "threadsafe" death test executes the program again up to this statement),
  // since other cases of this program may have multiplied on a GPU already.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(cublaslt_is_loaded() ? 1 : 0), ::testing::ExitedWithCode(0), "")
      << "the program loaded libcublasLt before anything called it";
  const size_t version = cublasLtGetVersion();
  EXPECT_EQ(version / 10000, size_t(CUBLAS_VER_MAJOR)) << "the library this build's <cublasLt.h> describes";
  EXPECT_TRUE(cublaslt_is_loaded());
}

}  // namespace
