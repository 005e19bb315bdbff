#pragma once
/// @file cpu_options.hpp
/// @brief `CpuOptions`: how many threads a CPU call may use and the highest instruction set its
/// vector passes may use. Every CPU entry point takes them as an argument (the eviction's
/// `EvictOptions`, the engine's `ForwardOptions` and the quantized products'
/// `QuantProductOptions` are CpuOptions); depthkv keeps no process-wide setting and never changes
/// OpenMP's.
///
/// `n_threads` means the same everywhere: 0 = all cores (`omp_get_num_procs()` with OpenMP, else
/// `std::thread::hardware_concurrency()`), 1 = the calling thread only, n > 1 = up to n threads.
/// `max_simd_level` caps the instruction set: 0 scalar, 1 SSE2, 2 AVX2, 3 AVX-512 VNNI (the CPU's
/// own highest level, `cpu_simd_level()` in simd_level.hpp, still applies). Neither changes a
/// result: every thread count gives the same bytes, and so does every level, except the
/// quantized products, whose levels agree up to float summation order (llama/quant/products.hpp);
/// they exist for speed, tests and benchmarks.
///
/// @code
/// depthkv::EvictOptions opt;          // an EvictOptions is a CpuOptions
/// opt.n_threads = 4;                  // same result, 4 threads
/// opt.max_simd_level = 0;             // same result, scalar passes only
/// auto ev = depthkv::evict(cache, scores, keep, {4, 32}, opt);
/// @endcode

#include <algorithm>
#include <thread>

#include "depthkv/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace depthkv {

class ThreadPool;  // thread_pool.hpp

/// The most threads `CpuOptions::n_threads` accepts: far more than any machine's cores, and far
/// below what makes libgomp overflow a stack or run out of memory (100,000 and 2^31-1 did).
inline constexpr int kMaxCpuThreads = 1024;

/// Threads and instruction-set cap of one CPU call (see the file comment).
struct CpuOptions {
  int n_threads = 0;       ///< 0 = all cores, 1 = the calling thread, n > 1 = up to n threads
  int max_simd_level = 3;  ///< 0 scalar, 1 SSE2, 2 AVX2, 3 AVX-512 VNNI (at most what the CPU has)
  /// Workers kept between calls for the call's parallel loops (thread_pool.hpp; where a part
  /// takes one, its documentation says so); nullptr: an OpenMP team per loop.
  ThreadPool* pool = nullptr;

  /// @throws Error when n_threads is outside [0, kMaxCpuThreads] or max_simd_level outside [0, 3]
  void validate() const {
    DEPTHKV_CHECK(n_threads >= 0 && n_threads <= kMaxCpuThreads,
                  "n_threads must be in [0, " << kMaxCpuThreads << "] (0: all cores), got " << n_threads);
    DEPTHKV_CHECK(max_simd_level >= 0 && max_simd_level <= 3,
                  "max_simd_level must be 0, 1, 2 or 3, got " << max_simd_level);
  }
};

/// @return the number of cores `n_threads = 0` stands for (at least 1)
inline int all_cores() {
#ifdef _OPENMP
  return std::max(1, omp_get_num_procs());
#else
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#endif
}

/// @param n_threads a `CpuOptions::n_threads` (>= 0)
/// @return the thread count it stands for: n_threads, or all_cores() for 0
inline int thread_count(int n_threads) { return n_threads == 0 ? all_cores() : n_threads; }

}  // namespace depthkv
