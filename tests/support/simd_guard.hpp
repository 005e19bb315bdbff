#pragma once
// RAII guard for the process-wide SIMD cap of the CPU passes (depthkv::set_max_simd_level), so a
// test that lowers it restores the previous cap however it leaves the scope, and the list of the
// levels this CPU and build really run. (The streaming-store threshold needs no guard: it is the
// per-call EvictOptions::streaming_min_bytes / compact_runs argument.)

#include <vector>

#include "depthkv/detail/simd.hpp"
#include "depthkv/simd_level.hpp"

namespace depthkv_test {

/// Caps the instruction set of the CPU passes at `level` for the guard's scope.
class SimdLevelGuard {
 public:
  explicit SimdLevelGuard(int level) : saved_(depthkv::set_max_simd_level(level)) {}
  ~SimdLevelGuard() { depthkv::set_max_simd_level(saved_); }
  SimdLevelGuard(const SimdLevelGuard&) = delete;
  SimdLevelGuard& operator=(const SimdLevelGuard&) = delete;

 private:
  int saved_;
};

/// The levels this CPU and build really run: 0 (scalar) up to the uncapped detail::simd_level().
inline std::vector<int> available_simd_levels() {
  SimdLevelGuard all(2);
  std::vector<int> levels;
  for (int l = 0; l <= depthkv::detail::simd_level(); ++l) levels.push_back(l);
  return levels;
}

}  // namespace depthkv_test
