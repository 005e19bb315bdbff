// PruneSpec: one validate() naming every bad field, one JSON form (and the legacy selection
// spellings), the conversions to the allocator, the schedule and score_and_evict.

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"

namespace {

using depthkv::PruneSpec;
using Catch::Matchers::Contains;

/// A spec with every field away from its default (a valid one).
PruneSpec prune_spec_sample() {
  PruneSpec s;
  s.scorer = depthkv::scorer_config("snapkv");
  s.scorer.window = 8;
  s.scorer.kernel = 5;
  s.scorer.pooling = depthkv::Pooling::kAvg;
  s.scorer.output_aware = true;
  s.protection = {2, 6};
  s.budget = depthkv::Budget::keep(0.3);
  s.policy = depthkv::AllocationPolicy::kOptimal;
  s.head_split = {depthkv::HeadAllocation::kAdaptive, 0.4};
  s.schedule = {depthkv::ScheduleMode::kDecode, 64, 16};
  s.safeguard = depthkv::Safeguard::from_min_tokens(12);
  s.safeguard.margin = 3;
  return s;
}

/// `edit` applied to a valid spec must make validate() throw with `message`.
void prune_spec_refused(const std::function<void(PruneSpec&)>& edit, const std::string& message) {
  PruneSpec s = prune_spec_sample();
  edit(s);
  INFO(message);
  REQUIRE_THROWS_WITH(s.validate(), Contains(message));
}

}  // namespace

TEST_CASE("PruneSpec::validate names every bad field and bound", "[prune_spec]") {
  REQUIRE_NOTHROW(prune_spec_sample().validate());
  REQUIRE_NOTHROW(PruneSpec().validate());
  prune_spec_refused([](PruneSpec& s) { s.scorer.window = 0; }, "scorer.window must be >= 1, got 0");
  prune_spec_refused([](PruneSpec& s) { s.scorer.kernel = 4; }, "scorer.kernel must be odd and >= 1, got 4");
  prune_spec_refused([](PruneSpec& s) { s.scorer.kernel = -1; }, "scorer.kernel must be odd and >= 1, got -1");
  prune_spec_refused([](PruneSpec& s) { s.scorer.lookahead = -1; }, "scorer.lookahead must be >= 0, got -1");
  prune_spec_refused([](PruneSpec& s) { s.scorer.kind = depthkv::ScorerKind::kKeyNorm; },
                     "scorer.output_aware: only for h2o, snapkv and tova, not knorm");
  for (const auto& [kind, name] : {std::pair{depthkv::ScorerKind::kKeyNorm, "knorm"},
                                   std::pair{depthkv::ScorerKind::kKeyDiff, "keydiff"}}) {
    const depthkv::ScorerKind k = kind;  // the key-only scorers observe nothing: no lookahead
    prune_spec_refused(
        [k](PruneSpec& s) {
          s.scorer.output_aware = false;
          s.scorer.kind = k;
          s.scorer.lookahead = 4;
          s.schedule.mode = depthkv::ScheduleMode::kOneshot;
        },
        std::string("scorer.lookahead: ") + name + " observes no attention");
  }
  prune_spec_refused([](PruneSpec& s) { s.protection.n_sink = -1; }, "protection must be >= 0, got n_sink -1");
  prune_spec_refused([](PruneSpec& s) { s.protection.n_recent = -2; }, "n_recent -2");
  prune_spec_refused([](PruneSpec& s) { s.budget = depthkv::Budget::keep(1.5); }, "budget: keep ratio 1.5 is outside [0, 1]");
  prune_spec_refused([](PruneSpec& s) { s.budget = depthkv::Budget::keep(-0.1); }, "budget: keep ratio -0.1");
  prune_spec_refused([](PruneSpec& s) { s.budget = depthkv::Budget::keep(std::nan("")); }, "budget: keep ratio nan");
  prune_spec_refused([](PruneSpec& s) { s.budget = depthkv::Budget::tokens(-5); }, "budget: total_tokens -5 is negative");
  prune_spec_refused([](PruneSpec& s) { s.head_split.alpha = 1.5; }, "head_split.alpha 1.5 outside [0, 1]");
  prune_spec_refused([](PruneSpec& s) { s.head_split.alpha = -0.5; }, "head_split.alpha -0.5 outside [0, 1]");
  prune_spec_refused([](PruneSpec& s) { s.schedule.chunk = 0; }, "schedule.chunk must be >= 1, got 0");
  prune_spec_refused([](PruneSpec& s) { s.schedule.interval = 0; }, "schedule.interval must be >= 1, got 0");
  prune_spec_refused([](PruneSpec& s) { s.scorer.lookahead = 8; },
                     "schedule.decode evicts while the context is read; scorer.lookahead (8)");
  prune_spec_refused(
      [](PruneSpec& s) {
        s.safeguard.mode = depthkv::Safeguard::Mode::kTokens;
        s.safeguard.tokens = 0;
      },
      "safeguard.tokens must be >= 1, got 0");
  prune_spec_refused([](PruneSpec& s) { s.safeguard.margin = -1; }, "safeguard.margin must be >= 0, got -1");
}

TEST_CASE("PruneSpec JSON: a round trip of every field, the selection subset, refusals", "[prune_spec]") {
  const PruneSpec s = prune_spec_sample();
  const nlohmann::json j = depthkv::prune_spec_to_json(s);
  const PruneSpec back = depthkv::prune_spec_from_json(j, "spec");
  REQUIRE(back == s);
  REQUIRE(depthkv::prune_spec_to_json(back) == j);
  REQUIRE(j["budget"] == nlohmann::json{{"keep", 0.3}});
  REQUIRE(j["schedule"]["mode"] == "decode");
  REQUIRE(j["safeguard"]["min_tokens"] == 12);
  REQUIRE(j["policy"] == "optimal");
  // a token budget and head-optimal
  PruneSpec t = s;
  t.budget = depthkv::Budget::tokens(4096);
  t.policy = depthkv::AllocationPolicy::kHeadOptimal;
  t.safeguard = depthkv::Safeguard::from_min_tokens(0);
  REQUIRE(depthkv::prune_spec_from_json(depthkv::prune_spec_to_json(t), "spec") == t);
  REQUIRE_FALSE(depthkv::prune_spec_from_json(depthkv::prune_spec_to_json(t), "spec") == s);
  // the selection subset: no scorer, budget, policy, schedule or safeguard
  const nlohmann::json sel = depthkv::prune_spec_to_json(s, depthkv::SpecFields::kSelection);
  for (const char* key : {"scorer", "budget", "policy", "schedule", "safeguard"}) REQUIRE_FALSE(sel.contains(key));
  REQUIRE(depthkv::prune_spec_from_json(sel, "sel").same_selection(s));
  // refusals name the key
  nlohmann::json bad = j;
  bad["budget"] = {{"keep", 0.5}, {"tokens", 9}};
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"), Contains("'spec.budget' must be"));
  bad = j;
  bad["schedule"]["mode"] = "sometimes";
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"), Contains("unknown schedule 'sometimes'"));
  bad = j;
  bad["policy"] = "best";
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"), Contains("unknown allocation policy 'best'"));
  bad = j;
  bad["budget"]["keep"] = 2.0;
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"),
                      Contains("bad selection settings in 'spec'") && Contains("keep ratio 2 is outside [0, 1]"));
  bad = j;
  bad.erase("kernel");
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"), Contains("missing key 'spec.kernel'"));
  // the older spelling of a profile's selection, read by the one legacy reader
  const PruneSpec old = depthkv::selection_from_json({{"n_sink", 2}, {"n_recent", 8}, {"window", 4}, {"kernel", 5}}, "s");
  REQUIRE(old.describe_selection() == "sinks=2 recent=8 obs_window=4 kernel=5 pooling=max");
}

TEST_CASE("PruneSpec: the allocator request, the schedule and score_and_evict come from one spec", "[prune_spec]") {
  PruneSpec s;
  s.protection = {4, 16};
  s.scorer.window = 16;
  s.budget = depthkv::Budget::keep(0.25);
  const depthkv::BudgetRequest r = s.budget_request({100, 100, 10});
  REQUIRE(r.keep_ratio == 0.25);
  REQUIRE(r.total_tokens == -1);
  REQUIRE(r.floors == std::vector<int>{20, 20, 10});
  REQUIRE(r.min_tokens == 4 + 16 + depthkv::kSafeguardMargin);
  REQUIRE(r.safeguard_shrink);
  REQUIRE(r.window == 16);
  s.budget = depthkv::Budget::tokens(90);
  s.safeguard = depthkv::Safeguard::from_min_tokens(0);
  const depthkv::BudgetRequest t = s.budget_request({100, 100, 10});
  REQUIRE(t.total_tokens == 90);
  REQUIRE(t.keep_ratio == -1.0);
  REQUIRE(t.min_tokens == 0);
  REQUIRE_FALSE(t.safeguard_shrink);
  // allocate: layer policies through BudgetAllocator, head-optimal refused without head curves
  const depthkv::Allocation a = depthkv::allocate(s, {100, 100, 10}, {});
  REQUIRE(a.layers == depthkv::BudgetAllocator().allocate(depthkv::AllocationPolicy::kUniform, t));
  s.policy = depthkv::AllocationPolicy::kHeadOptimal;
  REQUIRE_THROWS_WITH(depthkv::allocate(s, {100, 100, 10}, {}), Contains("head-optimal needs head curves"));
  REQUIRE_THROWS_WITH(depthkv::detail::schedule_config(s, {}), Contains("head-optimal needs head curves"));
  REQUIRE_THROWS_WITH(depthkv::BudgetAllocator().allocate(depthkv::AllocationPolicy::kHeadOptimal, t),
                      Contains("head-optimal gives per-head budgets"));
  // the schedule's config carries every field of the spec
  s.policy = depthkv::AllocationPolicy::kUniform;
  s.schedule = {depthkv::ScheduleMode::kChunked, 32, 8};
  s.head_split = {depthkv::HeadAllocation::kAdaptive, 0.3};
  const depthkv::detail::ScheduleConfig sc = depthkv::detail::schedule_config(s, {});
  REQUIRE(sc.budget.total_tokens == 90);
  REQUIRE(sc.budget.lengths.empty());
  REQUIRE(sc.budget.floors.empty());
  REQUIRE(sc.interval == 8);
  REQUIRE(sc.protection.n_sink == 4);
  REQUIRE(sc.head_allocation == depthkv::HeadAllocation::kAdaptive);
  REQUIRE(sc.head_alpha == 0.3);
  // and the oneshot request the same settings
  const depthkv::detail::PruneRequest pr = depthkv::detail::prune_request(s, {});
  REQUIRE(pr.budget.total_tokens == 90);
  REQUIRE(pr.budget.lengths.empty());
  REQUIRE(pr.protection.n_sink == 4);
  REQUIRE(pr.head_allocation == depthkv::HeadAllocation::kAdaptive);
  REQUIRE(pr.head_alpha == 0.3);
  REQUIRE(pr.floors_from_protection);
  s.policy = depthkv::AllocationPolicy::kHeadOptimal;
  REQUIRE_THROWS_WITH(depthkv::detail::prune_request(s, {}), Contains("head-optimal needs head curves"));
  REQUIRE(depthkv::parse_allocation_policy("head-optimal") == depthkv::AllocationPolicy::kHeadOptimal);
  REQUIRE(depthkv::to_string(depthkv::parse_schedule_mode("decode")) == "decode");
}

TEST_CASE("raise_to_protection: a keep ratio below the protected tokens becomes their total", "[prune_spec]") {
  PruneSpec s;
  s.protection = {4, 16};
  s.budget = depthkv::Budget::keep(0.25);
  PruneSpec r = s;
  CHECK_FALSE(depthkv::raise_to_protection(r, {100, 100, 10}));  // 53 tokens >= the 50 protected
  CHECK(r.budget == s.budget);
  r.budget = depthkv::Budget::keep(0.2);                            // 42 < 50
  CHECK(depthkv::raise_to_protection(r, {100, 100, 10}));
  CHECK(r.budget == depthkv::Budget::tokens(50));
  r.budget = depthkv::Budget::keep(0.5);                            // 5 held, all protected: keep them
  CHECK(depthkv::raise_to_protection(r, {5, 5}));
  CHECK(r.budget == depthkv::Budget::tokens(10));
  r.budget = depthkv::Budget::tokens(3);                            // a token total is the caller's
  CHECK_FALSE(depthkv::raise_to_protection(r, {5, 5}));
  CHECK(r.budget == depthkv::Budget::tokens(3));
}

TEST_CASE("pool_over_spans: each slot scores its span's best, per head, by original position", "[prune_spec][span]") {
  depthkv::HostLayer<float> layer(2, 1);  // 2 KV heads, head_dim 1
  const float kv[2] = {0.0f, 0.0f};
  for (int p = 0; p < 8; ++p) layer.append(kv, kv, p);
  // head 1 lost positions 2 and 3 (an earlier eviction): slots hold 0 1 4 5 6 7
  std::vector<std::int32_t> kept = {0, 1, 4, 5, 6, 7};
  layer.compact(1, kept.data(), static_cast<int>(kept.size()));
  // spans: {0}, {1, 2, 3}, {4, 5}, {6}; position 7 is beyond the spans (a span of its own)
  const std::vector<std::int32_t> span_start = {0, 1, 1, 1, 4, 4, 6};
  depthkv::LayerScores s = {{0.1f, 0.2f, 0.9f, 0.3f, 0.5f, 0.4f, 0.6f, 0.7f},
                            {0.1f, 0.2f, 0.4f, std::nanf(""), 0.6f, 0.7f}};
  depthkv::detail::pool_over_spans(layer, s, span_start);
  CHECK(s[0] == std::vector<float>{0.1f, 0.9f, 0.9f, 0.9f, 0.5f, 0.5f, 0.6f, 0.7f});
  REQUIRE(s[1].size() == 6);
  CHECK(s[1][0] == 0.1f);
  CHECK(s[1][1] == 0.2f);  // position 1: its span's other positions are gone from this head
  CHECK(s[1][2] == 0.4f);
  CHECK(std::isnan(s[1][3]));  // a NaN stays for the evictor to refuse
  CHECK(s[1][4] == 0.6f);
  CHECK(s[1][5] == 0.7f);
  // the spec's JSON carries the flag (written when true)
  PruneSpec spec;
  spec.scorer.span_pooling = true;
  const nlohmann::json j = depthkv::prune_spec_to_json(spec);
  REQUIRE(j.at("span_pooling") == true);
  REQUIRE(depthkv::prune_spec_from_json(j, "spec") == spec);
  REQUIRE(!depthkv::prune_spec_to_json(PruneSpec{}).contains("span_pooling"));
  REQUIRE(spec.describe_selection().find(" span_pooling=1") != std::string::npos);
  nlohmann::json bad = j;
  bad["span_pooling"] = 1;
  REQUIRE_THROWS_WITH(depthkv::prune_spec_from_json(bad, "spec"), Contains("'spec.span_pooling' must be a boolean"));
  PruneSpec other = spec;
  other.scorer.span_pooling = false;
  REQUIRE(!(other == spec));
}
