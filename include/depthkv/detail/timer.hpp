#pragma once
/// @file detail/timer.hpp
/// @brief Elapsed wall-clock time on `std::chrono::steady_clock`, for timing reports (the
/// engine's `ForwardStats`, the command-line program's timing lines).

#include <chrono>

namespace depthkv {
namespace detail {

/// @return seconds elapsed since `t0` (steady clock)
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace detail
}  // namespace depthkv
