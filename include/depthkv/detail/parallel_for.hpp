#pragma once
/// @file detail/parallel_for.hpp
/// @brief A minimal fork-join loop over task indices with std::thread (no pool kept alive: the
/// library never owns threads between calls; engines own their threads).

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "depthkv/error.hpp"

namespace depthkv {
namespace detail {

/// Resolves a caller's thread count: 1 (the default everywhere) runs on the calling thread, 0
/// means std::thread::hardware_concurrency(), n > 1 uses up to n threads (never more than tasks).
/// @throws Error when n_threads < 0
inline int resolve_threads(int n_threads, int n_tasks) {
  DEPTHKV_CHECK(n_threads >= 0, "thread count must be >= 0 (0 = hardware concurrency), got " << n_threads);
  int t = n_threads == 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : n_threads;
  return std::max(1, std::min(t, n_tasks));
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

}  // namespace detail
}  // namespace depthkv
