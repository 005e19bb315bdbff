#pragma once
/// @file detail/simd.hpp
/// @brief The instruction set the CPU passes use, chosen at run time: 0 scalar, 1 SSE2 (every
/// x86-64), 2 AVX2. AVX2 code is compiled with a target attribute (no `-mavx2` needed) and only
/// called when the CPU has it; `-DDEPTHKV_NO_AVX2_DISPATCH` leaves it out. Every level gives the
/// same results; `depthkv::set_max_simd_level` (simd_level.hpp) caps the level.

#include "depthkv/simd_level.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(DEPTHKV_NO_AVX2_DISPATCH)
#define DEPTHKV_AVX2_DISPATCH 1  // AVX2 passes compiled with a target attribute, chosen at run time
#include <immintrin.h>
#endif

namespace depthkv {
namespace detail {

/// The instruction set the vector passes use now: the highest the CPU has, at most
/// `depthkv::max_simd_level()`.
inline int simd_level() {
  int level = 0;
#if defined(__SSE2__)
  level = 1;
#endif
#if defined(DEPTHKV_AVX2_DISPATCH)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  }();
  if (avx2) level = 2;
#endif
  const int cap = depthkv::max_simd_level();
  return level < cap ? level : cap;
}

}  // namespace detail
}  // namespace depthkv
