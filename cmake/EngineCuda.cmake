# ENGINE_CUDA=AUTO|ON|OFF. AUTO compiles the CUDA sources when a toolkit is found (including the
# usual /usr/local/cuda when nvcc is not on PATH); ON fails if none is; OFF builds CPU only.
set(ENGINE_HAVE_CUDA OFF)
if(NOT ENGINE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100/H200)
    endif()
    enable_language(CUDA)
    # The engine's headers need C++20 (defaulted operator==, std::bit_cast), and CMake 3.25 knows no
    # CUDA20 dialect for nvcc: tell it the flag, so CUDA sources get the C++ standard of the rest.
    # After enable_language: its compiler checks (try_compile) would ask for CUDA20 without the flag
    # and fail in a fresh build folder.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(ENGINE_HAVE_CUDA ON)
    # Every CUDA source: constexpr std functions in device code, and no contraction into
    # FMAs the source did not write (-fmad=false) and no fast math, so kernels that share their math
    # with the CPU give its bits (tests/ops/cuda_ptx_test checks the PTX).
    add_compile_options($<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr> $<$<COMPILE_LANGUAGE:CUDA>:-fmad=false>)
  elseif(ENGINE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ENGINE_CUDA=ON but no CUDA compiler was found (set CMAKE_CUDA_COMPILER)")
  endif()
endif()
message(STATUS "engine: CUDA ${ENGINE_HAVE_CUDA} (ENGINE_CUDA=${ENGINE_CUDA})")

# cuDNN's fused SDPA for causal_attention in bf16/fp16 (ops/nn/attention_cudnn.cpp): cudnn.h and
# libcudnn (the toolkit's directories, /usr/local/cuda), and the cuDNN frontend's headers, which
# scripts/setup installs into third_party/cudnn_frontend/include (ENGINE_CUDNN_FRONTEND_DIR to use
# another copy). With both, ENGINE_HAVE_CUDNN; without, the engine's own kernels do all attention
# and ENGINE_CUDNN_MISSING says why (`engine --version` prints it). ENGINE_CUDNN=OFF skips it.
set(ENGINE_CUDNN AUTO CACHE STRING "cuDNN SDPA for 16-bit attention: AUTO (when cuDNN and its frontend are found) or OFF")
set(ENGINE_CUDNN_FRONTEND_DIR ${PROJECT_SOURCE_DIR}/third_party/cudnn_frontend/include CACHE PATH
    "The cuDNN frontend's include folder (cudnn_frontend.h)")
set(ENGINE_HAVE_CUDNN OFF)
set(ENGINE_CUDNN_MISSING "")
if(NOT ENGINE_HAVE_CUDA)
  set(ENGINE_CUDNN_MISSING "no CUDA in this build")
elseif(ENGINE_CUDNN STREQUAL "OFF")
  set(ENGINE_CUDNN_MISSING "configured with ENGINE_CUDNN=OFF")
else()
  find_path(ENGINE_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(ENGINE_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NOT ENGINE_CUDNN_INCLUDE_DIR OR NOT ENGINE_CUDNN_LIBRARY)
    set(ENGINE_CUDNN_MISSING "cudnn.h or libcudnn not found beside the CUDA toolkit")
  elseif(NOT EXISTS ${ENGINE_CUDNN_FRONTEND_DIR}/cudnn_frontend.h)
    set(ENGINE_CUDNN_MISSING "no cuDNN frontend headers in ${ENGINE_CUDNN_FRONTEND_DIR} (scripts/setup --deps installs them)")
  elseif(NOT TARGET CUDA::nvrtc)
    set(ENGINE_CUDNN_MISSING "no NVRTC library in the CUDA toolkit (the cuDNN frontend links it)")
  else()
    set(ENGINE_HAVE_CUDNN ON)
  endif()
endif()
if(ENGINE_HAVE_CUDNN)
  message(STATUS "engine: cuDNN SDPA ON (${ENGINE_CUDNN_LIBRARY}, frontend ${ENGINE_CUDNN_FRONTEND_DIR})")
else()
  message(STATUS "engine: cuDNN SDPA OFF: ${ENGINE_CUDNN_MISSING}")
endif()

# NCCL for the device communicator (engine/dist/nccl_communicator.h): found beside the CUDA toolkit.
# With it, ENGINE_HAVE_NCCL; without, the communicator's stub says why (ENGINE_NCCL_MISSING).
set(ENGINE_NCCL AUTO CACHE STRING "NCCL for multi-GPU communication: AUTO (when found beside CUDA) or OFF")
set(ENGINE_HAVE_NCCL OFF)
set(ENGINE_NCCL_MISSING "")
if(NOT ENGINE_HAVE_CUDA)
  set(ENGINE_NCCL_MISSING "no CUDA in this build")
elseif(ENGINE_NCCL STREQUAL "OFF")
  set(ENGINE_NCCL_MISSING "configured with ENGINE_NCCL=OFF")
else()
  find_path(ENGINE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(ENGINE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NOT ENGINE_NCCL_INCLUDE_DIR OR NOT ENGINE_NCCL_LIBRARY)
    set(ENGINE_NCCL_MISSING "nccl.h or libnccl not found beside the CUDA toolkit")
  else()
    # ncclGetLastError and ncclCommGetAsyncError's use here need NCCL 2.13 or later.
    file(STRINGS ${ENGINE_NCCL_INCLUDE_DIR}/nccl.h nccl_major REGEX "^#define NCCL_MAJOR [0-9]+")
    file(STRINGS ${ENGINE_NCCL_INCLUDE_DIR}/nccl.h nccl_minor REGEX "^#define NCCL_MINOR [0-9]+")
    string(REGEX MATCH "[0-9]+$" nccl_major "${nccl_major}")
    string(REGEX MATCH "[0-9]+$" nccl_minor "${nccl_minor}")
    if(nccl_major LESS 2 OR (nccl_major EQUAL 2 AND nccl_minor LESS 13))
      set(ENGINE_NCCL_MISSING "NCCL ${nccl_major}.${nccl_minor} is older than 2.13")
    else()
      set(ENGINE_HAVE_NCCL ON)
    endif()
  endif()
endif()
if(ENGINE_HAVE_NCCL)
  message(STATUS "engine: NCCL ${nccl_major}.${nccl_minor} ON (${ENGINE_NCCL_LIBRARY})")
else()
  message(STATUS "engine: NCCL OFF: ${ENGINE_NCCL_MISSING}")
endif()
