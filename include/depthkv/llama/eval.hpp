#pragma once
/// @file llama/eval.hpp
/// @brief `PruningEvaluator`: the quality of a pruned KV cache against the full cache (mean KL,
/// NLL increase, top-1 agreement, KV bytes; metrics.hpp) for budget plans, `PruneSpec`s and
/// schedules on a set of windows, reusing the full run's activations (what the
/// `SensitivityProfiler` calls). Its settings and results: llama/eval_config.hpp; its runs:
/// llama/detail/eval_runs.hpp.
///
/// ## Evaluation protocol
/// A window is a context and a continuation. The full run prefills the context (observing its
/// attention with the scorers; a scorer with a lookahead observes the G greedy tokens after it
/// instead, `observe_lookahead`) and teacher-forces the continuation on the full cache. A pruned
/// run evicts each layer of the context cache to its budget once, after the whole context is
/// prefilled (prefill chunking only splits the computation), then teacher-forces the
/// continuation on the pruned cache (continuation tokens are appended, never evicted; positions
/// keep their original values). Metrics are taken over the `Tc` continuation positions, i.e. the
/// distributions computed while feeding continuation token i, all of which read the pruned
/// cache: KL(full || pruned) and top-1 agreement over all `Tc` rows, and the NLL of the true next
/// token over the `Tc - 1` rows that have one inside the window.
/// The continuation is the window's text (`ContinuationSource::kText`) or the model's own greedy
/// continuation of the context (`kModel`, generated on the full cache, then teacher-forced on
/// the full and on every pruned cache as above). An oracle scorer (`EvalConfig::oracle`, a
/// measurement) scores the context by the attention of the continuation's own `Tc` queries,
/// observed while the full run teacher-forces it.
/// `evaluate_schedule` runs the bounded-memory variant instead: the pruned run prefills the
/// context in chunks under an `EvictionSchedule` (eviction after every chunk, to the budget of
/// the tokens seen so far) and reaches the same final budget before the continuation; with
/// `ScheduleEval::kDecode` it also evicts during the continuation, every `interval`
/// teacher-forced tokens (the continuation is fed in blocks that end where the schedule evicts,
/// which gives every token the cache it would see when decoded one by one).
/// `EvalConfig::chunked_plans` runs every plan (hence the profiler) as a schedule whose targets
/// are the plan's budgets (`TargetPlan`).
///
/// ## Activation reuse
/// When the first pruned layer of a plan is `l`, layers `< l` see exactly the full run's caches
/// and inputs, so their continuation activations equal the full run's. The evaluator stores, per
/// window, the full context cache of every layer, the continuation's residual-stream input of
/// every layer (and the final residual), the full run's log-probabilities and every layer's
/// token scores, and runs a plan from layer `l` on: layer `l` (and any later pruned layer) on a
/// pruned copy of its context cache, the other layers on copies of their full caches. The context
/// is never recomputed. Profiling "only layer l at ratio r" thus costs `(L - l) / L` of a
/// continuation-only forward pass instead of a full context + continuation pass. The head
/// curves ("only KV head h of layer l at ratio r", `head_metrics`, `head_function`) start from
/// layer l's stored input in the same way. The ratios of one layer (or head) run as one batch per
/// window (`LlamaEngine::forward_layer_batch`: each weight matrix read once for all of them, the
/// classifier once), equal to separate runs up to the rounding of products over more rows.
///
/// @code
/// using namespace depthkv;
/// llama::LlamaEngine engine(model);
/// llama::PruningEvaluator ev(engine, windows, cfg);       // the full runs
/// PruneSpec spec;                                         // uniform H2O, keep 30%
/// spec.budget = Budget::keep(0.3);
/// std::vector<llama::WindowResult> r = ev.evaluate(spec, PolicyData{});  // r[w].metrics.loss.kl
/// @endcode

#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/detail/eval_runs.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "depthkv/llama/eval_config.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/metrics.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/sensitivity_profiler.hpp"

namespace depthkv {
namespace llama {

/// Evaluates per-layer budget plans on a fixed set of windows against the full cache. The full
/// run of every window is computed once, in the constructor; each plan then runs only the
/// continuation from its first pruned layer on (see the file comment). Const calls are
/// thread-safe. Memory per window: the full context cache, `(L + 1) * Tc * dim` floats of stored
/// activations, `Tc * vocab` doubles of log-probabilities, and the context's scores per scorer.
///
/// @code
/// llama::PruningEvaluator ev(engine, windows, cfg);                  // runs the full passes
/// std::vector<double> plan(n_layers, 1.0);
/// plan[3] = 0.2;                                                    // only layer 3 keeps 20%
/// std::vector<llama::SampleLoss> per_window = ev.plan_losses(plan, /*scorer=*/0);
/// SensitivityProfiler prof(n_layers);
/// prof.run_batched(ev.layer_function(/*scorer=*/0));               // or prof.run(ev.plan_function(0))
/// SensitivityProfile p = prof.result().profile(LossMetric::kKL);
/// @endcode
class PruningEvaluator : private detail::EvalRuns {
 public:
  /// Runs the full (unpruned) passes of every window.
  /// @param engine the engine (must outlive the evaluator)
  /// @param windows the samples (each context and continuation non-empty)
  /// @param cfg scorers, protection, chunking, threads
  /// @throws Error on empty windows, invalid tokens or scorer configurations (also a lookahead
  ///   that does not fit the model's context after a window's context)
  PruningEvaluator(const LlamaEngine& engine, std::vector<EvalWindow> windows, EvalConfig cfg = EvalConfig())
      : EvalRuns(engine, std::move(windows), std::move(cfg)) {}

  using EvalRuns::n_kv_heads;
  using EvalRuns::n_layers;
  using EvalRuns::n_scorers;
  using EvalRuns::n_windows;
  using EvalRuns::to_sample_metrics;
  const EvalConfig& config() const { return cfg_; }
  const std::vector<EvalWindow>& windows() const { return windows_; }
  /// Full-cache logits of window w's continuation `[Tc x vocab]`.
  const RowMatrix& full_logits(int w) const { return ref(w).logits; }
  /// Full-cache mean NLL of window w's continuation targets.
  double nll_full(int w) const { return ref(w).nll; }
  /// Mean NLL of window w's last `config().context_nll_tokens` context tokens under the model
  /// (0 when not measured).
  double context_nll(int w) const { return ref(w).context_nll; }
  /// Layer-token products run by plan evaluations so far (a cost measure: a full
  /// context+continuation pass of window w costs `L * (|context| + Tc)`).
  long long layer_tokens_run() const { return layer_tokens_.load(); }

  /// Evaluates a keep-ratio plan: layer l keeps `keep_tokens(plan[l], length, protection)`
  /// tokens of each window's context in every head (1.0 = full).
  /// @param plan one ratio per layer, in [0, 1]
  /// @param scorer index into `config().scorers`
  /// @return one result per window
  /// @throws Error on a plan of the wrong size or ratio, or a bad scorer index
  std::vector<WindowResult> evaluate_plan(const std::vector<double>& plan, int scorer = 0) const {
    DEPTHKV_CHECK(static_cast<int>(plan.size()) == n_layers(), "plan has " << plan.size() << " ratios for " << n_layers() << " layers");
    for (double r : plan) DEPTHKV_CHECK(r >= 0.0 && r <= 1.0, "keep ratio " << r << " outside [0, 1]");
    return run_all(scorer, [&](int w) {
      const int n = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
      Budgets b;
      b.layer.resize(plan.size());
      for (std::size_t l = 0; l < plan.size(); ++l) b.layer[l] = keep_tokens(plan[l], n, cfg_.protection);
      return b;
    });
  }

  /// Evaluates per-layer token budgets (every head of layer l keeps `keep_per_layer[l]` of the
  /// context tokens; more than the context keeps all).
  /// @throws Error on the wrong layer count, a negative budget, one below the protected count,
  ///   or a bad scorer index
  std::vector<WindowResult> evaluate_budgets(const std::vector<int>& keep_per_layer, int scorer = 0) const {
    DEPTHKV_CHECK(static_cast<int>(keep_per_layer.size()) == n_layers(),
                  "budgets for " << keep_per_layer.size() << " layers, model has " << n_layers());
    return run_all(scorer, [&](int w) {
      const int n = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
      Budgets b;
      b.layer.resize(keep_per_layer.size());
      for (std::size_t l = 0; l < b.layer.size(); ++l) {
        DEPTHKV_CHECK(keep_per_layer[l] >= 0, "negative budget " << keep_per_layer[l] << " for layer " << l);
        b.layer[l] = std::min(keep_per_layer[l], n);
      }
      return b;
    });
  }

  /// Evaluates per-head token budgets: head h of layer l keeps `keep[l][h]` of the context
  /// tokens (more than the context keeps all), e.g. `head_optimal_budgets`. With `resplit`,
  /// each layer's total is split again by `config().head_allocation` with these as the
  /// starting budgets (`head_budgets`' per-head form: kAdaptive keeps alpha * keep[l][h] per
  /// head and places the rest by the scores); without it they are kept exactly.
  /// `WindowResult::budgets` holds each layer's mean per head (rounded).
  /// @throws Error on the wrong layer or head count, a negative budget, one below the protected
  ///   count, or a bad scorer index
  std::vector<WindowResult> evaluate_head_budgets(const std::vector<std::vector<int>>& keep, int scorer = 0,
                                                  bool resplit = false) const {
    DEPTHKV_CHECK(static_cast<int>(keep.size()) == n_layers(),
                  "head budgets for " << keep.size() << " layers, model has " << n_layers());
    for (std::size_t l = 0; l < keep.size(); ++l) {
      DEPTHKV_CHECK(static_cast<int>(keep[l].size()) == n_kv_heads(),
                    "layer " << l << ": " << keep[l].size() << " head budgets for " << n_kv_heads() << " KV heads");
      for (std::size_t h = 0; h < keep[l].size(); ++h)
        DEPTHKV_CHECK(keep[l][h] >= 0, "negative budget " << keep[l][h] << " for layer " << l << " head " << h);
    }
    return run_all(scorer, [&](int w) {
      const int n = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
      Budgets b;
      b.heads = keep;
      b.resplit = resplit;
      for (auto& row : b.heads)
        for (int& k : row) k = std::min(k, n);
      return b;
    });
  }

  /// What `evaluate_schedule` evicts (eval_config.hpp).
  using ScheduleEval = llama::ScheduleEval;

  /// Evaluates a bounded-memory schedule: each window's context is prefilled in chunks of
  /// `config().chunk_size` with an `EvictionSchedule` evicting after every chunk (and at the end
  /// of the context, `evict_now`, so that the continuation starts on the final budget), then the
  /// continuation is teacher-forced on the pruned cache (appended, not evicted), as in the
  /// one-shot protocol; with `mode = kDecode` the continuation is evicted too, every
  /// `sc.interval` tokens (see the file comment). `sc.scorer` is replaced by
  /// `config().scorers[scorer]` and `sc.protection` by `config().protection`. With one chunk per
  /// context and kPrefill this equals a one-shot run of the same budget (`bytes_peak` aside).
  /// `budgets` are the ones after the context; `bytes_peak` counts every chunk and block before
  /// its eviction.
  /// @throws Error on a bad scorer index or an invalid schedule
  std::vector<WindowResult> evaluate_schedule(const ScheduleConfig& sc, int scorer = 0,
                                              ScheduleEval mode = ScheduleEval::kPrefill) const {
    check_scorer(scorer);
    DEPTHKV_CHECK(!is_oracle(scorer), "scorer " << scorer << " takes oracle scores, which a schedule cannot use");
    const ScheduleConfig cfg = schedule_base(scorer, sc);
    const LlamaConfig& c = engine_.config();
    EvictionSchedule(cfg, c.n_layers, c.n_heads, c.n_kv_heads);  // validates (serial)
    std::vector<WindowResult> out(windows_.size());
    parallel_windows([&](int w) { out[static_cast<std::size_t>(w)] = run_schedule(w, cfg, mode); });
    return out;
  }

  /// Evaluates a `PruneSpec` (prune_spec.hpp): allocates its budget over the windows' context
  /// (`allocate`), then `evaluate_head_budgets` (head-optimal, re-split when the head split is
  /// adaptive) or `evaluate_budgets` for a oneshot schedule, `evaluate_schedule` (kPrefill for
  /// chunked, kDecode for decode) otherwise. The spec's scorer, protection, head split and chunk
  /// must be the evaluator's (`config().scorers[scorer]` and the rest of `config()`), since the
  /// full runs observed those; every window's context must have one length.
  /// @param data the curves the spec's policy reads
  /// @throws Error on a spec that differs from the evaluator's settings, windows of several
  ///   context lengths, or as `allocate` and the evaluation called
  std::vector<WindowResult> evaluate(const PruneSpec& spec, const PolicyData& data, int scorer = 0) const {
    check_scorer(scorer);
    spec.validate();
    check_spec(spec, scorer);
    const int n = static_cast<int>(windows_.front().context.size());
    PolicyData d = data;  // the model's sliding windows cap its local layers
    if (d.layer_window.empty()) d.layer_window = engine_.config().layer_window;
    if (spec.schedule.mode != ScheduleMode::kOneshot)
      return evaluate_schedule(schedule_config(spec, d), scorer,
                               spec.schedule.mode == ScheduleMode::kDecode ? ScheduleEval::kDecode : ScheduleEval::kPrefill);
    const Allocation a = allocate(spec, std::vector<int>(static_cast<std::size_t>(n_layers()), n), d);
    if (is_head_policy(spec.policy)) return evaluate_head_budgets(a.heads, scorer, spec.head_split.mode != HeadAllocation::kUniform);
    return evaluate_budgets(a.layers, scorer);
  }

  /// `evaluate_plan` reduced to the per-window losses.
  std::vector<SampleLoss> plan_losses(const std::vector<double>& plan, int scorer = 0) const {
    std::vector<SampleLoss> out;
    for (const WindowResult& r : evaluate_plan(plan, scorer)) out.push_back(r.metrics.loss);
    return out;
  }

  /// `evaluate_plan` in the SensitivityProfiler's form (one entry per window, window order).
  SampleMetrics plan_metrics(const KeepPlan& plan, int scorer = 0) const {
    return to_sample_metrics(evaluate_plan(plan, scorer));
  }

  /// "Only `layer` pruned, at each of `keep_ratios`": one `SampleMetrics` per ratio. All
  /// windows run in parallel, each window's ratios as one batch; each starts from the
  /// stored input of `layer`.
  /// @throws Error on a bad layer, ratio or scorer index
  std::vector<SampleMetrics> layer_metrics(int layer, const std::vector<double>& keep_ratios, int scorer = 0) const {
    DEPTHKV_CHECK(layer >= 0 && layer < n_layers(), "layer " << layer << " outside [0, " << n_layers() << ")");
    return per_ratio(keep_ratios, scorer, [&](int n, int k) {
      Budgets b;
      b.layer.assign(static_cast<std::size_t>(n_layers()), n);
      b.layer[static_cast<std::size_t>(layer)] = k;
      return b;
    });
  }

  /// "Only KV head `head` of `layer` pruned, at each of `keep_ratios`" (every other head of
  /// every layer full; the head's budget is kept exactly, whatever `config().head_allocation`):
  /// one `SampleMetrics` per ratio, scheduled as `layer_metrics` and with the same activation
  /// reuse (the runs start from the stored input of `layer`).
  /// @throws Error on a bad layer, head, ratio or scorer index
  std::vector<SampleMetrics> head_metrics(int layer, int head, const std::vector<double>& keep_ratios,
                                          int scorer = 0) const {
    DEPTHKV_CHECK(layer >= 0 && layer < n_layers(), "layer " << layer << " outside [0, " << n_layers() << ")");
    DEPTHKV_CHECK(head >= 0 && head < n_kv_heads(), "KV head " << head << " outside [0, " << n_kv_heads() << ")");
    return per_ratio(keep_ratios, scorer, [&](int n, int k) {
      Budgets b;
      b.heads.assign(static_cast<std::size_t>(n_layers()), std::vector<int>(static_cast<std::size_t>(n_kv_heads()), n));
      b.heads[static_cast<std::size_t>(layer)][static_cast<std::size_t>(head)] = k;
      return b;
    });
  }

  /// The plan function to hand to `SensitivityProfiler::run` (references this evaluator, which
  /// must outlive it).
  /// @throws Error on a bad scorer index
  PlanRunFunction plan_function(int scorer = 0) const {
    check_scorer(scorer);
    return [this, scorer](const KeepPlan& plan) { return plan_metrics(plan, scorer); };
  }

  /// The batched function to hand to `SensitivityProfiler::run_batched` (preferred: all ratios
  /// of a layer run in parallel).
  /// @throws Error on a bad scorer index
  LayerRunFunction layer_function(int scorer = 0) const {
    check_scorer(scorer);
    return [this, scorer](int layer, const std::vector<double>& ratios) { return layer_metrics(layer, ratios, scorer); };
  }

  /// The batched function of the head curves for a `SensitivityProfiler` over
  /// `n_layers() * n_kv_heads()` units: unit u is (layer u / n_kv_heads(), head u % n_kv_heads())
  /// (`head_metrics`; the evaluator must outlive it).
  /// @throws Error on a bad scorer index
  LayerRunFunction head_function(int scorer = 0) const {
    check_scorer(scorer);
    return [this, scorer](int unit, const std::vector<double>& ratios) {
      return head_metrics(unit / n_kv_heads(), unit % n_kv_heads(), ratios, scorer);
    };
  }
};

}  // namespace llama
}  // namespace depthkv
