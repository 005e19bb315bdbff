// CPU eviction speed (issue 6): selection throughput, select+compact time against a plain memcpy
// of the kept bytes measured in the same run, and the naive baseline (full std::sort of
// (score, index) then a copy of the kept tokens).
//
// Shapes: Llama-like layers of 8 KV heads x head_dim 128 x 4K or 32K tokens, fp32 / fp16 / bf16
// storage, keep 10 / 20 / 50 %. Memory: one 32K fp32 layer holds 268 MB of K+V and the benchmark
// keeps a pristine copy to restore after every eviction, so it runs kLayers32K = 2 layers at 32K
// and kLayers4K = 8 layers at 4K (16 and 64 rows per iteration) instead of 32; rows are independent,
// so per-row figures do not depend on the layer count.
//
// Every iteration draws fresh random scores (uniform in [0, 1): spread over few exponents, the
// hard case for the top histogram digit) and restores the cache, outside the timed region. The
// reported time is select+compact (library `evict`, manual timing; thread CPU time, see Clock);
// the counters are:
//   ratio_vs_memcpy      select+compact time / memcpy time of the kept K+V bytes into a separate
//                        cache-cold buffer (same iteration)
//   select_elems_per_s   scores selected per second (NaN check + selection per row as evict does
//                        it, one thread: per core)
//   speedup_vs_sort      naive (full sort + copy) time / select+compact time
//   select_speedup_vs_sort  full sort time / selection time (selection alone)
//   memcpy_GBps          bandwidth of the memcpy baseline (bytes read + written / time)
// BM_Evict/<type>/<n>/<keep%>/<mode>/<threads>: mode 0 = library evict (Layer::compact, one memmove
// per token), mode 1 = library selection + detail::compact_runs (one memmove per run of kept tokens).
//
// Run: build/<dir>/benchmarks/evict_cpu_bench --benchmark_format=json > evict.json
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <ctime>
#include <random>
#include <utility>
#include <vector>

#include "depthkv/detail/compact_runs.hpp"
#include "depthkv/detail/radix_select.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/kv_cache.hpp"

namespace {

// Timers: CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), not wall time: the machine the
// figures were taken on is shared, and wall time would count the time this thread waits for a
// core. Runs with threads > 1 use wall time (their work is on other threads too).
struct Clock {
  using time_point = double;
  static bool wall;
  static double now() {
    timespec t;
    clock_gettime(wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
};
bool Clock::wall = false;
double seconds_since(double t0) { return Clock::now() - t0; }

constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kLayers4K = 8;
constexpr int kLayers32K = 2;

template <class T>
depthkv::KVCache<depthkv::HostLayer<T>> make_cache(int n_layers, int n, std::mt19937& rng) {
  depthkv::KVCache<depthkv::HostLayer<T>> cache;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> k(kKvHeads * kHeadDim), v(k.size());
  for (int l = 0; l < n_layers; ++l) {
    auto& L = cache.add_layer(depthkv::HostLayer<T>(kKvHeads, kHeadDim, n));
    for (int t = 0; t < n; ++t) {
      for (auto& x : k) x = u(rng);
      for (auto& x : v) x = u(rng);
      L.append(k.data(), v.data(), t);
    }
  }
  return cache;
}

void fresh_scores(std::vector<depthkv::LayerScores>& s, int n_layers, int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  s.assign(static_cast<std::size_t>(n_layers),
           depthkv::LayerScores(kKvHeads, std::vector<float>(static_cast<std::size_t>(n))));
  for (auto& layer : s)
    for (auto& row : layer)
      for (auto& x : row) x = u(rng);
}

template <class T>
void BM_Evict(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int keep_pct = static_cast<int>(state.range(1));
  const int mode = static_cast<int>(state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const int n_layers = n >= 32768 ? kLayers32K : kLayers4K;
  const int k = static_cast<int>(static_cast<long long>(n) * keep_pct / 100);
  Clock::wall = threads != 1;
  std::mt19937 rng(12345);
  const auto pristine = make_cache<T>(n_layers, n, rng);
  auto cache = pristine;
  std::vector<depthkv::LayerScores> scores;
  const std::vector<int> keep(static_cast<std::size_t>(n_layers), k);
  const std::size_t tok_bytes = sizeof(T) * kHeadDim;
  const std::size_t kept_bytes =
      static_cast<std::size_t>(n_layers) * kKvHeads * static_cast<std::size_t>(k) * tok_bytes * 2;
  // memcpy / naive target: a separate region per row, as large as the kept bytes of all rows (cold
  // in the caches like the cache's own memory, which compaction writes in place)
  const std::size_t row_bytes = static_cast<std::size_t>(k) * tok_bytes * 2;
  std::vector<unsigned char> dst_all(kept_bytes + 64, 1);
  std::vector<std::pair<float, int>> pairs(static_cast<std::size_t>(n));
  std::vector<int> idx(static_cast<std::size_t>(k));
  double t_evict = 0, t_select = 0, t_memcpy = 0, t_naive = 0, t_sort = 0;
  for (auto _ : state) {
    state.PauseTiming();
    fresh_scores(scores, n_layers, n, rng);
    for (int l = 0; l < n_layers; ++l) cache.layer(l) = pristine.layer(l);
    state.ResumeTiming();

    double t0 = Clock::now();
    if (mode == 0) {
      auto ev = depthkv::evict(cache, scores, keep, {}, /*shrink=*/false, threads);
      benchmark::DoNotOptimize(ev.data());
    } else {
      depthkv::detail::SelectWorkspace ws;
      std::vector<std::int32_t> kept;
      for (int l = 0; l < n_layers; ++l)
        for (int h = 0; h < kKvHeads; ++h) {
          auto& L = cache.layer(l);
          depthkv::detail::select_row(depthkv::detail::FloatKeys{scores[l][h].data()}, L.positions(h), n, k,
                                      depthkv::Protection{}, ws, kept);
          depthkv::detail::compact_runs(L.key(h, 0), kHeadDim, kHeadDim, kept.data(), k);
          depthkv::detail::compact_runs(L.value(h, 0), kHeadDim, kHeadDim, kept.data(), k);
        }
    }
    const double te = seconds_since(t0);
    state.SetIterationTime(te);
    t_evict += te;

    state.PauseTiming();
    // selection alone, single thread, as evict does it per row (NaN check + select, reused workspace)
    {
      depthkv::detail::SelectWorkspace ws;
      std::vector<std::int32_t> kept;
      t0 = Clock::now();
      for (int l = 0; l < n_layers; ++l)
        for (int h = 0; h < kKvHeads; ++h) {
          if (depthkv::detail::first_nan(scores[l][h].data(), n) >= 0) state.SkipWithError("NaN");
          depthkv::detail::select_row(depthkv::detail::FloatKeys{scores[l][h].data()},
                                      pristine.layer(l).positions(h), n, k, depthkv::Protection{}, ws, kept);
          benchmark::DoNotOptimize(kept.data());
        }
      t_select += seconds_since(t0);
    }
    // memcpy of the kept bytes (K and V of every row) from the pristine cache
    t0 = Clock::now();
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const auto& L = pristine.layer(l);
        unsigned char* dst = dst_all.data() + static_cast<std::size_t>(l * kKvHeads + h) * row_bytes;
        std::memcpy(dst, L.key(h, n - k), static_cast<std::size_t>(k) * tok_bytes);
        std::memcpy(dst + static_cast<std::size_t>(k) * tok_bytes, L.value(h, n - k),
                    static_cast<std::size_t>(k) * tok_bytes);
        benchmark::ClobberMemory();
      }
    t_memcpy += seconds_since(t0);
    // naive: full sort of (score, index), then copy the kept tokens in position order
    t0 = Clock::now();
    double ts = 0;
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const double ts0 = Clock::now();
        const auto& s = scores[l][h];
        for (int i = 0; i < n; ++i) pairs[static_cast<std::size_t>(i)] = {s[static_cast<std::size_t>(i)], i};
        std::sort(pairs.begin(), pairs.end(),
                  [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
                    return a.first != b.first ? a.first > b.first : a.second < b.second;
                  });
        for (int i = 0; i < k; ++i)
          idx[static_cast<std::size_t>(i)] = pairs[static_cast<std::size_t>(i)].second;
        std::sort(idx.begin(), idx.end());
        ts += seconds_since(ts0);
        const auto& L = pristine.layer(l);
        unsigned char* dst = dst_all.data() + static_cast<std::size_t>(l * kKvHeads + h) * row_bytes;
        for (int i = 0; i < k; ++i) {
          std::memcpy(dst + static_cast<std::size_t>(i) * tok_bytes,
                      L.key(h, idx[static_cast<std::size_t>(i)]), tok_bytes);
          std::memcpy(dst + static_cast<std::size_t>(k + i) * tok_bytes,
                      L.value(h, idx[static_cast<std::size_t>(i)]), tok_bytes);
        }
        benchmark::ClobberMemory();
      }
    t_naive += seconds_since(t0);
    t_sort += ts;
    state.ResumeTiming();
  }
  const double it = static_cast<double>(state.iterations());
  const double elems = static_cast<double>(n_layers) * kKvHeads * n;
  state.counters["ratio_vs_memcpy"] = t_evict / t_memcpy;
  state.counters["select_elems_per_s"] = elems * it / t_select;
  state.counters["speedup_vs_sort"] = t_naive / t_evict;
  state.counters["select_speedup_vs_sort"] = t_sort / t_select;
  state.counters["memcpy_GBps"] = 2.0 * static_cast<double>(kept_bytes) * it / t_memcpy / 1e9;
  state.counters["kept_MB"] = static_cast<double>(kept_bytes) / 1e6;
  state.counters["rows"] = n_layers * kKvHeads;
  state.SetBytesProcessed(static_cast<std::int64_t>(kept_bytes) * state.iterations());
}

void evict_args(benchmark::internal::Benchmark* b) {
  for (int n : {4096, 32768})
    for (int keep : {10, 20, 50})
      for (int mode : {0, 1}) b->Args({n, keep, mode, 1});
  for (int n : {4096, 32768}) b->Args({n, 20, 0, 2});  // two threads over the rows
  b->ArgNames({"n", "keep%", "mode", "threads"})
      ->UseManualTime()
      ->Iterations(6)
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK_TEMPLATE(BM_Evict, float)->Apply(evict_args);
BENCHMARK_TEMPLATE(BM_Evict, Eigen::half)->Apply(evict_args);
BENCHMARK_TEMPLATE(BM_Evict, Eigen::bfloat16)->Apply(evict_args);

// Selection of one row, pure: a pool of distinct random rows, a different one each iteration.
// path 0 = histogram select, 1 = std::nth_element (+ sort of the kept), 2 = full sort baseline.
// Used to find the crossover length (kRadixSelectMinLength) and the per-core throughput.
template <class Key>
void BM_Select(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int path = static_cast<int>(state.range(1));
  const int m = std::max(1, n / 5);  // keep 20 %
  const int pool = std::max(8, std::min(512, (1 << 22) / n));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> f(static_cast<std::size_t>(pool) * static_cast<std::size_t>(n));
  for (auto& x : f) x = u(rng);
  std::vector<std::uint16_t> b(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    const Eigen::half h(f[i]);
    std::memcpy(&b[i], &h, 2);
  }
  depthkv::detail::SelectWorkspace ws;
  std::vector<std::int32_t> out;
  std::vector<std::pair<float, int>> pairs(static_cast<std::size_t>(n));
  int r = 0;
  for (auto _ : state) {
    const std::size_t off = static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
    r = (r + 1) % pool;
    out.clear();
    if (path == 2) {
      for (int i = 0; i < n; ++i)
        pairs[static_cast<std::size_t>(i)] = {f[off + static_cast<std::size_t>(i)], i};
      std::sort(pairs.begin(), pairs.end(),
                [](const std::pair<float, int>& a, const std::pair<float, int>& c) {
                  return a.first != c.first ? a.first > c.first : a.second < c.second;
                });
      for (int i = 0; i < m; ++i) out.push_back(pairs[static_cast<std::size_t>(i)].second);
      std::sort(out.begin(), out.end());
    } else if (std::is_same<Key, depthkv::detail::FloatKeys>::value) {
      const depthkv::detail::FloatKeys keys{f.data() + off};
      if (path == 0)
        depthkv::detail::select_best_radix(keys, nullptr, 0, n, m, ws, out);
      else
        depthkv::detail::select_best_nth(keys, nullptr, 0, n, m, ws, out);
    } else {
      const depthkv::detail::Bits16Keys keys{b.data() + off};
      if (path == 0)
        depthkv::detail::select_best_radix(keys, nullptr, 0, n, m, ws, out);
      else
        depthkv::detail::select_best_nth(keys, nullptr, 0, n, m, ws, out);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["select_elems_per_s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ns_per_elem"] =
      benchmark::Counter(static_cast<double>(n) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
void select_args(benchmark::internal::Benchmark* b) {
  for (int n : {64, 128, 256, 512, 768, 1024, 2048, 4096, 32768, 131072})
    for (int path : {0, 1, 2}) b->Args({n, path});
  b->ArgNames({"n", "path"});
}
BENCHMARK_TEMPLATE(BM_Select, depthkv::detail::FloatKeys)->Apply(select_args);
BENCHMARK_TEMPLATE(BM_Select, depthkv::detail::Bits16Keys)->Apply(select_args);

}  // namespace

BENCHMARK_MAIN();
