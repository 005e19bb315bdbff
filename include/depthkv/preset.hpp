#pragma once
/// @file preset.hpp
/// @brief Named presets: the recommended `PruneSpec` for a profile and a request, with the
/// per-request scorer choice; and the policy data a profile file holds for a spec
/// (`PolicyCurves`). Reads profile files, so it needs nlohmann/json (profile_io.hpp).
///
/// ## "best"
/// - scorer: output-aware (CriticalKV) scores with max pooling, observing the attention of the
///   model's next `kPresetLookahead` greedy tokens after the context (`ScorerConfig::lookahead`;
///   another lookahead when the request gives one) and, with weight `kPresetContextWeight`, the
///   context's own SnapKV observation window (`ScorerConfig::context_weight`:
///   s_j = l_j + w * (L / C) * c_j, scorer_config.hpp), so that what SnapKV's window ranks high
///   keeps a high score when the greedy lookahead attends elsewhere (text the model cannot
///   predict); the head curves are the lookahead scorer's (measured without the context weight);
/// - policy: head-optimal (per-(layer, KV head) budgets from the profile's head curves, LU-KV),
///   each head keeping exactly its budget (head split uniform);
/// - scorer kind, per request: of the candidates {snapkv, h2o} whose head curves the profile
///   holds, the one whose head-optimal budgets for this request have the lowest predicted loss
///   (`predicted_head_loss` on its own head curves; ties: the earlier candidate);
/// - protection, budget, safeguard and schedule: the request's (`base`), since the protection
///   depends on the context length.
/// - per input, whether to use all of the above (`preset_trusts_input`): only on text the model
///   predicts about as well as the kinds the rule was set on; otherwise the request is served by
///   the fallback, plain SnapKV with uniform budgets and no lookahead (`preset_fallback_spec`).
///   The signal is the mean NLL of the context's last `kPresetTrustTokens` tokens under the
///   model (each predicted from the tokens before it), divided by ln(vocabulary size) so that it
///   reads the same for any vocabulary (1.0: no better than uniform guessing). A model's greedy
///   lookahead on text it cannot predict attends to other tokens than the real continuation
///   needs, and the profile's curves were measured on text it predicts; the fallback is the
///   plainest baseline, so a distrusted input is served exactly as plain SnapKV would serve it.
/// The choices were made on calibration windows only (docs/results/preset.md, lookahead.md,
/// robust.md).
///
/// ## "retrieval"
/// "best" with the scorer kind "snapkv-keydiff" (the larger of a slot's SnapKV and KeyDiff rank
/// fractions, scorers/snapkv_keydiff.hpp; not output-aware: the rescaling is SnapKV's), and a
/// floor under every KV head's budget: each keeps at least `kRetrievalUniformFloor` of the
/// uniform per-layer budget (`uniform_fraction_floor`). KeyDiff keeps the distinctive keys that the
/// context's end does not attend to (a needle, when the question comes after the pruning); the
/// floor keeps the head-optimal budgets, set on next-token KL curves of text, from starving the
/// heads that retrieval reads. Its fallback for distrusted input: "snapkv-keydiff" with uniform
/// budgets. Chosen on the RULER calibration seeds and calibration licence windows
/// (docs/results/ruler.md, "A preset for retrieval"). Its profile: head curves of
/// "snapkv-keydiff" (`depthkv profile --preset retrieval`).
///
/// @code
/// depthkv::ProfileFile f = depthkv::load_profile("stories260K.best.profile.json");
/// depthkv::PruneSpec base;                     // protection {4, 16}, window 16, ...
/// base.protection = {4, 16};
/// base.budget = depthkv::Budget::keep(0.2);
/// depthkv::PresetChoice c = depthkv::preset("best", f, base, std::vector<int>(f.n_layers, 384));
/// // c.spec: the whole spec for keeping 20% of 384-token contexts (c.spec.scorer: the candidate
/// // of the lowest predicted loss, c.predicted: each candidate's)
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"

namespace depthkv {

/// The lookahead tokens of "best" when the request gives none.
inline constexpr int kPresetLookahead = 32;

/// The weight of the context's own SnapKV observation window beside the lookahead's queries in
/// "best"'s scores (`ScorerConfig::context_weight`; 0: the lookahead alone): of the weights 0,
/// 0.25, 0.5, 1, 2 and 4, measured on calibration data only (profiles of the first half of the
/// calibration windows, scored on the second half and on licence windows 16..31; both reference
/// models, both continuation protocols; scripts/preset-calibration.sh,
/// docs/results/preset-calibration.md), none put a cell above plain SnapKV uniform beyond one
/// standard error, and 0 and 0.25 tied for the lowest geometric-mean ratio (0.120): the rule,
/// fixed before the run, takes the smallest weight within 1% of the lowest.
inline constexpr double kPresetContextWeight = 0.0;

/// The context tokens (at its end) whose mean NLL is "best"'s per-input signal
/// (`preset_trusts_input`).
inline constexpr int kPresetTrustTokens = 32;

/// The largest normalized context NLL (mean NLL in nats / ln(vocabulary size)) at which "best"
/// uses its lookahead and head-optimal budgets (`preset_trusts_input`): the largest value of any
/// calibration window, rounded up to 0.1 (1.510, stories260K on licence windows 16..31; stories
/// and licence text, both reference models, scripts/preset-calibration.sh,
/// docs/results/preset-calibration.md), so that the rule never overrides the preset on text like
/// what it was chosen on.
inline constexpr double kPresetMaxNormalizedNll = 1.6;

/// "retrieval"'s floor under each KV head's budget, as a fraction of the uniform per-layer budget
/// (`uniform_fraction_floor`): of 0, 0.25, 0.5 and 0.75, the largest mean RULER score over the 5
/// needle tasks and compressions 0.25-0.875 (SmolLM2 at 4K, calibration seeds 0-1; 63 against 39
/// for no floor), with the KL on calibration licence windows 18..29 below SnapKV uniform's at keep
/// 0.1-0.3 (docs/results/ruler.md).
inline constexpr double kRetrievalUniformFloor = 0.5;

/// The InfoNCE stage the InfoNCE-guided policies (mga, mlma*) read from a profile.
inline const char* const kInfoNCEKey = "infonce/post_attn";

/// The curves and scores a profile file holds for one scorer and policy (owning;
/// `data()` points into it).
struct PolicyCurves {
  SensitivityProfile layer;    ///< the scorer's layer curves (when the policy reads them)
  SensitivityProfile heads;    ///< the scorer's head curves (head-optimal)
  bool has_layer = false, has_heads = false;
  int n_kv_heads = 0;
  std::vector<double> infonce; ///< mga, mlma*
  std::vector<int> layer_window;  ///< the profile's sliding windows (empty: none)
  /// The tokens' spans for `scorer.span_pooling` (`PolicyData::span_start`; empty: none), set by
  /// the caller that knows the tokens (e.g. `llama::token_span_starts` of the prompt).
  std::vector<std::int32_t> span_start;

  /// The `PolicyData` view (valid while this object lives and is not moved).
  PolicyData data() const {
    PolicyData d;
    d.layer_curves = has_layer ? &layer : nullptr;
    d.head_curves = has_heads ? &heads : nullptr;
    d.n_kv_heads = n_kv_heads;
    d.infonce = infonce;
    d.layer_window = layer_window;
    d.span_start = span_start.empty() ? nullptr : &span_start;
    return d;
  }
};

/// What `policy` reads from `f` for `scorer`: the layer curves (proportional, optimal), the head
/// curves (head-optimal), the InfoNCE scores (mga, mlma*).
/// @throws Error when the file lacks them (naming the scorer, or the profiling step to run)
inline PolicyCurves policy_curves(const ProfileFile& f, const std::string& scorer, AllocationPolicy policy) {
  PolicyCurves c;
  c.layer_window = f.layer_window;
  if (policy_needs_profile(policy)) {
    c.layer = f.profile(scorer);  // refuses a scorer the profile lacks
    c.has_layer = true;
  }
  if (is_head_policy(policy)) {
    c.heads = f.head_profile(scorer);  // refuses a scorer without head curves
    c.has_heads = true;
    c.n_kv_heads = f.head_curves.at(scorer).n_kv_heads;
  }
  if (policy_needs_infonce(policy)) {
    const auto it = f.layer_metrics.find(kInfoNCEKey);
    DEPTHKV_CHECK(it != f.layer_metrics.end(), "policy '" << to_string(policy) << "' needs the profile's '"
                                                          << kInfoNCEKey << "' scores: profile with the infonce metric");
    c.infonce = it->second.mean;
  }
  return c;
}

/// The presets' names.
inline std::vector<std::string> preset_names() { return {"best", "retrieval"}; }

/// @throws Error unless `name` is one of `preset_names()` (the message names `what`, e.g. a flag)
inline void check_preset_name(const std::string& name, const std::string& what = "preset") {
  std::string names;
  for (const std::string& n : preset_names()) {
    if (n == name) return;
    names += (names.empty() ? "" : ", ") + n;
  }
  throw Error(what + ": unknown preset '" + name + "' (expected " + names + ")");
}

/// What distinguishes the named presets (the file comment): everything else they set is shared.
struct PresetTraits {
  std::vector<std::string> candidates;  ///< the scorers chosen from for each request, in tie order
  bool output_aware = true;             ///< the candidates' scores rescaled by the output norms
  std::string fallback;                 ///< the scorer a distrusted input is served with (uniform budgets)
  /// Each KV head's floor as a fraction of the uniform per-layer budget (`uniform_fraction_floor`);
  /// 0: the request's safeguard alone.
  double uniform_floor = 0.0;
};

/// The traits of preset `name`.
/// @throws Error on an unknown preset
inline PresetTraits preset_traits(const std::string& name) {
  check_preset_name(name);
  if (name == "retrieval") return {{"snapkv-keydiff"}, false, "snapkv-keydiff", kRetrievalUniformFloor};
  return {{"snapkv", "h2o"}, true, "snapkv", 0.0};
}

/// The scorers preset `name` chooses from for each request, in tie order.
/// @throws Error on an unknown preset
inline std::vector<std::string> preset_candidates(const std::string& name) { return preset_traits(name).candidates; }

/// `base` with the fields preset `name` sets (everything but the per-request scorer kind, which
/// stays the first candidate's): see the file comment.
/// @param lookahead the request's lookahead (nullopt: the preset's)
/// @param context_weight the request's context weight (nullopt: the preset's); 0 whenever the
///   lookahead is 0
/// @throws Error on an unknown preset
inline PruneSpec preset_spec(const std::string& name, PruneSpec base, std::optional<int> lookahead = std::nullopt,
                             std::optional<double> context_weight = std::nullopt) {
  const PresetTraits t = preset_traits(name);
  base.scorer = scorer_config(t.candidates.front(), base.scorer);
  base.scorer.pooling = Pooling::kMax;
  base.scorer.output_aware = t.output_aware;
  base.scorer.lookahead = lookahead ? *lookahead : kPresetLookahead;
  base.scorer.context_weight =
      base.scorer.lookahead == 0 ? 0.0 : context_weight ? *context_weight : kPresetContextWeight;
  base.head_split = HeadSplitSpec{};
  base.policy = AllocationPolicy::kHeadOptimal;
  return base;
}

/// `nll` (mean nats per token) / ln(`vocab_size`): 1.0 is the NLL of uniform guessing.
/// @throws Error on a vocabulary of fewer than 2 tokens or a NaN or negative NLL
inline double normalized_nll(double nll, int vocab_size) {
  DEPTHKV_CHECK(vocab_size >= 2, "normalized NLL: vocabulary of " << vocab_size << " tokens");
  DEPTHKV_CHECK(nll >= 0.0, "normalized NLL: NLL " << nll << " is negative or NaN");
  return nll / std::log(static_cast<double>(vocab_size));
}

/// Whether preset `name` serves an input with its own spec (true) or with
/// `preset_fallback_spec` (false): true when `context_nll`, the mean NLL (nats) of the context's
/// last `kPresetTrustTokens` tokens (all but its first when it is shorter) under the model, is
/// at most `kPresetMaxNormalizedNll` * ln(`vocab_size`). See the file comment.
/// @throws Error on an unknown preset, or as `normalized_nll`
inline bool preset_trusts_input(const std::string& name, double context_nll, int vocab_size) {
  check_preset_name(name);
  return normalized_nll(context_nll, vocab_size) <= kPresetMaxNormalizedNll;
}

/// What preset `name` serves a distrusted input with: plain SnapKV ("retrieval": snapkv-keydiff;
/// `base`'s window and kernel, default pooling, not output-aware, no lookahead) with uniform
/// budgets and an even head split; `base`'s protection, budget, safeguard and schedule.
/// @throws Error on an unknown preset
inline PruneSpec preset_fallback_spec(const std::string& name, PruneSpec base) {
  base.scorer = scorer_config(preset_traits(name).fallback, base.scorer);
  base.scorer.pooling = ScorerConfig().pooling;
  base.scorer.output_aware = false;
  base.scorer.lookahead = 0;
  base.scorer.context_weight = 0.0;
  base.head_split = HeadSplitSpec{};
  base.policy = AllocationPolicy::kUniform;
  return base;
}

/// A preset resolved for one request.
struct PresetChoice {
  PruneSpec spec;                                          ///< with the chosen scorer kind
  std::vector<std::pair<std::string, double>> predicted;  ///< each candidate considered, its predicted loss
};

/// Of `candidates`, the scorer whose head-optimal budgets for `spec`'s budget (raised to the protected
/// tokens as the driver raises it, `raise_to_protection`) on layers of
/// `lengths` tokens have the lowest predicted loss (`predicted_head_loss`); candidates without
/// (complete) head curves in `f` are skipped; ties: the earlier one.
/// @return `spec` with that scorer kind, and every candidate's predicted loss
/// @throws Error when `f` holds head curves of no candidate, or the request is infeasible
inline PresetChoice lowest_predicted_scorer(const ProfileFile& f, const std::vector<std::string>& candidates,
                                            PruneSpec spec, const std::vector<int>& lengths) {
  PresetChoice c;
  double best = 0.0;
  std::string chosen;
  PruneSpec applied = spec;  // the budget the driver applies: a short context keeps its protected tokens
  raise_to_protection(applied, lengths);
  const BudgetRequest req = applied.budget_request(lengths);
  for (const std::string& s : candidates) {
    if (!f.has_head_curves(s)) continue;
    const SensitivityProfile hp = f.head_profile(s);
    const std::vector<std::vector<int>> k = head_optimal_budgets(hp, f.head_curves.at(s).n_kv_heads, req);
    const double pred = predicted_head_loss(hp, k, req.lengths);
    c.predicted.emplace_back(s, pred);
    if (chosen.empty() || pred < best) {
      chosen = s;
      best = pred;
    }
  }
  std::ostringstream names;
  for (std::size_t i = 0; i < candidates.size(); ++i) names << (i ? ", " : "") << candidates[i];
  DEPTHKV_CHECK(!chosen.empty(), "the profile has no complete head curves of any of the scorers "
                                     << names.str() << ": profile it with the preset's scorers and head curves");
  spec.scorer = scorer_config(chosen, spec.scorer);
  c.spec = spec;
  return c;
}

/// The safeguard for `spec` on layers of `lengths` tokens with each KV head's floor at `fraction`
/// of the uniform per-layer budget: max(n_sink + n_recent + margin, floor(fraction * B / L)), B the
/// budget in tokens (keep ratio * sum(lengths), or the token total), L the layer count;
/// `spec.safeguard` when that is automatic and its floor is the larger, or when the safeguard is
/// not automatic (the request's).
inline Safeguard uniform_fraction_floor(const PruneSpec& spec, const std::vector<int>& lengths, double fraction) {
  if (spec.safeguard.mode != Safeguard::Mode::kAuto || lengths.empty()) return spec.safeguard;
  long long held = 0;
  for (int n : lengths) held += n;
  const double b = spec.budget.is_ratio() ? spec.budget.ratio() * static_cast<double>(held)
                                          : static_cast<double>(spec.budget.total_tokens());
  const long long f = static_cast<long long>(fraction * b / static_cast<double>(lengths.size()));
  if (f <= spec.safeguard.floor(spec.protection)) return spec.safeguard;
  return Safeguard::from_min_tokens(static_cast<int>(std::min<long long>(f, std::numeric_limits<int>::max())));
}

/// Preset `name` resolved for one request: `preset_spec` (with `uniform_fraction_floor` when the
/// preset has a floor, `PresetTraits::uniform_floor`), then the per-request scorer choice
/// (`lowest_predicted_scorer` over `preset_candidates`).
/// @param f the profile (its head curves choose the scorer)
/// @param base protection, budget, safeguard, schedule and the scorer's window and kernel
/// @param lengths the tokens each layer holds when the budget is applied (the context)
/// @param lookahead the request's lookahead (nullopt: the preset's)
/// @param context_weight the request's context weight (nullopt: the preset's)
/// @throws Error on an unknown preset, a profile without the candidates' head curves, or an
///   infeasible request
inline PresetChoice preset(const std::string& name, const ProfileFile& f, const PruneSpec& base,
                           const std::vector<int>& lengths, std::optional<int> lookahead = std::nullopt,
                           std::optional<double> context_weight = std::nullopt) {
  const PresetTraits t = preset_traits(name);
  PruneSpec spec = preset_spec(name, base, lookahead, context_weight);
  if (t.uniform_floor > 0.0) spec.safeguard = uniform_fraction_floor(spec, lengths, t.uniform_floor);
  return lowest_predicted_scorer(f, t.candidates, spec, lengths);
}

}  // namespace depthkv
