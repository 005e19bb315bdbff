#pragma once
/// @file simd_level.hpp
/// @brief The instruction-set levels of depthkv's CPU passes (NaN checks, selection, compaction,
/// quantized products): 0 scalar, 1 SSE2 (every x86-64), 2 AVX2, 3 AVX-512 VNNI (AVX-512 F, BW, VL
/// and VNNI; only the K-quant matmul has a level-3 kernel, every other pass runs its AVX2 code
/// there), and the highest level this CPU and build run.
///
/// The passes use the highest level the CPU has, at most the call's `CpuOptions::max_simd_level`
/// (cpu_options.hpp). AVX2 and AVX-512 are chosen at run time: no `-mavx2` needed; `-DDEPTHKV_NO_AVX2_DISPATCH`
/// leaves it out. Every level gives the same results; a lower cap only changes speed. There is no
/// process-wide setting.
///
/// @code
/// for (int level = 0; level <= depthkv::cpu_simd_level(); ++level) {
///   depthkv::EvictOptions opt;
///   opt.max_simd_level = level;   // same kept slots at every level
/// }
/// @endcode

#include "depthkv/cpu_options.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(DEPTHKV_NO_AVX2_DISPATCH)
#define DEPTHKV_AVX2_DISPATCH 1  // AVX2 passes compiled with a target attribute, chosen at run time
#endif

namespace depthkv {

/// @return the highest instruction-set level this CPU and build run: 3 with AVX-512 F, BW, VL and
///   VNNI (and AVX2), 2 with AVX2 (and POPCNT, F16C and FMA), 1 with SSE2, else 0
inline int cpu_simd_level() {
  int level = 0;
#if defined(__SSE2__)
  level = 1;
#endif
#if defined(DEPTHKV_AVX2_DISPATCH)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("fma");
  }();
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  if (avx2) level = vnni ? 3 : 2;
#endif
  return level;
}

}  // namespace depthkv
