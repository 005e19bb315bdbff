#pragma once
/// @file config.hpp
/// @brief Version and the host/device helper macro shared by the CPU and CUDA paths.

#define DEPTHKV_VERSION_MAJOR 0
#define DEPTHKV_VERSION_MINOR 1
#define DEPTHKV_VERSION_PATCH 0

/// Marks helpers compiled for both host and device; plain `inline` when not compiled by nvcc.
#if defined(__CUDACC__)
#define DEPTHKV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DEPTHKV_HOST_DEVICE inline
#endif
