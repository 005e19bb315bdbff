#pragma once
/// @file llama/eval.hpp
/// @brief The decode-loop integration of depthkv in the reference engine (prefill with token
/// scorers -> scores -> `BudgetAllocator` per-layer budgets -> eviction -> decode or teacher
/// forcing), the quality metrics of a pruned cache against the full cache (mean KL, NLL increase,
/// top-1 agreement, KV bytes), and `PruningEvaluator`, which evaluates budget plans on a set of
/// windows reusing the full run's activations (what the `SensitivityProfiler` calls).
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
/// `PruningEvaluator::evaluate_schedule` runs the bounded-memory variant instead: the pruned run
/// prefills the context in chunks with an `EvictionSchedule` (eviction after every chunk, to the
/// budget of the tokens seen so far) and reaches the same final budget before the continuation.
/// `EvalConfig::chunked_plans` runs every plan (hence the profiler) under that chunked eviction.
/// With `ScheduleEval::kDecode` it also evicts during the continuation, every `interval`
/// teacher-forced tokens (decode-time eviction: the continuation is fed in blocks that end where
/// the schedule evicts, which gives every token the cache it would see when decoded one by one).
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
/// layer l's stored input in the same way.
///
/// @code
/// using namespace depthkv;
/// llama::LlamaEngine engine(model);
/// auto cache = engine.make_cache();
/// auto scorers = llama::make_scorers(model.config, ScorerConfig{});            // H2O
/// llama::ForwardOptions opt;
/// opt.observer = llama::observe_into(scorers);
/// engine.prefill(context, 0, cache, opt);
/// llama::PruneRequest req;                                                     // uniform, keep 30%
/// req.policy = AllocationPolicy::kUniform;
/// req.budget.keep_ratio = 0.3;
/// llama::PruneReport rep = llama::score_and_evict(cache, scorers, req);       // rep.budgets per layer
/// RowMatrix logits = engine.teacher_force(continuation, static_cast<int>(context.size()), cache);
/// @endcode

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "depthkv/budget_allocator.hpp"
#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/lookahead.hpp"
#include "depthkv/metrics.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {
namespace llama {

// ---- the decode-loop integration --------------------------------------------------------------

// The engine-neutral glue (scorers, observers, `score_and_evict`) lives in the core header
// eviction_schedule.hpp; these names keep working as `llama::...`.
using depthkv::keep_tokens;
using depthkv::layer_scores;
using depthkv::observe_into;
using depthkv::PruneReport;
using depthkv::PruneRequest;
using depthkv::score_and_evict;

/// One `TokenScorer` per layer of the model.
/// @throws Error on an invalid scorer configuration
inline std::vector<TokenScorer> make_scorers(const LlamaConfig& config, const ScorerConfig& scorer) {
  return depthkv::make_scorers(config.n_layers, scorer, config.n_heads, config.n_kv_heads);
}
using depthkv::make_scorers;

// Output projections for output-aware scorers (`OutputProjections`, `output_projections`): see
// llama/output_projections.hpp.

// ---- lookahead observation in the reference engine ---------------------------------------------

/// `depthkv::observe_lookahead` (lookahead.hpp) with this engine's decode step: each step is one
/// `forward` of one token on `cache`, observed, and its argmax is the next token; the model's
/// context (`seq_len`) bounds the lookahead.
/// @throws Error as `depthkv::observe_lookahead` or `LlamaEngine::forward`; `cache` holds the
///   context as before then
template <class Layer>
void observe_lookahead(const LlamaEngine& engine, KVCache<Layer>& cache, int first_token, std::int32_t pos0,
                       const std::vector<std::vector<TokenScorer>*>& sets) {
  depthkv::observe_lookahead(cache, first_token, pos0, sets, engine.config().seq_len,
                             [&](int token, std::int32_t pos, const AttentionObserver& observer) {
                               ForwardOptions opt;
                               opt.observer = observer;
                               const RowMatrix logits = engine.forward(&token, 1, pos, cache, opt);
                               Eigen::Index next = 0;
                               logits.row(0).maxCoeff(&next);
                               return static_cast<int>(next);
                             });
}

/// The argmax of the last row of `logits` (the first lookahead token after a prefill).
inline int last_argmax(const RowMatrix& logits) {
  DEPTHKV_CHECK(logits.rows() >= 1 && logits.cols() >= 1, "no logits");
  Eigen::Index t = 0;
  logits.row(logits.rows() - 1).maxCoeff(&t);
  return static_cast<int>(t);
}

// ---- the evaluator with activation reuse --------------------------------------------------------

/// Settings of a `PruningEvaluator`.
struct EvalConfig {
  /// Scorers observed during the full run (one profile / evaluation per entry; index = `scorer`
  /// argument of the evaluation calls).
  std::vector<ScorerConfig> scorers = std::vector<ScorerConfig>(1);  // one H2O scorer
  Protection protection;  ///< tokens every head keeps (inside the budget)
  int chunk_size = 1024;  ///< prefill chunk (computation only; eviction happens once after the context)
  int n_threads = 0;      ///< windows evaluated in parallel: 0 = OpenMP's default, 1 = serial
  bool reuse = true;      ///< reuse the full run's activations (false: recompute everything, for checks)
  /// Plans (`evaluate_plan`, `evaluate_budgets`, `layer_metrics`, hence the profiler) evict after
  /// every prefill chunk instead of once after the context, as `EvictionSchedule` with interval 1
  /// does: after the chunk that brings a layer to `s` tokens seen, the layer with final budget
  /// k of n context tokens keeps `keep_tokens(k / n, s, protection)` (= k at s = n). The context
  /// is then recomputed for every plan (no activation reuse).
  bool chunked_plans = false;
  /// How each layer's budget is split across its KV heads (head_budget.hpp) in every plan and
  /// schedule; the adaptive split's floor fraction.
  HeadAllocation head_allocation = HeadAllocation::kUniform;
  double head_alpha = kDefaultHeadAlpha;
};

/// Result of one window under one plan.
struct WindowResult {
  ContinuationMetrics metrics;
  std::vector<int> budgets;      ///< tokens kept per layer (context part)
  std::size_t bytes_kept = 0;    ///< KV bytes of the context after eviction (all layers)
  std::size_t bytes_full = 0;    ///< KV bytes of the full context
  /// Most KV bytes the pruned run's layers held at once (`cache.bytes()` at its largest: before
  /// an eviction, or at the end of the continuation).
  std::size_t bytes_peak = 0;
  /// Most KV bytes the full run held (full context + continuation).
  std::size_t bytes_full_peak = 0;
};

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
class PruningEvaluator {
 public:
  /// Runs the full (unpruned) passes of every window.
  /// @param engine the engine (must outlive the evaluator)
  /// @param windows the samples (each context and continuation non-empty)
  /// @param cfg scorers, protection, chunking, threads
  /// @throws Error on empty windows, invalid tokens or scorer configurations (also a lookahead
  ///   that does not fit the model's context after a window's context)
  PruningEvaluator(const LlamaEngine& engine, std::vector<EvalWindow> windows, EvalConfig cfg = EvalConfig())
      : engine_(engine), windows_(std::move(windows)), cfg_(std::move(cfg)) {
    DEPTHKV_CHECK(!cfg_.scorers.empty(), "no scorer configured");
    DEPTHKV_CHECK(cfg_.chunk_size >= 1, "chunk_size must be >= 1, got " << cfg_.chunk_size);
    check_thread_count(cfg_.n_threads, "n_threads");
    for (std::size_t w = 0; w < windows_.size(); ++w)
      DEPTHKV_CHECK(!windows_[w].context.empty() && !windows_[w].continuation.empty(),
                    "window " << w << " has an empty context or continuation");
    bool output_aware = false;
    for (const ScorerConfig& s : cfg_.scorers) {
      TokenScorer(s, engine.config().n_heads, engine.config().n_kv_heads);
      output_aware = output_aware || s.output_aware;
      DEPTHKV_CHECK(!cfg_.chunked_plans || s.lookahead == 0,
                    "chunked plans evict while the context is read; lookahead (" << s.lookahead
                                                                                 << ") needs the whole context first");
      for (std::size_t w = 0; w < windows_.size() && s.lookahead > 0; ++w) {  // observe_lookahead's check, up front
        const long long ctx = static_cast<long long>(windows_[w].context.size());
        DEPTHKV_CHECK(ctx + s.lookahead <= engine.config().seq_len,
                      "lookahead: " << s.lookahead << " greedy tokens after a context of " << ctx
                                    << " tokens do not fit the model's context of " << engine.config().seq_len
                                    << " tokens (at most "
                                    << std::max<long long>(0, engine.config().seq_len - ctx) << " here)");
      }
    }
    depthkv::detail::check_head_alpha(cfg_.head_alpha);
    if (output_aware) {
      wo_storage_ = OutputProjections(engine.model());
      wo_ = wo_storage_.views();
    }
    refs_.resize(windows_.size());
    parallel_windows([&](int w) { refs_[static_cast<std::size_t>(w)] = full_run(windows_[static_cast<std::size_t>(w)]); });
  }

  int n_windows() const { return static_cast<int>(windows_.size()); }
  int n_layers() const { return engine_.config().n_layers; }
  int n_kv_heads() const { return engine_.config().n_kv_heads; }
  int n_scorers() const { return static_cast<int>(cfg_.scorers.size()); }
  const EvalConfig& config() const { return cfg_; }
  const std::vector<EvalWindow>& windows() const { return windows_; }
  /// Full-cache logits of window w's continuation `[Tc x vocab]`.
  const RowMatrix& full_logits(int w) const { return ref(w).logits; }
  /// Full-cache mean NLL of window w's continuation targets.
  double nll_full(int w) const { return ref(w).nll; }
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

  /// What `evaluate_schedule` evicts: the context only (kPrefill), or the continuation too (kDecode).
  enum class ScheduleEval { kPrefill, kDecode };

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
    ScheduleConfig cfg = sc;
    cfg.scorer = cfg_.scorers[static_cast<std::size_t>(scorer)];
    cfg.protection = cfg_.protection;
    cfg.head_allocation = cfg_.head_allocation;
    cfg.head_alpha = cfg_.head_alpha;
    cfg.output_projections = wo();
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
    if (spec.schedule.mode != ScheduleMode::kOneshot)
      return evaluate_schedule(schedule_config(spec, data), scorer,
                               spec.schedule.mode == ScheduleMode::kDecode ? ScheduleEval::kDecode : ScheduleEval::kPrefill);
    const Allocation a = allocate(spec, std::vector<int>(static_cast<std::size_t>(n_layers()), n), data);
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
  /// (window, ratio) runs are scheduled together (parallel over both); each starts from the
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

  /// Per-window results in the profiler's form.
  static SampleMetrics to_sample_metrics(const std::vector<WindowResult>& results) {
    SampleMetrics m;
    for (const WindowResult& r : results) {
      m.kl.push_back(r.metrics.loss.kl);
      m.dnll.push_back(r.metrics.loss.dnll);
      m.top1_disagree.push_back(r.metrics.loss.top1_disagree);
    }
    return m;
  }

 private:
  struct Reference {
    HostCache cache;                         // full context cache
    std::vector<RowMatrix> inputs;           // [L + 1] continuation residual input of layer l (L: final)
    RowMatrix logits;                        // full continuation logits
    std::size_t full_peak = 0;               // KV bytes of the full cache after the continuation
    std::vector<std::vector<LayerScores>> scores;  // [scorer][layer]
    std::vector<int> targets;
    double nll = 0;
  };

  const Reference& ref(int w) const {
    DEPTHKV_CHECK(w >= 0 && w < n_windows(), "window " << w << " outside [0, " << n_windows() << ")");
    return refs_[static_cast<std::size_t>(w)];
  }
  const std::vector<OutputProjection>* wo() const { return wo_.empty() ? nullptr : &wo_; }
  const OutputProjection* wo(int l) const { return wo_.empty() ? nullptr : &wo_[static_cast<std::size_t>(l)]; }
  // A plan's context budgets: per layer (`layer[l]` for every head, split across the heads by
  // EvalConfig::head_allocation), or per head (`heads[l][h]`, kept exactly unless `resplit`).
  struct Budgets {
    std::vector<int> layer;
    std::vector<std::vector<int>> heads;
    bool resplit = false;

    bool per_head() const { return !heads.empty(); }
    // the starting budget of every head of layer l
    std::vector<int> start(int l, int n_heads) const {
      return per_head() ? heads[static_cast<std::size_t>(l)]
                        : std::vector<int>(static_cast<std::size_t>(n_heads), layer[static_cast<std::size_t>(l)]);
    }
    // whether layer l keeps fewer than n tokens in some head
    bool prunes(int l, int n) const {
      if (!per_head()) return layer[static_cast<std::size_t>(l)] < n;
      for (int k : heads[static_cast<std::size_t>(l)])
        if (k < n) return true;
      return false;
    }
    // tokens layer l keeps over all heads of n each
    long long tokens(int l, int n, int n_heads) const {
      long long t = 0;
      for (int k : start(l, n_heads)) t += std::min(k, n);
      return t;
    }
    // WindowResult::budgets: per layer, the mean per head (rounded)
    std::vector<int> per_layer(int n_layers, int n, int n_heads) const {
      if (!per_head()) return layer;
      std::vector<int> out(static_cast<std::size_t>(n_layers));
      for (int l = 0; l < n_layers; ++l)
        out[static_cast<std::size_t>(l)] = static_cast<int>(std::llround(static_cast<double>(tokens(l, n, n_heads)) / n_heads));
      return out;
    }
  };
  // Per-head budgets of layer l from the starting budgets `start`: split by
  // EvalConfig::head_allocation for layer plans and resplit head plans, else as given.
  template <class Layer>
  std::vector<int> head_keep(const Budgets& b, const Layer& layer, const LayerScores& s, std::vector<int> start) const {
    if (cfg_.head_allocation == HeadAllocation::kUniform || (b.per_head() && !b.resplit)) return start;
    return head_budgets(cfg_.head_allocation, layer, s, start, cfg_.protection, cfg_.head_alpha);
  }
  // One SampleMetrics per keep ratio: every (window, ratio) run in parallel, with the budgets
  // budgets_of(context tokens n, keep_tokens(ratio, n, protection)).
  template <class BudgetsOf>
  std::vector<SampleMetrics> per_ratio(const std::vector<double>& keep_ratios, int scorer, BudgetsOf&& budgets_of) const {
    check_scorer(scorer);
    const int R = static_cast<int>(keep_ratios.size()), W = n_windows();
    for (double r : keep_ratios) DEPTHKV_CHECK(r >= 0.0 && r <= 1.0, "keep ratio " << r << " outside [0, 1]");
    std::vector<WindowResult> res(static_cast<std::size_t>(R) * static_cast<std::size_t>(W));
    parallel_tasks(R * W, [&](int t) {
      const int k = t / W, w = t % W;
      const int n = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
      res[static_cast<std::size_t>(t)] =
          run_one(w, scorer, budgets_of(n, keep_tokens(keep_ratios[static_cast<std::size_t>(k)], n, cfg_.protection)));
    });
    std::vector<SampleMetrics> out;
    for (int k = 0; k < R; ++k)
      out.push_back(to_sample_metrics(std::vector<WindowResult>(res.begin() + static_cast<std::ptrdiff_t>(k) * W,
                                                                res.begin() + static_cast<std::ptrdiff_t>(k + 1) * W)));
    return out;
  }
  // `evaluate`'s requirement: the spec prunes as the evaluator observed.
  void check_spec(const PruneSpec& spec, int scorer) const {
    DEPTHKV_CHECK(!windows_.empty(), "no windows to evaluate");
    const ScorerConfig& o = cfg_.scorers[static_cast<std::size_t>(scorer)];
    const ScorerConfig& s = spec.scorer;
    DEPTHKV_CHECK(scorer_name(s) == scorer_name(o) && s.window == o.window && s.kernel == o.kernel && s.pooling == o.pooling &&
                      s.output_aware == o.output_aware && s.lookahead == o.lookahead,
                  "the spec's scorer differs from the evaluator's scorer " << scorer);
    DEPTHKV_CHECK(spec.protection.n_sink == cfg_.protection.n_sink && spec.protection.n_recent == cfg_.protection.n_recent &&
                      spec.head_split.mode == cfg_.head_allocation && spec.head_split.alpha == cfg_.head_alpha &&
                      spec.schedule.chunk == cfg_.chunk_size,
                  "the spec's protection, head split or chunk differ from the evaluator's");
    for (const EvalWindow& w : windows_)
      DEPTHKV_CHECK(w.context.size() == windows_.front().context.size(), "windows of several context lengths");
  }
  void check_scorer(int scorer) const {
    DEPTHKV_CHECK(scorer >= 0 && scorer < n_scorers(), "scorer " << scorer << " outside [0, " << n_scorers() << ")");
  }

  template <class F>
  void parallel_windows(F&& f) const {
    parallel_tasks(n_windows(), std::forward<F>(f));
  }
  template <class F>
  void parallel_tasks(int n, F&& f) const {
    std::exception_ptr err;
#ifdef _OPENMP
    const int threads = cfg_.n_threads > 0 ? cfg_.n_threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && n > 1)
#endif
    for (int w = 0; w < n; ++w) {
      try {
        f(w);
      } catch (...) {
#ifdef _OPENMP
#pragma omp critical(depthkv_eval_error)
#endif
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
  }

  Reference full_run(const EvalWindow& win) const {
    const LlamaConfig& c = engine_.config();
    Reference r;
    r.cache = engine_.make_cache();
    std::vector<std::vector<TokenScorer>> sets;
    for (const ScorerConfig& s : cfg_.scorers) sets.push_back(make_scorers(c, s));
    std::vector<std::vector<TokenScorer>*> context_sets, lookahead_sets;
    for (auto& set : sets) (set.front().config().lookahead > 0 ? lookahead_sets : context_sets).push_back(&set);
    ForwardOptions opt;
    opt.chunk_size = cfg_.chunk_size;
    opt.all_logits = false;
    opt.observer = [&context_sets](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
      for (std::vector<TokenScorer>* set : context_sets) (*set)[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
    };
    const RowMatrix last = engine_.prefill(win.context, 0, r.cache, opt);
    if (!lookahead_sets.empty())
      observe_lookahead(engine_, r.cache, last_argmax(last), static_cast<std::int32_t>(win.context.size()), lookahead_sets);
    for (auto& set : sets) r.scores.push_back(layer_scores(set, r.cache, wo()));
    // Continuation on a copy (the stored cache stays context-only), capturing layer inputs.
    HostCache work = r.cache;
    const int tc = static_cast<int>(win.continuation.size());
    r.inputs.assign(static_cast<std::size_t>(c.n_layers) + 1, RowMatrix(tc, c.dim));
    const std::int32_t pos0 = static_cast<std::int32_t>(win.context.size());
    ForwardOptions fo;
    fo.chunk_size = cfg_.chunk_size;
    fo.capture_points = capture_bit(CapturePoint::kLayerInput) | capture_bit(CapturePoint::kLayerOutput);
    fo.capture = [&](int l, CapturePoint p, std::int32_t p0, const RowMatrix& rows) {
      const int idx = p == CapturePoint::kLayerInput ? l : l + 1;
      if (p == CapturePoint::kLayerOutput && l + 1 < c.n_layers) return;  // = next layer's input
      r.inputs[static_cast<std::size_t>(idx)].middleRows(p0 - pos0, rows.rows()) = rows;
    };
    r.logits = engine_.teacher_force(win.continuation, pos0, work, fo);
    r.full_peak = work.bytes();
    r.targets = continuation_targets(win.continuation);
    r.nll = compare_logits(r.logits, r.logits, r.targets).nll_full;
    return r;
  }

  template <class KeepFn>
  std::vector<WindowResult> run_all(int scorer, KeepFn&& keep_of) const {
    check_scorer(scorer);
    std::vector<WindowResult> out(windows_.size());
    std::vector<Budgets> keeps(windows_.size());
    for (int w = 0; w < n_windows(); ++w) keeps[static_cast<std::size_t>(w)] = keep_of(w);  // validates (serial)
    parallel_windows([&](int w) { out[static_cast<std::size_t>(w)] = run_one(w, scorer, keeps[static_cast<std::size_t>(w)]); });
    return out;
  }

  WindowResult run_one(int w, int scorer, const Budgets& keep) const {
    if (cfg_.chunked_plans) return run_chunked_plan(w, scorer, keep);
    return cfg_.reuse ? run_reuse(w, scorer, keep) : run_naive(w, scorer, keep);
  }

  std::size_t layer_bytes(int tokens) const {
    return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(engine_.config().n_kv_heads) *
           static_cast<std::size_t>(engine_.config().head_dim) * 2 * sizeof(float);
  }
  std::size_t head_token_bytes(long long tokens) const {
    return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(engine_.config().head_dim) * 2 * sizeof(float);
  }

  WindowResult run_reuse(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const Reference& r = refs_[static_cast<std::size_t>(w)];
    const int n_ctx = static_cast<int>(win.context.size());
    WindowResult res;
    res.budgets = keep.per_layer(c.n_layers, n_ctx, c.n_kv_heads);
    int first = c.n_layers;
    for (int l = 0; l < c.n_layers; ++l) {
      res.bytes_full += layer_bytes(n_ctx);
      res.bytes_kept += head_token_bytes(keep.tokens(l, n_ctx, c.n_kv_heads));
      if (keep.prunes(l, n_ctx) && first == c.n_layers) first = l;
    }
    RowMatrix x = r.inputs[static_cast<std::size_t>(first)];
    ForwardOptions fo;
    const int tc = static_cast<int>(x.rows());
    // bytes at the end: layers below `first` hold the full context + continuation
    std::size_t bytes_end = 0;
    for (int l = 0; l < first; ++l) bytes_end += r.cache.layer(l).bytes() + layer_bytes(tc);
    res.bytes_full_peak = r.full_peak;
    for (int l = first; l < c.n_layers; ++l) {
      HostLayer<float> kv = r.cache.layer(l);
      if (keep.prunes(l, n_ctx)) {
        const LayerScores& s = r.scores[static_cast<std::size_t>(scorer)][static_cast<std::size_t>(l)];
        evict_layer(kv, s, head_keep(keep, kv, s, keep.start(l, c.n_kv_heads)), cfg_.protection);
      }
      // the continuation in chunks, as the full run processed it
      for (int c0 = 0; c0 < tc; c0 += cfg_.chunk_size) {
        const int t = std::min(cfg_.chunk_size, tc - c0);
        RowMatrix xc = x.middleRows(c0, t);
        engine_.forward_layer(l, xc, n_ctx + c0, kv, fo);
        x.middleRows(c0, t) = xc;
      }
      bytes_end += kv.bytes();
    }
    res.bytes_peak = std::max(r.cache.bytes(), bytes_end);  // before the eviction, or at the end
    layer_tokens_ += static_cast<long long>(c.n_layers - first) * tc;
    RowMatrix logits(tc, c.vocab_size);
    for (int c0 = 0; c0 < tc; c0 += cfg_.chunk_size) {  // per chunk, as the full run (same rounding)
      const int t = std::min(cfg_.chunk_size, tc - c0);
      logits.middleRows(c0, t) = engine_.logits(x.middleRows(c0, t), nullptr, n_ctx + c0);
      LlamaEngine::check_finite(logits.middleRows(c0, t), n_ctx + c0, "the logits");
    }
    res.metrics = compare_logits(r.logits, logits, r.targets);
    return res;
  }

  WindowResult run_naive(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const int n_ctx = static_cast<int>(win.context.size());
    ForwardOptions opt;
    opt.chunk_size = cfg_.chunk_size;
    opt.all_logits = false;
    // full run from scratch
    HostCache full = engine_.make_cache();
    engine_.prefill(win.context, 0, full, opt);
    const RowMatrix lf = engine_.teacher_force(win.continuation, n_ctx, full, opt);
    // pruned run from scratch
    HostCache cache = engine_.make_cache();
    std::vector<TokenScorer> sc = make_scorers(c, cfg_.scorers[static_cast<std::size_t>(scorer)]);
    ForwardOptions po = opt;
    const bool lookahead = sc.front().config().lookahead > 0;
    if (!lookahead) po.observer = observe_into(sc);
    const RowMatrix last = engine_.prefill(win.context, 0, cache, po);
    if (lookahead) observe_lookahead(engine_, cache, last_argmax(last), n_ctx, {&sc});
    WindowResult res;
    res.budgets = keep.per_layer(c.n_layers, n_ctx, c.n_kv_heads);
    res.bytes_full = cache.bytes();
    res.bytes_full_peak = full.bytes();
    const std::vector<LayerScores> scores = layer_scores(sc, cache, wo());
    std::vector<std::vector<int>> per_head(static_cast<std::size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l)
      per_head[static_cast<std::size_t>(l)] =
          head_keep(keep, cache.layer(l), scores[static_cast<std::size_t>(l)], keep.start(l, c.n_kv_heads));
    evict(cache, scores, per_head, cfg_.protection);
    res.bytes_kept = cache.bytes();
    const RowMatrix lp = engine_.teacher_force(win.continuation, n_ctx, cache, opt);
    res.bytes_peak = std::max(res.bytes_full, cache.bytes());
    layer_tokens_ += static_cast<long long>(c.n_layers) * (2 * n_ctx + 2 * static_cast<long long>(win.continuation.size()));
    res.metrics = compare_logits(lf, lp, continuation_targets(win.continuation));
    return res;
  }

  // The prefill of window `w` in chunks, `evict_chunk(seen, cache)` called after every chunk
  // (`seen` context tokens appended; the peak is taken before it) and `after_prefill(cache)` once
  // at its end, then the continuation by `continuation(cache, res)` (its logits, [tc][vocab]):
  // the accounting shared by the chunked plans and the schedules.
  template <class EvictFn, class AfterFn, class ContinuationFn>
  WindowResult run_evicting(int w, AttentionObserver observer, EvictFn&& evict_chunk, AfterFn&& after_prefill,
                            ContinuationFn&& continuation) const {
    const LlamaConfig& c = engine_.config();
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const Reference& r = refs_[static_cast<std::size_t>(w)];
    HostCache cache = engine_.make_cache();
    WindowResult res;
    res.bytes_full = r.cache.bytes();
    res.bytes_full_peak = r.full_peak;
    ForwardOptions po;
    po.chunk_size = cfg_.chunk_size;
    po.all_logits = false;
    po.observer = std::move(observer);
    po.after_chunk = [&](int seen, std::int32_t) {
      res.bytes_peak = std::max(res.bytes_peak, cache.bytes());  // the chunk appended, not yet evicted
      evict_chunk(seen, cache);
    };
    engine_.prefill(win.context, 0, cache, po);
    after_prefill(cache);
    res.bytes_kept = cache.bytes();
    res.budgets = cache.lengths();
    const RowMatrix lp = continuation(cache, res);
    res.bytes_peak = std::max(res.bytes_peak, cache.bytes());
    layer_tokens_ += static_cast<long long>(c.n_layers) * static_cast<long long>(win.context.size() + win.continuation.size());
    res.metrics = compare_logits(r.logits, lp, r.targets);
    return res;
  }

  // The continuation teacher-forced in chunks, the cache not evicted.
  RowMatrix continue_plain(int w, HostCache& cache) const {
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    ForwardOptions fo;
    fo.chunk_size = cfg_.chunk_size;
    return engine_.teacher_force(win.continuation, static_cast<std::int32_t>(win.context.size()), cache, fo);
  }

  // A plan evicted after every prefill chunk (EvalConfig::chunked_plans).
  WindowResult run_chunked_plan(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const int n_ctx = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
    std::vector<TokenScorer> sc = make_scorers(c, cfg_.scorers[static_cast<std::size_t>(scorer)]);
    const auto evict_chunk = [&](int seen, HostCache& cache) {
      for (int l = 0; l < c.n_layers; ++l) {
        if (!keep.prunes(l, n_ctx)) continue;
        std::vector<int> target = keep.start(l, c.n_kv_heads);  // each head's budget of the `seen` tokens
        for (int& k : target)
          if (seen < n_ctx && k < n_ctx) k = keep_tokens(static_cast<double>(k) / n_ctx, seen, cfg_.protection);
        auto& layer = cache.layer(l);
        bool over = false;
        for (int h = 0; h < c.n_kv_heads; ++h) over = over || layer.size(h) > target[static_cast<std::size_t>(h)];
        if (!over) continue;
        const LayerScores s = sc[static_cast<std::size_t>(l)].scores(layer, wo(l));
        const LayerEviction e = evict_layer(layer, s, head_keep(keep, layer, s, target), cfg_.protection);
        for (int h = 0; h < c.n_kv_heads; ++h) {
          const auto& kept = e.kept_slots[static_cast<std::size_t>(h)];
          sc[static_cast<std::size_t>(l)].compact(h, kept.data(), static_cast<int>(kept.size()));
        }
      }
    };
    WindowResult res = run_evicting(
        w, observe_into(sc), evict_chunk, [](HostCache&) {},
        [&](HostCache& cache, WindowResult&) { return continue_plain(w, cache); });
    res.budgets = keep.per_layer(c.n_layers, n_ctx, c.n_kv_heads);
    return res;
  }

  WindowResult run_schedule(int w, const ScheduleConfig& sc, ScheduleEval mode) const {
    const LlamaConfig& c = engine_.config();
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const int n_ctx = static_cast<int>(win.context.size());
    const int tc = static_cast<int>(win.continuation.size());
    EvictionSchedule schedule(sc, c.n_layers, c.n_heads, c.n_kv_heads);
    const auto continuation = [&](HostCache& cache, WindowResult& res) {
      if (mode == ScheduleEval::kPrefill) return continue_plain(w, cache);
      // blocks that end where the schedule may evict: each token sees its decode-time cache
      ForwardOptions fo;
      fo.chunk_size = cfg_.chunk_size;
      fo.observer = schedule.observer();
      RowMatrix lp(tc, c.vocab_size);
      for (int t0 = 0; t0 < tc;) {
        const int t = static_cast<int>(std::min<long long>(tc - t0, std::max<long long>(1, sc.interval - schedule.pending())));
        const std::vector<int> block(win.continuation.begin() + t0, win.continuation.begin() + t0 + t);
        lp.middleRows(t0, t) = engine_.teacher_force(block, n_ctx + t0, cache, fo);
        res.bytes_peak = std::max(res.bytes_peak, cache.bytes());
        schedule.after_decode_step(cache);
        t0 += t;
      }
      return lp;
    };
    return run_evicting(
        w, schedule.observer(), [&](int, HostCache& cache) { schedule.after_chunk(cache); },
        [&](HostCache& cache) { schedule.evict_now(cache); }, continuation);
  }

  const LlamaEngine& engine_;
  std::vector<EvalWindow> windows_;
  EvalConfig cfg_;
  std::vector<Reference> refs_;
  OutputProjections wo_storage_;      // owns the float copies of stored (F16, quantized) wo that wo_ views
  std::vector<OutputProjection> wo_;  // per layer, when a scorer is output-aware
  mutable std::atomic<long long> layer_tokens_{0};
};

}  // namespace llama
}  // namespace depthkv
