#pragma once
// The instruction-set levels this CPU and build really run, for tests that run a pass at every
// level through its options (CpuOptions::max_simd_level, SelectWorkspace::simd_level, ...). There
// is no process-wide cap to guard; the streaming-store threshold is a per-call argument too. A test
// of one level's kernels skips on a CPU or build without that level (require_simd_level).

#include <string>
#include <vector>

#include "depthkv/simd_level.hpp"
#include "support/skip.hpp"

namespace depthkv_test {

/// The levels this CPU and build really run: 0 (scalar) up to depthkv::cpu_simd_level().
inline std::vector<int> available_simd_levels() {
  std::vector<int> levels;
  for (int l = 0; l <= depthkv::cpu_simd_level(); ++l) levels.push_back(l);
  return levels;
}

/// Skips the test (skip.hpp) unless this CPU and build run `level`; `what` names its instructions.
inline void require_simd_level(int level, const std::string& what) {
  const int have = depthkv::cpu_simd_level();
  if (have < level)
    skip("no " + what + " on this CPU / build (SIMD level " + std::to_string(have) + ", the test needs " +
         std::to_string(level) + ")");
}

}  // namespace depthkv_test
