#pragma once
/// @file llama/eval.hpp
/// @brief `PruningEvaluator`: the quality of a pruned KV cache against the full cache (mean KL,
/// NLL increase, top-1 agreement, KV bytes; metrics.hpp) for budget plans, `PruneSpec`s and
/// schedules on a set of windows, reusing the full run's activations (what the
/// `SensitivityProfiler` calls). Its protocol settings and results: llama/eval_config.hpp.
///
/// ## Evaluation protocol
/// A window is a context and a continuation. The full run prefills the context (observing its
/// attention with the scorers; a scorer with a lookahead observes the G greedy tokens after it,
/// `observe_lookahead`) and teacher-forces the continuation on the full cache. A pruned run evicts
/// each layer of the context cache to its budget once, after the whole context (chunking only
/// splits the computation), then teacher-forces the continuation on the pruned cache (appended,
/// never evicted; positions keep their values). Metrics are taken over the `Tc` continuation
/// rows, all of which read the pruned cache: KL(full || pruned) and top-1 agreement over all `Tc`
/// rows, the NLL of the true next token over the `Tc - 1` rows that have one in the window.
/// The continuation is the window's text (`ContinuationSource::kText`) or the model's greedy
/// continuation of the context (`kModel`, generated on the full cache). An oracle scorer
/// (`EvalConfig::oracle`, a measurement) scores the context by the attention of the
/// continuation's own `Tc` queries, observed while the full run teacher-forces it.
/// A chunked or decode spec runs the bounded-memory variant on the driver (`PrunedGeneration`):
/// the context is prefilled in chunks under an `EvictionSchedule` (eviction after every chunk, to
/// the budget of the tokens seen) and reaches the final budget before the continuation; under a
/// decode spec the continuation is evicted too, every `interval` tokens, as decoding it token by
/// token would. `EvalConfig::chunked_plans` runs every plan as a schedule whose targets are the
/// plan's budgets (`detail::TargetPlan`).
///
/// ## Activation reuse
/// When the first pruned layer of a plan is `l`, layers `< l` see exactly the full run's caches
/// and inputs. The evaluator stores, per window, the full context cache of every layer, the
/// continuation's residual input of every layer (and the final residual), the full run's logits
/// and every layer's token scores, and runs a plan from layer `l` on: layer `l` (and any later
/// pruned layer) on a pruned copy of its context cache, the others on copies of their full
/// caches. "Only layer l at ratio r" thus costs `(L - l) / L` of a continuation-only pass. The
/// ratios of one layer (or KV head) run as one batch per window (`forward_layer_batch`: each
/// weight matrix read once for all), equal to separate runs up to the rounding of products.
///
/// @code
/// using namespace depthkv;
/// llama::PruningEvaluator ev(engine, windows, cfg);                // the full runs
/// PruneSpec spec;                                                  // uniform H2O, keep 30%
/// spec.budget = Budget::keep(0.3);
/// std::vector<llama::WindowResult> r = ev.evaluate(spec, PolicyData{});  // r[w].metrics.loss.kl
/// SensitivityProfiler prof(ev.n_layers());
/// prof.run_batched(ev.layer_function(/*scorer=*/0));              // the layer curves
/// @endcode

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "depthkv/detail/parallel_for.hpp"
#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "depthkv/llama/eval_config.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/llama/pruned_generation.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/metrics.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {
namespace llama {

/// Evaluates budget plans on a fixed set of windows against the full cache. The full run of
/// every window is computed once, in the constructor. Const calls are thread-safe. Memory per
/// window: the full context cache, `(L + 1) * Tc * dim` floats of activations, `Tc * vocab`
/// logits and the context's scores per scorer.
class PruningEvaluator {
 public:

  /// Runs the full (unpruned) passes of every window.
  /// @param engine the engine (must outlive the evaluator)
  /// @param windows the samples (each context and continuation non-empty)
  /// @throws Error on empty windows, invalid tokens or scorer configurations (also a lookahead
  ///   that does not fit the model's context after a window's context)
  PruningEvaluator(const LlamaEngine& engine, std::vector<EvalWindow> windows, EvalConfig cfg = EvalConfig())
      : engine_(engine), windows_(std::move(windows)), cfg_(std::move(cfg)) {
    if (cfg_.scorers.empty()) cfg_.scorers.push_back(cfg_.spec.scorer);
    check_config();
    for (const ScorerConfig& s : cfg_.scorers)
      if (s.output_aware && wo_.empty()) {
        wo_storage_ = OutputProjections(engine.model());
        wo_ = wo_storage_.views();
      }
    refs_.resize(windows_.size());
    parallel_tasks(n_windows(), [&](int w) {
      refs_[static_cast<std::size_t>(w)] = full_run(windows_[static_cast<std::size_t>(w)]);
    });
  }

  const EvalConfig& config() const { return cfg_; }
  const std::vector<EvalWindow>& windows() const { return windows_; }
  int n_windows() const { return static_cast<int>(windows_.size()); }
  int n_layers() const { return engine_.config().n_layers; }
  int n_kv_heads() const { return engine_.config().n_kv_heads; }
  int n_scorers() const { return static_cast<int>(cfg_.scorers.size()); }
  /// Full-cache logits of window w's continuation `[Tc x vocab]`.
  const RowMatrix& full_logits(int w) const { return ref(w).logits; }
  /// Full-cache mean NLL of window w's continuation targets.
  double nll_full(int w) const { return ref(w).nll; }
  /// Mean NLL of window w's last `config().context_nll_tokens` context tokens (0: not measured).
  double context_nll(int w) const { return ref(w).context_nll; }
  /// Layer-token products run by plan evaluations so far (a full context+continuation pass of
  /// window w costs `L * (|context| + Tc)`).
  long long layer_tokens_run() const { return layer_tokens_.load(); }

  /// A `PruneSpec` (prune_spec.hpp): its budget allocated over the windows' context
  /// (`allocate`), then run once after the context (a oneshot schedule; head-optimal re-split when
  /// the head split is adaptive) or on the driver under a schedule (the file comment: kPrefill for
  /// chunked, kDecode for decode). The spec must select as `config().spec` does (protection, head
  /// split, chunk), with the scorer `config().scorers[scorer]` (the full runs observed them);
  /// every context one length.
  /// @param data the curves the spec's policy reads
  /// @throws Error on a spec that selects otherwise, windows of several context lengths, or as
  ///   `allocate` and the evaluation called
  std::vector<WindowResult> evaluate(const PruneSpec& spec, const PolicyData& data, int scorer = 0) const {
    check_scorer(scorer);
    spec.validate();
    check_spec(spec, scorer);
    PolicyData d = data;  // the model's sliding windows cap its local layers
    if (d.layer_window.empty()) d.layer_window = engine_.config().layer_window;
    if (spec.schedule.mode != ScheduleMode::kOneshot)
      return evaluate_schedule(
          depthkv::detail::schedule_config(spec, d), scorer,
          spec.schedule.mode == ScheduleMode::kDecode);
    const int n = static_cast<int>(windows_.front().context.size());
    const Allocation a = allocate(spec, std::vector<int>(static_cast<std::size_t>(n_layers()), n), d);
    if (is_head_policy(spec.policy))
      return evaluate_head_budgets(a.heads, scorer, spec.head_split.mode != HeadAllocation::kUniform);
    return evaluate_budgets(a.layers, scorer);
  }

  /// A keep-ratio plan: layer l keeps `keep_tokens(plan[l], length, protection)` tokens of each
  /// window's context in every head (1.0 = full).
  /// @throws Error on a plan of the wrong size or a ratio outside [0, 1], or a bad scorer index
  std::vector<WindowResult> evaluate_plan(const std::vector<double>& plan, int scorer = 0) const {
    DEPTHKV_CHECK(static_cast<int>(plan.size()) == n_layers(),
                  "plan has " << plan.size() << " ratios for " << n_layers() << " layers");
    for (double r : plan) DEPTHKV_CHECK(r >= 0.0 && r <= 1.0, "keep ratio " << r << " outside [0, 1]");
    return run_all(scorer, [&](int n) {
      std::vector<int> k;
      for (double r : plan) k.push_back(keep_tokens(r, n, cfg_.spec.protection));
      return layer_plan(k);
    });
  }

  /// Per-layer token budgets (every head of layer l keeps `keep_per_layer[l]` context tokens,
  /// split across the heads by `config().spec.head_split`; more than the context keeps all).
  /// @throws Error on the wrong layer count, a negative budget, one below the protected count,
  ///   or a bad scorer index
  std::vector<WindowResult> evaluate_budgets(const std::vector<int>& keep_per_layer, int scorer = 0) const {
    DEPTHKV_CHECK(static_cast<int>(keep_per_layer.size()) == n_layers(),
                  "budgets for " << keep_per_layer.size() << " layers, model has " << n_layers());
    for (std::size_t l = 0; l < keep_per_layer.size(); ++l)
      DEPTHKV_CHECK(keep_per_layer[l] >= 0, "negative budget " << keep_per_layer[l] << " for layer " << l);
    return run_all(scorer, [&](int n) {
      std::vector<int> k;
      for (int b : keep_per_layer) k.push_back(std::min(b, n));
      return layer_plan(k);
    });
  }

  /// Per-head token budgets: head h of layer l keeps `keep[l][h]` context tokens (e.g.
  /// `head_optimal_budgets`). With `resplit` each layer's total is split again by
  /// `config().spec.head_split` from these (`head_budgets`' per-head form); without it they are
  /// kept exactly. `WindowResult::budgets` holds each layer's mean per head (rounded).
  /// @throws Error on the wrong layer or head count, a negative budget, one below the protected
  ///   count, or a bad scorer index
  std::vector<WindowResult> evaluate_head_budgets(const std::vector<std::vector<int>>& keep, int scorer = 0,
                                                  bool resplit = false) const {
    DEPTHKV_CHECK(static_cast<int>(keep.size()) == n_layers(),
                  "head budgets for " << keep.size() << " layers, model has " << n_layers());
    for (std::size_t l = 0; l < keep.size(); ++l) {
      DEPTHKV_CHECK(
          static_cast<int>(keep[l].size()) == n_kv_heads(),
          "layer " << l << ": " << keep[l].size() << " head budgets for " << n_kv_heads() << " KV heads");
      for (std::size_t h = 0; h < keep[l].size(); ++h)
        DEPTHKV_CHECK(keep[l][h] >= 0,
                      "negative budget " << keep[l][h] << " for layer " << l << " head " << h);
    }
    return run_all(scorer, [&](int n) {
      Budgets b{keep, resplit};
      for (auto& row : b.heads)
        for (int& k : row) k = std::min(k, n);
      return b;
    });
  }

  /// "Only `layer` pruned, at each of `keep_ratios`": one `SampleMetrics` per ratio, from the
  /// stored input of `layer` (the windows in parallel, each window's ratios as one batch).
  /// @throws Error on a bad layer, ratio or scorer index
  std::vector<SampleMetrics> layer_metrics(int layer, const std::vector<double>& keep_ratios,
                                           int scorer = 0) const {
    DEPTHKV_CHECK(layer >= 0 && layer < n_layers(),
                  "layer " << layer << " outside [0, " << n_layers() << ")");
    return per_ratio(keep_ratios, scorer, [&](int n, int k) {
      std::vector<int> b(static_cast<std::size_t>(n_layers()), n);
      b[static_cast<std::size_t>(layer)] = k;
      return layer_plan(b);
    });
  }

  /// "Only KV head `head` of `layer` pruned" (its budget kept exactly whatever
  /// `config().spec.head_split`), as `layer_metrics`.
  /// @throws Error on a bad layer, head, ratio or scorer index
  std::vector<SampleMetrics> head_metrics(int layer, int head, const std::vector<double>& keep_ratios,
                                          int scorer = 0) const {
    DEPTHKV_CHECK(layer >= 0 && layer < n_layers(),
                  "layer " << layer << " outside [0, " << n_layers() << ")");
    DEPTHKV_CHECK(head >= 0 && head < n_kv_heads(),
                  "KV head " << head << " outside [0, " << n_kv_heads() << ")");
    return per_ratio(keep_ratios, scorer, [&](int n, int k) {
      Budgets b{std::vector<std::vector<int>>(static_cast<std::size_t>(n_layers()),
                                              std::vector<int>(static_cast<std::size_t>(n_kv_heads()), n)),
                false};
      b.heads[static_cast<std::size_t>(layer)][static_cast<std::size_t>(head)] = k;
      return b;
    });
  }

  /// The functions to hand to `SensitivityProfiler::run` (a plan), `run_batched` (a layer's
  /// ratios) and, over `n_layers() * n_kv_heads()` units (unit u = layer u / H, head u % H), the
  /// head curves' `run_batched`. They reference this evaluator, which must outlive them.
  /// @throws Error on a bad scorer index
  PlanRunFunction plan_function(int scorer = 0) const {
    check_scorer(scorer);
    return [this, scorer](const KeepPlan& plan) { return to_sample_metrics(evaluate_plan(plan, scorer)); };
  }
  LayerRunFunction layer_function(int scorer = 0) const {
    check_scorer(scorer);
    return [this, scorer](int layer, const std::vector<double>& ratios) {
      return layer_metrics(layer, ratios, scorer);
    };
  }
  LayerRunFunction head_function(int scorer = 0) const {
    check_scorer(scorer);
    return [this, scorer](int u, const std::vector<double>& r) {
      return head_metrics(u / n_kv_heads(), u % n_kv_heads(), r, scorer);
    };
  }

 private:
  // A bounded-memory schedule on the driver (see the file comment): `sc.scorer`, protection,
  // head split and projections are replaced by the evaluator's (`config().scorers[scorer]`).
  // With one chunk per context and no decode eviction this equals a one-shot run of the same budget
  // (`bytes_peak` aside). `budgets` are the ones after the context; `bytes_peak` counts every
  // chunk and block before its eviction.
  // @throws Error on a bad or oracle scorer index, or an invalid schedule
  std::vector<WindowResult> evaluate_schedule(const depthkv::detail::ScheduleConfig& sc, int scorer, bool decode) const {
    DEPTHKV_CHECK(!is_oracle(scorer),
                  "scorer " << scorer << " takes oracle scores, which a schedule cannot use");
    const depthkv::detail::ScheduleConfig cfg = schedule_base(scorer, sc);
    const LlamaConfig& c = engine_.config();
    EvictionSchedule(cfg, c.n_layers, c.n_heads, c.n_kv_heads);  // validates (serial)
    std::vector<WindowResult> out(windows_.size());
    parallel_tasks(n_windows(),
                   [&](int w) { out[static_cast<std::size_t>(w)] = run_schedule(w, cfg, decode); });
    return out;
  }

  /// One window's full run (see the file comment).
  struct Reference {
    HostCache cache;                // full context cache
    std::vector<RowMatrix> inputs;  // [L + 1] continuation residual input of layer l (L: final)
    RowMatrix logits;               // full continuation logits
    std::size_t full_peak = 0;      // KV bytes after the continuation
    std::vector<std::vector<LayerScores>> scores;  // [scorer][layer]
    std::vector<int> targets;
    double nll = 0, context_nll = 0;
  };

  /// A plan's context budgets: head h of layer l keeps `heads[l][h]` tokens, split again across
  /// the layer's heads by `the head split of `EvalConfig::spec`` when `resplit` (a per-layer plan is every
  /// head at the layer's budget, re-split).
  struct Budgets {
    std::vector<std::vector<int>> heads;
    bool resplit = true;

    bool prunes(int l, int n) const {  // layer l keeps fewer than n in some head
      const std::vector<int>& k = heads[static_cast<std::size_t>(l)];
      return *std::min_element(k.begin(), k.end()) < n;
    }
    long long tokens(int l, int n) const {  // kept over all heads
      long long t = 0;
      for (int k : heads[static_cast<std::size_t>(l)]) t += std::min(k, n);
      return t;
    }
    std::vector<int> per_layer(int n) const {  // WindowResult::budgets: each layer's mean per head
      std::vector<int> out;
      for (std::size_t l = 0; l < heads.size(); ++l)
        out.push_back(static_cast<int>(
            std::llround(static_cast<double>(tokens(static_cast<int>(l), n)) / heads[l].size())));
      return out;
    }
  };
  Budgets layer_plan(const std::vector<int>& keep) const {
    Budgets b;
    for (int k : keep) b.heads.emplace_back(static_cast<std::size_t>(n_kv_heads()), k);
    return b;
  }

  void check_config() const {
    cfg_.spec.validate();
    check_thread_count(cfg_.n_threads, "n_threads");
    for (std::size_t w = 0; w < windows_.size(); ++w)
      DEPTHKV_CHECK_AS("PruningEvaluator", !windows_[w].context.empty() && !windows_[w].continuation.empty(),
                       "window " << w << " has an empty context or continuation");
    const LlamaConfig& c = engine_.config();
    for (const ScorerConfig& s : cfg_.scorers) {
      TokenScorer(s, c.n_heads, c.n_kv_heads);
      DEPTHKV_CHECK_AS("PruningEvaluator", !cfg_.chunked_plans || s.lookahead == 0,
                       "chunked plans evict while the context is read; lookahead ("
                           << s.lookahead << ") needs the whole context first");
      for (std::size_t w = 0; w < windows_.size() && s.lookahead > 0;
           ++w) {  // observe_lookahead's check, up front
        const long long ctx = static_cast<long long>(windows_[w].context.size());
        DEPTHKV_CHECK_AS("PruningEvaluator", ctx + s.lookahead <= c.seq_len,
                         "lookahead: " << s.lookahead << " greedy tokens after a context of " << ctx
                                       << " tokens do not fit the model's context of " << c.seq_len
                                       << " tokens (at most " << std::max<long long>(0, c.seq_len - ctx)
                                       << " here)");
      }
    }
    DEPTHKV_CHECK_AS(
        "PruningEvaluator", cfg_.oracle.empty() || cfg_.oracle.size() == cfg_.scorers.size(),
        "oracle flags for " << cfg_.oracle.size() << " of " << cfg_.scorers.size() << " scorers");
    DEPTHKV_CHECK_AS(
        "PruningEvaluator",
        !cfg_.chunked_plans || std::find(cfg_.oracle.begin(), cfg_.oracle.end(), true) == cfg_.oracle.end(),
        "chunked plans evict while the context is read; oracle scores need the continuation first");
  }
  // `evaluate`'s requirement: the spec prunes as the evaluator observed.
  void check_spec(const PruneSpec& spec, int scorer) const {
    DEPTHKV_CHECK(!windows_.empty(), "no windows to evaluate");
    const ScorerConfig &o = cfg_.scorers[static_cast<std::size_t>(scorer)], &s = spec.scorer;
    DEPTHKV_CHECK(scorer_name(s) == scorer_name(o) && s.window == o.window && s.kernel == o.kernel &&
                      s.pooling == o.pooling && s.output_aware == o.output_aware &&
                      s.lookahead == o.lookahead && s.context_weight == o.context_weight,
                  "the spec's scorer differs from the evaluator's scorer " << scorer);
    const PruneSpec& e = cfg_.spec;
    DEPTHKV_CHECK(spec.protection.n_sink == e.protection.n_sink && spec.protection.n_recent == e.protection.n_recent &&
                      spec.head_split == e.head_split && spec.schedule.chunk == e.schedule.chunk,
                  "the spec's protection, head split or chunk differ from the evaluator's");
    for (const EvalWindow& w : windows_)
      DEPTHKV_CHECK(w.context.size() == windows_.front().context.size(),
                    "windows of several context lengths");
  }
  void check_scorer(int scorer) const {
    DEPTHKV_CHECK(scorer >= 0 && scorer < n_scorers(),
                  "scorer " << scorer << " outside [0, " << n_scorers() << ")");
  }
  const Reference& ref(int w) const {
    DEPTHKV_CHECK(w >= 0 && w < n_windows(), "window " << w << " outside [0, " << n_windows() << ")");
    return refs_[static_cast<std::size_t>(w)];
  }
  template <class F>
  void parallel_tasks(int n, F&& f) const {
    depthkv::detail::omp_tasks(n, cfg_.n_threads, std::forward<F>(f));
  }

  bool is_oracle(int s) const { return !cfg_.oracle.empty() && cfg_.oracle[static_cast<std::size_t>(s)]; }
  // Scorer s for a window of `tc` continuation tokens: an oracle observes all `tc` continuation
  // rows (as a lookahead of `tc` tokens would) and nothing else.
  std::vector<TokenScorer> scorers_of(int s, int tc) const {
    ScorerConfig sc = cfg_.scorers[static_cast<std::size_t>(s)];
    if (is_oracle(s)) {
      sc.lookahead = tc;
      sc.context_weight = 0.0;
    }
    return make_scorers(engine_.config(), sc);
  }
  // An oracle's scorers keep the state of the context's `n` slots only.
  static void keep_context_state(std::vector<TokenScorer>& set, int n) {
    for (TokenScorer& s : set)
      depthkv::detail::keep_prefix(s.n_kv_heads(),
                                   std::vector<int>(static_cast<std::size_t>(s.n_kv_heads()), n),
                                   [&s](int h, const std::int32_t* slots, int k) { s.compact(h, slots, k); });
  }
  const std::vector<OutputProjection>* wo() const { return wo_.empty() ? nullptr : &wo_; }
  static AttentionObserver observe_sets(const std::vector<std::vector<TokenScorer>*>& sets) {
    return [sets](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
      for (std::vector<TokenScorer>* set : sets)
        (*set)[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
    };
  }

  // The scorer sets of a full run, grouped by what they observe: the context's prefill, the
  // lookahead after it (a set with a context weight in both), the continuation (oracles).
  struct ObservedSets {
    std::vector<std::vector<TokenScorer>> sets;  // [scorer]
    std::vector<std::vector<TokenScorer>*> context, lookahead, oracle;
  };
  ObservedSets observed_sets(int tc) const {
    ObservedSets o;
    for (int s = 0; s < n_scorers(); ++s) o.sets.push_back(scorers_of(s, tc));
    for (int s = 0; s < n_scorers(); ++s) {
      std::vector<TokenScorer>* set = &o.sets[static_cast<std::size_t>(s)];
      const ScorerConfig& sc = set->front().config();
      if (is_oracle(s)) {
        o.oracle.push_back(set);
        continue;
      }
      if (sc.lookahead > 0) o.lookahead.push_back(set);
      if (sc.lookahead == 0 || sc.context_weight > 0.0) o.context.push_back(set);
    }
    return o;
  }

  // The full run of `win`; with ContinuationSource::kModel its continuation is first replaced by
  // the model's greedy one (as many tokens).
  Reference full_run(EvalWindow& win) {
    Reference r;
    r.cache = engine_.make_cache();
    const int tc = static_cast<int>(win.continuation.size());
    ObservedSets o = observed_sets(tc);
    ForwardOptions opt;
    opt.chunk_size = cfg_.spec.schedule.chunk;
    opt.all_logits = false;
    opt.observer = observe_sets(o.context);
    std::unique_ptr<TailNll> tail;
    if (cfg_.context_nll_tokens > 0 && win.context.size() >= 2)
      tail = std::make_unique<TailNll>(engine_, win.context, cfg_.context_nll_tokens, opt);
    const RowMatrix last = engine_.prefill(win.context, 0, r.cache, opt);
    if (tail) r.context_nll = tail->nll();
    const std::int32_t pos0 = static_cast<std::int32_t>(win.context.size());
    if (cfg_.continuation_source == ContinuationSource::kModel)
      win.continuation = greedy_continuation(engine_, r.cache, last_argmax(last), pos0, tc);
    if (!o.lookahead.empty()) observe_lookahead(engine_, r.cache, last_argmax(last), pos0, o.lookahead);
    r.scores.resize(o.sets.size());
    for (int s = 0; s < n_scorers(); ++s)
      if (!is_oracle(s))
        r.scores[static_cast<std::size_t>(s)] = layer_scores(o.sets[static_cast<std::size_t>(s)], r.cache, wo());
    full_continuation(win, r, o.oracle);
    for (int s = 0; s < n_scorers(); ++s) {
      if (!is_oracle(s)) continue;
      keep_context_state(o.sets[static_cast<std::size_t>(s)], static_cast<int>(pos0));
      r.scores[static_cast<std::size_t>(s)] = layer_scores(o.sets[static_cast<std::size_t>(s)], r.cache, wo());
    }
    r.targets = continuation_targets(win.continuation);
    r.nll = compare_logits(r.logits, r.logits, r.targets).nll_full;
    return r;
  }
  // The full run's continuation, on a copy of its context cache: every layer's input captured,
  // the logits and the peak kept, and the oracles observing its attention.
  void full_continuation(const EvalWindow& win, Reference& r,
                         const std::vector<std::vector<TokenScorer>*>& oracle) const {
    const LlamaConfig& c = engine_.config();
    const std::int32_t pos0 = static_cast<std::int32_t>(win.context.size());
    HostCache work = r.cache;
    r.inputs.assign(static_cast<std::size_t>(c.n_layers) + 1,
                    RowMatrix(static_cast<Eigen::Index>(win.continuation.size()), c.dim));
    ForwardOptions fo;
    fo.chunk_size = cfg_.spec.schedule.chunk;
    fo.capture_points = capture_bit(CapturePoint::kLayerInput) | capture_bit(CapturePoint::kLayerOutput);
    fo.capture = [&](int l, CapturePoint p, std::int32_t p0, const RowMatrix& rows) {
      if (p == CapturePoint::kLayerOutput && l + 1 < c.n_layers) return;  // = the next layer's input
      r.inputs[static_cast<std::size_t>(p == CapturePoint::kLayerInput ? l : l + 1)].middleRows(
          p0 - pos0, rows.rows()) = rows;
    };
    if (!oracle.empty()) fo.observer = observe_sets(oracle);
    r.logits = engine_.teacher_force(win.continuation, pos0, work, fo);
    r.full_peak = work.bytes();
  }

  template <class BudgetsOf>  // budgets_of(context tokens) per window
  std::vector<WindowResult> run_all(int scorer, BudgetsOf&& budgets_of) const {
    check_scorer(scorer);
    std::vector<Budgets> keeps;  // validates (serial)
    for (const EvalWindow& w : windows_) keeps.push_back(budgets_of(static_cast<int>(w.context.size())));
    std::vector<WindowResult> out(windows_.size());
    parallel_tasks(n_windows(), [&](int w) {
      out[static_cast<std::size_t>(w)] = run_one(w, scorer, keeps[static_cast<std::size_t>(w)]);
    });
    return out;
  }
  // One SampleMetrics per keep ratio, the budgets budgets_of(n, keep_tokens(ratio, n, protection))
  // for n context tokens: with reuse each window's ratios in one batch, else each run alone.
  template <class BudgetsOf>
  std::vector<SampleMetrics> per_ratio(const std::vector<double>& keep_ratios, int scorer,
                                       BudgetsOf&& budgets_of) const {
    check_scorer(scorer);
    for (double r : keep_ratios) DEPTHKV_CHECK(r >= 0.0 && r <= 1.0, "keep ratio " << r << " outside [0, 1]");
    const int R = static_cast<int>(keep_ratios.size()), W = n_windows();
    std::vector<WindowResult> res(static_cast<std::size_t>(R) * static_cast<std::size_t>(W));
    const auto keep_of = [&](int w, int k) {
      const int n = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
      return budgets_of(n, keep_tokens(keep_ratios[static_cast<std::size_t>(k)], n, cfg_.spec.protection));
    };
    if (cfg_.reuse && !cfg_.chunked_plans) {
      parallel_tasks(W, [&](int w) {
        std::vector<Budgets> keeps;
        for (int k = 0; k < R; ++k) keeps.push_back(keep_of(w, k));
        std::vector<WindowResult> rw = run_reuse(w, scorer, keeps);
        for (int k = 0; k < R; ++k)
          res[static_cast<std::size_t>(k) * W + w] = std::move(rw[static_cast<std::size_t>(k)]);
      });
    } else {
      parallel_tasks(R * W, [&](int t) {
        res[static_cast<std::size_t>(t)] = run_one(t % W, scorer, keep_of(t % W, t / W));
      });
    }
    std::vector<SampleMetrics> out;
    for (int k = 0; k < R; ++k)
      out.push_back(to_sample_metrics({res.begin() + static_cast<std::ptrdiff_t>(k) * W,
                                       res.begin() + static_cast<std::ptrdiff_t>(k + 1) * W}));
    return out;
  }
  static SampleMetrics to_sample_metrics(const std::vector<WindowResult>& results) {
    SampleMetrics m;
    for (const WindowResult& r : results) {
      m.kl.push_back(r.metrics.loss.kl);
      m.dnll.push_back(r.metrics.loss.dnll);
      m.top1_disagree.push_back(r.metrics.loss.top1_disagree);
    }
    return m;
  }
  WindowResult run_one(int w, int scorer, const Budgets& keep) const {
    if (cfg_.chunked_plans) return run_chunked_plan(w, scorer, keep);
    return cfg_.reuse ? run_reuse(w, scorer, {keep}).front() : run_naive(w, scorer, keep);
  }

  // Per-head budgets of layer l from `start`: split by the head split of `EvalConfig::spec` for layer
  // plans and resplit head plans, else as given.
  template <class Layer>
  std::vector<int> head_keep(const Budgets& b, const Layer& layer, const LayerScores& s,
                             std::vector<int> start) const {
    if (cfg_.spec.head_split.mode == HeadAllocation::kUniform || !b.resplit) return start;
    return head_budgets(cfg_.spec.head_split.mode, layer, s, start, cfg_.spec.protection, cfg_.spec.head_split.alpha);
  }
  std::size_t head_token_bytes(long long tokens) const {
    return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(engine_.config().head_dim) * 2 *
           sizeof(float);
  }
  // KV bytes the lookahead of scorer s appends to the full context cache before the eviction.
  std::size_t lookahead_bytes(int s) const {
    const LlamaConfig& c = engine_.config();
    return is_oracle(s) ? 0
                        : head_token_bytes(static_cast<long long>(c.n_layers) * c.n_kv_heads *
                                           cfg_.scorers[static_cast<std::size_t>(s)].lookahead);
  }

  // Window w under each plan of `keeps` from the stored activations: plan s starts at its first
  // pruned layer from that layer's stored input; from there every started plan runs each layer
  // in one batch (`forward_layer_batch`) on its own copy of the layer's context cache, evicted to
  // its budgets, and the classifier runs once for all.
  std::vector<WindowResult> run_reuse(int w, int scorer, const std::vector<Budgets>& keeps) const {
    const int L = engine_.config().n_layers;
    ReuseRun run{refs_[static_cast<std::size_t>(w)], static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size()),
                 scorer, keeps, {}, {}, {}, {}};
    const int S = static_cast<int>(keeps.size());
    run.res.resize(static_cast<std::size_t>(S));
    run.x.resize(static_cast<std::size_t>(S));
    for (int s = 0; s < S; ++s) start_plan(run, s);
    for (int l = S ? *std::min_element(run.first.begin(), run.first.end()) : L; l < L; ++l) reuse_layer(run, l);
    std::vector<int> pruned;
    for (int s = 0; s < S; ++s) {
      WindowResult& out = run.res[static_cast<std::size_t>(s)];
      out.bytes_peak = std::max(run.r.cache.bytes() + lookahead_bytes(scorer),
                                run.bytes_end[static_cast<std::size_t>(s)]);  // before the eviction, or at the end
      if (run.first[static_cast<std::size_t>(s)] < L)
        pruned.push_back(s);
      else  // nothing pruned: the reference
        out.metrics = compare_logits(run.r.logits, run.r.logits, run.r.targets);
    }
    if (!pruned.empty()) reuse_metrics(run, pruned);
    return run.res;
  }
  // run_reuse's state for one window: each plan's result, first pruned layer, KV bytes at the
  // end, and continuation rows (once started).
  struct ReuseRun {
    const Reference& r;
    int n_ctx, scorer;
    const std::vector<Budgets>& keeps;
    std::vector<WindowResult> res;
    std::vector<int> first;
    std::vector<std::size_t> bytes_end;
    std::vector<RowMatrix> x;
  };
  // Plan s's budgets and byte counts, its first pruned layer and the bytes of the layers before it.
  void start_plan(ReuseRun& run, int s) const {
    const LlamaConfig& c = engine_.config();
    const Budgets& keep = run.keeps[static_cast<std::size_t>(s)];
    WindowResult& out = run.res[static_cast<std::size_t>(s)];
    const long long tc = run.r.inputs.front().rows();
    int first = c.n_layers;
    std::size_t bytes = 0;
    out.budgets = keep.per_layer(run.n_ctx);
    for (int l = 0; l < c.n_layers; ++l) {
      out.bytes_full += head_token_bytes(static_cast<long long>(run.n_ctx) * c.n_kv_heads);
      out.bytes_kept += head_token_bytes(keep.tokens(l, run.n_ctx));
      if (keep.prunes(l, run.n_ctx) && first == c.n_layers) first = l;
    }
    for (int l = 0; l < first; ++l) bytes += run.r.cache.layer(l).bytes() + head_token_bytes(tc * c.n_kv_heads);
    out.bytes_full_peak = run.r.full_peak;
    layer_tokens_ += static_cast<long long>(c.n_layers - first) * tc;
    run.first.push_back(first);
    run.bytes_end.push_back(bytes);
  }
  // Layer l for every plan started at or below it, in one batch on their evicted copies.
  void reuse_layer(ReuseRun& run, int l) const {
    using Layer = std::decay_t<decltype(refs_.front().cache.layer(0))>;
    std::vector<int> started;
    for (int s = 0; s < static_cast<int>(run.keeps.size()); ++s)
      if (run.first[static_cast<std::size_t>(s)] <= l) started.push_back(s);
    std::vector<Layer> kv(started.size(), run.r.cache.layer(l));
    std::vector<Layer*> kvp;
    for (std::size_t i = 0; i < started.size(); ++i) {
      const std::size_t s = static_cast<std::size_t>(started[i]);
      if (run.first[s] == l) run.x[s] = run.r.inputs[static_cast<std::size_t>(l)];
      if (run.keeps[s].prunes(l, run.n_ctx)) {
        const LayerScores sc = window_slots(
            kv[i], l, run.n_ctx, run.r.scores[static_cast<std::size_t>(run.scorer)][static_cast<std::size_t>(l)]);
        evict_layer(kv[i], sc, head_keep(run.keeps[s], kv[i], sc, run.keeps[s].heads[static_cast<std::size_t>(l)]),
                    cfg_.spec.protection);
      }
      kvp.push_back(&kv[i]);
    }
    for_chunks(static_cast<int>(run.r.inputs.front().rows()), [&](int c0, int t) {
      RowMatrix xc = gather(run.x, started, c0, t);  // in chunks, as the full run processed them
      engine_.forward_layer_batch(l, xc, run.n_ctx + c0, kvp, ForwardOptions());
      scatter(xc, run.x, started, c0, t);
    });
    for (std::size_t i = 0; i < started.size(); ++i)
      run.bytes_end[static_cast<std::size_t>(started[i])] += kv[i].bytes();
  }
  // The classifier once for the `pruned` plans, and their metrics against the full run.
  void reuse_metrics(ReuseRun& run, const std::vector<int>& pruned) const {
    const int tc = static_cast<int>(run.r.inputs.front().rows());
    std::vector<RowMatrix> logits(run.keeps.size());
    for (int s : pruned) logits[static_cast<std::size_t>(s)].resize(tc, engine_.config().vocab_size);
    for_chunks(tc, [&](int c0, int t) {
      scatter(engine_.logits(gather(run.x, pruned, c0, t), nullptr, run.n_ctx + c0), logits, pruned, c0, t);
    });
    const Eigen::MatrixXd full = log_softmax_rows(run.r.logits);  // once for all plans
    parallel_tasks(static_cast<int>(pruned.size()), [&](int i) {
      const std::size_t s = static_cast<std::size_t>(pruned[static_cast<std::size_t>(i)]);
      LlamaEngine::check_finite(logits[s], run.n_ctx, "the logits");
      run.res[s].metrics = compare_log_softmax(full, logits[s], run.r.targets);
    });
  }
  // A sliding-window layer l: drops the slots of `kv` (a copy of the context's layer) that no
  // query from position n_ctx on sees, and returns `scores` without them; else `scores`.
  template <class Layer>
  LayerScores window_slots(Layer& kv, int l, int n_ctx, const LayerScores& scores) const {
    const int win = engine_.config().window(l);
    if (win <= 0) return scores;
    LayerScores out = scores;
    std::vector<std::int32_t> kept;
    for (int h = 0; h < kv.n_kv_heads(); ++h) {
      const int d = drop_positions(kv, h, std::numeric_limits<std::int32_t>::min(), n_ctx - win, kept);
      auto& s = out[static_cast<std::size_t>(h)];
      s.erase(s.begin(), s.begin() + std::min<std::ptrdiff_t>(d, static_cast<std::ptrdiff_t>(s.size())));
    }
    return out;
  }
  template <class F>  // f(c0, t) for the chunks [c0, c0 + t) of n continuation rows
  void for_chunks(int n, F&& f) const {
    for (int c0 = 0; c0 < n; c0 += cfg_.spec.schedule.chunk) f(c0, std::min(cfg_.spec.schedule.chunk, n - c0));
  }
  // Rows [c0, c0 + t) of m[s] for each s of `which`, stacked in that order, and back.
  static RowMatrix gather(const std::vector<RowMatrix>& m, const std::vector<int>& which, int c0, int t) {
    RowMatrix out(static_cast<Eigen::Index>(which.size()) * t,
                  m[static_cast<std::size_t>(which.front())].cols());
    for (std::size_t i = 0; i < which.size(); ++i)
      out.middleRows(static_cast<Eigen::Index>(i) * t, t) =
          m[static_cast<std::size_t>(which[i])].middleRows(c0, t);
    return out;
  }
  static void scatter(const RowMatrix& rows, std::vector<RowMatrix>& m, const std::vector<int>& which, int c0,
                      int t) {
    for (std::size_t i = 0; i < which.size(); ++i)
      m[static_cast<std::size_t>(which[i])].middleRows(c0, t) =
          rows.middleRows(static_cast<Eigen::Index>(i) * t, t);
  }

  // Window w under `keep` from scratch (EvalConfig::reuse false, a check of run_reuse): the
  // context prefilled, observed and scored again (an oracle by the full cache's continuation),
  // evicted, and the continuation run through every layer.
  WindowResult run_naive(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const Reference& r = refs_[static_cast<std::size_t>(w)];
    const int n_ctx = static_cast<int>(win.context.size());
    ForwardOptions opt;
    opt.chunk_size = cfg_.spec.schedule.chunk;
    opt.all_logits = false;
    std::vector<TokenScorer> sc = scorers_of(scorer, static_cast<int>(win.continuation.size()));
    const bool oracle = is_oracle(scorer), lookahead = !oracle && sc.front().config().lookahead > 0;
    HostCache cache = engine_.make_cache();
    ForwardOptions po = opt;
    if (!oracle && (!lookahead || sc.front().config().context_weight > 0.0)) po.observer = observe_into(sc);
    const RowMatrix last = engine_.prefill(win.context, 0, cache, po);
    if (lookahead) observe_lookahead(engine_, cache, last_argmax(last), n_ctx, {&sc});
    if (oracle) {  // the continuation's queries on a copy of the full context cache
      HostCache full = cache;
      po.observer = observe_into(sc);
      engine_.teacher_force(win.continuation, n_ctx, full, po);
      keep_context_state(sc, n_ctx);
    }
    WindowResult res;
    res.budgets = keep.per_layer(n_ctx);
    res.bytes_full = cache.bytes();
    res.bytes_full_peak = r.full_peak;
    drop_outside_windows(cache, sc, c.layer_window);  // a local layer: only the slots its window still sees
    const std::vector<LayerScores> scores = layer_scores(sc, cache, wo());
    std::vector<std::vector<int>> per_head;
    for (int l = 0; l < c.n_layers; ++l)
      per_head.push_back(head_keep(keep, cache.layer(l), scores[static_cast<std::size_t>(l)],
                                   keep.heads[static_cast<std::size_t>(l)]));
    evict(cache, scores, per_head, cfg_.spec.protection);
    res.bytes_kept = cache.bytes();
    const RowMatrix lp = engine_.teacher_force(win.continuation, n_ctx, cache, opt);
    res.bytes_peak = std::max(res.bytes_full + lookahead_bytes(scorer), cache.bytes());
    layer_tokens_ += static_cast<long long>(c.n_layers) *
                     (2 * n_ctx + 2 * static_cast<long long>(win.continuation.size()));
    res.metrics = compare_logits(r.logits, lp, r.targets);
    return res;
  }

  // A plan evicted after every prefill chunk (EvalConfig::chunked_plans): a schedule with the
  // plan's budgets as fixed targets.
  WindowResult run_chunked_plan(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const int n_ctx = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
    depthkv::detail::ScheduleConfig sc = schedule_base(scorer);
    sc.targets.length = n_ctx;
    sc.targets.split = keep.resplit;
    for (int l = 0; l < c.n_layers; ++l) sc.targets.keep.push_back(keep.heads[static_cast<std::size_t>(l)]);
    WindowResult res = run_schedule(w, sc, /*decode=*/false, /*evict_at_end=*/false);
    res.budgets = keep.per_layer(n_ctx);
    return res;
  }
  // A schedule's settings with the evaluator's scorer, protection, head split and projections.
  depthkv::detail::ScheduleConfig schedule_base(int scorer, depthkv::detail::ScheduleConfig sc = {}) const {
    sc.scorer = cfg_.scorers[static_cast<std::size_t>(scorer)];
    sc.protection = cfg_.spec.protection;
    sc.head_allocation = cfg_.spec.head_split.mode;
    sc.head_alpha = cfg_.spec.head_split.alpha;
    sc.output_projections = wo();
    sc.layer_window = engine_.config().layer_window;
    return sc;
  }
  // Window w on the driver under schedule `sc`: the context in chunks (then, with `evict_at_end`,
  // evicted to the final budget), the continuation teacher-forced (`decode`: evicted as decoded).
  WindowResult run_schedule(int w, const depthkv::detail::ScheduleConfig& sc, bool decode,
                            bool evict_at_end = true) const {
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const Reference& r = refs_[static_cast<std::size_t>(w)];
    ForwardOptions run;
    run.chunk_size = cfg_.spec.schedule.chunk;
    PrunedGeneration<HostCache> g(engine_, engine_.make_cache(), sc, run);
    g.prefill(win.context, evict_at_end);
    WindowResult res;
    res.bytes_full = r.cache.bytes();
    res.bytes_full_peak = r.full_peak;
    res.bytes_kept = g.cache().bytes();
    res.budgets = g.cache().lengths();
    const RowMatrix lp = decode
                             ? g.teacher_force(win.continuation)
                             : engine_.teacher_force(win.continuation, g.position(), g.cache(), run);
    res.bytes_peak = std::max(g.report().peak_bytes, g.cache().bytes());
    layer_tokens_ += static_cast<long long>(engine_.config().n_layers) *
                     static_cast<long long>(win.context.size() + win.continuation.size());
    res.metrics = compare_logits(r.logits, lp, r.targets);
    return res;
  }

  const LlamaEngine& engine_;
  std::vector<EvalWindow> windows_;
  EvalConfig cfg_;
  std::vector<Reference> refs_;
  OutputProjections wo_storage_{};    // owns the float copies of stored (F16, quantized) wo that wo_ views
  std::vector<OutputProjection> wo_;  // per layer, when a scorer is output-aware
  mutable std::atomic<long long> layer_tokens_{0};
};

}  // namespace llama
}  // namespace depthkv
