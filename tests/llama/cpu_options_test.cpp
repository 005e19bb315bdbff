// CpuOptions travel down the calls: the engine's forward pass and the eviction give the same bytes
// for every thread count and instruction-set cap, and no call changes OpenMP's settings.

#include "depthkv/cpu_options.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "depthkv/evictor.hpp"
#include "depthkv/llama/engine.hpp"
#include "support/random_model.hpp"
#include "support/simd_guard.hpp"

namespace {

using depthkv::llama::ForwardOptions;
using depthkv::llama::HostCache;
using depthkv::llama::LlamaEngine;
using depthkv::llama::RowMatrix;

// A model whose projections and attention pass the engine's thresholds for running on several
// threads (kParallelGemmWork, kParallelWork) at 300 tokens, with a depth of 1024 in w2 (beyond the
// depth at which Eigen's own multi-threaded product blocks differently from its single-threaded one).
depthkv_test::RandomSpec cpu_options_spec() {
  depthkv_test::RandomSpec spec;
  spec.dim = 64;
  spec.hidden = 1024;
  spec.layers = 2;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.vocab = 2048;
  spec.seq_len = 512;
  spec.seed = 11;
  return spec;
}

struct CpuRun {
  RowMatrix logits;
  std::vector<float> observed;  // sum of each observed probability row block, in call order
  HostCache cache;
};

CpuRun cpu_options_forward(const LlamaEngine& engine, const std::vector<int>& tokens, int n_threads,
                           bool observe) {
  CpuRun run{RowMatrix(), {}, engine.make_cache()};
  ForwardOptions opt;
  opt.n_threads = n_threads;
  opt.chunk_size = 128;  // three chunks: attention against a growing cache
#ifdef _OPENMP
  const int omp_before = omp_get_max_threads();
#endif
  if (observe)
    opt.observer = [&](int, int, std::int32_t, int nq, const float* p, int ld, int n) {
#ifdef _OPENMP
      REQUIRE(omp_get_max_threads() == omp_before);  // no call changes OpenMP's thread count
#endif
      float s = 0;
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < n; ++j)
          s += p[static_cast<std::size_t>(i) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(j)];
      run.observed.push_back(s);
    };
  run.logits = engine.prefill(tokens, 0, run.cache, opt);
#ifdef _OPENMP
  REQUIRE(omp_get_max_threads() == omp_before);
#endif
  return run;
}

// Keys and values of head h of two layers, slot by slot.
template <class L>
bool same_head_bytes(const L& a, const L& b, int h) {
  if (a.size(h) != b.size(h)) return false;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(a.head_dim());
  for (int i = 0; i < a.size(h); ++i)
    if (std::memcmp(a.key(h, i), b.key(h, i), bytes) != 0 ||
        std::memcmp(a.value(h, i), b.value(h, i), bytes) != 0 || a.positions(h)[i] != b.positions(h)[i])
      return false;
  return true;
}

bool same_bytes(const RowMatrix& a, const RowMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

}  // namespace

TEST_CASE("CpuOptions: validate names what is wrong", "[cpu_options]") {
  depthkv::CpuOptions o;
  CHECK(o.n_threads == 0);
  CHECK(o.max_simd_level == 3);
  o.validate();
  o.n_threads = -1;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("n_threads must be in [0, 1024] (0: all cores), got -1"));
  o.n_threads = 1025;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("got 1025"));
  o.n_threads = 1;
  o.max_simd_level = 4;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("max_simd_level must be 0, 1, 2 or 3, got 4"));
  CHECK(depthkv::thread_count(0) == depthkv::all_cores());
  CHECK(depthkv::thread_count(3) == 3);
  CHECK(depthkv::EvictOptions().n_threads ==
        1);  // the eviction and the products default to the calling thread
  CHECK(depthkv::llama::QuantProductOptions().n_threads == 1);
  CHECK(ForwardOptions().n_threads == 0);
}

TEST_CASE("engine: forward gives the same bytes on 1 and 2 threads, and leaves OpenMP's settings alone",
          "[engine][cpu_options]") {
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(cpu_options_spec());
  const LlamaEngine engine(model);
  const std::vector<int> tokens = depthkv_test::random_tokens(300, cpu_options_spec().vocab, 5);
  for (const bool observe : {false, true}) {
    INFO("observer " << observe);
    const CpuRun one = cpu_options_forward(engine, tokens, 1, observe);
    for (const int n_threads : {2, 3}) {
      INFO("threads " << n_threads);
      const CpuRun many = cpu_options_forward(engine, tokens, n_threads, observe);
      REQUIRE(same_bytes(one.logits, many.logits));
      REQUIRE(one.observed == many.observed);
      for (int l = 0; l < engine.config().n_layers; ++l)
        for (int h = 0; h < engine.config().n_kv_heads; ++h)
          REQUIRE(same_head_bytes(one.cache.layer(l), many.cache.layer(l), h));
    }
    // a decode step after the prefill, on each thread count
    HostCache c1 = one.cache, c2 = one.cache;
    const Eigen::VectorXf d1 = engine.decode(7, 300, c1, nullptr, depthkv::CpuOptions{1, 2});
    const Eigen::VectorXf d2 = engine.decode(7, 300, c2, nullptr, depthkv::CpuOptions{2, 2});
    REQUIRE(std::memcmp(d1.data(), d2.data(), sizeof(float) * static_cast<std::size_t>(d1.size())) == 0);
  }
  ForwardOptions bad;
  bad.n_threads = -2;
  HostCache cache = engine.make_cache();
  CHECK_THROWS_WITH(engine.prefill(tokens, 0, cache, bad), Catch::Contains("n_threads must be in [0, 1024]"));
  CHECK(cache.lengths() == std::vector<int>(2, 0));  // validated before the cache is touched
}

TEST_CASE("evict: the same kept slots and cache bytes for every thread count and SIMD level",
          "[evict][cpu_options]") {
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(cpu_options_spec());
  const LlamaEngine engine(model);
  const std::vector<int> tokens = depthkv_test::random_tokens(300, cpu_options_spec().vocab, 9);
  const CpuRun base = cpu_options_forward(engine, tokens, 1, false);
  std::mt19937 rng(3);
  std::vector<depthkv::LayerScores> scores(2, depthkv::LayerScores(2, std::vector<float>(300)));
  for (auto& layer : scores)
    for (auto& head : layer)
      for (float& s : head) s = static_cast<float>(rng() % 40) * 0.25f;  // many ties
  const std::vector<int> keep = {77, 150};
  std::vector<depthkv::LayerEviction> want;
  HostCache want_cache = base.cache;
  {
    depthkv::EvictOptions opt;  // 1 thread, AVX2 where present
    want = depthkv::evict(want_cache, scores, keep, {4, 16}, opt);
  }
  for (const int level : depthkv_test::available_simd_levels())
    for (const int n_threads : {1, 2, 0}) {
      INFO("level " << level << " threads " << n_threads);
      depthkv::EvictOptions opt;
      opt.n_threads = n_threads;
      opt.max_simd_level = level;
      HostCache cache = base.cache;
      const std::vector<depthkv::LayerEviction> got = depthkv::evict(cache, scores, keep, {4, 16}, opt);
      for (int l = 0; l < 2; ++l) {
        REQUIRE(got[static_cast<std::size_t>(l)].kept_slots == want[static_cast<std::size_t>(l)].kept_slots);
        REQUIRE(got[static_cast<std::size_t>(l)].kept_positions ==
                want[static_cast<std::size_t>(l)].kept_positions);
        for (int h = 0; h < 2; ++h) {
          REQUIRE(cache.layer(l).size(h) == keep[static_cast<std::size_t>(l)]);
          REQUIRE(same_head_bytes(cache.layer(l), want_cache.layer(l), h));
        }
      }
    }
  depthkv::EvictOptions bad;
  bad.max_simd_level = -1;
  HostCache cache = base.cache;
  CHECK_THROWS_WITH(depthkv::evict(cache, scores, keep, {4, 16}, bad),
                    Catch::Contains("max_simd_level must be 0, 1, 2 or 3, got -1"));
}
