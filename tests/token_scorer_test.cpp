// Tests of token_scorer.hpp against naive references that store every observed row.
#include "depthkv/token_scorer.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "depthkv/evictor.hpp"

using depthkv::Pooling;
using depthkv::ScorerConfig;
using depthkv::ScorerKind;
using depthkv::TokenScorer;

namespace {

// Naive reference: stores every row (q_head, q_pos, probs) and recomputes the scores from the
// formulas with plain loops in double.
struct NaiveScorer {
  ScorerConfig cfg;
  int n_heads, n_kv;
  struct Row {
    int q_head;
    std::int32_t pos;
    std::vector<double> p;
  };
  std::vector<Row> rows;

  int kv_of(int q) const { return q / (n_heads / n_kv); }
  void observe(int q, std::int32_t pos, const float* probs, int n) {
    rows.push_back({q, pos, std::vector<double>(probs, probs + n)});
  }
  void compact(int h, const std::vector<std::int32_t>& kept) {
    for (Row& r : rows) {
      if (kv_of(r.q_head) != h) continue;
      std::vector<double> p(kept.size(), 0.0);
      for (std::size_t i = 0; i < kept.size(); ++i)
        if (static_cast<std::size_t>(kept[i]) < r.p.size()) p[i] = r.p[static_cast<std::size_t>(kept[i])];
      r.p = p;
    }
  }
  // the sum of the group's rows (those at positions >= first), slot by slot, over n slots
  std::vector<double> summed(int h, int n, std::int32_t first) const {
    std::vector<double> s(static_cast<std::size_t>(n), 0.0);
    for (const Row& r : rows)
      if (kv_of(r.q_head) == h && r.pos >= first)
        for (std::size_t j = 0; j < r.p.size() && j < s.size(); ++j) s[j] += r.p[j];
    return s;
  }
  // the positions observed by the group, ascending, distinct
  std::vector<std::int32_t> positions(int h) const {
    std::vector<std::int32_t> pos;
    for (const Row& r : rows)
      if (kv_of(r.q_head) == h) pos.push_back(r.pos);
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
    return pos;
  }
  // SnapKV pooling (max: -inf padding; avg: zero padding)
  void pool(std::vector<double>& s) const {
    if (cfg.pooling == Pooling::kNone) return;
    const std::vector<double> u = s;
    const int n = static_cast<int>(s.size()), rad = cfg.kernel / 2;
    for (int j = 0; j < n; ++j) {
      double m = -1e300, sum = 0;
      for (int t = std::max(0, j - rad); t <= std::min(n - 1, j + rad); ++t) {
        m = std::max(m, u[static_cast<std::size_t>(t)]);
        sum += u[static_cast<std::size_t>(t)];
      }
      s[static_cast<std::size_t>(j)] = cfg.pooling == Pooling::kMax ? m : sum / cfg.kernel;
    }
  }
  // ||row||_1, ||row||_2 or ||row||_2^2 of a key or value row
  template <class Elem>
  static double norm(const Elem* x, int hd, int p) {
    double a = 0;
    for (int d = 0; d < hd; ++d) {
      const double v = static_cast<float>(x[d]);
      a += p == 1 ? std::fabs(v) : v * v;
    }
    return p == 2 ? std::sqrt(a) : a;
  }
  template <class Layer>
  std::vector<double> head_scores(const Layer& L, int h) const {
    const int n = L.size(h), hd = L.head_dim();
    const std::vector<std::int32_t> pos = positions(h);
    std::vector<double> s;
    switch (cfg.kind) {
      case ScorerKind::kH2O:
        return summed(h, n, std::numeric_limits<std::int32_t>::min());
      case ScorerKind::kH2OValueL1:
      case ScorerKind::kH2OValueL2:
        s = summed(h, n, std::numeric_limits<std::int32_t>::min());
        for (int j = 0; j < n; ++j)
          s[static_cast<std::size_t>(j)] *= norm(L.value(h, j), hd, cfg.kind == ScorerKind::kH2OValueL1 ? 1 : 2);
        return s;
      case ScorerKind::kTOVA:
        return pos.empty() ? std::vector<double>(static_cast<std::size_t>(n), 0.0) : summed(h, n, pos.back());
      case ScorerKind::kSnapKV: {
        const std::size_t w = static_cast<std::size_t>(cfg.window);
        s = summed(h, n, pos.size() > w ? pos[pos.size() - w] : std::numeric_limits<std::int32_t>::min());
        pool(s);
        return s;
      }
      case ScorerKind::kKeyNorm:
        s.assign(static_cast<std::size_t>(n), 0.0);
        for (int j = 0; j < n; ++j) s[static_cast<std::size_t>(j)] = -norm(L.key(h, j), hd, 2);
        return s;
      case ScorerKind::kKeyDiff: {  // -cos(K_j, mean of the unit keys)
        std::vector<double> a(static_cast<std::size_t>(hd), 0.0);
        for (int j = 0; j < n; ++j)
          for (int d = 0; d < hd; ++d)
            a[static_cast<std::size_t>(d)] += static_cast<float>(L.key(h, j)[d]) / norm(L.key(h, j), hd, 2) / n;
        double an = 0;
        for (double x : a) an += x * x;
        s.assign(static_cast<std::size_t>(n), 0.0);
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += static_cast<float>(L.key(h, j)[d]) * a[static_cast<std::size_t>(d)];
          s[static_cast<std::size_t>(j)] = -dot / (norm(L.key(h, j), hd, 2) * std::sqrt(an));
        }
        return s;
      }
      case ScorerKind::kSnapKVKeyDiff:  // tested as the composition of the two (test "snapkv-keydiff")
        FAIL("no naive reference for snapkv-keydiff");
    }
    return s;
  }
  template <class Layer>
  std::vector<std::vector<double>> scores(const Layer& L) const {
    std::vector<std::vector<double>> out(static_cast<std::size_t>(n_kv));
    for (int h = 0; h < n_kv; ++h) out[static_cast<std::size_t>(h)] = head_scores(L, h);
    return out;
  }
};

template <class Layer>
void append_random(Layer& L, int n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<std::size_t>(L.n_kv_heads() * L.head_dim())), v(k.size());
  for (int i = 0; i < n; ++i) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    L.append(k.data(), v.data(), L.size(0) == 0 ? 0 : L.positions(0)[L.size(0) - 1] + 1);
  }
}

void check_close(const depthkv::LayerScores& got, const std::vector<std::vector<double>>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t h = 0; h < got.size(); ++h) {
    REQUIRE(got[h].size() == want[h].size());
    for (std::size_t j = 0; j < got[h].size(); ++j) {
      INFO("head " << h << " slot " << j);
      REQUIRE(got[h][j] == Approx(want[h][j]).epsilon(1e-5).margin(1e-6));
    }
  }
}

// Random attention rows: causal over the n slots, some masked zeros.
std::vector<float> random_probs(int n_rows, int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> p(static_cast<std::size_t>(n_rows) * static_cast<std::size_t>(n));
  for (auto& x : p) x = u(rng) < 0.2f ? 0.0f : u(rng) / static_cast<float>(std::max(1, n));
  return p;
}

const ScorerConfig kConfigs[] = {
    {ScorerKind::kH2O, 32, 7, Pooling::kMax},        {ScorerKind::kH2OValueL1, 32, 7, Pooling::kMax},
    {ScorerKind::kH2OValueL2, 32, 7, Pooling::kMax}, {ScorerKind::kSnapKV, 5, 7, Pooling::kMax},
    {ScorerKind::kSnapKV, 3, 3, Pooling::kAvg},      {ScorerKind::kSnapKV, 8, 5, Pooling::kNone},
    {ScorerKind::kSnapKV, 1, 1, Pooling::kMax},      {ScorerKind::kTOVA, 32, 7, Pooling::kMax},
    {ScorerKind::kKeyNorm, 32, 7, Pooling::kMax},    {ScorerKind::kKeyDiff, 32, 7, Pooling::kMax},
};

}  // namespace

TEST_CASE("scorer kinds: names round-trip, unknown names throw", "[scorer]") {
  for (ScorerKind k : {ScorerKind::kH2O, ScorerKind::kH2OValueL1, ScorerKind::kH2OValueL2,
                       ScorerKind::kSnapKV, ScorerKind::kTOVA, ScorerKind::kKeyNorm, ScorerKind::kKeyDiff,
                       ScorerKind::kSnapKVKeyDiff})
    CHECK(depthkv::parse_scorer_kind(depthkv::to_string(k)) == k);
  CHECK(depthkv::to_string(ScorerKind::kKeyDiff) == "keydiff");
  CHECK(depthkv::to_string(ScorerKind::kH2OValueL1) == "h2o-v1");
  CHECK(depthkv::to_string(ScorerKind::kKeyNorm) == "knorm");
  CHECK_THROWS_AS(depthkv::parse_scorer_kind("H2O"), depthkv::Error);
  CHECK_THROWS_AS(depthkv::parse_scorer_kind(""), depthkv::Error);
}

TEMPLATE_TEST_CASE("every kind matches the naive reference (GQA, chunked prefill, interleaved heads)",
                   "[scorer]", float, Eigen::half) {
  std::mt19937 rng(2024);
  const int n_heads = 8, n_kv = 2, hd = 16;
  for (const ScorerConfig& cfg : kConfigs) {
    INFO("kind " << depthkv::to_string(cfg.kind) << " window " << cfg.window << " kernel " << cfg.kernel);
    depthkv::HostLayer<TestType> L(n_kv, hd);
    TokenScorer sc(cfg, n_heads, n_kv);
    NaiveScorer ref{cfg, n_heads, n_kv, {}};
    std::int32_t pos = 0;
    // three prefill chunks of different lengths, heads in a shuffled order, blocks and single rows
    for (int chunk : {13, 40, 7}) {
      append_random(L, chunk, rng);
      const int n = L.size(0);
      std::vector<int> order(n_heads);
      for (int q = 0; q < n_heads; ++q) order[static_cast<std::size_t>(q)] = q;
      std::shuffle(order.begin(), order.end(), rng);
      for (int q : order) {
        const int ld = n + 2;
        std::vector<float> p = random_probs(chunk, ld, rng);
        if (q % 2 == 0) {
          sc.observe_block(q, pos, chunk, p.data(), ld, n);
        } else {
          for (int r = 0; r < chunk; ++r) sc.observe(q, pos + r, p.data() + r * ld, n);
        }
        for (int r = 0; r < chunk; ++r) ref.observe(q, pos + r, p.data() + r * ld, n);
      }
      pos += chunk;
      check_close(sc.scores(L), ref.scores(L));
    }
    // decode-style rows that cover fewer slots than the layer holds (the rest count as 0), one head only
    std::vector<float> p = random_probs(1, 20, rng);
    sc.observe(3, pos, p.data(), 20);
    ref.observe(3, pos, p.data(), 20);
    check_close(sc.scores(L), ref.scores(L));
    const auto s = sc.scores(L);
    REQUIRE(s.size() == static_cast<std::size_t>(n_kv));  // per KV head, never per query head
  }
}

TEST_CASE("rank_fractions: rank / n in ascending (score, index) order, NaN lowest", "[scorer]") {
  CHECK(depthkv::rank_fractions({}).empty());
  CHECK(depthkv::rank_fractions({5.0f}) == std::vector<float>{0.0f});
  // ties: the later index ranks higher; NaN below every number
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(depthkv::rank_fractions({2.0f, 1.0f, 2.0f, nan}) == std::vector<float>{0.5f, 0.25f, 0.75f, 0.0f});
  // invariant under a monotone rescaling of the scores
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(64), w(64);
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(u(rng) * 4.0f) / 4.0f;  // many ties
    w[i] = 10.0f * v[i] + 7.0f;
  }
  CHECK(depthkv::rank_fractions(v) == depthkv::rank_fractions(w));
}

TEST_CASE("snapkv-keydiff: the larger of each slot's SnapKV and KeyDiff rank fractions", "[scorer]") {
  std::mt19937 rng(91);
  const int n_heads = 4, n_kv = 2, hd = 16;
  ScorerConfig hy{ScorerKind::kSnapKVKeyDiff, 5, 7, Pooling::kMax}, sn = hy, kd = hy;
  sn.kind = ScorerKind::kSnapKV;
  kd.kind = ScorerKind::kKeyDiff;
  depthkv::HostLayer<float> L(n_kv, hd);
  TokenScorer h(hy, n_heads, n_kv), s(sn, n_heads, n_kv), k(kd, n_heads, n_kv);
  std::int32_t pos = 0;
  for (int chunk : {37, 11}) {
    append_random(L, chunk, rng);
    const int n = L.size(0);
    for (int q = 0; q < n_heads; ++q) {
      std::vector<float> p = random_probs(chunk, n, rng);
      h.observe_block(q, pos, chunk, p.data(), n, n);
      s.observe_block(q, pos, chunk, p.data(), n, n);
    }
    pos += chunk;
    const depthkv::LayerScores got = h.scores(L), a = s.scores(L), b = k.scores(L);
    for (int kv = 0; kv < n_kv; ++kv) {
      // rank fraction: position in ascending (score, slot) order over n
      const auto ranks = [n](const std::vector<float>& v) {
        std::vector<float> r(v.size());
        for (int j = 0; j < n; ++j) {
          int below = 0;
          for (int t = 0; t < n; ++t) below += v[static_cast<std::size_t>(t)] < v[static_cast<std::size_t>(j)] ||
                                               (v[static_cast<std::size_t>(t)] == v[static_cast<std::size_t>(j)] && t < j);
          r[static_cast<std::size_t>(j)] = static_cast<float>(below) / static_cast<float>(n);
        }
        return r;
      };
      const std::vector<float> ra = ranks(a[static_cast<std::size_t>(kv)]), rb = ranks(b[static_cast<std::size_t>(kv)]);
      for (int j = 0; j < n; ++j)
        REQUIRE(got[static_cast<std::size_t>(kv)][static_cast<std::size_t>(j)] ==
                std::max(ra[static_cast<std::size_t>(j)], rb[static_cast<std::size_t>(j)]));
    }
  }
  CHECK(depthkv::parse_scorer_kind("snapkv-keydiff") == ScorerKind::kSnapKVKeyDiff);
  CHECK(h.positions_needed() == 5);  // SnapKV's window: the engine forms only those rows
}

TEST_CASE("compact keeps the state of the survivors, scores keep accumulating (chunked prefill)",
          "[scorer]") {
  std::mt19937 rng(77);
  const int n_heads = 4, n_kv = 2, hd = 8;
  for (const ScorerConfig& cfg : kConfigs) {
    INFO("kind " << depthkv::to_string(cfg.kind) << " window " << cfg.window);
    depthkv::HostLayer<float> L(n_kv, hd);
    TokenScorer sc(cfg, n_heads, n_kv);
    NaiveScorer ref{cfg, n_heads, n_kv, {}};
    std::int32_t pos = 0;
    for (int round = 0; round < 4; ++round) {
      const int chunk = 30;
      append_random(L, chunk, rng);
      for (int q = 0; q < n_heads; ++q) {
        const int n = L.size(q / (n_heads / n_kv));
        std::vector<float> p = random_probs(chunk, n, rng);
        sc.observe_block(q, pos, chunk, p.data(), n, n);
        for (int r = 0; r < chunk; ++r) ref.observe(q, pos + r, p.data() + r * n, n);
      }
      pos += chunk;
      const auto s = sc.scores(L);
      check_close(s, ref.scores(L));
      // evict with per-head budgets, then compact the scorer
      const std::vector<int> keep{L.size(0) / 2, L.size(1) / 3 + 2};
      const auto ev = depthkv::evict_layer(L, s, keep, {1, 2});
      for (int h = 0; h < n_kv; ++h) {
        const auto& kept = ev.kept_slots[static_cast<std::size_t>(h)];
        sc.compact(h, kept.data(), static_cast<int>(kept.size()));
        ref.compact(h, kept);
        if (cfg.kind != ScorerKind::kKeyNorm && cfg.kind != ScorerKind::kKeyDiff) CHECK(sc.observed_size(h) == L.size(h));
      }
      check_close(sc.scores(L), ref.scores(L));
      // the heads now hold different numbers of tokens; the next chunk is appended to both
    }
  }
}

TEST_CASE("SnapKV pooling: hand-computed example", "[scorer]") {
  depthkv::HostLayer<float> L(1, 2);
  const float kv[2] = {1, 1};
  for (int i = 0; i < 5; ++i) L.append(kv, kv, i);
  const float u[5] = {1, 5, 2, 0, 3};
  SECTION("max") {
    TokenScorer sc({ScorerKind::kSnapKV, 4, 3, Pooling::kMax}, 1, 1);
    sc.observe(0, 4, u, 5);
    CHECK(sc.scores(L)[0] == std::vector<float>{5, 5, 5, 3, 3});
  }
  SECTION("avg divides by the kernel at the edges too") {
    TokenScorer sc({ScorerKind::kSnapKV, 4, 3, Pooling::kAvg}, 1, 1);
    sc.observe(0, 4, u, 5);
    const auto s = sc.scores(L)[0];
    const float want[5] = {6.0f / 3, 8.0f / 3, 7.0f / 3, 5.0f / 3, 3.0f / 3};
    for (int j = 0; j < 5; ++j) CHECK(s[static_cast<std::size_t>(j)] == Approx(want[j]));
  }
  SECTION("window: only the last positions count, in any arrival order of the group's heads") {
    TokenScorer sc({ScorerKind::kSnapKV, 2, 1, Pooling::kNone}, 2, 1);
    const float a[5] = {1, 0, 0, 0, 0}, b[5] = {0, 1, 0, 0, 0}, c[5] = {0, 0, 1, 0, 0};
    sc.observe(0, 0, a, 5);
    sc.observe(0, 1, b, 5);
    sc.observe(0, 2, c, 5);  // head 0 saw positions 0, 1, 2
    sc.observe(1, 0, a, 5);  // head 1 arrives later with position 0: outside the window
    sc.observe(1, 1, b, 5);
    CHECK(sc.scores(L)[0] == std::vector<float>{0, 2, 1, 0, 0});
  }
  SECTION("TOVA: the last position only, summed over the group") {
    TokenScorer sc({ScorerKind::kTOVA}, 2, 1);
    const float a[5] = {1, 0, 0, 0, 0}, b[5] = {0, 1, 0, 0, 0};
    sc.observe(0, 3, a, 5);
    sc.observe(0, 4, b, 5);
    sc.observe(1, 4, a, 5);
    CHECK(sc.scores(L)[0] == std::vector<float>{1, 1, 0, 0, 0});
  }
}

TEST_CASE("scorer errors leave the state unchanged", "[scorer]") {
  std::mt19937 rng(5);
  CHECK_THROWS_AS(TokenScorer({ScorerKind::kSnapKV, 0, 7, Pooling::kMax}, 4, 2), depthkv::Error);
  CHECK_THROWS_AS(TokenScorer({ScorerKind::kSnapKV, 8, 6, Pooling::kMax}, 4, 2), depthkv::Error);
  CHECK_THROWS_AS(TokenScorer({ScorerKind::kSnapKV, 8, -1, Pooling::kMax}, 4, 2), depthkv::Error);
  CHECK_THROWS_AS(TokenScorer({}, 6, 4), depthkv::Error);
  CHECK_THROWS_AS(TokenScorer({}, 0, 1), depthkv::Error);
  CHECK_THROWS_AS(TokenScorer({}, 4, 0), depthkv::Error);

  for (ScorerKind kind : {ScorerKind::kH2O, ScorerKind::kSnapKV, ScorerKind::kTOVA}) {
    INFO(depthkv::to_string(kind));
    depthkv::HostLayer<float> L(2, 4);
    append_random(L, 10, rng);
    TokenScorer sc({kind, 4, 3, Pooling::kMax}, 4, 2);
    std::vector<float> p = random_probs(3, 10, rng);
    sc.observe_block(0, 5, 3, p.data(), 10, 10);
    const auto before = sc.scores(L);
    auto unchanged = [&](auto&& call) {
      CHECK_THROWS_AS(call(), depthkv::Error);
      CHECK(sc.scores(L) == before);
    };
    std::vector<float> bad = random_probs(3, 10, rng);
    bad[25] = std::numeric_limits<float>::quiet_NaN();
    unchanged([&] { sc.observe_block(1, 5, 3, bad.data(), 10, 10); });  // NaN in the last row
    bad[25] = std::numeric_limits<float>::infinity();
    unchanged([&] { sc.observe_block(1, 5, 3, bad.data(), 10, 10); });
    bad[25] = -1e-3f;
    unchanged([&] { sc.observe_block(1, 5, 3, bad.data(), 10, 10); });
    unchanged([&] { sc.observe(1, 5, bad.data() + 20, 10); });
    unchanged([&] { sc.observe(4, 9, p.data(), 10); });  // bad query head
    unchanged([&] { sc.observe(-1, 9, p.data(), 10); });
    unchanged([&] { sc.observe(0, 6, p.data(), 10); });              // position went back (last was 7)
    unchanged([&] { sc.observe(1, -1, p.data(), 10); });             // negative position
    unchanged([&] { sc.observe(1, 9, p.data(), -1); });              // n < 0
    unchanged([&] { sc.observe_block(1, 9, 2, p.data(), 5, 10); });  // ld < n
    unchanged([&] { sc.observe_block(1, 9, -1, p.data(), 10, 10); });
    unchanged([&] { sc.observe(1, 9, nullptr, 10); });
    const std::int32_t unsorted[3] = {0, 2, 1};
    unchanged([&] { sc.compact(0, unsorted, 3); });
    const std::int32_t negative[2] = {-1, 2};
    unchanged([&] { sc.compact(0, negative, 2); });
    unchanged([&] { sc.compact(2, unsorted, 1); });
    unchanged([&] { sc.compact(0, unsorted, -1); });
    CHECK_NOTHROW(sc.observe(0, 7, p.data(), 10));  // the same position again is allowed
    // layer shape mismatches
    depthkv::HostLayer<float> other(3, 4);
    CHECK_THROWS_AS(sc.scores(other), depthkv::Error);
    depthkv::HostLayer<float> shorter(2, 4);
    append_random(shorter, 9, rng);
    CHECK_THROWS_AS(sc.scores(shorter), depthkv::Error);
  }
}

TEST_CASE("reset forgets observations, key-norm needs none", "[scorer]") {
  std::mt19937 rng(9);
  depthkv::HostLayer<float> L(1, 4);
  append_random(L, 6, rng);
  TokenScorer sc({}, 1, 1);
  std::vector<float> p = random_probs(1, 6, rng);
  sc.observe(0, 10, p.data(), 6);
  sc.reset();
  CHECK(sc.scores(L)[0] == std::vector<float>(6, 0.0f));
  CHECK_NOTHROW(sc.observe(0, 0, p.data(), 6));  // positions start over
  TokenScorer kn({ScorerKind::kKeyNorm}, 1, 1);
  const auto s = kn.scores(L)[0];
  for (int j = 0; j < 6; ++j) {
    float sq = 0;
    for (int d = 0; d < 4; ++d) sq += L.key(0, j)[d] * L.key(0, j)[d];
    CHECK(s[static_cast<std::size_t>(j)] == Approx(-std::sqrt(sq)));
  }
}

// ---- output-aware rescaling (CriticalKV) ----------------------------------------------------

namespace {

// n[h][j] = mean over the group's query heads q of sum_r |sum_d W(r, q*hd + d) * V_{h,j}[d]|,
// W row-major [dim][n_heads*hd], in double with plain loops.
std::vector<std::vector<double>> naive_output_norms(const depthkv::HostLayer<float>& L, const std::vector<float>& W,
                                                    int dim, int n_heads) {
  const int nkv = L.n_kv_heads(), hd = L.head_dim(), group = n_heads / nkv, cols = n_heads * hd;
  std::vector<std::vector<double>> out(static_cast<std::size_t>(nkv));
  for (int h = 0; h < nkv; ++h)
    for (int j = 0; j < L.size(h); ++j) {
      double total = 0;
      for (int q = h * group; q < (h + 1) * group; ++q)
        for (int r = 0; r < dim; ++r) {
          double y = 0;
          for (int d = 0; d < hd; ++d)
            y += static_cast<double>(W[static_cast<std::size_t>(r * cols + q * hd + d)]) * L.value(h, j)[d];
          total += std::fabs(y);
        }
      out[static_cast<std::size_t>(h)].push_back(total / group);
    }
  return out;
}

}  // namespace

TEST_CASE("output-aware scores are (s + eps) * mean_q ||W_o^(q) V||_1 for h2o, snapkv and tova", "[scorer][output]") {
  std::mt19937 rng(1717);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> nd;
  for (ScorerKind kind : {ScorerKind::kH2O, ScorerKind::kSnapKV, ScorerKind::kTOVA})
    for (int trial = 0; trial < 6; ++trial) {
      const int n_kv = 1 + static_cast<int>(rng() % 3), group = 1 + static_cast<int>(rng() % 3);
      const int n_heads = n_kv * group, hd = 1 + static_cast<int>(rng() % 6), dim = 1 + static_cast<int>(rng() % 9);
      const int n = static_cast<int>(rng() % 300);  // crosses the 256-slot block of the product
      ScorerConfig cfg;
      cfg.kind = kind;
      cfg.window = 1 + static_cast<int>(rng() % 5);
      cfg.kernel = 3;
      cfg.output_aware = true;
      TokenScorer sc(cfg, n_heads, n_kv);
      ScorerConfig base_cfg = cfg;
      base_cfg.output_aware = false;
      NaiveScorer ref{base_cfg, n_heads, n_kv, {}};
      depthkv::HostLayer<float> L(n_kv, hd);
      append_random(L, n, rng);
      for (int pos = std::max(0, n - 8); pos < n; ++pos)
        for (int q = 0; q < n_heads; ++q) {
          std::vector<float> p(static_cast<std::size_t>(pos + 1));
          for (float& x : p) x = u01(rng);
          sc.observe(q, pos, p.data(), pos + 1);
          ref.observe(q, pos, p.data(), pos + 1);
        }
      std::vector<float> W(static_cast<std::size_t>(dim * n_heads * hd));
      for (float& x : W) x = nd(rng);
      INFO(depthkv::to_string(kind) << " n_kv " << n_kv << " group " << group << " hd " << hd << " dim " << dim
                                    << " n " << n);
      std::vector<std::vector<double>> want = ref.scores(L);
      const std::vector<std::vector<double>> norms = naive_output_norms(L, W, dim, n_heads);
      for (std::size_t h = 0; h < want.size(); ++h)
        for (std::size_t j = 0; j < want[h].size(); ++j) want[h][j] = (want[h][j] + 1e-4) * norms[h][j];
      const depthkv::OutputProjection wo{W.data(), dim, n_heads, hd};
      check_close(sc.scores(L, &wo), want);
      // the transposed layout [n_heads*hd][dim] row-major, through the strides
      std::vector<float> Wt(W.size());
      for (int r = 0; r < dim; ++r)
        for (int c = 0; c < n_heads * hd; ++c)
          Wt[static_cast<std::size_t>(c * dim + r)] = W[static_cast<std::size_t>(r * n_heads * hd + c)];
      const depthkv::OutputProjection wt{Wt.data(), dim, n_heads, hd, /*row_stride=*/1, /*col_stride=*/dim};
      check_close(sc.scores(L, &wt), want);
      // the norms alone
      check_close(depthkv::output_contribution_norms(L, wo), norms);
    }
}

TEST_CASE("output-aware scoring refuses what it cannot compute", "[scorer][output]") {
  for (ScorerKind kind : {ScorerKind::kKeyNorm, ScorerKind::kKeyDiff, ScorerKind::kH2OValueL1, ScorerKind::kH2OValueL2}) {
    ScorerConfig cfg;
    cfg.kind = kind;
    cfg.output_aware = true;
    CHECK_THROWS_WITH(TokenScorer(cfg, 2, 1), Catch::Contains("output-aware") && Catch::Contains(depthkv::to_string(kind)));
  }
  ScorerConfig cfg;
  cfg.output_aware = true;
  TokenScorer sc(cfg, 4, 2);
  depthkv::HostLayer<float> L(2, 3);
  std::mt19937 rng(3);
  append_random(L, 5, rng);
  CHECK_THROWS_WITH(sc.scores(L), Catch::Contains("no output projection"));
  std::vector<float> W(static_cast<std::size_t>(6 * 4 * 3), 1.0f);
  const depthkv::OutputProjection heads{W.data(), 6, 2, 3};
  CHECK_THROWS_WITH(sc.scores(L, &heads), Catch::Contains("2 query heads, scorer 4"));
  const depthkv::OutputProjection hd{W.data(), 6, 4, 2};
  CHECK_THROWS_WITH(sc.scores(L, &hd), Catch::Contains("head_dim 2, layer 3"));
  const depthkv::OutputProjection null{nullptr, 6, 4, 3};
  CHECK_THROWS_WITH(sc.scores(L, &null), Catch::Contains("null data"));
  const depthkv::OutputProjection stride{W.data(), 6, 4, 3, 0, 0};
  CHECK_THROWS_WITH(sc.scores(L, &stride), Catch::Contains("strides"));
  // without output_aware the projection is not read
  TokenScorer plain(ScorerConfig{}, 4, 2);
  CHECK(plain.scores(L, &null).size() == 2);
}
