#pragma once
/// @file llama/eval_config.hpp
/// @brief The settings and per-window results of `PruningEvaluator` (llama/eval.hpp).

#include <cstddef>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/metrics.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/scorer_config.hpp"

namespace depthkv {
namespace llama {

/// Where each window's continuation comes from (`EvalConfig::continuation_source`).
enum class ContinuationSource {
  kText,   ///< the window's own tokens (the true text), teacher-forced
  kModel,  ///< the model's greedy continuation of the context (as many tokens), teacher-forced
};

/// "text" or "model".
inline const char* to_string(ContinuationSource s) { return s == ContinuationSource::kModel ? "model" : "text"; }

/// Inverse of `to_string(ContinuationSource)`.
/// @throws Error on another name
inline ContinuationSource parse_continuation_source(const std::string& name) {
  if (name == "text") return ContinuationSource::kText;
  if (name == "model") return ContinuationSource::kModel;
  DEPTHKV_FAIL("unknown continuation source '" << name << "' (expected text or model)");
}

/// The evaluation protocol of a `PruningEvaluator`: the selection its plans share, the scorers
/// its full runs observe, and how the windows run.
struct EvalConfig {
  /// The selection every plan evicts with: its protection, its head split (`head_split`: how
  /// each layer's budget is split across its KV heads, head_budget.hpp) and its prefill chunk
  /// (`schedule.chunk`; computation only: a oneshot plan evicts once after the context). Its
  /// scorer is the one observed when `scorers` is empty. Its budget, policy, tiers, safeguard
  /// and schedule mode are not read: every evaluation brings its own (`evaluate` a spec that
  /// selects as this one does).
  PruneSpec spec;
  /// Scorers observed during the full run, one profile or evaluation per entry (index = the
  /// `scorer` argument of the evaluation calls); empty: `spec.scorer` alone.
  std::vector<ScorerConfig> scorers{};
  int n_threads = 0;      ///< windows evaluated in parallel: 0 = OpenMP's default, 1 = serial
  bool reuse = true;      ///< reuse the full run's activations (false: recompute everything, for checks)
  /// Plans (`evaluate_plan`, `evaluate_budgets`, `layer_metrics`, hence the profiler) evict after
  /// every prefill chunk instead of once after the context, as `EvictionSchedule` with interval 1
  /// does: after the chunk that brings a layer to `s` tokens seen, the layer with final budget
  /// k of n context tokens keeps `keep_tokens(k / n, s, protection)` (= k at s = n). The context
  /// is then recomputed for every plan (no activation reuse).
  bool chunked_plans = false;
  /// The continuation every run teacher-forces: the window's text (kText), or (kModel) the
  /// model's own greedy continuation of the context, generated on the full cache one token at a
  /// time (token 0 = argmax of the context's last logits, token i = argmax of the step that fed
  /// token i - 1; `|continuation|` tokens, replacing the window's) and then teacher-forced on the
  /// full cache (the reference) and on every pruned cache. kModel is what a deployment that
  /// generates sees: the continuation's queries are the model's own.
  ContinuationSource continuation_source = ContinuationSource::kText;
  /// Oracle scores, a measurement of the limit and not a method (no deployment knows the
  /// continuation): per scorer (empty: none is), whether its scores come from the attention of
  /// the window's continuation itself, i.e. the `Tc` continuation tokens' queries over the
  /// context's keys while they are teacher-forced on the full cache (the scorer observes them
  /// as it observes a lookahead of `Tc` tokens; its own `lookahead` is not run). One-shot plans
  /// only (no chunked plans or schedules). Its size: 0 or `scorers.size()`.
  std::vector<bool> oracle{};
  /// Context tokens, at its end, whose mean NLL under the model the full run measures
  /// (`PruningEvaluator::context_nll`; e.g. `kPresetTrustTokens` for `preset_trusts_input`):
  /// each predicted from the tokens before it, at most all but the first; 0 = not measured.
  int context_nll_tokens = 0;
};

/// Result of one window under one plan.
struct WindowResult {
  ContinuationMetrics metrics;
  std::vector<int> budgets;      ///< tokens kept per layer (context part)
  std::size_t bytes_kept = 0;    ///< KV bytes of the context after eviction (all layers)
  std::size_t bytes_full = 0;    ///< KV bytes of the full context
  /// Most KV bytes the pruned run's layers held at once (`cache.bytes()` at its largest: before
  /// an eviction, or at the end of the continuation). A scorer with a lookahead of G tokens
  /// decodes them on the full context cache before the eviction: that cache then holds G more
  /// slots in every KV head of every layer, and they count here.
  std::size_t bytes_peak = 0;
  /// Most KV bytes the full run held (full context + continuation).
  std::size_t bytes_full_peak = 0;
};

}  // namespace llama
}  // namespace depthkv
