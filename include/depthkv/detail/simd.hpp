#pragma once
/// @file detail/simd.hpp
/// @brief The instruction set the CPU passes use, chosen at run time: 0 scalar, 1 SSE2 (every
/// x86-64), 2 AVX2. AVX2 code is compiled with a target attribute (no `-mavx2` needed) and only
/// called when the CPU has it; `-DDEPTHKV_NO_AVX2_DISPATCH` leaves it out. Every level gives the
/// same results; tests lower `max_simd_level` to run each path.

#include <atomic>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(DEPTHKV_NO_AVX2_DISPATCH)
#define DEPTHKV_AVX2_DISPATCH 1  // AVX2 passes compiled with a target attribute, chosen at run time
#include <immintrin.h>
#endif

namespace depthkv {
namespace detail {

/// Highest level `simd_level()` may return (tests lower it to cover every path).
inline std::atomic<int> max_simd_level{2};

/// The instruction set the vector passes use now: the highest the CPU has, at most max_simd_level.
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
  const int cap = max_simd_level.load(std::memory_order_relaxed);
  return level < cap ? level : cap;
}

}  // namespace detail
}  // namespace depthkv
