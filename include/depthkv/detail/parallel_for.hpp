#pragma once
/// @file detail/parallel_for.hpp
/// @brief A minimal fork-join loop over task indices with std::thread (no pool kept alive: the
/// library never owns threads between calls; engines own their threads), and `run_eigen_serial`,
/// which keeps Eigen's products single-threaded on the calling thread (no team).

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include <Eigen/Core>

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

/// Calls `fn(task)` for every task in [0, n_tasks) on an OpenMP team of `n_threads` threads (0:
/// OpenMP's default, 1: serial on the calling thread), one task at a time per thread (dynamic
/// schedule), so that Eigen and the engine inside a task see an active team. Every task runs
/// even if another throws; afterwards one of the exceptions is rethrown.
template <class Fn>
void omp_tasks(int n_tasks, int n_threads, Fn&& fn) {
  std::exception_ptr err;
#ifdef _OPENMP
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && n_tasks > 1)
#else
  (void)n_threads;
#endif
  for (int t = 0; t < n_tasks; ++t) {
    try {
      fn(t);
    } catch (...) {
#ifdef _OPENMP
#pragma omp critical(depthkv_omp_tasks_error)
#endif
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

#ifdef _OPENMP
/// Sets the first element of the calling task's OpenMP thread-count ICV (nthreads-var, what
/// `omp_get_max_threads()` returns and Eigen reads for its products) to `n` for the lifetime of
/// the scope, and restores it at the end (also when an exception leaves the scope). The ICV
/// belongs to the current task: other threads and tasks never see the change.
class TaskThreadsScope {
 public:
  explicit TaskThreadsScope(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~TaskThreadsScope() { omp_set_num_threads(saved_); }
  TaskThreadsScope(const TaskThreadsScope&) = delete;
  TaskThreadsScope& operator=(const TaskThreadsScope&) = delete;

 private:
  int saved_;
};
#endif

/// Runs `fn` on the calling thread so that Eigen's products inside it take their single-threaded
/// path, without a thread team and without changing OpenMP's settings as seen after the call.
/// Eigen splits a product over `Eigen::nbThreads()` threads (OpenMP's `omp_get_max_threads()`
/// unless `Eigen::setNbThreads` was called) when it is called outside a team of several threads;
/// so outside any active parallel region the calling task's thread count is 1 while `fn` runs
/// (`TaskThreadsScope`). Only when the program set `Eigen::setNbThreads(n > 1)`, which overrides
/// OpenMP, does `fn` run on thread 0 of a two-thread team (the other thread only joins it).
/// Inside an active region a new team has one thread, and `fn` runs directly.
template <class Fn>
void run_eigen_serial(Fn&& fn) {
#ifdef _OPENMP
  if (omp_get_active_level() == 0) {
    const TaskThreadsScope one(1);
    if (Eigen::nbThreads() <= 1) {
      fn();
      return;
    }
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
