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
// the counters are medians over the kIterations iterations of per-iteration figures:
//   ratio_vs_memcpy      select+compact time / memcpy time of the kept K+V bytes into a separate
//                        cache-cold buffer (same iteration)
//   ratio_vs_stream_copy the same against a contiguous copy of those bytes with the streaming
//                        stores compaction uses on large heads (detail::stream_copy)
//   select_elems_per_s   scores selected per second (NaN check + selection per row as evict does
//                        it, one thread: per core), on freshly drawn scores still in the caches, as
//                        a scorer leaves them just before the eviction
//   select_cold_elems_per_s  the same on the scores the eviction used, after its traffic (hundreds
//                        of MB of K/V) has pushed them out to memory
//   speedup_vs_sort      naive (full sort + copy) time / select+compact time
//   select_speedup_vs_sort  full sort time / selection time (selection alone)
//   memcpy_GBps          bandwidth of the memcpy baseline (bytes read + written / time)
// BM_Evict/<type>/<n>/<keep%>/<threads>: the library's evict (NaN checks, selection, Layer::compact:
// one move per run of kept tokens, prefetched, streaming stores on heads of >= 256 KiB), shrink off.
//
// Run: build/<dir>/benchmarks/evict_cpu_bench --benchmark_format=json > evict.json
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <utility>
#include <vector>

#include "depthkv/detail/compact_runs.hpp"
#include "depthkv/detail/large_page_allocator.hpp"
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

// A/B of the compaction's streaming stores: DEPTHKV_STREAMING_MIN_BYTES sets
// EvictOptions::streaming_min_bytes of the timed evictions (default 256 KiB; e.g.
// 18446744073709551615 turns streaming off).
std::size_t streaming_min_bytes_from_env() {
  const char* v = std::getenv("DEPTHKV_STREAMING_MIN_BYTES");
  if (v == nullptr) return depthkv::detail::kDefaultStreamingMinBytes;
  return static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
}

constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kLayers4K = 8;
constexpr int kLayers32K = 2;
constexpr int kIterations = 11;  // per configuration; counters are medians over them

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

/// The full sort's order of (score, index): higher score first, then lower index.
struct HigherScoreFirst {
  bool operator()(const std::pair<float, int>& a, const std::pair<float, int>& b) const {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  }
};

/// One BM_Evict configuration: the pristine cache and the one evicted, the scores, and the
/// buffers of the baselines timed against the library's evict in the same iteration.
template <class T>
struct EvictCase {
  EvictCase(int n_tokens, int keep_pct, int threads)
      : n(n_tokens),
        n_layers(n >= 32768 ? kLayers32K : kLayers4K),
        k(static_cast<int>(static_cast<long long>(n) * keep_pct / 100)),
        pristine(make_cache<T>(n_layers, n, rng)),
        cache(pristine),
        keep(static_cast<std::size_t>(n_layers), k),
        kept_bytes(static_cast<std::size_t>(n_layers) * kKvHeads * static_cast<std::size_t>(k) * tok_bytes * 2),
        row_bytes(static_cast<std::size_t>(k) * tok_bytes * 2),
        dst_all(kept_bytes + 64, 1),
        dst0(dst_all.data() + (64 - reinterpret_cast<std::uintptr_t>(dst_all.data()) % 64) % 64),  // aligned
        pairs(static_cast<std::size_t>(n)),
        idx(static_cast<std::size_t>(k)),
        elems(static_cast<double>(n_layers) * kKvHeads * n) {
    opt.shrink = false;
    opt.n_threads = threads;
    opt.streaming_min_bytes = streaming_min_bytes_from_env();
  }

  /// Fresh scores, and the cache restored (outside the timed region).
  void reset() {
    fresh_scores(scores, n_layers, n, rng);
    for (int l = 0; l < n_layers; ++l) cache.layer(l) = pristine.layer(l);
  }

  /// The library's evict (select + compact), timed.
  double time_evict() {
    const double t0 = Clock::now();
    auto ev = depthkv::evict(cache, scores, keep, {}, opt);
    benchmark::DoNotOptimize(ev.data());
    return seconds_since(t0);
  }

  /// Selection alone, single thread, as evict does it per row (NaN check + select, reused workspace).
  double time_selection(benchmark::State& state) {
    const double ts0 = Clock::now();
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        if (depthkv::detail::first_nan(scores[l][h].data(), n, opt.max_simd_level) >= 0) state.SkipWithError("NaN");
        depthkv::detail::select_row(depthkv::detail::FloatKeys{scores[l][h].data()},
                                    pristine.layer(l).positions(h), n, k, depthkv::Protection{}, ws, kept);
        benchmark::DoNotOptimize(kept.data());
      }
    return seconds_since(ts0);
  }

  /// The memcpy / naive target of row (l, h): a separate region per row.
  unsigned char* row_dst(int l, int h) const {
    return dst0 + static_cast<std::size_t>(l * kKvHeads + h) * row_bytes;
  }

  /// Contiguous copy of the kept bytes (K and V of every row) from the pristine cache with `copy`, timed.
  template <class Copy>
  double time_contiguous_copy(Copy&& copy) {
    const double tc0 = Clock::now();
    const std::size_t half = static_cast<std::size_t>(k) * tok_bytes;
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const auto& L = pristine.layer(l);
        unsigned char* dst = row_dst(l, h);
        copy(dst, L.key(h, n - k), half);
        copy(dst + half, L.value(h, n - k), half);
        benchmark::ClobberMemory();
      }
    return seconds_since(tc0);
  }

  /// Naive eviction of row (l, h): full sort of (score, index), then a copy of the kept tokens in
  /// position order; the sort's seconds are added to `t_sort`.
  void naive_row(int l, int h, double& t_sort) {
    const double ts0 = Clock::now();
    const auto& s = scores[l][h];
    for (int i = 0; i < n; ++i) pairs[static_cast<std::size_t>(i)] = {s[static_cast<std::size_t>(i)], i};
    std::sort(pairs.begin(), pairs.end(), HigherScoreFirst{});
    for (int i = 0; i < k; ++i) idx[static_cast<std::size_t>(i)] = pairs[static_cast<std::size_t>(i)].second;
    std::sort(idx.begin(), idx.end());
    t_sort += seconds_since(ts0);
    const auto& L = pristine.layer(l);
    unsigned char* dst = row_dst(l, h);
    for (int i = 0; i < k; ++i) {
      const int t = idx[static_cast<std::size_t>(i)];
      std::memcpy(dst + static_cast<std::size_t>(i) * tok_bytes, L.key(h, t), tok_bytes);
      std::memcpy(dst + static_cast<std::size_t>(k + i) * tok_bytes, L.value(h, t), tok_bytes);
    }
    benchmark::ClobberMemory();
  }

  /// The naive eviction of every row, timed; the sorts' seconds in `t_sort`.
  double time_naive(double& t_sort) {
    const double t0 = Clock::now();
    t_sort = 0;
    for (int l = 0; l < n_layers; ++l)
      for (int h = 0; h < kKvHeads; ++h) naive_row(l, h, t_sort);
    return seconds_since(t0);
  }

  const int n, n_layers, k;
  std::mt19937 rng{12345};
  const depthkv::KVCache<depthkv::HostLayer<T>> pristine;
  depthkv::KVCache<depthkv::HostLayer<T>> cache;
  std::vector<depthkv::LayerScores> scores;
  const std::vector<int> keep;
  static constexpr std::size_t tok_bytes = sizeof(T) * kHeadDim;
  const std::size_t kept_bytes;
  // memcpy / naive target: a separate region per row, as large as the kept bytes of all rows (cold
  // in the caches like the cache's own memory, which compaction writes in place)
  const std::size_t row_bytes;
  std::vector<unsigned char> dst_all;
  unsigned char* const dst0;
  std::vector<std::pair<float, int>> pairs;
  std::vector<int> idx;
  // the selection-alone runs reuse one workspace across iterations: evict allocates its workspace
  // once per call for every row of every layer (256 rows for a 32-layer, 8-KV-head model), so its
  // allocation is negligible per row there; this benchmark holds only 16 or 64 rows per call
  depthkv::detail::SelectWorkspace ws;
  std::vector<std::int32_t> kept;
  const double elems;
  depthkv::EvictOptions opt;
};

/// BM_Evict's figures of each iteration; the counters are their medians (robust to the other
/// tenants of a shared machine, whose bursts hit single iterations).
struct EvictSamples {
  std::vector<double> r_memcpy, r_stream, r_sort, r_select, r_select_cold, r_select_sort, bw_memcpy;

  /// The baselines of one iteration against its evict time `t_evict` (outside the timed region).
  template <class T>
  void measure(EvictCase<T>& c, benchmark::State& state, double t_evict) {
    // selection alone: first on the scores just used (the eviction's traffic has pushed them out
    // of the caches), then on a fresh draw, still in the caches as a scorer leaves them
    const double t_select_cold = c.time_selection(state);
    fresh_scores(c.scores, c.n_layers, c.n, c.rng);
    const double t_select = c.time_selection(state);
    const double t_memcpy =
        c.time_contiguous_copy([](void* d, const void* s, std::size_t b) { std::memcpy(d, s, b); });
    // the same with the streaming stores compaction uses on large heads (detail::stream_copy;
    // glibc's memcpy uses plain stores at these sizes)
    const int level = depthkv::cpu_simd_level();
    const double t_stream = c.time_contiguous_copy([level](void* d, const void* s, std::size_t b) {
      depthkv::detail::stream_copy(d, s, b, level);
      depthkv::detail::stream_fence(level);
    });
    double t_sort = 0;
    const double t_naive = c.time_naive(t_sort);
    r_memcpy.push_back(t_evict / t_memcpy);
    r_stream.push_back(t_evict / t_stream);
    r_sort.push_back(t_naive / t_evict);
    r_select.push_back(c.elems / t_select);
    r_select_cold.push_back(c.elems / t_select_cold);
    r_select_sort.push_back(t_sort / t_select);
    bw_memcpy.push_back(2.0 * static_cast<double>(c.kept_bytes) / t_memcpy / 1e9);
  }

  void set_counters(benchmark::State& state, std::size_t kept_bytes, int rows) const {
    state.counters["ratio_vs_memcpy"] = median(r_memcpy);
    state.counters["ratio_vs_stream_copy"] = median(r_stream);
    state.counters["select_elems_per_s"] = median(r_select);
    state.counters["select_cold_elems_per_s"] = median(r_select_cold);
    state.counters["speedup_vs_sort"] = median(r_sort);
    state.counters["select_speedup_vs_sort"] = median(r_select_sort);
    state.counters["memcpy_GBps"] = median(bw_memcpy);
    state.counters["kept_MB"] = static_cast<double>(kept_bytes) / 1e6;
    state.counters["rows"] = rows;
    state.SetBytesProcessed(static_cast<std::int64_t>(kept_bytes) * state.iterations());
  }
};

template <class T>
void BM_Evict(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(2));
  Clock::wall = threads != 1;
  EvictCase<T> c(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), threads);
  EvictSamples samples;
  for (auto _ : state) {
    state.PauseTiming();
    c.reset();
    state.ResumeTiming();

    const double t_evict = c.time_evict();
    state.SetIterationTime(t_evict);

    state.PauseTiming();
    samples.measure(c, state, t_evict);
    state.ResumeTiming();
  }
  samples.set_counters(state, c.kept_bytes, c.n_layers * kKvHeads);
}

void evict_args(benchmark::internal::Benchmark* b) {
  for (int n : {4096, 32768})
    for (int keep : {10, 20, 50}) b->Args({n, keep, 1});
  for (int n : {4096, 32768}) b->Args({n, 20, 2});  // two threads over the rows
  b->ArgNames({"n", "keep%", "threads"})
      ->UseManualTime()
      ->Iterations(kIterations)
      ->Unit(benchmark::kMillisecond);
}
BENCHMARK_TEMPLATE(BM_Evict, float)->Apply(evict_args);
BENCHMARK_TEMPLATE(BM_Evict, Eigen::half)->Apply(evict_args);
BENCHMARK_TEMPLATE(BM_Evict, Eigen::bfloat16)->Apply(evict_args);

// The memory bound of compaction at low keep ratios: reading the survivors of a head (pieces of
// tok_bytes, keep% of them, scattered uniformly) against reading the same number of bytes
// contiguously, in the same iteration, with the prefetching of compact_runs. Counter
// scattered_over_contiguous = time ratio. 256 MB of
// 2 MiB-page storage (the allocator of HostLayer), a fresh random survivor set per iteration.
void BM_ScatteredRead(benchmark::State& state) {
  const std::size_t tok_bytes = static_cast<std::size_t>(state.range(0));
  const int keep_pct = static_cast<int>(state.range(1));
  const std::size_t total = std::size_t{256} << 20, n_tok = total / tok_bytes;
  std::vector<float, depthkv::detail::LargePageAllocator<float>> buf(total / sizeof(float), 1.0f);
  std::vector<float, depthkv::detail::LargePageAllocator<float>> flush(total / sizeof(float), 2.0f);
  std::mt19937 rng(3);
  std::vector<std::size_t> kept;
  std::vector<double> ratio;
  const std::size_t per_tok = tok_bytes / sizeof(float);
  auto sum = [&](const float* p, std::size_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t i = 0; i < n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += p[i + static_cast<std::size_t>(j)];
    return acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
  };
  for (auto _ : state) {
    state.PauseTiming();
    kept.clear();
    for (std::size_t t = 0; t < n_tok; ++t)
      if (static_cast<int>(rng() % 100) < keep_pct) kept.push_back(t);
    for (std::size_t i = 0; i < flush.size(); i += 16) flush[i] += 1.0f;  // push buf out of the caches
    state.ResumeTiming();
    double t0 = Clock::now();
    float acc = 0;
    const std::size_t ahead = 4096 / tok_bytes;  // prefetched as compact_runs does
    for (std::size_t j = 0; j < kept.size(); ++j) {
      if (j + ahead < kept.size())
        depthkv::detail::prefetch_bytes(buf.data() + kept[j + ahead] * per_tok, tok_bytes);
      acc += sum(buf.data() + kept[j] * per_tok, per_tok);
    }
    const double t_scattered = seconds_since(t0);
    state.PauseTiming();
    for (std::size_t i = 0; i < flush.size(); i += 16) flush[i] += 1.0f;
    t0 = Clock::now();
    acc += sum(buf.data(), kept.size() * per_tok);
    const double t_contiguous = seconds_since(t0);
    benchmark::DoNotOptimize(acc);
    ratio.push_back(t_scattered / t_contiguous);
    state.ResumeTiming();
  }
  state.counters["scattered_over_contiguous"] = median(ratio);
}
BENCHMARK(BM_ScatteredRead)
    ->Args({256, 10})
    ->Args({512, 10})
    ->Args({256, 50})
    ->ArgNames({"tok_bytes", "keep%"})
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

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
      std::sort(pairs.begin(), pairs.end(), HigherScoreFirst{});
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
  for (int n : {16, 32, 48, 64, 96, 128, 256, 512, 768, 1024, 2048, 4096, 32768, 131072})
    for (int path : {0, 1, 2}) b->Args({n, path});
  b->ArgNames({"n", "path"});
}
BENCHMARK_TEMPLATE(BM_Select, depthkv::detail::FloatKeys)->Apply(select_args);
BENCHMARK_TEMPLATE(BM_Select, depthkv::detail::Bits16Keys)->Apply(select_args);

}  // namespace

BENCHMARK_MAIN();
