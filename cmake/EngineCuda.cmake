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
    # The engine's headers need C++20 (defaulted operator==, std::bit_cast), and CMake 3.25 knows no
    # CUDA20 dialect for nvcc: tell it the flag, so CUDA sources get the C++ standard of the rest.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
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
