#pragma once
/// @file simd_level.hpp
/// @brief The process-wide cap on the instruction set of depthkv's CPU passes (NaN checks,
/// selection, compaction): 0 scalar, 1 SSE2 (every x86-64), 2 AVX2.
///
/// By default the passes use the highest level the CPU has (AVX2 is chosen at run time: no
/// `-mavx2` needed; `-DDEPTHKV_NO_AVX2_DISPATCH` leaves it out). Every level gives the same results;
/// lowering the cap only changes speed. It exists to test and benchmark each path, and to rule out
/// a vector path when diagnosing a machine. The cap applies to every thread and every call that
/// starts after it is set (an atomic; set it while no eviction is running for a clean comparison).
///
/// @code
/// const int saved = depthkv::set_max_simd_level(0);   // scalar passes only
/// // ... evict ...
/// depthkv::set_max_simd_level(saved);
/// @endcode

#include <atomic>

#include "depthkv/error.hpp"

namespace depthkv {

namespace detail {
/// Storage of the cap read by `max_simd_level()`.
inline std::atomic<int> simd_level_cap{2};
}  // namespace detail

/// The highest instruction-set level the CPU passes may use (0 scalar, 1 SSE2, 2 AVX2; default 2).
inline int max_simd_level() noexcept { return detail::simd_level_cap.load(std::memory_order_relaxed); }

/// Caps the instruction set of the CPU passes at `level` (the CPU's own highest level still applies).
/// @param level 0 scalar, 1 SSE2, 2 AVX2
/// @return the previous cap
/// @throws Error when level is outside [0, 2]
inline int set_max_simd_level(int level) {
  DEPTHKV_CHECK(level >= 0 && level <= 2, "SIMD level must be 0, 1 or 2, got " << level);
  return detail::simd_level_cap.exchange(level, std::memory_order_relaxed);
}

}  // namespace depthkv
