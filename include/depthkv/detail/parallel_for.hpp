#pragma once
/// @file detail/parallel_for.hpp
/// @brief A minimal fork-join loop over task indices with std::thread (no pool kept alive: the
/// library never owns threads between calls; engines own their threads), and `run_eigen_serial`,
/// which keeps Eigen's products single-threaded without touching OpenMP's settings.

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "depthkv/cpu_options.hpp"
#include "depthkv/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace depthkv {
namespace detail {

/// Resolves a caller's `CpuOptions::n_threads`: 1 runs on the calling thread, 0 means all cores
/// (`all_cores()`), n > 1 uses up to n threads (never more than tasks).
/// @throws Error when n_threads < 0
inline int resolve_threads(int n_threads, int n_tasks) {
  DEPTHKV_CHECK(n_threads >= 0, "thread count must be >= 0 (0 = all cores), got " << n_threads);
  return std::max(1, std::min(thread_count(n_threads), n_tasks));
}

/// Calls `fn(worker, task)` for every task in [0, n_tasks), on `n_workers` threads (the calling
/// thread is worker 0). Every task runs even if another throws; afterwards the exception of the
/// lowest-numbered failing task is rethrown, so errors are deterministic.
template <class Fn>
void parallel_for(int n_tasks, int n_workers, Fn&& fn) {
  if (n_tasks <= 0) return;
  if (n_workers <= 1) {
    for (int t = 0; t < n_tasks; ++t) fn(0, t);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n_tasks));
  std::atomic<int> next{0};
  auto work = [&](int worker) {
    for (int t = next.fetch_add(1); t < n_tasks; t = next.fetch_add(1)) {
      try {
        fn(worker, t);
      } catch (...) {
        errors[static_cast<std::size_t>(t)] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n_workers - 1));
  try {
    for (int w = 1; w < n_workers; ++w) threads.emplace_back(work, w);
  } catch (...) {
    // could not start a thread: the started ones and this one finish the tasks
  }
  work(0);
  for (std::thread& th : threads) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Runs `fn` on the calling thread so that Eigen's products inside it take their single-threaded
/// path, without changing any OpenMP setting. Eigen splits a product over threads (as many as the
/// process's OpenMP default, `OMP_NUM_THREADS`) only when it is called outside a team of several
/// threads; so outside any active parallel region `fn` runs on thread 0 of a two-thread team (the
/// other thread only joins it). Inside an active region a new team has one thread, and `fn` runs
/// directly.
template <class Fn>
void run_eigen_serial(Fn&& fn) {
#ifdef _OPENMP
  if (omp_get_active_level() == 0) {
    std::exception_ptr err;
#pragma omp parallel num_threads(2)
    {
      if (omp_get_thread_num() == 0) {
        try {
          fn();
        } catch (...) {
          err = std::current_exception();
        }
      }
    }
    if (err) std::rethrow_exception(err);
    return;
  }
#endif
  fn();
}

}  // namespace detail
}  // namespace depthkv
