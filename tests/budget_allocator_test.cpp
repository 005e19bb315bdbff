#include "depthkv/budget_allocator.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

using depthkv::AllocationInfo;
using depthkv::AllocationPolicy;
using depthkv::BudgetAllocator;
using depthkv::BudgetRequest;
using depthkv::SensitivityProfile;

namespace {

long long sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0LL); }

const std::vector<double> kRatios = {0.05, 0.1, 0.2, 0.3, 0.5, 0.75};

/// Convex curves a (1 - r)^p, p >= 1, or arbitrary non-negative values (non-convex, non-monotone).
SensitivityProfile random_profile(std::mt19937& rng, int n_layers, bool convex) {
  SensitivityProfile p;
  p.keep_ratios = kRatios;
  p.loss.resize(n_layers, static_cast<Eigen::Index>(kRatios.size()));
  std::uniform_real_distribution<double> amp(0.01, 3.0), pw(1.0, 4.0), u(0.0, 2.0);
  for (int l = 0; l < n_layers; ++l) {
    const double a = amp(rng), e = pw(rng);
    for (std::size_t k = 0; k < kRatios.size(); ++k) {
      p.loss(l, static_cast<Eigen::Index>(k)) = convex ? a * std::pow(1.0 - kRatios[k], e) : u(rng);
    }
  }
  return p;
}

/// Naive largest remainder: floor everything, then +1 to the largest fractional parts,
/// equal parts by lower index (selection by repeated scans).
std::vector<int> naive_largest_remainder(const std::vector<double>& x, long long total) {
  std::vector<int> b(x.size());
  long long s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    b[i] = static_cast<int>(std::floor(x[i]));
    s += b[i];
  }
  std::vector<bool> used(x.size(), false);
  for (long long r = total - s; r > 0; --r) {
    std::size_t best = x.size();
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (used[i]) continue;
      if (best == x.size() || (x[i] - b[i]) > (x[best] - b[best])) best = i;
    }
    used[best] = true;
    ++b[best];
  }
  return b;
}

struct RandomCase {
  BudgetRequest req;
  SensitivityProfile profile;
};

RandomCase random_case(std::mt19937& rng, int n_layers) {
  RandomCase rc;
  std::uniform_int_distribution<int> len_d(0, 300), coin(0, 3);
  const bool same = coin(rng) == 0;
  const int common = len_d(rng);
  for (int l = 0; l < n_layers; ++l) rc.req.lengths.push_back(same ? common : len_d(rng));
  if (coin(rng) != 0) {
    for (int l = 0; l < n_layers; ++l) {
      const int len = rc.req.lengths[static_cast<std::size_t>(l)];
      rc.req.caps.push_back(coin(rng) == 0 ? std::uniform_int_distribution<int>(0, len)(rng) : len);
    }
  }
  const std::vector<int> caps = rc.req.caps.empty() ? rc.req.lengths : rc.req.caps;
  if (coin(rng) != 0) {
    for (int l = 0; l < n_layers; ++l) {
      rc.req.floors.push_back(std::uniform_int_distribution<int>(0, std::min(20, caps[static_cast<std::size_t>(l)]))(rng));
    }
  }
  const long long lo = rc.req.floors.empty() ? 0 : sum(rc.req.floors);
  const long long hi = sum(caps);
  rc.req.total_tokens = std::uniform_int_distribution<long long>(lo, hi)(rng);
  rc.profile = random_profile(rng, n_layers, coin(rng) < 2);
  std::uniform_real_distribution<double> inf(0.5, 3.0);
  for (int l = 0; l < n_layers; ++l) rc.req.infonce.push_back(inf(rng));
  return rc;
}

void check_bounds(const std::vector<int>& b, const BudgetRequest& req, long long total) {
  REQUIRE(b.size() == req.lengths.size());
  REQUIRE(sum(b) == total);
  for (std::size_t l = 0; l < b.size(); ++l) {
    const int cap = req.caps.empty() ? req.lengths[l] : req.caps[l];
    const int flo = req.floors.empty() ? 0 : std::min(req.floors[l], req.lengths[l]);
    REQUIRE(b[l] >= flo);
    REQUIRE(b[l] <= cap);
  }
}

bool applicable(AllocationPolicy p, int n_layers) {
  if (p == AllocationPolicy::kMLMA6) return n_layers >= 6;
  if (p == AllocationPolicy::kMLMA4) return n_layers >= 4;
  if (p == AllocationPolicy::kMLMA2 || p == AllocationPolicy::kMLP || p == AllocationPolicy::kMiddle)
    return n_layers >= 2;
  return true;
}

}  // namespace

TEST_CASE("policy names round trip and unknown names throw", "[allocator]") {
  for (AllocationPolicy p : depthkv::all_allocation_policies()) {
    REQUIRE(depthkv::parse_allocation_policy(depthkv::to_string(p)) == p);
  }
  REQUIRE(depthkv::to_string(AllocationPolicy::kPyramid) == "pyramid");
  REQUIRE(depthkv::to_string(AllocationPolicy::kMLMA4) == "mlma4");
  REQUIRE_THROWS_AS(depthkv::parse_allocation_policy("Uniform"), depthkv::Error);
  REQUIRE_THROWS_WITH(depthkv::parse_allocation_policy("h2o"), Catch::Contains("unknown allocation policy 'h2o'"));
}

TEST_CASE("largest remainder matches a naive reference", "[allocator]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    // Targets on a coarse grid so that equal fractional parts (ties) are common.
    std::vector<double> x(static_cast<std::size_t>(n));
    for (auto& v : x) v = std::uniform_int_distribution<int>(0, 40)(rng) / 4.0;
    double s = std::accumulate(x.begin(), x.end(), 0.0);
    const double shift = (std::ceil(s) - s) / n;  // make the sum an integer
    for (auto& v : x) v += shift;
    const long long total = std::llround(std::accumulate(x.begin(), x.end(), 0.0));
    std::vector<int> floors(static_cast<std::size_t>(n)), caps(static_cast<std::size_t>(n));
    for (int l = 0; l < n; ++l) {
      floors[static_cast<std::size_t>(l)] = static_cast<int>(std::floor(x[static_cast<std::size_t>(l)]));
      caps[static_cast<std::size_t>(l)] = static_cast<int>(std::ceil(x[static_cast<std::size_t>(l)]));
    }
    const auto got = depthkv::detail::largest_remainder(x, floors, caps, total);
    const auto ref = naive_largest_remainder(x, total);
    REQUIRE(got == ref);
    REQUIRE(depthkv::detail::round_to_budget(x, floors, caps, total) == ref);
  }
}

TEST_CASE("ties go to the lower layer", "[allocator]") {
  BudgetRequest req;
  req.lengths = {10, 10, 10, 10};
  req.total_tokens = 6;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kUniform, req) == std::vector<int>{2, 2, 1, 1});
  req.total_tokens = 7;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kUniform, req) == std::vector<int>{2, 2, 2, 1});
}

TEST_CASE("every policy: exact sum, floors and caps on random requests", "[allocator]") {
  std::mt19937 rng(12345);
  BudgetAllocator alloc;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 12)(rng);
    RandomCase rc = random_case(rng, n);
    rc.req.min_tokens = std::uniform_int_distribution<int>(0, 30)(rng);
    for (AllocationPolicy p : depthkv::all_allocation_policies()) {
      if (!applicable(p, n)) {
        REQUIRE_THROWS_AS(alloc.allocate(p, rc.req, &rc.profile), depthkv::Error);
        continue;
      }
      INFO("trial " << trial << " policy " << depthkv::to_string(p));
      AllocationInfo info;
      const auto b = alloc.allocate(p, rc.req, &rc.profile, &info);
      check_bounds(b, rc.req, rc.req.total_tokens);
      for (std::size_t l = 0; l < b.size(); ++l) REQUIRE(b[l] >= info.floors[l]);
      REQUIRE(alloc.allocate(p, rc.req, &rc.profile) == b);  // deterministic
    }
  }
}

TEST_CASE("empty, keep-all and keep-none requests", "[allocator]") {
  BudgetAllocator alloc;
  std::mt19937 rng(3);
  SensitivityProfile p3 = random_profile(rng, 3, true);
  SensitivityProfile p0;
  p0.keep_ratios = kRatios;
  p0.loss.resize(0, static_cast<Eigen::Index>(kRatios.size()));
  for (AllocationPolicy p : depthkv::all_allocation_policies()) {
    INFO(depthkv::to_string(p));
    BudgetRequest req;
    req.infonce = {1.0, 2.0, 3.0};
    req.lengths = {100, 50, 80};
    if (applicable(p, 3) && p != AllocationPolicy::kMLMA4) {
      req.keep_ratio = 1.0;
      REQUIRE(alloc.allocate(p, req, &p3) == req.lengths);
      req.keep_ratio = 0.0;
      REQUIRE(alloc.allocate(p, req, &p3) == std::vector<int>{0, 0, 0});
    }
    if (applicable(p, 0) && p != AllocationPolicy::kMLMA2 && p != AllocationPolicy::kMLMA4) {
      BudgetRequest empty;
      empty.total_tokens = 0;
      REQUIRE(alloc.allocate(p, empty, &p0).empty());
    }
  }
}

TEST_CASE("uniform and optimal budgets never decrease as the budget grows", "[allocator]") {
  std::mt19937 rng(99);
  BudgetAllocator alloc;
  for (int trial = 0; trial < 16; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    RandomCase rc = random_case(rng, n);
    rc.req.min_tokens = trial % 2 == 0 ? 0 : 12;
    const std::vector<int> caps = rc.req.caps.empty() ? rc.req.lengths : rc.req.caps;
    const long long lo = rc.req.floors.empty() ? 0 : sum(rc.req.floors);
    for (AllocationPolicy p : {AllocationPolicy::kUniform, AllocationPolicy::kOptimal}) {
      std::vector<int> prev;
      for (long long total = lo; total <= sum(caps); ++total) {
        rc.req.total_tokens = total;
        const auto b = alloc.allocate(p, rc.req, &rc.profile);
        for (std::size_t l = 0; l < prev.size(); ++l) {
          INFO("trial " << trial << " policy " << depthkv::to_string(p) << " total " << total << " layer " << l);
          REQUIRE(b[l] >= prev[l]);
        }
        prev = b;
      }
    }
  }
}

TEST_CASE("proportional with fixed scores: shares grow with the budget, up to one token of rounding", "[allocator]") {
  // With fixed robustness scores the real-valued shares are non-decreasing in the budget;
  // largest-remainder rounding can take one token back when the budget grows by one (the
  // Alabama paradox of Hamilton's method), never more.
  std::mt19937 rng(99);
  BudgetAllocator alloc;
  int dips = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    RandomCase rc = random_case(rng, n);
    rc.req.min_tokens = trial % 2 == 0 ? 0 : 12;
    // Half the trials: the user's scores; the other half: the default scores from the profile
    // (mean loss over the probed ratios, independent of the budget).
    if (trial % 4 < 2) rc.req.robustness = rc.req.infonce;
    const std::vector<int> caps = rc.req.caps.empty() ? rc.req.lengths : rc.req.caps;
    const long long lo = rc.req.floors.empty() ? 0 : sum(rc.req.floors);
    for (AllocationPolicy p : {AllocationPolicy::kProportional, AllocationPolicy::kMGA}) {
      std::vector<int> prev;
      for (long long total = lo; total <= sum(caps); ++total) {
        rc.req.total_tokens = total;
        const auto b = alloc.allocate(p, rc.req, &rc.profile);
        for (std::size_t l = 0; l < prev.size(); ++l) {
          INFO("trial " << trial << " policy " << depthkv::to_string(p) << " total " << total << " layer " << l);
          REQUIRE(b[l] >= prev[l] - 1);
          dips += b[l] < prev[l];
        }
        prev = b;
      }
    }
  }
  WARN("proportional/mga: " << dips << " one-token dips over the sweeps");
}

TEST_CASE("proportional with fixed scores never decreases over a keep-ratio sweep of whole tokens", "[allocator]") {
  // Equal lengths of 1000 and keep-ratio steps of 0.05: every unsaturated layer's real share grows
  // by more than one token per step, so the rounded budgets cannot dip.
  BudgetAllocator alloc;
  BudgetRequest req;
  req.lengths = std::vector<int>(8, 1000);
  req.robustness = {1.0, 0.9, 0.5, 0.3, 0.7, 1.3, 2.0, 0.6};
  std::vector<int> prev;
  for (int step = 0; step <= 20; ++step) {
    req.keep_ratio = 0.05 * step;
    const auto b = alloc.allocate(AllocationPolicy::kProportional, req);
    for (std::size_t l = 0; l < prev.size(); ++l) REQUIRE(b[l] >= prev[l]);
    prev = b;
  }
}

TEST_CASE("optimal never predicts a higher loss than any other policy", "[allocator]") {
  std::mt19937 rng(2024);
  BudgetAllocator alloc;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 10)(rng);
    RandomCase rc = random_case(rng, n);
    const double best = depthkv::predicted_loss(rc.profile, alloc.allocate(AllocationPolicy::kOptimal, rc.req, &rc.profile),
                                                rc.req.lengths);
    for (AllocationPolicy p : depthkv::all_allocation_policies()) {
      if (!applicable(p, n)) continue;
      const double other = depthkv::predicted_loss(rc.profile, alloc.allocate(p, rc.req, &rc.profile), rc.req.lengths);
      INFO("trial " << trial << " policy " << depthkv::to_string(p));
      REQUIRE(best <= other + 1e-9 * (1.0 + std::abs(other)));
    }
  }
}

TEST_CASE("optimal equals brute force on tiny cases", "[allocator]") {
  std::mt19937 rng(5);
  BudgetAllocator alloc;
  for (int trial = 0; trial < 150; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 3)(rng);
    BudgetRequest req;
    for (int l = 0; l < n; ++l) req.lengths.push_back(std::uniform_int_distribution<int>(0, 12)(rng));
    for (int l = 0; l < n; ++l) req.floors.push_back(std::uniform_int_distribution<int>(0, 2)(rng));
    long long lo = 0;
    for (int l = 0; l < n; ++l) lo += std::min(req.floors[static_cast<std::size_t>(l)], req.lengths[static_cast<std::size_t>(l)]);
    req.total_tokens = std::uniform_int_distribution<long long>(lo, sum(req.lengths))(rng);
    const SensitivityProfile prof = random_profile(rng, n, trial % 2 == 0);
    const auto b = alloc.allocate(AllocationPolicy::kOptimal, req, &prof);
    const double got = depthkv::predicted_loss(prof, b, req.lengths);
    // Enumerate every vector within the bounds summing to the budget.
    double best = 1e300;
    std::vector<int> cur(static_cast<std::size_t>(n));
    std::function<void(int, long long)> rec = [&](int l, long long left) {
      if (l == n) {
        if (left == 0) best = std::min(best, depthkv::predicted_loss(prof, cur, req.lengths));
        return;
      }
      const auto i = static_cast<std::size_t>(l);
      for (int v = std::min(req.floors[i], req.lengths[i]); v <= req.lengths[i] && v <= left; ++v) {
        cur[i] = v;
        rec(l + 1, left - v);
      }
    };
    rec(0, req.total_tokens);
    INFO("trial " << trial);
    REQUIRE(got == Approx(best).margin(1e-12));
  }
}

namespace {

/// Independent of detail::raw_curve / lower_hull / predicted_loss: the points of layer l's curve
/// as documented (ratio 0 at the first segment's slope extended, floored at flat; the probed
/// points; (1, 0)) and the value at r of their lower convex envelope, as the minimum over every
/// pair of points bracketing r of the chord between them (the envelope of finitely many points
/// is the pointwise minimum of such chords).
double envelope_loss(const SensitivityProfile& p, int l, double r) {
  std::vector<double> x, y;
  const std::size_t n = p.keep_ratios.size();
  const double x1 = n > 1 ? p.keep_ratios[1] : 1.0, y1 = n > 1 ? p.loss(l, 1) : 0.0;
  const double x0 = p.keep_ratios[0], y0 = p.loss(l, 0);
  x.push_back(0.0);
  y.push_back(y0 + std::max(0.0, (y0 - y1) / (x1 - x0)) * x0);
  for (std::size_t k = 0; k < n; ++k) {
    x.push_back(p.keep_ratios[k]);
    y.push_back(p.loss(l, static_cast<Eigen::Index>(k)));
  }
  x.push_back(1.0);
  y.push_back(0.0);
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == r) best = std::min(best, y[i]);
    for (std::size_t j = 0; j < x.size(); ++j) {
      if (x[i] < r && r < x[j]) best = std::min(best, y[i] + (y[j] - y[i]) * (r - x[i]) / (x[j] - x[i]));
    }
  }
  return best;
}

/// Sum over the layers of envelope_loss at budget / length (layers of length 0 add 0).
double envelope_total(const SensitivityProfile& p, const std::vector<int>& b, const std::vector<int>& lengths) {
  double t = 0.0;
  for (std::size_t l = 0; l < b.size(); ++l)
    if (lengths[l] > 0) t += envelope_loss(p, static_cast<int>(l), static_cast<double>(b[l]) / lengths[l]);
  return t;
}

/// Three layers, ratios 0.25 / 0.5 / 0.75 (hull slopes worked out by hand below).
SensitivityProfile hand_profile() {
  SensitivityProfile p;
  p.keep_ratios = {0.25, 0.5, 0.75};
  p.loss.resize(3, 3);
  p.loss << 4.0, 3.5, 0.5,  // layer 0: non-convex (flat, then a cliff)
      1.0, 0.4, 0.1,        // layer 1: convex
      0.2, 0.9, 0.3;        // layer 2: non-monotone
  return p;
}

}  // namespace

TEST_CASE("optimal equals an independent brute force (pairwise-chord envelope and exhaustive search)",
          "[allocator]") {
  std::mt19937 rng(23);
  BudgetAllocator alloc;
  int non_convex = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = std::uniform_int_distribution<int>(2, 4)(rng);
    const int max_len = n == 4 ? 7 : 11;
    BudgetRequest req;
    for (int l = 0; l < n; ++l) req.lengths.push_back(std::uniform_int_distribution<int>(0, max_len)(rng));
    for (int l = 0; l < n; ++l) req.floors.push_back(std::uniform_int_distribution<int>(0, 2)(rng));
    long long lo = 0;
    for (int l = 0; l < n; ++l)
      lo += std::min(req.floors[static_cast<std::size_t>(l)], req.lengths[static_cast<std::size_t>(l)]);
    req.total_tokens = std::uniform_int_distribution<long long>(lo, sum(req.lengths))(rng);
    const bool convex = trial % 3 == 0;
    non_convex += convex ? 0 : 1;
    const SensitivityProfile prof = random_profile(rng, n, convex);
    const auto b = alloc.allocate(AllocationPolicy::kOptimal, req, &prof);
    check_bounds(b, req, req.total_tokens);
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> cur(static_cast<std::size_t>(n));
    std::function<void(int, long long)> rec = [&](int l, long long left) {
      const auto i = static_cast<std::size_t>(l);
      if (l == n) {
        if (left == 0) best = std::min(best, envelope_total(prof, cur, req.lengths));
        return;
      }
      for (int v = std::min(req.floors[i], req.lengths[i]); v <= req.lengths[i] && v <= left; ++v) {
        cur[i] = v;
        rec(l + 1, left - v);
      }
    };
    rec(0, req.total_tokens);
    INFO("trial " << trial << " layers " << n << " budget " << req.total_tokens);
    REQUIRE(envelope_total(prof, b, req.lengths) == Approx(best).margin(1e-12));
  }
  REQUIRE(non_convex >= 150);
}

TEST_CASE("optimal on hand-derived non-convex curves of three layers", "[allocator]") {
  // Curve points (ratio 0 by the first segment's slope, floored at flat):
  //   layer 0: (0, 4.5) (0.25, 4) (0.5, 3.5) (0.75, 0.5) (1, 0); slope at 0: (4 - 3.5) / 0.25 = 2.
  //     Lower hull: (0, 4.5) -> (0.75, 0.5) slope -16/3 (the flat part lies above it), then
  //     (0.75, 0.5) -> (1, 0) slope -2.
  //   layer 1: (0, 1.6) (0.25, 1) (0.5, 0.4) (0.75, 0.1) (1, 0): convex, slopes -2.4 (twice),
  //     -1.2, -0.4.
  //   layer 2: (0, 0.2) (0.25, 0.2) (0.5, 0.9) (0.75, 0.3) (1, 0); the first slope is negative, so
  //     ratio 0 stays at 0.2. Lower hull: the chord (0, 0.2) -> (1, 0), slope -0.2.
  // A layer of length L gains |slope| / L per token on a segment. With lengths 100 / 40 / 100:
  //   layer 0: 0.0533 for its first 75 tokens, 0.02 for the last 25;
  //   layer 1: 0.06 for tokens 0-20, 0.03 for 20-30, 0.01 for 30-40;
  //   layer 2: 0.002 for all 100.
  // Greedy order (exact for the convexified problem): L1 20, L0 75, L1 10, L0 25, L1 10, L2 100.
  // On the measured (non-convex) curve of layer 0 its first tokens would gain only 0.02 each,
  // so a solver that ignored the hull would give layer 1 all its tokens first.
  const SensitivityProfile p = hand_profile();
  BudgetAllocator alloc;
  BudgetRequest req;
  req.lengths = {100, 40, 100};
  struct Case {
    long long total;
    std::vector<int> floors, want;
    double loss;  // sum of the hull values at want / lengths
  };
  const Case cases[] = {
      // 20 -> L1 (at 0.5), 75 -> L0 (0.75), 10 -> L1 (0.75), 15 of L0's last 25: 0.2 + 0.1 + 0.2
      {120, {}, {90, 30, 0}, 0.2 + 0.1 + 0.2},
      // 20 -> L1, 40 of L0's first 75: L0 at 0.4 = 4.5 - 0.4 * 16/3 = 2.3667, L1 0.4, L2 0.2
      {60, {}, {40, 20, 0}, 4.5 - 0.4 * 16.0 / 3.0 + 0.4 + 0.2},
      // everything but L2's last 40: L2 at 0.6 = 0.2 * 0.4
      {200, {}, {100, 40, 60}, 0.08},
      // L2 floored at 50 (0.1); the other 70: 20 -> L1, 50 -> L0 (0.5 on the hull: 4.5 - 8/3)
      {120, {0, 0, 50}, {50, 20, 50}, 4.5 - 8.0 / 3.0 + 0.4 + 0.1},
      // L0 floored at 100 (0); 40 left: L1 20 + 10 + 10 (all of it): 0 + 0 + 0.2
      {140, {100, 0, 0}, {100, 40, 0}, 0.2},
  };
  for (const Case& c : cases) {
    req.total_tokens = c.total;
    req.floors = c.floors;
    INFO("budget " << c.total << " floors " << c.floors.size());
    const auto b = alloc.allocate(AllocationPolicy::kOptimal, req, &p);
    REQUIRE(b == c.want);
    REQUIRE(envelope_total(p, b, req.lengths) == Approx(c.loss).margin(1e-12));
    REQUIRE(depthkv::predicted_loss(p, b, req.lengths) == Approx(c.loss).margin(1e-12));
  }
  // The hull values themselves, by hand.
  REQUIRE(envelope_loss(p, 0, 0.5) == Approx(4.5 - 8.0 / 3.0));
  REQUIRE(envelope_loss(p, 0, 0.9) == Approx(0.2));
  REQUIRE(envelope_loss(p, 1, 0.25) == Approx(1.0));
  REQUIRE(envelope_loss(p, 2, 0.5) == Approx(0.1));
  REQUIRE(envelope_loss(p, 2, 0.0) == Approx(0.2));
}

TEST_CASE("optimal gives tokens where the curve is steep", "[allocator]") {
  SensitivityProfile p;
  p.keep_ratios = {0.25, 0.5, 0.75};
  p.loss.resize(2, 3);
  p.loss << 3.0, 2.0, 1.0,   // layer 0: linear, slope 4 per unit ratio
      0.3, 0.2, 0.1;          // layer 1: linear, slope 0.4
  BudgetRequest req;
  req.lengths = {100, 100};
  req.total_tokens = 120;
  const auto b = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p);
  REQUIRE(b == std::vector<int>{100, 20});
  REQUIRE(depthkv::predicted_loss(p, b, req.lengths) == Approx(0.0 + 0.4 * 0.8));
}

TEST_CASE("optimal's safeguard floor and its uniform fallback", "[allocator]") {
  SensitivityProfile p;
  p.keep_ratios = {0.25, 0.5, 0.75};
  p.loss.resize(2, 3);
  p.loss << 3.0, 2.0, 1.0, 0.3, 0.2, 0.1;
  BudgetRequest req;
  req.lengths = {100, 100};
  req.total_tokens = 120;
  req.min_tokens = 30;
  AllocationInfo info;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{90, 30});
  REQUIRE_FALSE(info.safeguard_fallback);
  req.min_tokens = 70;  // 2 x 70 > 120: the safeguard takes the whole budget -> uniform
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{60, 60});
  REQUIRE(info.safeguard_fallback);
  // shrinking: margins above the hard floors 10 and 0 (70 - 10 = 60, 70) halve together until they
  // fit: 10 + 30 and 35 (75 <= 120); the safeguard is kept, not dropped
  req.safeguard_shrink = true;
  req.floors = {10, 0};
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{85, 35});
  REQUIRE_FALSE(info.safeguard_fallback);
  REQUIRE(info.floors == std::vector<int>{40, 35});
  req.min_tokens = 30;  // floors that fit are not shrunk
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{90, 30});
  REQUIRE(info.floors == std::vector<int>{30, 30});
  req.floors = {60, 60};  // margins 10 halve down to 0: the hard floors, which take the whole budget
  req.min_tokens = 70;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{60, 60});
  REQUIRE(info.floors == std::vector<int>{60, 60});
  REQUIRE_FALSE(info.safeguard_fallback);
}

TEST_CASE("a shrunk safeguard: the largest halving of the margins that fits, the budget exact", "[allocator]") {
  std::mt19937 rng(77);
  const std::vector<double> ratios = {0.1, 0.3, 0.6};
  for (int trial = 0; trial < 400; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 8);
    SensitivityProfile p;
    p.keep_ratios = ratios;
    p.loss.resize(L, 3);
    for (int l = 0; l < L; ++l) {
      const double a = std::uniform_real_distribution<double>(0.01, 1.0)(rng);
      p.loss.row(l) << a, a / 3, a / 9;
    }
    BudgetRequest req;
    const int n = 8 + static_cast<int>(rng() % 120);
    req.lengths.assign(static_cast<std::size_t>(L), n);
    const int prot = static_cast<int>(rng() % 7);
    req.floors = depthkv::protection_floors(req.lengths, {prot / 2, prot - prot / 2});
    req.min_tokens = prot + static_cast<int>(rng() % 17);
    req.safeguard_shrink = true;
    req.total_tokens = prot * L + static_cast<long long>(rng() % static_cast<unsigned>((n - prot) * L + 1));
    INFO("trial " << trial);
    AllocationInfo info;
    const std::vector<int> b = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info);
    REQUIRE(std::accumulate(b.begin(), b.end(), 0LL) == req.total_tokens);
    // the floors used are the hard floor plus the margin halved k times, for the smallest k that fits
    const int margin = std::max(0, std::min(req.min_tokens, n) - std::min(prot, n));
    int m = margin;
    while (static_cast<long long>(std::min(prot, n) + m) * L > req.total_tokens && m > 0) m /= 2;
    for (int l = 0; l < L; ++l) {
      CHECK(b[static_cast<std::size_t>(l)] >= std::min(prot, n) + m);
      CHECK(info.floors[static_cast<std::size_t>(l)] == std::min(prot, n) + m);
    }
    CHECK_FALSE(info.safeguard_fallback);  // the hard floors always fit a feasible request
  }
}

TEST_CASE("pyramid matches the KVCache-Factory formula by hand", "[allocator]") {
  // L = 5, B' = 48, w = 8, beta = 20: min = 40/20 = 2, max = 80 - 2 = 78, step (78-2)/4 = 19:
  // 78+8, 59+8, 40+8, 21+8, 2+8.
  BudgetRequest req;
  req.lengths = std::vector<int>(5, 512);
  req.total_tokens = 5 * 48;
  req.window = 8;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kPyramid, req) == std::vector<int>{86, 67, 48, 29, 10});
  // max >= q_len - w: max = 100 - 8 = 92, min = 2*72 - 92 = 52: 100, 90, 80, 70, 60.
  req.lengths = std::vector<int>(5, 100);
  req.total_tokens = 5 * 80;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kPyramid, req) == std::vector<int>{100, 90, 80, 70, 60});
  // Average budget at or below the window: uniform.
  req.total_tokens = 5 * 8;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kPyramid, req) == std::vector<int>{8, 8, 8, 8, 8});
}

TEST_CASE("proportional: layer 0 full, cap respected, ratios proportional, mean exact", "[allocator]") {
  BudgetRequest req;
  req.lengths = std::vector<int>(6, 1000);
  req.keep_ratio = 0.5;
  req.robustness = {5.0, 1.0, 1.5, 2.0, 2.5, 10.0};
  AllocationInfo info;
  const auto b = BudgetAllocator().allocate(AllocationPolicy::kProportional, req, nullptr, &info);
  // Layers 1..5 prune 3000 of 5000 tokens, p_l = min(0.7, a s_l): layers 5, 4, 3 saturate at 0.7
  // (2100 tokens), the remaining 900 = a (1 + 1.5) 1000 -> a = 0.36: layer 1 p = 0.36, layer 2 p = 0.54.
  REQUIRE(b == std::vector<int>{1000, 640, 460, 300, 300, 300});
  REQUIRE(info.prune_cap == 0.7);
  double mean_p = 0.0;
  for (int x : b) mean_p += (1000.0 - x) / 1000.0;
  REQUIRE(mean_p / 6 == Approx(0.5));
}

TEST_CASE("proportional: the cap is lifted when the pruning ratio needs it", "[allocator]") {
  BudgetRequest req;
  req.lengths = std::vector<int>(5, 100);
  req.keep_ratio = 0.3;  // 150 tokens; layer 0 takes 100, the other four share 50 (87.5% pruned)
  req.robustness = {1.0, 1.0, 2.0, 3.0, 4.0};
  AllocationInfo info;
  const auto b = BudgetAllocator().allocate(AllocationPolicy::kProportional, req, nullptr, &info);
  // Smallest feasible cap: 4 (1 - cap) 100 = 50 -> cap = 0.875; every layer keeps 12.5, rounded
  // with ties to the lower layers.
  REQUIRE(info.prune_cap == Approx(0.875).margin(1e-9));
  REQUIRE(b == std::vector<int>{100, 13, 13, 12, 12});
  REQUIRE_FALSE(info.protected_reduced);
  // Not even layer 0 fits beside the others' floors: layer 0 gets what is left.
  req.keep_ratio = 0.5;
  req.floors = std::vector<int>(5, 40);
  const auto c = BudgetAllocator().allocate(AllocationPolicy::kProportional, req, nullptr, &info);
  REQUIRE(c == std::vector<int>{90, 40, 40, 40, 40});
  REQUIRE(info.protected_reduced);
}

TEST_CASE("proportional from a profile: sensitive layers pruned less", "[allocator]") {
  SensitivityProfile p;
  p.keep_ratios = {0.2, 0.5};
  p.loss.resize(4, 2);
  p.loss << 1.0, 0.5,  // layer 0 (protected anyway)
      1.0, 0.5,         // sensitive
      0.1, 0.05,        // robust
      0.5, 0.25;
  BudgetRequest req;
  req.lengths = std::vector<int>(4, 200);
  req.keep_ratio = 0.6;
  req.sensitivity_keep_ratio = 0.6;
  AllocationInfo info;
  // Sensitivities at keep 0.6: 0.4, 0.04, 0.2 -> s = 2.5, 25, 5. Layer 2 saturates (keeps 60),
  // the remaining 180 pruned tokens: a (2.5 + 5) 200 = 180 -> a = 0.12.
  const auto b = BudgetAllocator().allocate(AllocationPolicy::kProportional, req, &p, &info);
  REQUIRE(b == std::vector<int>{200, 140, 60, 80});
  REQUIRE(info.scores[1] == Approx(1.0 / (0.4 + 1e-6)));
  // Default: sensitivity = mean loss over the probed ratios (0.75, 0.075, 0.375 for layers 1-3):
  // 1.5x the values at 0.6, so the same split, with other scores.
  req.sensitivity_keep_ratio = 0.0;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kProportional, req, &p, &info) == b);
  REQUIRE(info.scores[1] == Approx(1.0 / (0.75 + 1e-6)));
  req.sensitivity_keep_ratio = 0.6;
  req.protect_layer0 = false;
  const auto c = BudgetAllocator().allocate(AllocationPolicy::kProportional, req, &p);
  REQUIRE(c == std::vector<int>{155, 155, 60, 110});
  // bad eps and ratio: the messages name the proportional family's allocation, as its other checks
  req.sensitivity_eps = 0.0;
  REQUIRE_THROWS_WITH(
      BudgetAllocator().allocate(AllocationPolicy::kProportional, req, &p),
      Catch::StartsWith("depthkv: allocate_proportional_family: proportional: sensitivity_eps 0"));
  req.sensitivity_eps = 1e-6;
  req.sensitivity_keep_ratio = 2.0;
  REQUIRE_THROWS_WITH(
      BudgetAllocator().allocate(AllocationPolicy::kProportional, req, &p),
      Catch::StartsWith("depthkv: allocate_proportional_family: proportional: sensitivity_keep_ratio 2"));
}

TEST_CASE("middle and mlp keep the middle layers full", "[allocator]") {
  BudgetRequest req;
  req.lengths = std::vector<int>(6, 100);
  req.total_tokens = 360;
  req.n_middle = 2;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kMiddle, req) == std::vector<int>{40, 40, 100, 100, 40, 40});
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kMLP, req) == std::vector<int>{40, 40, 100, 100, 40, 40});
  req.n_middle = 3;  // (6 - 3) / 2 = 1: layers 1, 2, 3
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kMiddle, req) == std::vector<int>{20, 100, 100, 100, 20, 20});
  // Too small to keep them full: they share what is above the others' floors.
  req.floors = std::vector<int>(6, 10);
  req.total_tokens = 100;
  AllocationInfo info;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kMiddle, req, nullptr, &info) ==
          std::vector<int>{10, 24, 23, 23, 10, 10});
  REQUIRE(info.protected_reduced);
}

TEST_CASE("mga and mlma follow the InfoNCE scores", "[allocator]") {
  BudgetRequest req;
  req.lengths = std::vector<int>(8, 100);
  req.keep_ratio = 0.5;
  req.infonce = {1.0, 1.0, 3.0, 2.0, 2.0, 1.0, 3.0, 2.0};
  const auto m = BudgetAllocator().allocate(AllocationPolicy::kMGA, req);
  REQUIRE(m[0] == 100);
  REQUIRE(sum(m) == 400);
  REQUIRE(m[1] > m[3]);  // lower InfoNCE -> more critical -> less pruning
  REQUIRE(m[3] > m[2]);
  for (int x : m) REQUIRE(x >= 30);
  REQUIRE(m == std::vector<int>{100, 68, 30, 35, 35, 67, 30, 35});
  req.keep_ratio = 0.75;  // layers 0 and 2..5 full (500), layers 1, 6, 7 keep 100 of 300
  const auto k = BudgetAllocator().allocate(AllocationPolicy::kMLMA4, req);
  REQUIRE(k == std::vector<int>{100, 40, 100, 100, 100, 100, 30, 30});
}

TEST_CASE("predicted loss by hand", "[allocator]") {
  SensitivityProfile p;
  p.keep_ratios = {0.2, 0.5};
  p.loss.resize(1, 2);
  p.loss << 0.1, 0.6;  // non-convex: hull from (0, 0.1) straight to (1, 0)
  const std::vector<int> len = {10};
  REQUIRE(depthkv::predicted_loss(p, {5}, len, false) == Approx(0.6));
  REQUIRE(depthkv::predicted_loss(p, {5}, len, true) == Approx(0.05));
  REQUIRE(depthkv::predicted_loss(p, {10}, len) == Approx(0.0));
  REQUIRE_THROWS_AS(depthkv::predicted_loss(p, {11}, len), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::predicted_loss(p, {1, 1}, len), depthkv::Error);
}

TEST_CASE("every error path says which", "[allocator]") {
  BudgetAllocator alloc;
  SensitivityProfile p;
  p.keep_ratios = {0.2, 0.5};
  p.loss = Eigen::MatrixXd::Constant(3, 2, 0.1);
  auto base = [] {
    BudgetRequest r;
    r.lengths = {100, 100, 100};
    r.total_tokens = 150;
    return r;
  };
  using Catch::Contains;
  BudgetRequest r = base();
  r.floors = {60, 60, 60};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("floors sum to 180"));
  r = base();
  r.total_tokens = 301;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("exceeds the sum of the caps"));
  r = base();
  r.caps = {10, 10, 10};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("exceeds the sum of the caps (30"));
  r = base();
  r.caps = {10, 200, 10};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("layer 1: cap 200"));
  r = base();
  r.caps = {10, 100, 100};
  r.floors = {20, 0, 0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("layer 0: floor 20 above cap 10"));
  r = base();
  r.floors = {0, -1, 0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("negative floor"));
  r = base();
  r.floors = {0, 0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("floors has 2 entries"));
  r = base();
  r.caps = {0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("caps has 1 entries"));
  r = base();
  r.lengths = {100, -3, 100};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("negative length"));
  r = base();
  r.keep_ratio = 0.5;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("both total_tokens and keep_ratio"));
  r = base();
  r.total_tokens = -1;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("neither"));
  r.keep_ratio = 1.5;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("keep_ratio 1.5 is outside"));
  r.keep_ratio = std::nan("");
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("outside [0, 1]"));
  r = base();
  r.total_tokens = -5;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kUniform, r), Contains("negative"));
  r = base();
  r.min_tokens = -1;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r, &p), Contains("min_tokens -1"));

  // Profiles.
  r = base();
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r), Contains("needs a SensitivityProfile"));
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kProportional, r), Contains("needs a SensitivityProfile"));
  SensitivityProfile bad = p;
  bad.loss(1, 0) = std::nan("");
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r, &bad), Contains("layer 1 at keep ratio 0.2 is not finite"));
  bad = p;
  bad.loss(2, 1) = -0.5;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r, &bad), Contains("negative"));
  bad = p;
  bad.keep_ratios = {0.5, 0.2};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r, &bad), Contains("not strictly ascending"));
  bad = p;
  bad.loss = Eigen::MatrixXd::Constant(4, 2, 0.1);
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r, &bad), Contains("the profile has 4 layers, the request 3"));
  bad = p;
  bad.loss = Eigen::MatrixXd::Constant(3, 3, 0.1);
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kOptimal, r, &bad), Contains("shape mismatch"));

  // Scores and policy parameters.
  r = base();
  r.robustness = {1.0, -1.0, 1.0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kProportional, r), Contains("robustness of layer 1"));
  r.robustness = {1.0, 1.0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kProportional, r), Contains("robustness has 2 entries"));
  r.robustness = {1.0, 0.0, 0.0};
  r.total_tokens = 250;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kProportional, r), Contains("robustness score 0"));
  r = base();
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kMGA, r), Contains("infonce has 0 entries"));
  r.infonce = {1.0, std::nan(""), 1.0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kMLMA2, r), Contains("infonce of layer 1"));
  r = base();
  r.infonce = {1.0, 1.0, 1.0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kMLMA4, r), Contains("only 3 layers"));
  r = base();
  r.n_middle = -1;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kMiddle, r), Contains("negative number of middle layers"));
  r = base();
  r.max_prune_ratio = 1.2;
  r.robustness = {1.0, 1.0, 1.0};
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kProportional, r), Contains("max_prune_ratio 1.2"));
  r = base();
  r.window = -1;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kPyramid, r), Contains("negative window"));
  r = base();
  r.beta = 0.0;
  REQUIRE_THROWS_WITH(alloc.allocate(AllocationPolicy::kPyramid, r), Contains("beta 0"));
}

TEST_CASE("window caps: a local layer is capped at window - 1, the rest goes to the global layers", "[allocator][window]") {
  using depthkv::cap_to_windows;
  using depthkv::window_caps;
  REQUIRE(window_caps({100, 100, 100}, {}) == std::vector<int>{100, 100, 100});
  REQUIRE(window_caps({100, 100, 5}, {16, 0, 16}) == std::vector<int>{15, 100, 5});
  REQUIRE_THROWS_AS(window_caps({1, 2}, {1}), depthkv::Error);
  REQUIRE_THROWS_AS(window_caps({1, 2}, {1, -1}), depthkv::Error);
  depthkv::BudgetRequest req;
  req.lengths = {100, 100, 100, 100};
  req.keep_ratio = 0.3;  // 120 tokens
  req.floors = {20, 20, 20, 20};
  cap_to_windows(req, {16, 16, 16, 0});
  REQUIRE(req.caps == std::vector<int>{15, 15, 15, 100});
  REQUIRE(req.floors == std::vector<int>{15, 15, 15, 20});
  const std::vector<int> b = depthkv::BudgetAllocator().allocate(depthkv::AllocationPolicy::kUniform, req);
  REQUIRE(b == std::vector<int>{15, 15, 15, 75});  // uniform 30 each; the 45 the local layers cannot use go to layer 3
  depthkv::BudgetRequest none = req;
  none.caps.clear();
  cap_to_windows(none, {0, 0, 0, 0});  // no local layer: unchanged
  REQUIRE(none.caps.empty());
}
