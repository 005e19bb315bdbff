// Tests of the presets (preset.hpp): "best"'s per-input rule (normalized_nll, preset_trusts_input,
// preset_fallback_spec) on constructed signals, and "retrieval"'s spec, floor and fallback.

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "depthkv/preset.hpp"

using namespace depthkv;

TEST_CASE("preset_trusts_input: keeps the lookahead on predictable text, falls back on unpredictable text",
          "[preset][trust]") {
  const double ln512 = std::log(512.0);
  REQUIRE(normalized_nll(ln512, 512) == Approx(1.0));
  REQUIRE(normalized_nll(0.0, 2) == 0.0);
  // story-like text (NLL ~1.3 nats over 512 tokens) is trusted, text far worse than guessing is not
  REQUIRE(preset_trusts_input("best", 1.3, 512));
  REQUIRE(preset_trusts_input("best", ln512, 512));
  REQUIRE(!preset_trusts_input("best", 2.0 * ln512, 512));
  // the threshold is inclusive and scales with the vocabulary
  REQUIRE(preset_trusts_input("best", kPresetMaxNormalizedNll * ln512 * 0.9999, 512));
  REQUIRE(!preset_trusts_input("best", kPresetMaxNormalizedNll * ln512 * 1.001, 512));
  const double ln32k = std::log(32000.0);
  REQUIRE(preset_trusts_input("best", 0.99 * kPresetMaxNormalizedNll * ln32k, 32000));
  REQUIRE(!preset_trusts_input("best", 0.99 * kPresetMaxNormalizedNll * ln32k, 512));
  REQUIRE_THROWS_WITH(preset_trusts_input("fast", 1.0, 512), Catch::Contains("unknown preset 'fast'"));
  REQUIRE_THROWS_WITH(normalized_nll(-1.0, 512), Catch::Contains("negative or NaN"));
  REQUIRE_THROWS_WITH(normalized_nll(std::nan(""), 512), Catch::Contains("negative or NaN"));
  REQUIRE_THROWS_WITH(normalized_nll(1.0, 1), Catch::Contains("vocabulary of 1 tokens"));
}

TEST_CASE("preset_fallback_spec: plain SnapKV, uniform budgets, no lookahead, the request's protection and budget",
          "[preset][trust]") {
  PruneSpec base;
  base.protection = {4, 16};
  base.budget = Budget::keep(0.3);
  base.scorer.window = 16;
  base.scorer.kernel = 5;
  const PruneSpec best = preset_spec("best", base);
  REQUIRE(best.scorer.lookahead == kPresetLookahead);
  const PruneSpec fb = preset_fallback_spec("best", best);
  REQUIRE(scorer_name(fb.scorer) == "snapkv");
  REQUIRE(!fb.scorer.output_aware);
  REQUIRE(fb.scorer.lookahead == 0);
  REQUIRE(fb.scorer.pooling == ScorerConfig().pooling);
  REQUIRE(fb.scorer.window == 16);
  REQUIRE(fb.scorer.kernel == 5);
  REQUIRE(fb.policy == AllocationPolicy::kUniform);
  REQUIRE(fb.head_split.mode == HeadAllocation::kUniform);
  REQUIRE(fb.protection.n_sink == 4);
  REQUIRE(fb.protection.n_recent == 16);
  REQUIRE(fb.budget.ratio() == 0.3);
  fb.validate();
}

TEST_CASE("preset \"retrieval\": snapkv-keydiff, not output-aware, a floor of half the uniform budget per head",
          "[preset][retrieval]") {
  REQUIRE(preset_candidates("retrieval") == std::vector<std::string>{"snapkv-keydiff"});
  PruneSpec base;
  base.protection = {4, 16};
  base.budget = Budget::keep(0.25);
  const PruneSpec r = preset_spec("retrieval", base);
  REQUIRE(scorer_name(r.scorer) == "snapkv-keydiff");
  REQUIRE(!r.scorer.output_aware);
  REQUIRE(r.scorer.lookahead == kPresetLookahead);
  REQUIRE(r.policy == AllocationPolicy::kHeadOptimal);
  r.validate();
  // the floor: half of keep * n per head when above the automatic one (4 + 16 + 8 = 28) ...
  const std::vector<int> lengths(30, 4000);
  REQUIRE(uniform_fraction_floor(r, lengths, kRetrievalUniformFloor).min_tokens() == 500);  // 0.5 * 0.25 * 4000
  PruneSpec t = r;
  t.budget = Budget::tokens(30 * 1000);
  REQUIRE(uniform_fraction_floor(t, lengths, kRetrievalUniformFloor).min_tokens() == 500);  // 0.5 * 30000 / 30
  // ... the automatic floor when that is larger, and the request's own safeguard untouched
  // 0.5 * 50 = 25 < 28
  REQUIRE(uniform_fraction_floor(r, std::vector<int>(30, 200), kRetrievalUniformFloor).min_tokens() == -1);
  PruneSpec own = r;
  own.safeguard = Safeguard::from_min_tokens(0);
  REQUIRE(uniform_fraction_floor(own, lengths, kRetrievalUniformFloor).min_tokens() == 0);
  // its fallback keeps the retrieval-safe scorer; a profile without its head curves is refused
  const PruneSpec fb = preset_fallback_spec("retrieval", r);
  REQUIRE(scorer_name(fb.scorer) == "snapkv-keydiff");
  REQUIRE(fb.policy == AllocationPolicy::kUniform);
  REQUIRE(fb.scorer.lookahead == 0);
  REQUIRE_THROWS_WITH(preset("retrieval", ProfileFile{}, base, lengths),
                      Catch::Contains("no complete head curves of any of the scorers snapkv-keydiff"));
}
