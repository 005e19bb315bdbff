#pragma once
// The instruction-set levels this CPU and build really run, for tests that run a pass at every
// level through its options (CpuOptions::max_simd_level, SelectWorkspace::simd_level, ...). There
// is no process-wide cap to guard; the streaming-store threshold is a per-call argument too.

#include <vector>

#include "depthkv/simd_level.hpp"

namespace depthkv_test {

/// The levels this CPU and build really run: 0 (scalar) up to depthkv::cpu_simd_level().
inline std::vector<int> available_simd_levels() {
  std::vector<int> levels;
  for (int l = 0; l <= depthkv::cpu_simd_level(); ++l) levels.push_back(l);
  return levels;
}

}  // namespace depthkv_test
