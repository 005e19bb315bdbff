// Tests of head_budget.hpp: uniform and adaptive (AdaKV) per-head budgets against a naive
// reference that sorts everything, the budgets' sum and floors, and eviction with them.
#include "depthkv/head_budget.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "depthkv/evictor.hpp"
#include "support/adversarial_scores.hpp"

using depthkv::HeadAllocation;
using depthkv::LayerScores;
using depthkv::Protection;
using I32 = std::int32_t;

namespace {

// The adaptive split by definition, with full sorts: per head the floor's best unprotected
// slots, then the best of every other unprotected slot of all heads by (score desc, position
// asc, head asc). Returns the kept slots per head (ascending); budgets = their sizes.
std::vector<std::vector<I32>> naive_adaptive(const LayerScores& s, const std::vector<std::vector<I32>>& pos,
                                             const std::vector<int>& keeps, Protection prot, double alpha) {
  const int H = static_cast<int>(s.size());
  std::vector<std::vector<I32>> kept(static_cast<std::size_t>(H));
  struct Cand {
    float score;
    I32 pos;
    int head;
    I32 slot;
  };
  auto better = [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.pos != b.pos) return a.pos < b.pos;
    return a.head < b.head;
  };
  std::vector<Cand> pool;
  long long total = 0, floors = 0;
  for (int h = 0; h < H; ++h) {
    const int keep = keeps[static_cast<std::size_t>(h)];
    const int floor_n = static_cast<int>(std::floor(alpha * keep));
    const int n = static_cast<int>(s[static_cast<std::size_t>(h)].size());
    total += std::min(keep, n);
    std::vector<Cand> mid;
    int p = 0;
    for (int j = 0; j < n; ++j) {
      const bool prot_j = j < prot.n_sink || j >= n - prot.n_recent;
      if (prot_j) {
        kept[static_cast<std::size_t>(h)].push_back(j);
        ++p;
      } else {
        mid.push_back({s[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)],
                       pos[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)], h, j});
      }
    }
    const int f = std::min(n, std::max(p, floor_n));
    floors += f;
    std::sort(mid.begin(), mid.end(), better);
    for (int i = 0; i < static_cast<int>(mid.size()); ++i)
      (i < f - p ? kept[static_cast<std::size_t>(h)].push_back(mid[static_cast<std::size_t>(i)].slot)
                 : pool.push_back(mid[static_cast<std::size_t>(i)]));
  }
  std::sort(pool.begin(), pool.end(), better);
  for (long long i = 0; i < total - floors && i < static_cast<long long>(pool.size()); ++i)
    kept[static_cast<std::size_t>(pool[static_cast<std::size_t>(i)].head)].push_back(pool[static_cast<std::size_t>(i)].slot);
  for (auto& k : kept) std::sort(k.begin(), k.end());
  return kept;
}

}  // namespace

TEST_CASE("adaptive head budgets match the naive reference, sum to the layer total, keep the floors", "[head_budget]") {
  std::mt19937 rng(2407);
  for (int trial = 0; trial < 600; ++trial) {
    const int H = 1 + static_cast<int>(rng() % 6), hd = 2;
    const int kind = trial % depthkv_test::kScoreKinds;
    const Protection prot{static_cast<int>(rng() % 4), static_cast<int>(rng() % 6)};
    const double alpha = trial % 7 == 0 ? 0.0 : trial % 11 == 0 ? 1.0 : std::uniform_real_distribution<double>(0, 1)(rng);
    depthkv::HostLayer<float> L(H, hd);
    LayerScores s(static_cast<std::size_t>(H));
    std::vector<std::vector<I32>> pos(static_cast<std::size_t>(H));
    int n_max = 0;
    const bool equal_sizes = trial % 2 == 0;
    const int n_common = static_cast<int>(rng() % 200);
    const std::vector<float> kv(static_cast<std::size_t>(hd), 0.5f);
    for (int h = 0; h < H; ++h) {
      const int n = equal_sizes ? n_common : static_cast<int>(rng() % 200);
      n_max = std::max(n_max, n);
      I32 p = static_cast<I32>(rng() % 3);
      for (int j = 0; j < n; ++j) {
        s[static_cast<std::size_t>(h)].push_back(depthkv_test::adversarial_score(kind, j, n, rng));
        pos[static_cast<std::size_t>(h)].push_back(p);
        L.append_head(h, kv.data(), kv.data(), p);
        p += 1 + static_cast<I32>(rng() % 3);
      }
    }
    // a keep every head can meet: at least every head's protected count
    int min_keep = 0;
    for (int h = 0; h < H; ++h) {
      const int n = L.size(h);
      min_keep = std::max(min_keep, std::min(n, prot.n_sink + prot.n_recent));
    }
    const int keep = min_keep + static_cast<int>(rng() % (n_max + 2));
    // every third trial: a starting budget per head (the per-head form), else one for all
    const bool per_head = trial % 3 == 0;
    std::vector<int> keeps(static_cast<std::size_t>(H), keep);
    if (per_head)
      for (int& k : keeps) k = min_keep + static_cast<int>(rng() % (n_max + 2));
    INFO("trial " << trial << " H " << H << " kind " << kind << " keep " << keep << " per_head " << per_head
                  << " alpha " << alpha << " sinks " << prot.n_sink << " recent " << prot.n_recent);
    const std::vector<std::vector<I32>> want = naive_adaptive(s, pos, keeps, prot, alpha);
    const std::vector<int> k = per_head ? depthkv::head_budgets(HeadAllocation::kAdaptive, L, s, keeps, prot, alpha)
                                        : depthkv::head_budgets(HeadAllocation::kAdaptive, L, s, keep, prot, alpha);
    REQUIRE(static_cast<int>(k.size()) == H);
    long long sum = 0, total = 0;
    for (int h = 0; h < H; ++h) {
      const int n = L.size(h);
      const int p = std::min(n, prot.n_sink + prot.n_recent);
      sum += k[static_cast<std::size_t>(h)];
      const int kh = keeps[static_cast<std::size_t>(h)];
      total += std::min(kh, n);
      CHECK(k[static_cast<std::size_t>(h)] == static_cast<int>(want[static_cast<std::size_t>(h)].size()));
      CHECK(k[static_cast<std::size_t>(h)] <= n);
      CHECK(k[static_cast<std::size_t>(h)] >= std::min(n, std::max(p, static_cast<int>(std::floor(alpha * kh)))));
    }
    REQUIRE(sum == total);
    // the uniform split
    const std::vector<int> u = per_head ? depthkv::head_budgets(HeadAllocation::kUniform, L, s, keeps, prot, alpha)
                                        : depthkv::head_budgets(HeadAllocation::kUniform, L, s, keep, prot, alpha);
    for (int h = 0; h < H; ++h)
      CHECK(u[static_cast<std::size_t>(h)] == std::min(keeps[static_cast<std::size_t>(h)], L.size(h)));
    // eviction with the adaptive budgets keeps exactly the reference's slots
    const depthkv::LayerEviction ev = depthkv::evict_layer(L, s, k, prot);
    for (int h = 0; h < H; ++h) {
      INFO("head " << h);
      CHECK(ev.kept_slots[static_cast<std::size_t>(h)] == want[static_cast<std::size_t>(h)]);
      CHECK(L.size(h) == static_cast<int>(want[static_cast<std::size_t>(h)].size()));
    }
  }
}

TEST_CASE("head budgets: alpha 1 is the uniform split, alpha 0 follows the scores alone", "[head_budget]") {
  // head 0 holds every high score: with alpha 0 it takes the whole layer budget it can hold
  const LayerScores s = {{9, 8, 7, 6}, {1, 1, 1, 1}};
  const std::vector<const I32*> none;
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, s, none, 2, {}, 1.0) == std::vector<int>{2, 2});
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, s, none, 2, {}, 0.0) == std::vector<int>{4, 0});
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, s, none, 2, {}, 0.5) == std::vector<int>{3, 1});
  // protected tokens count: head 1 keeps its sink even with alpha 0
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, s, none, 2, {1, 0}, 0.0) == std::vector<int>{3, 1});
  // keep-none and keep-all
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, s, none, 0, {}, 0.2) == std::vector<int>{0, 0});
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, s, none, 9, {}, 0.2) == std::vector<int>{4, 4});
  // empty heads
  const LayerScores e = {{}, {3, 2}};
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, e, none, 1, {}, 0.0) == std::vector<int>{0, 1});
  // ties across heads: equal score and position, the lower head wins
  const LayerScores t = {{5, 5}, {5, 5}};
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, t, none, 1, {}, 0.0) == std::vector<int>{1, 1});
  const I32 p0[2] = {0, 1}, p1[2] = {1, 2};  // position 1 in both heads: head 0 wins
  CHECK(depthkv::head_budgets(HeadAllocation::kAdaptive, t, std::vector<const I32*>{p0, p1}, 1, {}, 0.0) ==
        std::vector<int>{2, 0});
  CHECK(depthkv::to_string(HeadAllocation::kAdaptive) == "adaptive");
  CHECK(depthkv::parse_head_allocation("uniform") == HeadAllocation::kUniform);
}

TEST_CASE("head budgets refuse bad input with a depthkv::Error naming it", "[head_budget]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<const I32*> none;
  const LayerScores ok = {{1, 2, 3}, {3, 2, 1}};
  const LayerScores bad = {{1, 2, 3}, {3, nan, 1}};
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, bad, none, 2, {}, 0.2),
                    Catch::Contains("head 1: NaN score at slot 1"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kUniform, bad, none, 2, {}, 0.2),
                    Catch::Contains("NaN score"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, ok, none, 2, {}, 1.5), Catch::Contains("alpha 1.5"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, ok, none, 2, {}, std::nan("")),
                    Catch::Contains("alpha"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, ok, none, -1, {}, 0.2), Catch::Contains("keep must be >= 0"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, ok, none, 1, {1, 1}, 0.2),
                    Catch::Contains("head 0: keep 1 < 2 protected"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, ok, none, 2, {-1, 0}, 0.2),
                    Catch::Contains("protection"));
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, LayerScores{}, none, 2, {}, 0.2),
                    Catch::Contains("no heads"));
  const I32 p[3] = {0, 1, 2};
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, ok, std::vector<const I32*>{p}, 2, {}, 0.2),
                    Catch::Contains("1 position rows for 2 heads"));
  CHECK_THROWS_WITH(
      depthkv::head_budgets(HeadAllocation::kAdaptive, ok, std::vector<const I32*>{p, nullptr}, 2, {}, 0.2),
      Catch::StartsWith("depthkv: head_budgets: head 1: null positions"));  // the function called
  CHECK_THROWS_WITH(depthkv::parse_head_allocation("ada"), Catch::Contains("unknown head allocation 'ada'"));
  // the cache-wide form names the layer; the cache is only read
  depthkv::KVCache<depthkv::HostLayer<float>> cache(std::vector<depthkv::HostLayer<float>>(2, depthkv::HostLayer<float>(2, 1)));
  const float kv[2] = {1, 1};
  for (int l = 0; l < 2; ++l)
    for (int i = 0; i < 3; ++i) cache.layer(l).append(kv, kv, i);
  const std::vector<LayerScores> scores = {ok, bad};
  CHECK_THROWS_WITH(depthkv::head_budgets(HeadAllocation::kAdaptive, cache, scores, {2, 2}, {}, 0.2),
                    Catch::Contains("head_budgets: layer 1: head 1: NaN score at slot 1"));
  CHECK(cache.layer(1).size(1) == 3);
  const std::vector<std::vector<int>> kk =
      depthkv::head_budgets(HeadAllocation::kAdaptive, cache, std::vector<LayerScores>{ok, ok}, {2, 1}, {}, 0.0);
  CHECK(kk == std::vector<std::vector<int>>{{2, 2}, {1, 1}});
}

namespace {

// Random head curves of L layers x H heads at the probed ratios: non-increasing towards ratio 1,
// not necessarily convex; with `dead` some heads lose nothing.
depthkv::SensitivityProfile random_head_curves(std::mt19937& rng, int L, int H, const std::vector<double>& ratios,
                                               bool dead) {
  depthkv::SensitivityProfile p;
  p.keep_ratios = ratios;
  p.loss.resize(L * H, static_cast<Eigen::Index>(ratios.size()));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int r = 0; r < L * H; ++r) {
    const double scale = dead && rng() % 4 == 0 ? 0.0 : std::pow(10.0, -3.0 * u(rng));
    double v = scale * (0.5 + u(rng));
    for (int k = 0; k < static_cast<int>(ratios.size()); ++k) {
      p.loss(r, k) = v;
      v *= u(rng);  // decreasing
    }
  }
  return p;
}

// The layer curves the head curves add up to (row l = sum over its heads).
depthkv::SensitivityProfile summed(const depthkv::SensitivityProfile& heads, int H) {
  depthkv::SensitivityProfile p;
  p.keep_ratios = heads.keep_ratios;
  p.loss.resize(heads.n_layers() / H, heads.n_ratios());
  for (int l = 0; l < p.n_layers(); ++l) p.loss.row(l) = heads.loss.middleRows(l * H, H).colwise().sum();
  return p;
}

}  // namespace

TEST_CASE("head-level optimal budgets: exact sums, bounds, never a higher predicted loss than layer-level optimal",
          "[head_budget]") {
  using depthkv::AllocationPolicy;
  std::mt19937 rng(1337);
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 6), H = 1 + static_cast<int>(rng() % 4);
    const std::vector<double> ratios = trial % 2 ? std::vector<double>{0.05, 0.1, 0.2, 0.3, 0.5, 0.75}
                                                 : std::vector<double>{0.2, 0.6};
    const depthkv::SensitivityProfile heads = random_head_curves(rng, L, H, ratios, trial % 3 == 0);
    const depthkv::SensitivityProfile layers = summed(heads, H);
    depthkv::BudgetRequest req;
    const int n = 20 + static_cast<int>(rng() % 300);
    req.lengths.assign(static_cast<std::size_t>(L), n);
    if (trial % 5 == 1) req.lengths[0] = n / 2;  // layers of other lengths
    req.floors = depthkv::protection_floors(req.lengths, {static_cast<int>(rng() % 4), static_cast<int>(rng() % 8)});
    req.min_tokens = trial % 4 == 0 ? 16 : 0;
    if (trial % 2)
      req.keep_ratio = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    else
      req.total_tokens = static_cast<long long>(rng() % static_cast<unsigned>(n * L + 1));
    INFO("trial " << trial << " L " << L << " H " << H << " n " << n);
    std::vector<int> layer_b;
    try {
      layer_b = depthkv::BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &layers);
    } catch (const depthkv::Error&) {  // the floors do not fit this budget: the head level refuses too
      REQUIRE_THROWS_AS(depthkv::head_optimal_budgets(heads, H, req), depthkv::Error);
      continue;
    }
    const std::vector<std::vector<int>> k = depthkv::head_optimal_budgets(heads, H, req);
    REQUIRE(static_cast<int>(k.size()) == L);
    long long sum = 0, layer_sum = 0;
    std::vector<int> flat, flat_layer, unit_len;
    for (int l = 0; l < L; ++l) {
      REQUIRE(static_cast<int>(k[static_cast<std::size_t>(l)].size()) == H);
      layer_sum += layer_b[static_cast<std::size_t>(l)];
      for (int h = 0; h < H; ++h) {
        const int b = k[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
        const int len = req.lengths[static_cast<std::size_t>(l)];
        CHECK(b >= req.floors[static_cast<std::size_t>(l)]);
        CHECK(b <= len);
        sum += b;
        flat.push_back(b);
        flat_layer.push_back(layer_b[static_cast<std::size_t>(l)]);
        unit_len.push_back(len);
      }
    }
    REQUIRE(sum == H * layer_sum);  // the same global budget, counted over heads
    // the head-level optimum predicts no more loss than the layer-level one, under the head curves
    // and under the layer curves they add up to (a sum of hulls lies below the hull of the sum)
    const double head_opt = depthkv::predicted_loss(heads, flat, unit_len);
    REQUIRE(depthkv::predicted_head_loss(heads, k, req.lengths) == head_opt);  // the same sum over the units
    REQUIRE(depthkv::predicted_head_loss(heads, k, req.lengths, false) == depthkv::predicted_loss(heads, flat, unit_len, false));
    CHECK(head_opt <= depthkv::predicted_loss(heads, flat_layer, unit_len) + 1e-12);
    CHECK(head_opt <= depthkv::predicted_loss(layers, layer_b, req.lengths) + 1e-12);
  }
}

TEST_CASE("head-level optimal budgets give starved heads nothing to spare and refuse bad input", "[head_budget]") {
  // layer 0: head 0 sensitive, head 1 lossless; layer 1: both mildly sensitive
  depthkv::SensitivityProfile p;
  p.keep_ratios = {0.25, 0.5};
  p.loss.resize(4, 2);
  p.loss << 1.0, 0.5, 0.0, 0.0, 0.1, 0.05, 0.1, 0.05;
  depthkv::BudgetRequest req;
  req.lengths = {100, 100};
  req.keep_ratio = 0.5;
  const auto k = depthkv::head_optimal_budgets(p, 2, req);
  CHECK(k[0][1] == 0);    // the lossless head gives everything away
  CHECK(k[0][0] == 100);  // the steepest head is kept full
  CHECK(k[0][0] + k[0][1] + k[1][0] + k[1][1] == 200);
  // unit request: the budget in tokens scales with the heads, floors repeat
  req.keep_ratio = -1;
  req.total_tokens = 60;
  req.floors = {5, 7};
  const depthkv::BudgetRequest u = depthkv::head_unit_request(req, 2);
  CHECK(u.lengths == std::vector<int>{100, 100, 100, 100});
  CHECK(u.floors == std::vector<int>{5, 5, 7, 7});
  CHECK(u.total_tokens == 120);
  CHECK_THROWS_WITH(depthkv::head_optimal_budgets(p, 3, req), Catch::Contains("4 rows for 2 layers x 3 KV heads"));
  CHECK_THROWS_WITH(depthkv::head_unit_request(req, 0), Catch::Contains("n_kv_heads must be >= 1"));
  req.total_tokens = 5;  // the floors sum to 24 per head pair
  CHECK_THROWS_WITH(depthkv::head_optimal_budgets(p, 2, req), Catch::Contains("infeasible"));
  depthkv::SensitivityProfile bad = p;
  bad.loss(2, 1) = std::nan("");
  req.total_tokens = 60;
  CHECK_THROWS_WITH(depthkv::head_optimal_budgets(bad, 2, req), Catch::Contains("not finite"));
  // predicted loss of per-head budgets: the head curves at each head's ratio, summed
  CHECK(depthkv::predicted_head_loss(p, {{50, 25}, {50, 50}}, {100, 100}) == Approx(0.5 + 0.0 + 0.05 + 0.05));
  CHECK_THROWS_WITH(depthkv::predicted_head_loss(p, {{50, 25}, {50}}, {100, 100}),
                    Catch::Contains("layer 1 has budgets for 1 KV heads, layer 0 for 2"));
  CHECK_THROWS_WITH(depthkv::predicted_head_loss(p, {{50, 25}, {50, 50}}, {100}),
                    Catch::Contains("budgets for 2 layers, 1 lengths"));
  CHECK_THROWS_WITH(depthkv::predicted_head_loss(p, {{50, 25}, {50, 101}}, {100, 100}),
                    Catch::Contains("outside [0, 100]"));
}
