// Tests of evictor.hpp: select_keep against a naive full sort, evict_layer / evict against a naive
// copy of the kept tokens, atomicity of every error path, all storage types.
#include "depthkv/evictor.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "support/adversarial_scores.hpp"
#include "support/selection_reference.hpp"
#include "support/simd_guard.hpp"

using depthkv::Protection;
using I32 = std::int32_t;

namespace {

// The naive reference (support/selection_reference.hpp) with the library's Protection.
template <class S>
std::vector<I32> naive_select(const S* scores, const I32* positions, int n, int k, Protection prot) {
  return depthkv_test::naive_select_keep(scores, positions, n, k, prot.n_sink, prot.n_recent);
}

using depthkv_test::adversarial_scores;
constexpr int kKinds = depthkv_test::kScoreKinds;

// Eviction options: the defaults with shrink off, or with `n` threads.
depthkv::EvictOptions no_shrink() {
  depthkv::EvictOptions o;
  o.shrink = false;
  return o;
}
depthkv::EvictOptions threads(int n) {
  depthkv::EvictOptions o;
  o.n_threads = n;
  return o;
}

}  // namespace

TEST_CASE("select_keep matches a naive full sort on random and adversarial rows", "[evict]") {
  std::mt19937 rng(1234);
  const int sizes[] = {0, 1, 2, 3, 7, 31, 100, 767, 768, 769, 1000, 2049, 5000, 40000};
  int checked = 0;
  for (int n : sizes) {
    for (int kind = 0; kind < kKinds; ++kind) {
      const std::vector<float> s = adversarial_scores(n, kind, rng);
      std::uniform_int_distribution<int> pd(0, std::max(1, n / 8));
      for (int rep = 0; rep < 3; ++rep) {
        Protection prot{rep == 0 ? 0 : pd(rng), rep == 0 ? 0 : pd(rng)};
        const int p = depthkv::detail::protected_count(n, prot.n_sink, prot.n_recent);
        std::uniform_int_distribution<int> kd(p, n + 2);
        for (int k : {p, std::min(p + 1, n), std::max(p, n - 1), n, n + 3, kd(rng), kd(rng)}) {
          if (k < p) continue;
          const std::vector<I32> got = depthkv::select_keep(s.data(), nullptr, n, k, prot);
          const std::vector<I32> want = naive_select(s.data(), nullptr, n, k, prot);
          INFO("n " << n << " kind " << kind << " k " << k << " sink " << prot.n_sink << " recent "
                    << prot.n_recent);
          REQUIRE(got == want);
          ++checked;
        }
      }
    }
  }
  CHECK(checked > 1000);
}

TEST_CASE("select_keep breaks ties by position, also when positions are not slot-ordered", "[evict]") {
  std::mt19937 rng(99);
  for (int n : {50, 1000, 3000}) {
    for (int kind : {0, 1, 2, 3}) {
      const std::vector<float> s = adversarial_scores(n, kind, rng);
      std::vector<I32> pos(static_cast<std::size_t>(n));
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      if (kind == 3)  // duplicate positions too: the lower slot stays
        for (auto& p : pos) p /= 3;
      for (int k : {0, 1, n / 3, n / 2, n - 1, n}) {
        INFO("n " << n << " kind " << kind << " k " << k);
        REQUIRE(depthkv::select_keep(s.data(), pos.data(), n, k, {}) ==
                naive_select(s.data(), pos.data(), n, k, {}));
        if (k >= 5)
          REQUIRE(depthkv::select_keep(s.data(), pos.data(), n, k, {2, 3}) ==
                  naive_select(s.data(), pos.data(), n, k, {2, 3}));
      }
    }
  }
}

TEST_CASE("select_keep edge cases", "[evict]") {
  const std::vector<float> eq(10, 1.0f);
  SECTION("empty row") {
    CHECK(depthkv::select_keep(nullptr, nullptr, 0, 0, {}).empty());
    CHECK(depthkv::select_keep(nullptr, nullptr, 0, 5, {3, 3}).empty());
  }
  SECTION("keep none") { CHECK(depthkv::select_keep(eq.data(), nullptr, 10, 0, {}).empty()); }
  SECTION("keep all") {
    std::vector<I32> all(10);
    std::iota(all.begin(), all.end(), 0);
    CHECK(depthkv::select_keep(eq.data(), nullptr, 10, 10, {}) == all);
    CHECK(depthkv::select_keep(eq.data(), nullptr, 10, 11, {}) == all);
  }
  SECTION("all equal: the earliest positions stay") {
    CHECK(depthkv::select_keep(eq.data(), nullptr, 10, 3, {}) == std::vector<I32>{0, 1, 2});
    const I32 pos[10] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    CHECK(depthkv::select_keep(eq.data(), pos, 10, 3, {}) == std::vector<I32>{7, 8, 9});
  }
  SECTION("-0.0 equals +0.0") {
    const float z[4] = {-0.0f, 0.0f, -0.0f, 0.0f};
    CHECK(depthkv::select_keep(z, nullptr, 4, 2, {}) == std::vector<I32>{0, 1});
    const I32 pos[4] = {3, 2, 1, 0};
    CHECK(depthkv::select_keep(z, pos, 4, 2, {}) == std::vector<I32>{2, 3});
  }
  SECTION("protection is counted inside k") {
    const float s[8] = {0, 0, 9, 8, 7, 6, 0, 0};
    CHECK(depthkv::select_keep(s, nullptr, 8, 4, {1, 1}) == std::vector<I32>{0, 2, 3, 7});
    CHECK(depthkv::select_keep(s, nullptr, 8, 2, {1, 1}) == std::vector<I32>{0, 7});
    CHECK(depthkv::select_keep(s, nullptr, 8, 8, {1, 1}).size() == 8);
    // protection covering the whole row
    CHECK(depthkv::select_keep(s, nullptr, 8, 8, {5, 5}).size() == 8);
  }
  SECTION("+inf and -inf are ordinary scores") {
    const float inf = std::numeric_limits<float>::infinity();
    const float s[5] = {-inf, 1.0f, inf, -1.0f, inf};
    CHECK(depthkv::select_keep(s, nullptr, 5, 2, {}) == std::vector<I32>{2, 4});
    CHECK(depthkv::select_keep(s, nullptr, 5, 4, {}) == std::vector<I32>{1, 2, 3, 4});
  }
  SECTION("errors") {
    std::vector<float> s(10, 1.0f);
    CHECK_THROWS_AS(depthkv::select_keep(s.data(), nullptr, 10, -1, {}), depthkv::Error);
    CHECK_THROWS_AS(depthkv::select_keep(s.data(), nullptr, 10, 3, {2, 2}), depthkv::Error);
    CHECK_NOTHROW(depthkv::select_keep(s.data(), nullptr, 10, 4, {2, 2}));
    CHECK_THROWS_AS(depthkv::select_keep(s.data(), nullptr, 10, 4, {-1, 0}), depthkv::Error);
    CHECK_THROWS_AS(depthkv::select_keep(s.data(), nullptr, -1, 0, {}), depthkv::Error);
    s[7] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_AS(depthkv::select_keep(s.data(), nullptr, 10, 5, {}), depthkv::Error);
    CHECK_THROWS_WITH(depthkv::select_keep(s.data(), nullptr, 10, 10, {}), Catch::Contains("slot 7"));
  }
}

TEST_CASE("the NaN check finds the first NaN of every kind at every offset of the vector loop", "[evict]") {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::signaling_NaN()};
  std::uint32_t low_payload = 0x7F800001u;  // the smallest NaN pattern, next to +inf
  float tiny_nan;
  std::memcpy(&tiny_nan, &low_payload, sizeof tiny_nan);
  for (int level : {0, 1, 2}) {  // scalar, SSE2, AVX2 (where the CPU has them), as the call's cap
    for (int n : {1, 15, 16, 17, 31, 32, 33, 100}) {
      std::vector<float> s(static_cast<std::size_t>(n), std::numeric_limits<float>::infinity());
      for (int i = 0; i < n; i += 2) s[static_cast<std::size_t>(i)] = -std::numeric_limits<float>::infinity();
      CHECK(depthkv::detail::first_nan(s.data(), n, level) == -1);  // +/-inf are scores, not NaN
      for (int at = 0; at < n; ++at)
        for (float nan : {nans[0], nans[1], nans[2], tiny_nan}) {
          std::vector<float> t = s;
          t[static_cast<std::size_t>(at)] = nan;
          if (at + 3 < n) t[static_cast<std::size_t>(at + 3)] = nan;  // a later NaN does not hide the first
          INFO("simd level " << depthkv::detail::simd_level(level) << " n " << n << " NaN at " << at);
          REQUIRE(depthkv::detail::first_nan(t.data(), n, level) == at);
        }
    }
  }
}

TEMPLATE_TEST_CASE("select_keep on 16-bit scores matches the naive sort", "[evict]", Eigen::half,
                   Eigen::bfloat16) {
  std::mt19937 rng(7);
  for (int n : {0, 1, 10, 767, 768, 2000, 33000}) {
    for (int kind = 0; kind < kKinds; ++kind) {
      const std::vector<float> f = adversarial_scores(n, kind, rng);
      std::vector<TestType> s(f.size());
      for (std::size_t i = 0; i < f.size(); ++i) s[i] = static_cast<TestType>(f[i]);
      for (int k : {0, 1, n / 10, n / 2, n - 1, n}) {
        if (k < 0) continue;
        INFO("n " << n << " kind " << kind << " k " << k);
        REQUIRE(depthkv::select_keep(s.data(), nullptr, n, k, {}) ==
                naive_select(s.data(), nullptr, n, k, {}));
        if (k >= 4 || k >= n)
          REQUIRE(depthkv::select_keep(s.data(), nullptr, n, k, {2, 2}) ==
                  naive_select(s.data(), nullptr, n, k, {2, 2}));
      }
    }
  }
  std::vector<TestType> s(5, static_cast<TestType>(1.0f));
  s[3] = static_cast<TestType>(std::numeric_limits<float>::quiet_NaN());
  CHECK_THROWS_AS(depthkv::select_keep(s.data(), nullptr, 5, 2, {}), depthkv::Error);
  // -0 and +0 are equal scores
  const TestType z[3] = {static_cast<TestType>(-0.0f), static_cast<TestType>(0.0f),
                         static_cast<TestType>(-0.0f)};
  CHECK(depthkv::select_keep(z, nullptr, 3, 2, {}) == std::vector<I32>{0, 1});
}

// ---- eviction of layers ---------------------------------------------------------------------

namespace {

// Byte snapshot of a layer's observable state (sizes, positions, held K/V, capacity, allocation).
template <class Layer>
std::vector<unsigned char> snapshot(const Layer& L) {
  std::vector<unsigned char> b;
  auto put = [&](const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    b.insert(b.end(), c, c + n);
  };
  const int cap = L.capacity();
  const std::size_t alloc = L.bytes_allocated();
  put(&cap, sizeof cap);
  put(&alloc, sizeof alloc);
  for (int h = 0; h < L.n_kv_heads(); ++h) {
    const int n = L.size(h);
    put(&n, sizeof n);
    put(L.positions(h), sizeof(I32) * static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) {
      put(L.key(h, j), sizeof(typename Layer::Scalar) * static_cast<std::size_t>(L.head_dim()));
      put(L.value(h, j), sizeof(typename Layer::Scalar) * static_cast<std::size_t>(L.head_dim()));
    }
  }
  return b;
}

template <class Layer>
std::vector<unsigned char> snapshot(const depthkv::KVCache<Layer>& c) {
  std::vector<unsigned char> b;
  for (int l = 0; l < c.n_layers(); ++l) {
    auto s = snapshot(c.layer(l));
    b.insert(b.end(), s.begin(), s.end());
  }
  return b;
}

// Fills a layer with n tokens of random K/V at positions 2*i + 1 (gaps, as after an earlier eviction).
template <class Layer>
void fill(Layer& L, int n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<std::size_t>(L.n_kv_heads() * L.head_dim())), v(k.size());
  for (int i = 0; i < n; ++i) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    L.append(k.data(), v.data(), 2 * i + 1);
  }
}

depthkv::LayerScores random_scores(const std::vector<int>& sizes, std::mt19937& rng, int kind) {
  depthkv::LayerScores s;
  for (int n : sizes) s.push_back(adversarial_scores(n, kind, rng));
  return s;
}

template <class Layer>
std::vector<int> sizes_of(const Layer& L) {
  std::vector<int> s;
  for (int h = 0; h < L.n_kv_heads(); ++h) s.push_back(L.size(h));
  return s;
}

// Checks that `after` holds exactly the naive selection of `before` for every head.
template <class Layer>
void check_evicted(const Layer& before, const Layer& after, const depthkv::LayerScores& scores,
                   const std::vector<int>& keep, Protection prot, const depthkv::LayerEviction& ev) {
  using T = typename Layer::Scalar;
  const int hd = before.head_dim();
  REQUIRE(static_cast<int>(ev.kept_slots.size()) == before.n_kv_heads());
  for (int h = 0; h < before.n_kv_heads(); ++h) {
    const int n = before.size(h);
    const auto want = naive_select(scores[static_cast<std::size_t>(h)].data(), before.positions(h), n,
                                   keep[static_cast<std::size_t>(h)], prot);
    INFO("head " << h << " n " << n << " keep " << keep[static_cast<std::size_t>(h)]);
    REQUIRE(ev.kept_slots[static_cast<std::size_t>(h)] == want);
    REQUIRE(after.size(h) == static_cast<int>(want.size()));
    for (std::size_t i = 0; i < want.size(); ++i) {
      REQUIRE(ev.kept_positions[static_cast<std::size_t>(h)][i] == before.positions(h)[want[i]]);
      REQUIRE(after.positions(h)[i] == before.positions(h)[want[i]]);
      REQUIRE(std::memcmp(after.key(h, static_cast<int>(i)), before.key(h, want[i]), sizeof(T) * hd) == 0);
      REQUIRE(std::memcmp(after.value(h, static_cast<int>(i)), before.value(h, want[i]), sizeof(T) * hd) ==
              0);
    }
    // positions stay ascending (order preserved by compaction)
    for (int i = 1; i < after.size(h); ++i) REQUIRE(after.positions(h)[i - 1] < after.positions(h)[i]);
  }
}

}  // namespace

TEMPLATE_TEST_CASE("evict_layer keeps exactly the naive selection, in order", "[evict]", float, Eigen::half,
                   Eigen::bfloat16) {
  std::mt19937 rng(42);
  for (int n : {0, 1, 5, 300, 1500}) {
    for (int kind : {0, 1, 2, 3, 6}) {
      depthkv::HostLayer<TestType> L(3, 16);
      fill(L, n, rng);
      const depthkv::HostLayer<TestType> before = L;
      const auto scores = random_scores(sizes_of(L), rng, kind);
      const Protection prot{std::min(n, 2), std::min(n, 3)};
      const int p = depthkv::detail::protected_count(n, prot.n_sink, prot.n_recent);
      // per-head different budgets: protected-only, a middle value, everything
      const std::vector<int> keep{p, std::max(p, n / 3), n + 1};
      INFO("n " << n << " kind " << kind);
      const auto ev = depthkv::evict_layer(L, scores, keep, prot, no_shrink());
      check_evicted(before, L, scores, keep, prot, ev);
    }
  }
}

TEMPLATE_TEST_CASE("evict over a cache: per-layer and per-head budgets, threads give identical results",
                   "[evict]", float, Eigen::half) {
  std::mt19937 rng(5);
  depthkv::KVCache<depthkv::HostLayer<TestType>> cache;
  const int lens[] = {900, 40, 2000, 0};
  for (int n : lens) fill(cache.add_layer(depthkv::HostLayer<TestType>(2, 8)), n, rng);
  std::vector<depthkv::LayerScores> scores;
  for (int l = 0; l < cache.n_layers(); ++l)
    scores.push_back(random_scores(sizes_of(cache.layer(l)), rng, l % 2));
  const Protection prot{1, 4};
  const auto original = cache;

  SECTION("per-layer keep") {
    const std::vector<int> keep{300, 40, 5, 0};
    const auto ev = depthkv::evict(cache, scores, keep, prot);
    REQUIRE(ev.size() == 4);
    for (int l = 0; l < 4; ++l) {
      std::vector<int> kh(2, keep[static_cast<std::size_t>(l)]);
      check_evicted(original.layer(l), cache.layer(l), scores[static_cast<std::size_t>(l)], kh, prot,
                    ev[static_cast<std::size_t>(l)]);
    }
    auto cache2 = original;
    const auto ev2 = depthkv::evict(cache2, scores, keep, prot, threads(2));
    CHECK(snapshot(cache2) == snapshot(cache));
    auto cache3 = original;
    depthkv::evict(cache3, scores, keep, prot, threads(0));
    CHECK(snapshot(cache3) == snapshot(cache));
    // compaction with streaming stores on every head (by default only heads of >= 256 KiB use them;
    // float heads of 8 dimensions are 32-byte moves in 64-byte aligned storage, so they stream)
    auto cache4 = original;
    depthkv::EvictOptions streaming = threads(2);
    streaming.streaming_min_bytes = 0;
    depthkv::evict(cache4, scores, keep, prot, streaming);
    CHECK(snapshot(cache4) == snapshot(cache));
    for (int l = 0; l < 4; ++l)
      CHECK(ev2[static_cast<std::size_t>(l)].kept_slots == ev[static_cast<std::size_t>(l)].kept_slots);
  }
  SECTION("per-head keep") {
    const std::vector<std::vector<int>> keep{{5, 800}, {40, 10}, {1999, 2000}, {0, 3}};
    const auto ev = depthkv::evict(cache, scores, keep, prot, no_shrink());
    for (int l = 0; l < 4; ++l)
      check_evicted(original.layer(l), cache.layer(l), scores[static_cast<std::size_t>(l)],
                    keep[static_cast<std::size_t>(l)], prot, ev[static_cast<std::size_t>(l)]);
    CHECK(cache.layer(0).size(0) == 5);
    CHECK(cache.layer(0).size(1) == 800);
  }
}

TEST_CASE("evict: every error leaves the cache byte-for-byte unchanged", "[evict]") {
  std::mt19937 rng(11);
  depthkv::KVCache<depthkv::HostLayer<float>> cache;
  for (int l = 0; l < 3; ++l) fill(cache.add_layer(depthkv::HostLayer<float>(2, 4)), 100 + 50 * l, rng);
  std::vector<depthkv::LayerScores> scores;
  for (int l = 0; l < 3; ++l) scores.push_back(random_scores(sizes_of(cache.layer(l)), rng, 0));
  const auto before = snapshot(cache);
  const Protection prot{4, 8};
  const std::vector<int> ok{50, 50, 50};
  auto expect_unchanged = [&](auto&& call) {
    CHECK_THROWS_AS(call(), depthkv::Error);
    CHECK(snapshot(cache) == before);
  };
  SECTION("NaN in the last head of the last layer") {
    auto s = scores;
    s[2][1][77] = std::numeric_limits<float>::quiet_NaN();
    expect_unchanged([&] { depthkv::evict(cache, s, ok, prot); });
    expect_unchanged([&] { depthkv::evict(cache, s, ok, prot, threads(2)); });
    CHECK_THROWS_WITH(depthkv::evict(cache, s, ok, prot),
                      Catch::Contains("layer 2 head 1") && Catch::Contains("77"));
  }
  SECTION("keep below the protected count in one layer") {
    expect_unchanged([&] { depthkv::evict(cache, scores, std::vector<int>{50, 50, 11}, prot); });
  }
  SECTION("negative keep") {
    expect_unchanged([&] { depthkv::evict(cache, scores, std::vector<int>{50, -1, 50}, prot); });
  }
  SECTION("negative protection") {
    expect_unchanged([&] { depthkv::evict(cache, scores, ok, Protection{-1, 0}); });
  }
  SECTION("score row of the wrong length") {
    auto s = scores;
    s[2][0].pop_back();
    expect_unchanged([&] { depthkv::evict(cache, s, ok, prot); });
  }
  SECTION("scores with a missing head or layer") {
    auto s = scores;
    s[1].pop_back();
    expect_unchanged([&] { depthkv::evict(cache, s, ok, prot); });
    auto s2 = scores;
    s2.pop_back();
    expect_unchanged([&] { depthkv::evict(cache, s2, ok, prot); });
  }
  SECTION("keep with the wrong number of layers or heads") {
    expect_unchanged([&] { depthkv::evict(cache, scores, std::vector<int>{50, 50}, prot); });
    expect_unchanged([&] {
      depthkv::evict(cache, scores, std::vector<std::vector<int>>{{50, 50}, {50, 50}, {50}}, prot);
    });
    expect_unchanged([&] {
      depthkv::evict(cache, scores, std::vector<std::vector<int>>{{50, 50}, {50, 50}, {50, 11}}, prot);
    });
  }
  SECTION("bad thread count") {
    expect_unchanged([&] { depthkv::evict(cache, scores, ok, prot, threads(-1)); });
  }
  SECTION("evict_layer") {
    auto s = scores[0];
    s[0][3] = std::numeric_limits<float>::quiet_NaN();
    expect_unchanged([&] { depthkv::evict_layer(cache.layer(0), s, {50, 50}, prot); });
    expect_unchanged([&] { depthkv::evict_layer(cache.layer(0), scores[0], {50}, prot); });
    expect_unchanged([&] { depthkv::evict_layer(cache.layer(0), scores[0], {50, 3}, prot); });
  }
}

TEST_CASE("evict: keep-all, keep-none, ties, positions", "[evict]") {
  std::mt19937 rng(3);
  depthkv::HostLayer<float> L(2, 4);
  fill(L, 20, rng);
  const auto before = L;
  SECTION("keep-all changes nothing") {
    const auto s = random_scores(sizes_of(L), rng, 0);
    const auto ev = depthkv::evict_layer(L, s, {20, 25}, {}, no_shrink());
    CHECK(snapshot(L) == snapshot(before));
    CHECK(ev.kept_slots[1].size() == 20);
  }
  SECTION("keep-none empties the heads") {
    const auto s = random_scores(sizes_of(L), rng, 0);
    depthkv::evict_layer(L, s, {0, 0}, {});
    CHECK(L.size(0) == 0);
    CHECK(L.size(1) == 0);
    CHECK(L.bytes() == 0);
    CHECK(L.bytes_allocated() == 0);
  }
  SECTION("all-equal scores keep the earliest positions") {
    const depthkv::LayerScores s(2, std::vector<float>(20, 0.25f));
    const auto ev = depthkv::evict_layer(L, s, {5, 5}, {});
    CHECK(ev.kept_positions[0] == std::vector<I32>{1, 3, 5, 7, 9});
    CHECK(ev.kept_slots[1] == std::vector<I32>{0, 1, 2, 3, 4});
    CHECK(std::vector<I32>(L.positions(0), L.positions(0) + 5) == std::vector<I32>{1, 3, 5, 7, 9});
  }
  SECTION("all-equal scores with protection keep sinks, the earliest, and the recent window") {
    const depthkv::LayerScores s(2, std::vector<float>(20, 0.25f));
    const auto ev = depthkv::evict_layer(L, s, {6, 6}, {2, 2});
    CHECK(ev.kept_slots[0] == std::vector<I32>{0, 1, 2, 3, 18, 19});
  }
}

TEST_CASE("evict: shrink really lowers the allocation of a HostLayer", "[evict]") {
  std::mt19937 rng(8);
  depthkv::HostLayer<Eigen::half> L(4, 32);
  fill(L, 1000, rng);
  const std::size_t alloc0 = L.bytes_allocated();
  const auto s = random_scores(sizes_of(L), rng, 0);
  depthkv::HostLayer<Eigen::half> L2 = L;
  depthkv::evict_layer(L2, s, {100, 100, 100, 100}, {}, no_shrink());
  CHECK(L2.bytes_allocated() == alloc0);
  depthkv::evict_layer(L, s, {100, 200, 100, 100}, {}, depthkv::EvictOptions{});  // shrink = true
  CHECK(L.bytes_allocated() < alloc0);
  CHECK(L.bytes_allocated() == 4u * 200u * 32u * 2u * sizeof(Eigen::half));  // max per-head size kept
  CHECK(L.bytes() == (100u + 200u + 100u + 100u) * 32u * 2u * sizeof(Eigen::half));
}

TEMPLATE_TEST_CASE("evict on a LayerView over strided external memory", "[evict]", float, Eigen::bfloat16) {
  std::mt19937 rng(21);
  const int n_kv = 3, hd = 8, cap = 700, len = 650;
  const std::ptrdiff_t tstride = hd + 3, hstride = cap * tstride + 5;
  const TestType sentinel = static_cast<TestType>(-777.0f);
  std::vector<TestType> K(static_cast<std::size_t>(n_kv * hstride), sentinel), V(K.size(), sentinel);
  std::normal_distribution<float> nd;
  for (int h = 0; h < n_kv; ++h)
    for (int t = 0; t < len; ++t)
      for (int d = 0; d < hd; ++d) {
        K[static_cast<std::size_t>(h * hstride + t * tstride + d)] = static_cast<TestType>(nd(rng));
        V[static_cast<std::size_t>(h * hstride + t * tstride + d)] = static_cast<TestType>(nd(rng));
      }
  depthkv::KVCache<depthkv::LayerView<TestType>> cache;
  cache.add_layer(depthkv::LayerView<TestType>(K.data(), V.data(), n_kv, hd, cap, len, hstride, tstride));
  const auto before_layer = std::make_pair(K, V);
  // a copy of the view's bookkeeping over a copy of the memory, for the reference
  std::vector<TestType> K0 = K, V0 = V;
  depthkv::LayerView<TestType> ref(K0.data(), V0.data(), n_kv, hd, cap, len, hstride, tstride);
  const auto s = random_scores(sizes_of(cache.layer(0)), rng, 1);
  const std::vector<std::vector<int>> keep{{20, 600, 650}};
  const Protection prot{4, 16};

  // an error first: nothing of the external memory changes
  CHECK_THROWS_AS(depthkv::evict(cache, {s}, std::vector<std::vector<int>>{{20, 600, 19}}, prot),
                  depthkv::Error);
  CHECK(K == before_layer.first);
  CHECK(V == before_layer.second);

  const auto ev = depthkv::evict(cache, {s}, keep, prot, threads(2));
  check_evicted(ref, cache.layer(0), s, keep[0], prot, ev[0]);
  // padding between tokens and heads is never written
  for (int h = 0; h < n_kv; ++h)
    for (int t = 0; t < cap; ++t)
      for (std::ptrdiff_t d = hd; d < tstride; ++d) {
        REQUIRE(K[static_cast<std::size_t>(h * hstride + t * tstride + d)] == sentinel);
        REQUIRE(V[static_cast<std::size_t>(h * hstride + t * tstride + d)] == sentinel);
      }
  CHECK(cache.layer(0).bytes_allocated() == static_cast<std::size_t>(n_kv * cap * hd * 2) * sizeof(TestType));
}
