// What a build's CUDA backend promises, checked without a GPU (ctest label "ops"):
//  - the kernels meant to give the CPU's bits (the elementwise ones: gelu, relu, silu, swiglu,
//    dropout, add, widen, narrow, cast, copy) compile to PTX without flush-to-zero (.ftz), without
//    approximate instructions (approx: ex2, rcp, div, tanh ...) and without multiplies or adds
//    left to ptxas to contract into FMAs: nvcc writes `add.f32`/`mul.f32` for those and, with
//    -fmad=false (cmake/EngineCuda.cmake), `add.rn.f32`/`mul.rn.f32`, which it may not fuse. The
//    FMAs the shared math writes (fused_multiply_add: `fma.rn.f32`) are the CPU's own, so allowed;
//  - every op a harness case runs, its precision casts and its gradient nodes included, has a CUDA
//    kernel (OpDef::cuda; in a build without CUDA, ops/no_cuda.cpp's stubs);
//  - asking for a CUDA executor where there is none is a UserError that names cuda.
// The PTX test reads the library with cuobjdump (the toolkit's, or /usr/local/cuda/bin, or PATH)
// and skips in a build without CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/build_flags.h"
#include "core/device_info.h"
#include "core/error.h"
#include "op_harness.h"
#include "runtime/executor.h"

namespace engine {
namespace {

// ---- PTX ----

struct PtxFunction {
  std::string name;
  bool entry = false;  // a kernel (.entry), or a device function (.func)
  std::vector<std::string> body;
};

// The .entry and .func definitions of a PTX listing (cuobjdump -ptx prints one module after the
// other; a name may repeat, once per module or architecture). A definition runs from its header
// to the closing brace of its body; declarations (ending in ';' before any '{') are skipped.
std::vector<PtxFunction> ptx_functions(const std::string& text) {
  static const std::regex header(R"((^|\s)\.(entry|func)\s+(\([^)]*\)\s*)?([A-Za-z_$][A-Za-z0-9_$]*))");
  std::vector<PtxFunction> functions;
  std::istringstream lines(text);
  std::string line;
  PtxFunction current;
  bool in_header = false;
  int depth = 0;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!in_header && depth == 0) {
      if (std::regex_search(line, m, header)) {
        current = PtxFunction{m[4].str(), m[2].str() == "entry", {}};
        in_header = true;
      } else {
        continue;
      }
    }
    if (in_header && depth == 0 && line.find('{') == std::string::npos) {
      if (line.find(';') != std::string::npos) in_header = false;  // a declaration (prototype)
      continue;
    }
    for (char ch : line) {
      if (ch == '{') ++depth;
      if (ch == '}') --depth;
    }
    in_header = false;
    current.body.push_back(line);
    if (depth <= 0) {
      depth = 0;
      functions.push_back(std::move(current));
      current = {};
    }
  }
  return functions;
}

// The words of a (mangled) name: its Itanium identifiers (<length><identifier>), each split at
// underscores and lower-to-upper case changes, lower-cased. "_ZN6engine4cuda11gelu_kernelEPKfPfl"
// -> engine, cuda, gelu, kernel; a name that is not mangled counts as one identifier.
std::vector<std::string> name_words(const std::string& name) {
  std::vector<std::string> identifiers;
  if (name.rfind("_Z", 0) == 0) {
    for (size_t i = 2; i < name.size();) {
      if (!std::isdigit(static_cast<unsigned char>(name[i]))) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
      const size_t length = std::stoul(name.substr(i, end - i));
      if (length == 0 || end + length > name.size()) {
        i = end;
        continue;
      }
      identifiers.push_back(name.substr(end, length));
      i = end + length;
    }
  } else {
    identifiers.push_back(name);
  }
  std::vector<std::string> words;
  for (const std::string& id : identifiers) {
    std::string word;
    auto flush = [&] {
      if (!word.empty()) words.push_back(word);
      word.clear();
    };
    for (size_t k = 0; k < id.size(); ++k) {
      const char ch = id[k];
      if (!std::isalpha(static_cast<unsigned char>(ch))) {
        flush();
        continue;
      }
      if (std::isupper(static_cast<unsigned char>(ch)) && k > 0 && std::islower(static_cast<unsigned char>(id[k - 1])))
        flush();
      word += char(std::tolower(static_cast<unsigned char>(ch)));
    }
    flush();
  }
  return words;
}

// Whether a kernel is one of those meant to match the CPU bit for bit.
bool meant_bit_exact(const std::string& name) {
  // The element-wise ops, the casts, and the optimizer step's kernels (optim/update_kernels.cu).
  static const std::vector<std::string> kWords{"gelu",  "relu",   "silu", "swiglu", "dropout", "add",
                                               "widen", "narrow", "cast", "copy",   "adamw",   "sgd"};
  for (const std::string& word : name_words(name))
    if (std::find(kWords.begin(), kWords.end(), word) != kWords.end()) return true;
  return false;
}

// The lines of `f` that break bit-exactness: flush-to-zero, approximate instructions, and float
// adds, subtracts and multiplies without a rounding mode (ones ptxas may contract into an FMA).
std::vector<std::string> bit_exact_violations(const PtxFunction& f) {
  static const std::regex ftz(R"(\.ftz\b)"), approx(R"(\.approx\b)"),
      contractible(R"((^|\s)(add|sub|mul)(\.sat)?\.f(32|64)\s)");
  std::vector<std::string> bad;
  for (const std::string& line : f.body) {
    const std::string code = line.substr(0, line.find("//"));
    if (std::regex_search(code, ftz) || std::regex_search(code, approx) || std::regex_search(code, contractible))
      bad.push_back(code);
  }
  return bad;
}

// The violations of every bit-exact kernel in `ptx` and of the device functions it calls, by
// kernel name; `checked` gets the kernels looked at.
std::map<std::string, std::vector<std::string>> check_ptx(const std::string& ptx, std::vector<std::string>& checked) {
  const std::vector<PtxFunction> functions = ptx_functions(ptx);
  std::map<std::string, std::vector<std::string>> violations;
  for (const PtxFunction& f : functions) {
    if (!f.entry || !meant_bit_exact(f.name)) continue;
    if (std::find(checked.begin(), checked.end(), f.name) == checked.end()) checked.push_back(f.name);
    std::vector<std::string> bad = bit_exact_violations(f);
    for (const PtxFunction& callee : functions) {
      if (callee.entry) continue;
      bool called = false;
      for (const std::string& line : f.body)
        called = called || (line.find("call") != std::string::npos && line.find(callee.name) != std::string::npos);
      if (!called) continue;
      for (const std::string& line : bit_exact_violations(callee)) bad.push_back(callee.name + ": " + line);
    }
    if (!bad.empty()) {
      auto& list = violations[f.name];
      list.insert(list.end(), bad.begin(), bad.end());
    }
  }
  return violations;
}

// nvcc 13.0 -arch=sm_90 -O3 output for
//   __global__ void add_kernel(const float* a, const float* b, float* c, int n)
//     { int i = threadIdx.x; if (i < n) c[i] = a[i] * b[i] + c[i] - 1.0f; }
// with -fmad=false, with -fmad=true, and with -use_fast_math (an exp and a division instead).
constexpr const char* kPtxFmadFalse = R"(
.version 9.0
.target sm_90
.address_size 64

	// .globl	_Z10add_kernelPKfS0_Pfi

.visible .entry _Z10add_kernelPKfS0_Pfi(
	.param .u64 _Z10add_kernelPKfS0_Pfi_param_0,
	.param .u64 _Z10add_kernelPKfS0_Pfi_param_1,
	.param .u64 _Z10add_kernelPKfS0_Pfi_param_2,
	.param .u32 _Z10add_kernelPKfS0_Pfi_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<3>;
	.reg .f32 	%f<7>;
	.reg .b64 	%rd<11>;

	ld.param.u32 	%r2, [_Z10add_kernelPKfS0_Pfi_param_3];
	mov.u32 	%r1, %tid.x;
	setp.ge.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_2;
	ld.global.f32 	%f1, [%rd7];
	ld.global.f32 	%f2, [%rd9];
	mul.rn.f32 	%f3, %f2, %f1;
	ld.global.f32 	%f4, [%rd10];
	add.rn.f32 	%f5, %f3, %f4;
	add.rn.f32 	%f6, %f5, 0fBF800000;
	st.global.f32 	[%rd10], %f6;
$L__BB0_2:
	ret;

}
)";
constexpr const char* kPtxFmadTrue = R"(
.visible .entry _Z10add_kernelPKfS0_Pfi(
	.param .u64 _Z10add_kernelPKfS0_Pfi_param_0
)
{
	fma.rn.f32 	%f4, %f2, %f1, %f3;
	add.f32 	%f5, %f4, 0fBF800000;
	ret;
}
)";
constexpr const char* kPtxFastMath = R"(
.func  (.param .b32 func_retval0) _Z8gelu_mathf(
	.param .b32 _Z8gelu_mathf_param_0
)
{
	ex2.approx.ftz.f32 	%f3, %f2;
	ret;
}
.visible .entry _Z11gelu_kernelPKfPfi(
	.param .u64 _Z11gelu_kernelPKfPfi_param_0
)
{
	{ // callseq 0, 0
	call.uni (retval0), _Z8gelu_mathf, (param0);
	} // callseq 0
	div.approx.ftz.f32 	%f4, %f3, %f1;
	ret;
}
.visible .entry _Z13reduce_kernelPKfPfi(
	.param .u64 _Z13reduce_kernelPKfPfi_param_0
)
{
	add.ftz.f32 	%f5, %f4, %f3;
	ret;
}
)";

TEST(CudaBuild, PtxCheckFindsWhatItLooksFor) {
  EXPECT_EQ(name_words("_ZN6engine4cuda12_GLOBAL__N_119swiglu_backwardKernIfEEvPKfl"),
            (std::vector<std::string>{"engine", "cuda", "global", "n", "swiglu", "backward", "kern"}));
  EXPECT_TRUE(meant_bit_exact("_ZN6engine4cuda12_GLOBAL__N_112unary_kernelINS_3ops4GeluEEEvPKfPfl"));
  EXPECT_TRUE(meant_bit_exact("_ZN6engine4cuda11widenKernelEPKvPfl"));
  EXPECT_FALSE(meant_bit_exact("_ZN6engine4cuda12_GLOBAL__N_114softmax_kernelEPKfPfl"));
  EXPECT_FALSE(meant_bit_exact("_ZN6engine4cuda13padded_kernelEPKfPfl"));  // "add" only inside a word

  std::vector<std::string> checked;
  EXPECT_TRUE(check_ptx(kPtxFmadFalse, checked).empty());
  EXPECT_EQ(checked, std::vector<std::string>{"_Z10add_kernelPKfS0_Pfi"});

  checked.clear();
  const auto contracted = check_ptx(kPtxFmadTrue, checked);
  ASSERT_EQ(contracted.size(), 1u);
  EXPECT_EQ(contracted.begin()->second.size(), 1u);  // add.f32, not the written fma.rn.f32

  checked.clear();
  const auto fast = check_ptx(kPtxFastMath, checked);
  EXPECT_EQ(checked, std::vector<std::string>{"_Z11gelu_kernelPKfPfi"});  // not the reduction
  ASSERT_EQ(fast.size(), 1u);
  EXPECT_EQ(fast.begin()->second.size(), 2u);  // its div.approx.ftz and its callee's ex2.approx.ftz
}

std::string find_cuobjdump() {
#ifdef ENGINE_TEST_CUOBJDUMP
  if (std::filesystem::exists(ENGINE_TEST_CUOBJDUMP)) return ENGINE_TEST_CUOBJDUMP;
#endif
  if (std::filesystem::exists("/usr/local/cuda/bin/cuobjdump")) return "/usr/local/cuda/bin/cuobjdump";
  if (const char* path = std::getenv("PATH")) {
    std::istringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && std::filesystem::exists(dir + "/cuobjdump")) return dir + "/cuobjdump";
  }
  return "";
}

// Standard output and error of `command`, and its exit status.
std::string run_command(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    status = -1;
    return out;
  }
  char buffer[1 << 16];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  status = pclose(pipe);
  return out;
}

TEST(CudaBuild, BitExactKernelsHaveNoFlushToZeroApproximationOrContraction) {
  if (!kHaveCuda) GTEST_SKIP() << "this build has no CUDA kernels (ENGINE_CUDA=OFF or no toolkit found)";
#ifndef ENGINE_TEST_CUDA_LIB
  GTEST_SKIP() << "ENGINE_TEST_CUDA_LIB (the engine_core library) is not defined by the build";
#else
  // The library where it was built; elsewhere (a bundle carried to a GPU machine) this executable,
  // which embeds the same device code.
  const std::string library = std::filesystem::exists(ENGINE_TEST_CUDA_LIB)
                                  ? std::string(ENGINE_TEST_CUDA_LIB)
                                  : std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cuobjdump = find_cuobjdump();
  if (cuobjdump.empty()) GTEST_SKIP() << "no cuobjdump (the toolkit's, /usr/local/cuda/bin or PATH) to read the PTX";
  int status = 0;
  const std::string ptx = run_command("'" + cuobjdump + "' -ptx '" + library + "'", status);
  ASSERT_EQ(status, 0) << cuobjdump << " -ptx " << library << ":\n" << ptx.substr(0, 4000);
  if (ptx.find(".entry") == std::string::npos)
    GTEST_SKIP() << library << " embeds no PTX (CMAKE_CUDA_ARCHITECTURES with -real only?): nothing to read";
  std::vector<std::string> checked;
  const auto violations = check_ptx(ptx, checked);
  std::cout << "checked " << checked.size() << " kernels meant to match the CPU bit for bit:\n";
  for (const std::string& name : checked) std::cout << "  " << name << "\n";
  EXPECT_FALSE(checked.empty()) << "no kernel of " << library << " is named after an elementwise op";
  for (const auto& [name, lines] : violations) {
    std::string listed;
    for (size_t i = 0; i < lines.size() && i < 8; ++i) listed += "\n    " + lines[i];
    ADD_FAILURE() << name << ": " << lines.size() << " instructions that round unlike the CPU" << listed;
  }
#endif
}

// ---- every op of the harness has a CUDA kernel ----

TEST(CudaBuild, EveryOpOfTheHarnessHasACudaKernel) {
  for (int seed = 1; seed <= 2; ++seed) {
    std::mt19937 shape_rng{static_cast<uint32_t>(seed)};
    for (const op_harness::Case& c : op_harness::cases(shape_rng))
      for (DType storage : {DType::f32, DType::bf16, DType::f16}) {
        // The graph the harness runs: the op, the precision pass's casts, the loss and autodiff's nodes.
        const auto built = op_harness::build_case_graph(c, storage);
        for (const Node& node : built->graph.nodes())
          EXPECT_NE(node.op->cuda, nullptr) << "op " << node.op->name << " (node " << node.name << ", case " << c.name
                                            << ", " << dtype_name(storage) << ") has no CUDA kernel";
      }
  }
}

// ---- a CUDA executor where there is none ----

TEST(CudaBuild, CudaExecutorWithoutCudaOrDeviceIsAUserError) {
  std::mt19937 shape_rng{1};
  const auto built = op_harness::build_case_graph(op_harness::cases(shape_rng).front(), DType::f32);
  ParameterStore store(built->graph);
  store.initialize(1);
  // Without CUDA any index; with it, the first index past the devices the runtime sees.
  const int index = cuda_device_count();
  try {
    Executor exec(built->graph, store, 1, Device{Device::Kind::cuda, index});
    ADD_FAILURE() << "a CUDA executor on device " << index << " was made (" << (kHaveCuda ? "CUDA build" : "no CUDA")
                  << ", " << cuda_device_count() << " devices)";
  } catch (const UserError& e) {
    std::string message = e.what();
    std::transform(message.begin(), message.end(), message.begin(),
                   [](unsigned char ch) { return char(std::tolower(ch)); });
    EXPECT_NE(message.find("cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace engine
