#pragma once
/// @file detail/simd.hpp
/// @brief The instruction set a CPU pass uses, chosen at run time: 0 scalar, 1 SSE2 (every
/// x86-64), 2 AVX2 (with F16C and FMA), 3 AVX-512 VNNI (the K-quant matmul; the other passes run AVX2 there). AVX2
/// and AVX-512 code is compiled with target attributes (no `-mavx2` needed) and only called when
/// the CPU has it; `-DDEPTHKV_NO_AVX2_DISPATCH` leaves it out. Every level gives the same results
/// (the quantized products: up to float summation order); the caller's
/// `CpuOptions::max_simd_level` caps the level.

#include "depthkv/simd_level.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(DEPTHKV_AVX2_DISPATCH)
#include <immintrin.h>
#endif

namespace depthkv {
namespace detail {

/// @param cap the call's `CpuOptions::max_simd_level` (0 scalar, 1 SSE2, 2 AVX2, 3 AVX-512 VNNI)
/// @return the instruction set the vector passes use: the highest the CPU has, at most `cap`
inline int simd_level(int cap) {
  const int level = cpu_simd_level();
  return level < cap ? level : cap;
}

}  // namespace detail
}  // namespace depthkv
