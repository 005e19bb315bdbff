// ThreadPool: every task of every loop runs exactly once (many loops in a row, any thread and task
// count, loops after the workers fell asleep), workers take part, the lowest failing task's
// exception is rethrown after all ran, nested and concurrent calls run on their own thread, a
// stalled worker makes the next loop run on the caller alone, Eigen's products inside a task stay
// on it, and a fork's child can use and destroy its copy.

#include "depthkv/thread_pool.hpp"

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <set>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <Eigen/Core>

#if defined(__unix__)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace {

// Runs `loops` loops of n tasks on `pool` with `threads` threads; every task counts its runs.
void check_exactly_once(depthkv::ThreadPool& pool, int n, int threads, int loops) {
  std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
  for (int k = 0; k < loops; ++k) {
    for (auto& r : runs) r.store(0);
    pool.run(n, threads, [&](int t) { runs[static_cast<std::size_t>(t)].fetch_add(1); });
    int wrong = 0;
    for (auto& r : runs) wrong += r.load() != 1;
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("ThreadPool runs every task of every loop exactly once", "[thread_pool]") {
  depthkv::ThreadPool pool;
  for (int threads : {1, 2, 3, 8})
    for (int n : {1, 2, 3, 7, 64, 1000}) check_exactly_once(pool, n, threads, 200);
  check_exactly_once(pool, 0, 2, 1);
  CHECK(pool.n_workers() == 7);  // started by the first loop that needed them
}

TEST_CASE("ThreadPool wakes sleeping workers, and they take part", "[thread_pool]") {
  depthkv::ThreadPool pool;
  std::set<std::thread::id> seen;
  std::mutex m;
  for (int k = 0; k < 20 && seen.size() < 2; ++k) {
    std::this_thread::sleep_for(std::chrono::microseconds(3 * depthkv::ThreadPool::kSpinMicros));  // asleep
    check_exactly_once(pool, 5, 2, 1);
    pool.run(8, 2, [&](int) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard<std::mutex> lk(m);
      seen.insert(std::this_thread::get_id());
    });
  }
  CHECK(seen.size() == 2);  // the caller and the worker
}

TEST_CASE("ThreadPool runs all tasks and rethrows the lowest failing one's exception", "[thread_pool]") {
  depthkv::ThreadPool pool;
  for (int threads : {1, 2, 4}) {
    std::vector<std::atomic<int>> runs(50);
    try {
      pool.run(50, threads, [&](int t) {
        runs[static_cast<std::size_t>(t)].fetch_add(1);
        if (t == 37 || t == 11) throw std::runtime_error("task " + std::to_string(t));
      });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "task 11");
    }
    for (auto& r : runs) CHECK(r.load() == 1);
    check_exactly_once(pool, 50, threads, 5);  // usable afterwards
  }
  CHECK_THROWS_AS(pool.run(4, -1, [](int) {}), depthkv::Error);
  CHECK_THROWS_AS(pool.run(4, depthkv::kMaxCpuThreads + 1, [](int) {}), depthkv::Error);
}

TEST_CASE("ThreadPool: a nested loop and a concurrent caller's loop run on their own thread", "[thread_pool]") {
  depthkv::ThreadPool pool;
  std::vector<std::atomic<int>> runs(16 * 16);
  std::atomic<int> moved{0};  // inner tasks on another thread than their outer task (Catch's checks
                              // are for the test's own thread)
  pool.run(16, 2, [&](int i) {
    const std::thread::id self = std::this_thread::get_id();
    pool.run(16, 2, [&](int j) {
      moved.fetch_add(std::this_thread::get_id() != self);
      runs[static_cast<std::size_t>(i * 16 + j)].fetch_add(1);
    });
  });
  CHECK(moved.load() == 0);
  for (auto& r : runs) CHECK(r.load() == 1);

  std::vector<long long> sums(2, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c)
    callers.emplace_back([&, c] {
      for (int k = 0; k < 300; ++k) {
        std::vector<int> out(97, 0);
        pool.run(97, 2, [&](int t) { out[static_cast<std::size_t>(t)] = t; });
        for (int v : out) sums[static_cast<std::size_t>(c)] += v;
      }
    });
  for (std::thread& t : callers) t.join();
  CHECK(sums[0] == 300LL * 97 * 96 / 2);
  CHECK(sums[1] == 300LL * 97 * 96 / 2);
}

TEST_CASE("ThreadPool steps down to the caller alone after a worker stalls in a claimed task", "[thread_pool]") {
  // A worker claims a task and then stalls 40 ms in it, while the caller's share lasts only until
  // that claim: the caller waits far longer than its share, so the next loop runs on the caller
  // alone. The caller itself can be descheduled on a loaded machine (its share then looks long),
  // so the pair is tried up to 5 times; without the step-down every try shows the worker's tasks.
  depthkv::ThreadPool pool;
  const std::thread::id caller = std::this_thread::get_id();
  int stalls = 0;
  bool stepped_down = false;
  for (int k = 0; k < 20 && !stepped_down && stalls < 5; ++k) {
    std::atomic<bool> worker_ran{false};
    pool.run(2, 2, [&](int) {
      if (std::this_thread::get_id() == caller) {  // the caller's share: until the worker has claimed
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
        while (!worker_ran.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        return;
      }
      worker_ran.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));  // a worker descheduled in its task
    });
    if (!worker_ran.load()) continue;  // the caller ran both tasks: no stall this time
    ++stalls;
    std::atomic<int> elsewhere{0};  // the next loop: the caller alone
    pool.run(16, 2, [&](int) {
      elsewhere.fetch_add(std::this_thread::get_id() != caller);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
    stepped_down = elsewhere.load() == 0;
  }
  REQUIRE(stalls > 0);
  CHECK(stepped_down);
  check_exactly_once(pool, 100, 2, 50);  // still every task once, whichever thread runs them
}

TEST_CASE("ThreadPool: Eigen's products inside a task run on its thread", "[thread_pool]") {
#ifdef _OPENMP
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  depthkv::ThreadPool pool;
  std::vector<int> eigen_threads(6, -1);
  pool.run(6, 2, [&](int t) { eigen_threads[static_cast<std::size_t>(t)] = Eigen::nbThreads(); });
  for (int e : eigen_threads) CHECK(e == 1);
  std::vector<int> nested(36, -1);  // a nested loop runs on its caller's thread: serial there too
  pool.run(6, 2, [&](int i) {
    pool.run(6, 2, [&](int j) { nested[static_cast<std::size_t>(i * 6 + j)] = Eigen::nbThreads(); });
  });
  for (int e : nested) CHECK(e == 1);
  std::vector<int> alone(4, -1);  // one thread: the caller alone, serial too
  pool.run(4, 1, [&](int t) { alone[static_cast<std::size_t>(t)] = Eigen::nbThreads(); });
  for (int e : alone) CHECK(e == 1);
  CHECK(omp_get_max_threads() == 3);  // the caller's setting restored
  omp_set_num_threads(before);
#else
  SUCCEED("no OpenMP: Eigen is single-threaded");
#endif
}

#if defined(__unix__)
TEST_CASE("ThreadPool in the child of a fork: the caller runs every task, the destructor returns", "[thread_pool]") {
  auto* pool = new depthkv::ThreadPool;
  check_exactly_once(*pool, 64, 2, 3);  // workers started
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // no Catch here: the result is the exit code
    std::vector<int> runs(64, 0);
    pool->run(64, 2, [&](int t) { ++runs[static_cast<std::size_t>(t)]; });
    bool ok = true;
    for (int r : runs) ok = ok && r == 1;
    delete pool;
    _exit(ok ? 0 : 1);
  }
  int status = -1;
  pid_t done = 0;
  for (int i = 0; i < 1000 && done == 0; ++i) {  // 10 s
    done = waitpid(child, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  CHECK(done == child);  // did not hang
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  check_exactly_once(*pool, 64, 2, 3);  // the parent's pool is unchanged
  delete pool;
}
#endif

}  // namespace
