#pragma once
/// @file thread_pool.hpp
/// @brief `ThreadPool`: worker threads kept between calls for many small parallel loops (a
/// decode step of a small model runs about 7 products per layer, tens of microseconds each),
/// without a fork-join of a thread team per loop and without a barrier that waits for a thread
/// the OS has descheduled.
///
/// ## How a loop runs
/// `run(n_tasks, n_threads, fn)` splits the tasks into P = min(n_threads, workers + 1, n_tasks)
/// contiguous ranges, one per participant (the calling thread is participant 0). Each participant
/// claims the tasks of its own range in order (one atomic compare-and-swap per task), then claims
/// what is left of the others' ranges. The caller never waits for a worker to start: if a worker
/// is late (asleep, or descheduled because another process holds its core), the caller and the
/// workers that did come claim its tasks, and the loop ends when every task has run. The caller
/// waits only for tasks already claimed by a thread that is still running them.
///
/// ## Stepping down
/// A worker that the OS deschedules in the middle of a task it has claimed makes the caller wait
/// for it (on a machine shared with a busy process: a whole time slice of the other process). When
/// the caller, after its own share, waits longer than that share took (and at least
/// `kStallMicros`), the next loops run on the caller alone: 1 after the first such stall, then 2,
/// 4, ... up to `kMaxBackoff` at each further stall, until `kResetLoops` parallel loops in a row
/// have run without one. On a machine where every core is ours, stalls are rare and the loops stay
/// parallel; beside a busy process the pool runs mostly on the caller, at one thread's speed,
/// instead of waiting a time slice at a time. The tasks and their results are the same either way.
///
/// ## Waiting
/// After a loop a worker spins for up to `kSpinMicros` microseconds on the loop counter (a pause
/// instruction per check), then sleeps on a condition variable until the next loop, so a pool
/// between calls holds no core. The caller, waiting for claimed tasks, spins briefly and then
/// yields its core (`std::this_thread::yield`), so that a descheduled worker on the same core can
/// finish.
///
/// ## Contract
/// One loop at a time: a `run` while another is in progress (another thread's, or a nested call
/// from inside a task) runs its tasks on the calling thread. Every task runs exactly once, even
/// if another throws; afterwards the exception of the lowest-numbered failing task is rethrown.
/// Workers start on the first `run` that needs them (up to `n_threads - 1`, never more than
/// `kMaxCpuThreads`) and stop in the destructor. Inside a worker OpenMP's thread count is 1, so
/// Eigen's products in a task run on that thread. In the child of a `fork` the pool has no
/// workers: every loop runs on the caller, and the destructor does not wait for the parent's threads.
///
/// @code
/// depthkv::ThreadPool pool;
/// std::vector<float> y(n);
/// pool.run(n, /*n_threads=*/2, [&](int i) { y[i] = f(i); });
/// @endcode

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "depthkv/cpu_options.hpp"
#include "depthkv/error.hpp"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace depthkv {

class ThreadPool {
 public:
  /// How long an idle worker spins before it sleeps (microseconds).
  static constexpr int kSpinMicros = 200;
  /// The shortest wait for a claimed task that counts as a stall (microseconds), and the most
  /// loops a stall makes run on the caller alone.
  static constexpr int kStallMicros = 100;
  static constexpr int kMaxBackoff = 1024;
  /// Parallel loops without a stall after which the next stall starts from 1 loop again.
  static constexpr int kResetLoops = 4096;

  ThreadPool() = default;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() {
    if (owner_ != this_process()) {  // a fork's child: the pool without its threads, its mutex and
      for (std::thread& t : threads_) t.detach();  // condition variable maybe held or waited on by
      (void)sleep_.release();  // them at the fork: left as they are (destroying them would block)
      return;
    }
    {
      std::lock_guard<std::mutex> lk(sleep_->mutex);
      stop_.store(true);
    }
    sleep_->wake.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  /// Worker threads started so far (the caller makes one more participant).
  int n_workers() const { return static_cast<int>(threads_.size()); }

  /// Calls `fn(task)` for every task in [0, n_tasks) on the calling thread and up to
  /// `n_threads - 1` workers (see the file comment). n_threads: as `CpuOptions::n_threads`.
  /// @throws Error on n_threads outside [0, kMaxCpuThreads]; the lowest failing task's exception
  template <class Fn>
  void run(int n_tasks, int n_threads, Fn&& fn) {
    DEPTHKV_CHECK(n_threads >= 0 && n_threads <= kMaxCpuThreads,
                  "thread count must be in [0, " << kMaxCpuThreads << "] (0 = all cores), got " << n_threads);
    if (n_tasks <= 0) return;
    std::mutex error_mutex;
    std::exception_ptr error;
    int error_task = n_tasks;
    const auto guarded = [&](int t) {
      try {
        fn(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(error_mutex);
        if (t < error_task) {
          error_task = t;
          error = std::current_exception();
        }
      }
    };
    const int want = std::min(thread_count(n_threads), n_tasks);
#ifdef _OPENMP
    const int omp_threads = omp_get_max_threads();
    omp_set_num_threads(1);  // on every path: Eigen's products in a task stay on the thread running it
#endif
    if (want <= 1 || owner_ != this_process() || busy_.exchange(true, std::memory_order_acquire)) {
      for (int t = 0; t < n_tasks; ++t) guarded(t);
    } else if (serial_left_ > 0) {  // stepped down after a stall (see the file comment)
      --serial_left_;
      busy_.store(false, std::memory_order_release);
      for (int t = 0; t < n_tasks; ++t) guarded(t);
    } else {
      start_workers(want - 1);
      run_loop(n_tasks, std::min(want, n_workers() + 1), &call<decltype(guarded)>, &guarded);
      busy_.store(false, std::memory_order_release);
    }
#ifdef _OPENMP
    omp_set_num_threads(omp_threads);
#endif
    if (error) std::rethrow_exception(error);
  }

 private:
  // A word of a range: the loop number (high 32 bits) and a task index (low 32).
  static std::uint64_t pack(std::uint32_t loop, int task) {
    return (static_cast<std::uint64_t>(loop) << 32) | static_cast<std::uint32_t>(task);
  }
  static std::uint32_t loop_of(std::uint64_t w) { return static_cast<std::uint32_t>(w >> 32); }
  static int task_of(std::uint64_t w) { return static_cast<int>(w & 0xffffffffu); }
  // One participant's tasks: `claim` holds the next unclaimed one, `bound` the end of the range,
  // each tagged with its loop, so that a thread still in an older loop can never claim a task of
  // a newer one (its claim's loop differs) nor past its loop's end (it read that loop's bound).
  struct alignas(64) Range {
    std::atomic<std::uint64_t> claim{0};
    std::atomic<std::uint64_t> bound{0};
  };
  template <class G>
  static void call(const void* g, int t) {
    (*static_cast<const G*>(g))(t);
  }
  static long this_process() {
#if defined(__unix__) || defined(__APPLE__)
    return static_cast<long>(getpid());
#else
    return 0;
#endif
  }
  static void pause() {
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
    _mm_pause();
#endif
  }

  void start_workers(int n) {
    if (n <= n_workers()) return;
    if (!ranges_) ranges_ = std::make_unique<Range[]>(static_cast<std::size_t>(kMaxCpuThreads));
    try {
      const std::uint32_t seen = loop_.load(std::memory_order_relaxed);  // the next loop is new to it
      while (n_workers() < n) {
        const int id = n_workers() + 1;
        threads_.emplace_back([this, id, seen] { work(id, seen); });
      }
    } catch (...) {
      // could not start a thread: the ones started take part
    }
  }

  // The caller's side of one loop: publish it, take part as participant 0, wait for the rest.
  void run_loop(int n_tasks, int participants, void (*task)(const void*, int), const void* ctx) {
    const std::uint32_t loop = loop_.load(std::memory_order_relaxed) + 1;
    for (int i = 0; i < participants; ++i) {
      Range& r = ranges_[static_cast<std::size_t>(i)];
      r.bound.store(pack(loop, static_cast<int>(static_cast<std::int64_t>(n_tasks) * (i + 1) / participants)),
                    std::memory_order_relaxed);
      r.claim.store(pack(loop, static_cast<int>(static_cast<std::int64_t>(n_tasks) * i / participants)),
                    std::memory_order_relaxed);
    }
    task_ = task;  // read only by a thread holding a claim of this loop (the loop is not over)
    ctx_ = ctx;
    participants_.store(participants, std::memory_order_relaxed);
    remaining_.store(n_tasks, std::memory_order_relaxed);
    loop_.store(loop, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lk(sleep_->mutex); }
      sleep_->wake.notify_all();
    }
    const auto start = std::chrono::steady_clock::now();
    take_part(loop, 0);
    if (remaining_.load(std::memory_order_acquire) == 0) {
      clean_loop();
      return;
    }
    const auto own = std::chrono::steady_clock::now();  // the caller's share done
    for (int spins = 0; remaining_.load(std::memory_order_acquire) > 0; ++spins) {
      if (spins < 4096) {
        pause();
      } else {
        std::this_thread::yield();
      }
    }
    const auto waited = std::chrono::steady_clock::now() - own;
    if (waited > std::max<std::chrono::steady_clock::duration>(own - start, std::chrono::microseconds(kStallMicros))) {
      backoff_ = std::min(kMaxBackoff, std::max(1, 2 * backoff_));  // a worker stalled in a claimed task
      serial_left_ = backoff_;
      clean_loops_ = 0;
    } else {
      clean_loop();
    }
  }
  void clean_loop() {
    if (++clean_loops_ >= kResetLoops) backoff_ = 0;
  }

  // Claims and runs tasks of loop `loop`: participant `id`'s own range, then the others'.
  void take_part(std::uint32_t loop, int id) {
    const int p = participants_.load(std::memory_order_relaxed);
    for (int k = 0; k < p; ++k) {
      Range& r = ranges_[static_cast<std::size_t>((id + k) % p)];
      const std::uint64_t b = r.bound.load(std::memory_order_acquire);
      if (loop_of(b) != loop) continue;  // not a range of this loop
      std::uint64_t c = r.claim.load(std::memory_order_acquire);
      while (loop_of(c) == loop && task_of(c) < task_of(b)) {
        const int t = task_of(c);
        if (!r.claim.compare_exchange_weak(c, pack(loop, t + 1), std::memory_order_acq_rel,
                                           std::memory_order_acquire))
          continue;
        task_(ctx_, t);
        remaining_.fetch_sub(1, std::memory_order_acq_rel);
        c = r.claim.load(std::memory_order_acquire);
      }
    }
  }

  void work(int id, std::uint32_t seen) {
#ifdef _OPENMP
    omp_set_num_threads(1);  // Eigen's products inside a task stay on this thread
#endif
    while (true) {
      std::uint32_t now = wait_for_loop(seen);
      if (now == seen) return;  // stopped
      seen = now;
      if (id < participants_snapshot(now)) take_part(now, id);
    }
  }

  // The participant count of loop `loop`, or 0 when a newer loop has replaced it.
  int participants_snapshot(std::uint32_t loop) const {
    const int p = participants_.load(std::memory_order_relaxed);
    return loop_.load(std::memory_order_acquire) == loop ? p : 0;
  }

  // Spins, then sleeps, until the loop counter moves past `seen` (returns it) or the pool stops
  // (returns `seen`).
  std::uint32_t wait_for_loop(std::uint32_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    for (int i = 0;; ++i) {
      const std::uint32_t now = loop_.load(std::memory_order_acquire);
      if (now != seen) return now;
      if (stop_.load(std::memory_order_relaxed)) return seen;
      pause();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
    }
    std::unique_lock<std::mutex> lk(sleep_->mutex);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    sleep_->wake.wait(lk, [&] { return stop_.load() || loop_.load(std::memory_order_seq_cst) != seen; });
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return stop_.load() ? seen : loop_.load(std::memory_order_acquire);
  }

  std::atomic<bool> busy_{false};  // a loop is in progress
  int backoff_ = 0;                 // loops run alone after the last stall (0: none since)
  int serial_left_ = 0;             // loops still to run alone
  int clean_loops_ = 0;             // parallel loops since the last stall
  std::vector<std::thread> threads_;
  std::unique_ptr<Range[]> ranges_;
  std::atomic<std::uint32_t> loop_{0};
  std::atomic<int> remaining_{0};
  void (*task_)(const void*, int) = nullptr;
  const void* ctx_ = nullptr;
  std::atomic<int> participants_{0};
  struct Sleep {  // where idle workers sleep
    std::mutex mutex;
    std::condition_variable wake;
  };
  std::unique_ptr<Sleep> sleep_ = std::make_unique<Sleep>();
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  long owner_ = this_process();  // the process whose threads threads_ are
};

}  // namespace depthkv
