// The optimal policy under at most k tiers (BudgetRequest::tiers, budget_allocator.hpp "Tiers"):
// exact totals, at most k tiers whose budgets differ by at most one token, k >= L the exact
// optimum, k = 1 the uniform split, predicted loss never rising with k, and the refusals;
// PruneSpec::tiers through validate, the allocator request and the JSON form.

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "depthkv/budget_allocator.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"

namespace {

using depthkv::AllocationInfo;
using depthkv::AllocationPolicy;
using depthkv::BudgetAllocator;
using depthkv::BudgetRequest;
using depthkv::SensitivityProfile;
using Catch::Matchers::Contains;

/// Curves a (1 - r)^p (convex) or arbitrary values in [0, 2) (non-convex) on 5 probed ratios.
SensitivityProfile tiers_profile(std::mt19937& rng, int n_layers, bool convex) {
  const std::vector<double> ratios = {0.05, 0.1, 0.25, 0.5, 0.75};
  SensitivityProfile p;
  p.keep_ratios = ratios;
  p.loss.resize(n_layers, static_cast<Eigen::Index>(ratios.size()));
  std::uniform_real_distribution<double> amp(0.01, 3.0), pw(1.0, 4.0), u(0.0, 2.0);
  for (int l = 0; l < n_layers; ++l) {
    const double a = amp(rng), e = pw(rng);
    for (std::size_t k = 0; k < ratios.size(); ++k)
      p.loss(l, static_cast<Eigen::Index>(k)) = convex ? a * std::pow(1.0 - ratios[k], e) : u(rng);
  }
  return p;
}

long long tiers_sum(const std::vector<int>& v) {
  long long s = 0;
  for (int x : v) s += x;
  return s;
}

/// Checks the tier structure of `b`: at most k tiers named by `tier`, each tier's budgets
/// within one token of each other, at most 2k distinct values, floors and caps, the exact sum.
void check_tier_structure(const std::vector<int>& b, const std::vector<int>& tier, int k, const AllocationInfo& info) {
  REQUIRE(tier.size() == b.size());
  REQUIRE(tiers_sum(b) == info.total);
  std::map<int, std::pair<int, int>> range;  // tier -> (min, max) budget
  for (std::size_t l = 0; l < b.size(); ++l) {
    REQUIRE(b[l] >= info.floors[l]);
    REQUIRE(b[l] <= info.caps[l]);
    REQUIRE(tier[l] >= 0);
    REQUIRE(tier[l] < k);
    auto it = range.find(tier[l]);
    if (it == range.end()) range[tier[l]] = {b[l], b[l]};
    else it->second = {std::min(it->second.first, b[l]), std::max(it->second.second, b[l])};
  }
  REQUIRE(static_cast<int>(range.size()) <= k);
  for (const auto& r : range) REQUIRE(r.second.second - r.second.first <= 1);
  REQUIRE(std::set<int>(b.begin(), b.end()).size() <= 2 * range.size());
}

}  // namespace

TEST_CASE("tiers: at most k tiers, exact totals, k >= L exact, k = 1 uniform, loss non-increasing in k",
          "[allocator][tiers]") {
  std::mt19937 rng(2028);
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 7);
    const SensitivityProfile p = tiers_profile(rng, L, trial % 3 != 0);
    BudgetRequest req;
    const int n = 16 + static_cast<int>(rng() % 400);
    req.lengths.assign(static_cast<std::size_t>(L), n);
    req.floors = depthkv::protection_floors(req.lengths, {static_cast<int>(rng() % 3), static_cast<int>(rng() % 6)});
    req.min_tokens = trial % 2 == 0 ? 0 : 12;
    req.safeguard_shrink = true;
    const double lowest = (req.floors[0] + 1.0) / n;  // the budget above the hard floors
    req.keep_ratio = std::uniform_real_distribution<double>(std::max(0.05, lowest), 0.95)(rng);
    INFO("trial " << trial << ", " << L << " layers of " << n << ", keep " << req.keep_ratio);
    const std::vector<int> exact = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p);
    const double exact_loss = depthkv::predicted_loss(p, exact, req.lengths);
    double prev = std::numeric_limits<double>::infinity();
    for (int k = 1; k <= L + 1; ++k) {
      INFO("tiers " << k);
      req.tiers = k;
      AllocationInfo info;
      const std::vector<int> b = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info);
      check_tier_structure(b, info.tier, k, info);
      const double loss = depthkv::predicted_loss(p, b, req.lengths);
      REQUIRE(loss <= prev + 1e-12 * std::max(1.0, prev));
      REQUIRE(loss >= exact_loss - 1e-12 * std::max(1.0, exact_loss));
      prev = loss;
      if (k >= L) REQUIRE(b == exact);
      if (k == 1) {  // the uniform split over the effective floors (the uniform policy without a safeguard)
        BudgetRequest u = req;
        u.tiers = 0;
        u.floors = info.floors;
        u.min_tokens = 0;
        REQUIRE(b == BudgetAllocator().allocate(AllocationPolicy::kUniform, u));
      }
    }
    req.tiers = 0;  // 0 is no limit
    REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p) == exact);
  }
}

TEST_CASE("tiers: two kinds of layers in two tiers lose nothing, one tier costs more", "[allocator][tiers]") {
  // layers 0, 2, 4 steep (sensitive), 1, 3 flat: two tiers hold the optimum's predicted loss
  SensitivityProfile p;
  p.keep_ratios = {0.1, 0.25, 0.5, 0.75};
  p.loss.resize(5, 4);
  for (int l = 0; l < 5; ++l) {
    if (l % 2 == 0) p.loss.row(l) << 4.0, 2.0, 0.8, 0.2;
    else p.loss.row(l) << 0.4, 0.2, 0.08, 0.02;
  }
  BudgetRequest req;
  req.lengths.assign(5, 200);
  req.total_tokens = 310;  // the optimum: 150 to each steep layer's 0.5, then 10 more to layer 0
  const std::vector<int> exact = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p);
  const double exact_loss = depthkv::predicted_loss(p, exact, req.lengths);
  req.tiers = 2;
  AllocationInfo info;
  const std::vector<int> two = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info);
  REQUIRE(exact == std::vector<int>{110, 0, 100, 0, 100});
  REQUIRE(two == std::vector<int>{104, 0, 103, 0, 103});  // the steep tier's 310 split as uniform does
  REQUIRE(info.tier == std::vector<int>{1, 0, 1, 0, 1});  // tier 0: the flat layers (smaller budgets)
  REQUIRE(depthkv::predicted_loss(p, two, req.lengths) == Approx(exact_loss).epsilon(1e-12));
  req.tiers = 1;
  const std::vector<int> one = BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info);
  REQUIRE(one == std::vector<int>(5, 62));
  REQUIRE(info.tier == std::vector<int>(5, 0));
  REQUIRE(depthkv::predicted_loss(p, one, req.lengths) > exact_loss + 0.1);
}

TEST_CASE("tiers: a tier's total not a multiple of its size splits as uniform does (lower layer first)",
          "[allocator][tiers]") {
  SensitivityProfile p;
  p.keep_ratios = {0.5};
  p.loss.resize(3, 1);
  p.loss << 1.0, 1.0, 1.0;
  BudgetRequest req;
  req.lengths = {10, 10, 10};
  req.total_tokens = 17;
  req.tiers = 1;
  AllocationInfo info;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{6, 6, 5});
  REQUIRE(info.tier == std::vector<int>{0, 0, 0});
  // the safeguard's uniform fallback is one tier
  req.min_tokens = 7;
  REQUIRE(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info) == std::vector<int>{6, 6, 5});
  REQUIRE(info.safeguard_fallback);
  REQUIRE(info.tier == std::vector<int>{0, 0, 0});
  // without tiers the info names none
  req.tiers = 0;
  req.min_tokens = 0;
  BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p, &info);
  REQUIRE(info.tier.empty());
}

TEST_CASE("tiers: bad input is refused, naming tiers", "[allocator][tiers]") {
  SensitivityProfile p;
  p.keep_ratios = {0.5};
  p.loss.resize(2, 1);
  p.loss << 1.0, 2.0;
  BudgetRequest req;
  req.lengths = {10, 10};
  req.total_tokens = 8;
  req.tiers = -1;
  REQUIRE_THROWS_WITH(BudgetAllocator().allocate(AllocationPolicy::kOptimal, req, &p),
                      Contains("tiers -1 is negative (0: no limit)"));
  req.tiers = 1;
  for (AllocationPolicy policy : depthkv::all_allocation_policies()) {
    if (policy == AllocationPolicy::kOptimal) continue;
    INFO(depthkv::to_string(policy));
    REQUIRE_THROWS_WITH(BudgetAllocator().allocate(policy, req, &p),
                        Contains("tiers 1: only the optimal policy takes tiers, not '" + depthkv::to_string(policy) + "'"));
  }
  SensitivityProfile heads = p;  // 2 layers x 1 KV head
  REQUIRE_THROWS_WITH(depthkv::head_optimal_budgets(heads, 1, req),
                      Contains("tiers 1: only the optimal policy takes tiers, not 'head-optimal'"));
}

TEST_CASE("PruneSpec::tiers: validate, the allocator request, the JSON form", "[prune_spec][tiers]") {
  depthkv::PruneSpec s;
  s.policy = AllocationPolicy::kOptimal;
  s.budget = depthkv::Budget::keep(0.3);
  s.tiers = 3;
  REQUIRE_NOTHROW(s.validate());
  REQUIRE(s.budget_request({10, 10}).tiers == 3);
  const nlohmann::json j = depthkv::prune_spec_to_json(s);
  REQUIRE(j["tiers"] == 3);
  REQUIRE(depthkv::prune_spec_from_json(j, "spec") == s);
  depthkv::PruneSpec none = s;
  none.tiers = 0;
  REQUIRE_FALSE(none == s);
  REQUIRE_FALSE(depthkv::prune_spec_to_json(none).contains("tiers"));  // older files are written as before
  nlohmann::json old = j;
  old.erase("tiers");  // a file from before tiers: no limit
  REQUIRE(depthkv::prune_spec_from_json(old, "spec").tiers == 0);
  nlohmann::json bad = j;
  bad["tiers"] = -2;
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"), Contains("spec.tiers"));
  bad["tiers"] = 2;
  bad["policy"] = "uniform";
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"),
                      Contains("tiers (2): only the optimal policy takes tiers, not uniform"));
  s.tiers = -1;
  REQUIRE_THROWS_WITH(s.validate(), Contains("tiers must be >= 0 (0: no limit), got -1"));
  s.tiers = 2;
  s.policy = AllocationPolicy::kHeadOptimal;
  REQUIRE_THROWS_WITH(s.validate(), Contains("only the optimal policy takes tiers, not head-optimal"));
}
