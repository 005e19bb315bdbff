// The engine over F16 caches (HostCacheF16): keys and values are the F16 rounding of what a
// float32 cache holds, the logits stay within F16's rounding of the float32 run's, and eviction on
// F16 layers keeps the same slots as on float32 layers, with the same (rounded) rows.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "depthkv/evictor.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/metrics.hpp"
#include "depthkv/simd_level.hpp"
#include "support/random_model.hpp"
#include "support/skip.hpp"

namespace {

using depthkv::llama::ForwardOptions;
using depthkv::llama::HostCache;
using depthkv::llama::HostCacheF16;
using depthkv::llama::LlamaEngine;
using depthkv::llama::RowMatrix;

std::vector<int> f16_tokens(int n) {
  std::vector<int> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 31 + 7) % 50;
  return t;
}

TEST_CASE("engine F16 KV: layer 0 holds the F16 rounding of the float32 keys and values", "[engine][kv-f16]") {
  depthkv_test::RandomSpec spec;
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(spec);
  const LlamaEngine engine(model);
  const auto tokens = f16_tokens(60);
  HostCache c32 = engine.make_cache();
  HostCacheF16 c16 = engine.make_cache<Eigen::half>();
  const RowMatrix l32 = engine.prefill(tokens, 0, c32);
  const RowMatrix l16 = engine.prefill(tokens, 0, c16);
  CHECK(c16.bytes() * 2 == c32.bytes());
  // layer 0's keys and values come from the same input in both runs: exactly the rounding
  const int hd = engine.config().head_dim;
  bool rounded = true;
  for (int h = 0; h < engine.config().n_kv_heads; ++h)
    for (int j = 0; j < 60; ++j)
      for (int d = 0; d < hd; ++d) {
        rounded = rounded && c16.layer(0).key(h, j)[d] == Eigen::half(c32.layer(0).key(h, j)[d]) &&
                  c16.layer(0).value(h, j)[d] == Eigen::half(c32.layer(0).value(h, j)[d]);
      }
  CHECK(rounded);
  // the output moves by F16's rounding only (2^-11 relative per element)
  const depthkv::ContinuationMetrics m = depthkv::compare_logits(l32, l16, std::vector<int>(60, -1));
  INFO("KL(F32 KV || F16 KV) " << m.loss.kl << ", top-1 disagreement " << m.loss.top1_disagree);
  CHECK(m.loss.kl < 1e-5);
  CHECK(m.loss.kl > 0);  // F16 really rounds
  // decode continues on the F16 cache
  const Eigen::VectorXf next = engine.decode(3, 60, c16);
  CHECK(next.allFinite());
}

TEST_CASE("engine F16 KV: eviction keeps the same slots and rows as on float32 layers", "[engine][kv-f16][evict]") {
  const int n_kv = 2, hd = 8, n = 40;
  depthkv::HostLayer<float> a(n_kv, hd);
  depthkv::HostLayer<Eigen::half> b(n_kv, hd);
  std::vector<float> k(n_kv * hd), v(n_kv * hd);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < n_kv * hd; ++i) {
      k[static_cast<std::size_t>(i)] = std::sin(0.37f * static_cast<float>(t * 17 + i));
      v[static_cast<std::size_t>(i)] = std::cos(0.91f * static_cast<float>(t * 5 + i));
    }
    a.append(k.data(), v.data(), 2 * t);
    b.append(k.data(), v.data(), 2 * t);
  }
  depthkv::KVCache<depthkv::HostLayer<float>> ca;
  depthkv::KVCache<depthkv::HostLayer<Eigen::half>> cb;
  ca.add_layer(std::move(a));
  cb.add_layer(std::move(b));
  depthkv::LayerScores scores(n_kv, std::vector<float>(n));
  for (int h = 0; h < n_kv; ++h)
    for (int j = 0; j < n; ++j) scores[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)] = std::cos(1.3f * float(j + 7 * h));
  const std::vector<depthkv::LayerScores> all{scores};
  const std::vector<int> keep{12};
  depthkv::evict(ca, all, keep, depthkv::Protection{2, 3});
  depthkv::evict(cb, all, keep, depthkv::Protection{2, 3});
  for (int h = 0; h < n_kv; ++h) {
    REQUIRE(ca.layer(0).size(h) == 12);
    REQUIRE(cb.layer(0).size(h) == 12);
    for (int j = 0; j < 12; ++j) {
      CHECK(ca.layer(0).positions(h)[j] == cb.layer(0).positions(h)[j]);
      for (int d = 0; d < hd; ++d) {
        CHECK(cb.layer(0).key(h, j)[d] == Eigen::half(ca.layer(0).key(h, j)[d]));
        CHECK(cb.layer(0).value(h, j)[d] == Eigen::half(ca.layer(0).value(h, j)[d]));
      }
    }
  }
}

TEST_CASE("engine F16 KV: kv type names parse both ways and reject others", "[engine][kv-f16]") {
  using depthkv::llama::KvType;
  CHECK(depthkv::llama::parse_kv_type("f16") == KvType::kF16);
  CHECK(depthkv::llama::parse_kv_type("f32") == KvType::kF32);
  CHECK(std::string(depthkv::llama::kv_type_name(KvType::kF16)) == "f16");
  CHECK_THROWS_AS(depthkv::llama::parse_kv_type("bf16"), depthkv::Error);
}

}  // namespace

TEST_CASE("engine F16 KV: a decode step's observed probabilities from the F16 keys in registers equal the float path's",
          "[engine][kv-f16][observer]") {
  if (depthkv::cpu_simd_level() < 2) depthkv_test::skip("no AVX2/F16C/FMA on this CPU (SIMD level 2)");
  for (const bool gemma : {false, true}) {  // gemma: sliding-window layers (a window begin per row)
    CAPTURE(gemma);
    depthkv_test::RandomSpec spec;
    spec.gemma3 = gemma;
    const depthkv::llama::LlamaModel model = depthkv_test::random_model(spec);
    const LlamaEngine engine(model);
    HostCacheF16 cache = engine.make_cache<Eigen::half>();
    ForwardOptions prefill;
    prefill.observer = [](int, int, std::int32_t, int, const float*, int, int) {};  // keep every slot
    engine.prefill(f16_tokens(40), 0, cache, prefill);
    // the same step at SIMD level 2 (DecodeTile over the F16 rows) and level 1 (a float copy, Eigen)
    std::vector<std::vector<float>> rows[2];
    for (int level : {2, 1}) {
      HostCacheF16 c = cache;
      ForwardOptions o;
      o.max_simd_level = level;
      auto& out = rows[level - 1];
      o.observer = [&out](int, int, std::int32_t p0, int nq, const float* p, int ld, int n) {
        REQUIRE((p0 == 40 && nq == 1 && ld == n));
        out.emplace_back(p, p + n);
      };
      const int t = 9;
      engine.forward(&t, 1, 40, c, o);
    }
    REQUIRE(rows[0].size() == static_cast<std::size_t>(spec.layers * spec.heads));
    REQUIRE(rows[0].size() == rows[1].size());
    double worst = 0.0, mass = 0.0;
    for (std::size_t i = 0; i < rows[0].size(); ++i) {
      REQUIRE(rows[0][i].size() == rows[1][i].size());
      for (std::size_t j = 0; j < rows[0][i].size(); ++j) {
        worst = std::max(worst, static_cast<double>(std::fabs(rows[0][i][j] - rows[1][i][j])));
        mass += rows[1][i][j];
      }
    }
    CHECK(worst < 1e-6);
    CHECK(mass == Approx(static_cast<double>(rows[0].size())).epsilon(1e-5));  // every row sums to 1
  }
}
