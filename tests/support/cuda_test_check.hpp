#pragma once
// What every CUDA test program checks with: `CUDA_OK(call)` ends the program (exit 1) on a CUDA
// error, naming the call and the line; `fail(what)` counts a mismatch in `g_failures` (the
// first 30 are printed), which the program turns into its exit code.

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#define CUDA_OK(...)                                                                                          \
  do {                                                                                                        \
    const cudaError_t e_ = (__VA_ARGS__);                                                                     \
    if (e_ != cudaSuccess) {                                                                                  \
      std::fprintf(stderr, "FAIL: CUDA error '%s' at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, \
                   #__VA_ARGS__);                                                                             \
      std::exit(1);                                                                                           \
    }                                                                                                         \
  } while (0)

namespace depthkv_test {

/// Mismatches found so far.
inline int g_failures = 0;

/// Counts a mismatch; prints the first 30.
inline void fail(const std::string& what) {
  if (g_failures < 30) std::fprintf(stderr, "MISMATCH: %s\n", what.c_str());
  ++g_failures;
}

}  // namespace depthkv_test
