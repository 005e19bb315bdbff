// Tests of the context weight (ScorerConfig::context_weight): a lookahead scorer that also
// observes the context's own SnapKV window, s_j = l_j + w * (L / C) * c_j, against a reference
// computed by hand from constructed rows; its checks; and "best"'s spec and JSON.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "depthkv/kv_cache.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/token_scorer.hpp"

using namespace depthkv;

namespace {

// Row `r` (position r) of the constructed attention over `n` slots of query head `q`.
std::vector<float> cw_row(int q, int r, int n) {
  std::vector<float> p(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) p[static_cast<std::size_t>(j)] = static_cast<float>(((j * 7 + r * 3 + q * 5) % 11) + 1) / 64.0f;
  return p;
}

// Feeds `ctx` context rows (positions 0..ctx-1, each over slots 0..pos) then, after
// begin_lookahead, `G` lookahead rows (positions ctx..ctx+G-1, over ctx + g + 1 slots), to both
// query heads; then keeps the context's `ctx` slots, as observe_lookahead does.
void cw_feed(TokenScorer& s, int ctx, int G) {
  for (int r = 0; r < ctx; ++r)
    for (int q = 0; q < 2; ++q) s.observe(q, r, cw_row(q, r, r + 1).data(), r + 1);
  s.begin_lookahead();
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < 2; ++q) s.observe(q, ctx + g, cw_row(q, ctx + g, ctx + g + 1).data(), ctx + g + 1);
  std::vector<std::int32_t> prefix;
  for (int j = 0; j < ctx; ++j) prefix.push_back(j);
  s.compact(0, prefix.data(), ctx);
}

// The reference: l_j (the lookahead rows summed over both query heads), c_j (the context's last
// `window` rows), s_j = l_j + w * (L / C) * c_j; kernel 1 (no pooling).
std::vector<double> cw_reference(int ctx, int G, int window, double w) {
  std::vector<double> l(static_cast<std::size_t>(ctx)), c(static_cast<std::size_t>(ctx)), s(static_cast<std::size_t>(ctx));
  double L = 0, C = 0;
  for (int q = 0; q < 2; ++q) {
    for (int g = 0; g < G; ++g) {
      const std::vector<float> p = cw_row(q, ctx + g, ctx + g + 1);
      for (int j = 0; j < ctx; ++j) l[static_cast<std::size_t>(j)] += p[static_cast<std::size_t>(j)];
    }
    for (int r = ctx - window; r < ctx; ++r) {
      const std::vector<float> p = cw_row(q, r, r + 1);
      for (int j = 0; j <= r; ++j) c[static_cast<std::size_t>(j)] += p[static_cast<std::size_t>(j)];
    }
  }
  for (int j = 0; j < ctx; ++j) {
    L += l[static_cast<std::size_t>(j)];
    C += c[static_cast<std::size_t>(j)];
  }
  for (int j = 0; j < ctx; ++j)
    s[static_cast<std::size_t>(j)] = l[static_cast<std::size_t>(j)] + w * (L / C) * c[static_cast<std::size_t>(j)];
  return s;
}

HostLayer<float> cw_layer(int n) {
  HostLayer<float> layer(1, 2);
  const float kv[2] = {1, 1};
  for (int i = 0; i < n; ++i) layer.append(kv, kv, i);
  return layer;
}

}  // namespace

TEST_CASE("context_weight: the lookahead score plus the context window's, scaled to the same mass",
          "[scorer][lookahead]") {
  const int ctx = 9, G = 3, window = 4;
  const HostLayer<float> layer = cw_layer(ctx);
  for (ScorerKind kind : {ScorerKind::kH2O, ScorerKind::kSnapKV}) {
    for (double w : {0.25, 1.0, 3.0}) {
      CAPTURE(to_string(kind), w);
      ScorerConfig cfg;
      cfg.kind = kind;
      cfg.window = window;
      cfg.kernel = 1;
      cfg.lookahead = G;
      cfg.context_weight = w;
      TokenScorer s(cfg, /*n_heads=*/2, /*n_kv_heads=*/1);
      cw_feed(s, ctx, G);
      const std::vector<double> ref = cw_reference(ctx, G, window, w);
      const std::vector<float> got = s.scores(layer)[0];
      REQUIRE(got.size() == ref.size());
      for (int j = 0; j < ctx; ++j) REQUIRE(got[static_cast<std::size_t>(j)] == Approx(ref[static_cast<std::size_t>(j)]).epsilon(1e-5));
      // a copy scores the same; reset forgets the context rows and the phase
      const TokenScorer copy = s;
      REQUIRE(copy.scores(layer)[0] == got);
      s.reset();
      REQUIRE(s.scores(layer)[0] == std::vector<float>(static_cast<std::size_t>(ctx), 0.0f));
    }
  }
  // weight 0: the lookahead alone (the context's rows, fed before begin_lookahead, feed the rule as
  // before; here none are fed), which differs from a weight > 0
  ScorerConfig la;
  la.lookahead = G;
  la.window = window;
  la.kernel = 1;
  TokenScorer only(la, 2, 1);
  only.begin_lookahead();
  for (int g = 0; g < G; ++g)
    for (int q = 0; q < 2; ++q) only.observe(q, ctx + g, cw_row(q, ctx + g, ctx + g + 1).data(), ctx + g + 1);
  std::vector<std::int32_t> prefix;
  for (int j = 0; j < ctx; ++j) prefix.push_back(j);
  only.compact(0, prefix.data(), ctx);
  const std::vector<double> l = cw_reference(ctx, G, window, 0.0), mixed = cw_reference(ctx, G, window, 1.0);
  const std::vector<float> got = only.scores(layer)[0];
  double d = 0;
  for (int j = 0; j < ctx; ++j) {
    REQUIRE(got[static_cast<std::size_t>(j)] == Approx(l[static_cast<std::size_t>(j)]).epsilon(1e-5));
    d += std::abs(mixed[static_cast<std::size_t>(j)] - l[static_cast<std::size_t>(j)]);
  }
  REQUIRE(d > 0.1);
}

TEST_CASE("context_weight: a context with no window mass adds nothing", "[scorer][lookahead]") {
  ScorerConfig cfg;
  cfg.kind = ScorerKind::kSnapKV;
  cfg.kernel = 1;
  cfg.lookahead = 1;
  cfg.context_weight = 2.0;
  TokenScorer s(cfg, 1, 1);
  s.begin_lookahead();  // no context rows observed: C = 0
  const float row[3] = {0.5f, 0.25f, 0.25f};
  s.observe(0, 3, row, 3);
  REQUIRE(s.scores(cw_layer(3))[0] == std::vector<float>{0.5f, 0.25f, 0.25f});
}

TEST_CASE("context_weight: refused without a lookahead, when negative or not finite", "[scorer][lookahead]") {
  ScorerConfig cfg;
  cfg.context_weight = 1.0;
  REQUIRE_THROWS_WITH(TokenScorer(cfg, 2, 1), Catch::Contains("needs a lookahead"));
  cfg.lookahead = 4;
  cfg.context_weight = -0.5;
  REQUIRE_THROWS_WITH(TokenScorer(cfg, 2, 1), Catch::Contains("context_weight must be finite and >= 0"));
  cfg.context_weight = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(TokenScorer(cfg, 2, 1), Catch::Contains("context_weight must be finite and >= 0"));
  PruneSpec spec;
  spec.scorer.context_weight = 1.0;
  REQUIRE_THROWS_WITH(spec.validate(), Catch::Contains("scorer.context_weight 1 needs scorer.lookahead > 0"));
  spec.scorer.lookahead = 8;
  spec.validate();
  spec.scorer.context_weight = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_WITH(spec.validate(), Catch::Contains("scorer.context_weight must be finite"));
}

TEST_CASE("preset best: its context weight, 0 without a lookahead and in the fallback, with the spec JSON",
          "[preset][lookahead]") {
  PruneSpec base;
  base.protection = {4, 16};
  base.budget = Budget::keep(0.3);
  REQUIRE(preset_spec("best", base).scorer.lookahead == kPresetLookahead);
  REQUIRE(preset_spec("best", base).scorer.context_weight == kPresetContextWeight);
  const PruneSpec best = preset_spec("best", base, std::nullopt, 0.25);  // a request's own weight
  REQUIRE(best.scorer.lookahead == kPresetLookahead);
  REQUIRE(best.scorer.context_weight == 0.25);
  REQUIRE(preset_spec("best", base, 16, 2.0).scorer.context_weight == 2.0);
  REQUIRE(preset_spec("best", base, 0).scorer.context_weight == 0.0);
  REQUIRE(preset_spec("best", base, 0, 2.0).scorer.context_weight == 0.0);
  REQUIRE(preset_fallback_spec("best", best).scorer.context_weight == 0.0);
  // JSON: written when not 0, read back; specs differing only in it differ
  const nlohmann::json j = prune_spec_to_json(best);
  REQUIRE(j.at("context_weight").get<double>() == 0.25);
  const PruneSpec back = prune_spec_from_json(j, "spec");
  REQUIRE(back == best);
  PruneSpec other = best;
  other.scorer.context_weight = 0.0;
  REQUIRE(other != best);
  REQUIRE(other.same_selection(best));  // the curves of the lookahead alone serve it
  REQUIRE(!prune_spec_to_json(other).contains("context_weight"));
  REQUIRE(best.describe_selection().find(" context_weight=0.25") != std::string::npos);
}
