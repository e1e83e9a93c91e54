// GT_HD marks per-element math that the CPU loops and the CUDA kernels share (DESIGN.md: kernel math is written once).
#pragma once

#if defined(__CUDACC__)
#define GT_HD __host__ __device__ __forceinline__
#else
#define GT_HD inline
#endif
