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
#include "support/random_model.hpp"

namespace {

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
