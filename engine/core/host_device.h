// ENGINE_HOST_DEVICE marks a function written once for the CPU and CUDA kernels: compiled by nvcc
// it is __host__ __device__, by a C++ compiler it is a plain inline function. Element-wise and
// per-row math lives in such functions so both devices run the same operations in the same order
// (CUDA sources are built with -fmad=false: no contraction the source did not write).
//
//   ENGINE_HOST_DEVICE inline float relu(float x) { return x > 0.0f ? x : 0.0f; }
#pragma once

#if defined(__CUDACC__)
#define ENGINE_HOST_DEVICE __host__ __device__
#else
#define ENGINE_HOST_DEVICE
#endif
