#pragma once
/// @file llama/detail/eval_runs.hpp
/// @brief `PruningEvaluator`'s runs (llama/eval.hpp): the full run of every window with its
/// stored activations and scores, and one pruned run of a window under a plan (from the stored
/// activations, from scratch, or under an `EvictionSchedule`).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "depthkv/llama/eval_config.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/metrics.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {
namespace llama {
namespace detail {

/// The state and runs behind `PruningEvaluator` (its file comment gives the protocol).
class EvalRuns {
 public:
  /// Validates the settings and runs the full (unpruned) passes of every window.
  EvalRuns(const LlamaEngine& engine, std::vector<EvalWindow> windows, EvalConfig cfg)
      : engine_(engine), windows_(std::move(windows)), cfg_(std::move(cfg)) {
    DEPTHKV_CHECK_AS("PruningEvaluator", !cfg_.scorers.empty(), "no scorer configured");
    DEPTHKV_CHECK_AS("PruningEvaluator", cfg_.chunk_size >= 1, "chunk_size must be >= 1, got " << cfg_.chunk_size);
    check_thread_count(cfg_.n_threads, "n_threads");
    for (std::size_t w = 0; w < windows_.size(); ++w)
      DEPTHKV_CHECK_AS("PruningEvaluator", !windows_[w].context.empty() && !windows_[w].continuation.empty(),
                    "window " << w << " has an empty context or continuation");
    bool output_aware = false;
    for (const ScorerConfig& s : cfg_.scorers) {
      TokenScorer(s, engine.config().n_heads, engine.config().n_kv_heads);
      output_aware = output_aware || s.output_aware;
      DEPTHKV_CHECK_AS("PruningEvaluator", !cfg_.chunked_plans || s.lookahead == 0,
                    "chunked plans evict while the context is read; lookahead (" << s.lookahead
                                                                                 << ") needs the whole context first");
      for (std::size_t w = 0; w < windows_.size() && s.lookahead > 0; ++w) {  // observe_lookahead's check, up front
        const long long ctx = static_cast<long long>(windows_[w].context.size());
        DEPTHKV_CHECK_AS("PruningEvaluator", ctx + s.lookahead <= engine.config().seq_len,
                      "lookahead: " << s.lookahead << " greedy tokens after a context of " << ctx
                                    << " tokens do not fit the model's context of " << engine.config().seq_len
                                    << " tokens (at most "
                                    << std::max<long long>(0, engine.config().seq_len - ctx) << " here)");
      }
    }
    depthkv::detail::check_head_alpha(cfg_.head_alpha);
    DEPTHKV_CHECK_AS("PruningEvaluator", cfg_.oracle.empty() || cfg_.oracle.size() == cfg_.scorers.size(),
                     "oracle flags for " << cfg_.oracle.size() << " of " << cfg_.scorers.size() << " scorers");
    DEPTHKV_CHECK_AS("PruningEvaluator", !cfg_.chunked_plans || !any_oracle(),
                     "chunked plans evict while the context is read; oracle scores need the continuation first");
    if (output_aware) {
      wo_storage_ = OutputProjections(engine.model());
      wo_ = wo_storage_.views();
    }
    refs_.resize(windows_.size());
    parallel_windows([&](int w) { refs_[static_cast<std::size_t>(w)] = full_run(windows_[static_cast<std::size_t>(w)]); });
  }

  // Whether scorer s takes oracle scores (EvalConfig::oracle); whether any does.
  bool is_oracle(int s) const { return !cfg_.oracle.empty() && cfg_.oracle[static_cast<std::size_t>(s)]; }
  bool any_oracle() const {
    for (bool o : cfg_.oracle)
      if (o) return true;
    return false;
  }
  // The lookahead tokens scorer s decodes on the full context cache before its eviction (0 for
  // an oracle, which reads the continuation).
  int lookahead_of(int s) const { return is_oracle(s) ? 0 : cfg_.scorers[static_cast<std::size_t>(s)].lookahead; }
  // The scorers of scorer s for a window of `tc` continuation tokens: an oracle observes all
  // `tc` continuation rows (as a lookahead of `tc` tokens would).
  std::vector<TokenScorer> scorers_of(int s, int tc) const {
    ScorerConfig sc = cfg_.scorers[static_cast<std::size_t>(s)];
    if (is_oracle(s)) {
      sc.lookahead = tc;
      sc.context_weight = 0.0;  // the continuation's attention alone
    }
    return make_scorers(engine_.config(), sc);
  }
  // Every oracle scorer keeps the state of the context's `n` slots only (the continuation's
  // slots it observed are not in the cache that is scored).
  static void keep_context_state(std::vector<TokenScorer>& set, int n) {
    for (TokenScorer& s : set)
      depthkv::detail::keep_prefix(s.n_kv_heads(), std::vector<int>(static_cast<std::size_t>(s.n_kv_heads()), n),
                                   [&s](int h, const std::int32_t* slots, int k) { s.compact(h, slots, k); });
  }

  int n_windows() const { return static_cast<int>(windows_.size()); }
  int n_layers() const { return engine_.config().n_layers; }
  int n_kv_heads() const { return engine_.config().n_kv_heads; }
  int n_scorers() const { return static_cast<int>(cfg_.scorers.size()); }

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

  struct Reference {
    HostCache cache;                         // full context cache
    std::vector<RowMatrix> inputs;           // [L + 1] continuation residual input of layer l (L: final)
    RowMatrix logits;                        // full continuation logits
    std::size_t full_peak = 0;               // KV bytes of the full cache after the continuation
    std::vector<std::vector<LayerScores>> scores;  // [scorer][layer]
    std::vector<int> targets;
    double nll = 0;
    double context_nll = 0;  // EvalConfig::context_nll_tokens
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
  // One SampleMetrics per keep ratio, with the budgets budgets_of(context tokens n,
  // keep_tokens(ratio, n, protection)): with activation reuse, the windows in parallel, each
  // window's ratios in one batch (`run_reuse`); else every (window, ratio) run in parallel.
  template <class BudgetsOf>
  std::vector<SampleMetrics> per_ratio(const std::vector<double>& keep_ratios, int scorer, BudgetsOf&& budgets_of) const {
    check_scorer(scorer);
    const int R = static_cast<int>(keep_ratios.size()), W = n_windows();
    for (double r : keep_ratios) DEPTHKV_CHECK(r >= 0.0 && r <= 1.0, "keep ratio " << r << " outside [0, 1]");
    std::vector<WindowResult> res(static_cast<std::size_t>(R) * static_cast<std::size_t>(W));
    const auto keep_of = [&](int w, int k) {
      const int n = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
      return budgets_of(n, keep_tokens(keep_ratios[static_cast<std::size_t>(k)], n, cfg_.protection));
    };
    if (cfg_.reuse && !cfg_.chunked_plans) {  // a window's ratios in one batch
      parallel_windows([&](int w) {
        std::vector<Budgets> keeps;
        for (int k = 0; k < R; ++k) keeps.push_back(keep_of(w, k));
        std::vector<WindowResult> rw = run_reuse(w, scorer, keeps);
        for (int k = 0; k < R; ++k) res[static_cast<std::size_t>(k) * W + w] = std::move(rw[static_cast<std::size_t>(k)]);
      });
    } else {
      parallel_tasks(R * W, [&](int t) { res[static_cast<std::size_t>(t)] = run_one(t % W, scorer, keep_of(t % W, t / W)); });
    }
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
                      s.output_aware == o.output_aware && s.lookahead == o.lookahead &&
                      s.context_weight == o.context_weight,
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

  // The scorer sets by what they observe: the context, a lookahead, the continuation (oracle); a
  // lookahead set with a context weight observes the context too.
  void split_sets(std::vector<std::vector<TokenScorer>>& sets, std::vector<std::vector<TokenScorer>*>& context,
                  std::vector<std::vector<TokenScorer>*>& lookahead, std::vector<std::vector<TokenScorer>*>& oracle) const {
    for (int s = 0; s < n_scorers(); ++s) {
      std::vector<TokenScorer>* set = &sets[static_cast<std::size_t>(s)];
      const ScorerConfig& sc = set->front().config();
      (is_oracle(s) ? oracle : sc.lookahead > 0 ? lookahead : context).push_back(set);
      if (!is_oracle(s) && sc.lookahead > 0 && sc.context_weight > 0.0) context.push_back(set);
    }
  }
  // The context's scores of the oracle sets (after the continuation, their state cut to the
  // context first) or of the others, into r.scores.
  void store_scores(std::vector<std::vector<TokenScorer>>& sets, Reference& r, bool oracle) const {
    const int n = r.cache.layer(0).size(0);
    for (std::size_t s = 0; s < sets.size(); ++s) {
      if (is_oracle(static_cast<int>(s)) != oracle) continue;
      if (oracle) keep_context_state(sets[s], n);
      r.scores[s] = layer_scores(sets[s], r.cache, wo());
    }
  }

  // The full run of `win`; with ContinuationSource::kModel its continuation is replaced first by
  // the model's greedy one (the same number of tokens).
  Reference full_run(EvalWindow& win) const {
    const LlamaConfig& c = engine_.config();
    Reference r;
    r.cache = engine_.make_cache();
    const int tc = static_cast<int>(win.continuation.size());
    std::vector<std::vector<TokenScorer>> sets;
    for (int s = 0; s < n_scorers(); ++s) sets.push_back(scorers_of(s, tc));
    std::vector<std::vector<TokenScorer>*> context_sets, lookahead_sets, oracle_sets;
    split_sets(sets, context_sets, lookahead_sets, oracle_sets);
    ForwardOptions opt;
    opt.chunk_size = cfg_.chunk_size;
    opt.all_logits = false;
    opt.observer = [&context_sets](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
      for (std::vector<TokenScorer>* set : context_sets) (*set)[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
    };
    std::unique_ptr<TailNll> tail;
    if (cfg_.context_nll_tokens > 0 && win.context.size() >= 2)
      tail = std::make_unique<TailNll>(engine_, win.context, cfg_.context_nll_tokens, opt);
    const RowMatrix last = engine_.prefill(win.context, 0, r.cache, opt);
    if (tail) r.context_nll = tail->nll();
    const std::int32_t pos0 = static_cast<std::int32_t>(win.context.size());
    if (cfg_.continuation_source == ContinuationSource::kModel)
      win.continuation = greedy_continuation(engine_, r.cache, last_argmax(last), pos0, tc);
    if (!lookahead_sets.empty()) observe_lookahead(engine_, r.cache, last_argmax(last), pos0, lookahead_sets);
    r.scores.resize(sets.size());
    store_scores(sets, r, /*oracle=*/false);
    // Continuation on a copy (the stored cache stays context-only), capturing layer inputs.
    HostCache work = r.cache;
    r.inputs.assign(static_cast<std::size_t>(c.n_layers) + 1, RowMatrix(tc, c.dim));
    ForwardOptions fo;
    fo.chunk_size = cfg_.chunk_size;
    fo.capture_points = capture_bit(CapturePoint::kLayerInput) | capture_bit(CapturePoint::kLayerOutput);
    fo.capture = [&](int l, CapturePoint p, std::int32_t p0, const RowMatrix& rows) {
      const int idx = p == CapturePoint::kLayerInput ? l : l + 1;
      if (p == CapturePoint::kLayerOutput && l + 1 < c.n_layers) return;  // = next layer's input
      r.inputs[static_cast<std::size_t>(idx)].middleRows(p0 - pos0, rows.rows()) = rows;
    };
    if (!oracle_sets.empty())
      fo.observer = [&oracle_sets](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
        for (std::vector<TokenScorer>* set : oracle_sets) (*set)[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
      };
    r.logits = engine_.teacher_force(win.continuation, pos0, work, fo);
    store_scores(sets, r, /*oracle=*/true);
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
    return cfg_.reuse ? run_reuse(w, scorer, {keep}).front() : run_naive(w, scorer, keep);
  }

  std::size_t layer_bytes(int tokens) const {
    return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(engine_.config().n_kv_heads) *
           static_cast<std::size_t>(engine_.config().head_dim) * 2 * sizeof(float);
  }
  // KV bytes the lookahead of scorer s appends to the full context cache before the eviction:
  // G slots in every KV head of every layer.
  std::size_t lookahead_bytes(int s) const {
    return static_cast<std::size_t>(engine_.config().n_layers) * layer_bytes(lookahead_of(s));
  }
  std::size_t head_token_bytes(long long tokens) const {
    return static_cast<std::size_t>(tokens) * static_cast<std::size_t>(engine_.config().head_dim) * 2 * sizeof(float);
  }

  // Window w under each plan of `keeps`, from the stored activations: plan s starts at its first
  // pruned layer from the stored input of that layer (a plan that prunes nothing is the
  // reference). From there on every started plan runs each layer in one batch
  // (`forward_layer_batch`: one pass over each weight matrix for all of them) on its own copy of
  // the layer's context cache, evicted to its budgets, and the classifier runs once for all (the
  // comparisons with the full run's logits in parallel).
  std::vector<WindowResult> run_reuse(int w, int scorer, const std::vector<Budgets>& keeps) const {
    using Layer = std::decay_t<decltype(refs_.front().cache.layer(0))>;
    const LlamaConfig& c = engine_.config();
    const Reference& r = refs_[static_cast<std::size_t>(w)];
    const int n_ctx = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
    const int S = static_cast<int>(keeps.size()), tc = static_cast<int>(r.inputs.front().rows());
    std::vector<WindowResult> res(static_cast<std::size_t>(S));
    std::vector<int> first(static_cast<std::size_t>(S), c.n_layers);
    std::vector<std::size_t> bytes_end(static_cast<std::size_t>(S), 0);  // KV bytes at the end
    for (int s = 0; s < S; ++s)
      first[static_cast<std::size_t>(s)] = start_plan(r, n_ctx, tc, keeps[static_cast<std::size_t>(s)],
                                                      res[static_cast<std::size_t>(s)], bytes_end[static_cast<std::size_t>(s)]);
    std::vector<RowMatrix> x(static_cast<std::size_t>(S));  // each started plan's continuation rows
    const ForwardOptions fo;
    for (int l = S ? *std::min_element(first.begin(), first.end()) : c.n_layers; l < c.n_layers; ++l) {
      std::vector<int> run;  // the plans started at or below l
      for (int s = 0; s < S; ++s)
        if (first[static_cast<std::size_t>(s)] <= l) run.push_back(s);
      std::vector<Layer> kv(run.size(), r.cache.layer(l));
      std::vector<Layer*> kvp;
      for (std::size_t i = 0; i < run.size(); ++i) {
        const Budgets& keep = keeps[static_cast<std::size_t>(run[i])];
        if (first[static_cast<std::size_t>(run[i])] == l) x[static_cast<std::size_t>(run[i])] = r.inputs[static_cast<std::size_t>(l)];
        if (keep.prunes(l, n_ctx)) {
          const LayerScores sc = window_slots(kv[i], l, n_ctx, r.scores[static_cast<std::size_t>(scorer)][static_cast<std::size_t>(l)]);
          evict_layer(kv[i], sc, head_keep(keep, kv[i], sc, keep.start(l, c.n_kv_heads)), cfg_.protection);
        }
        kvp.push_back(&kv[i]);
      }
      for_chunks(tc, [&](int c0, int t) {  // the continuation in chunks, as the full run processed it
        RowMatrix xc = gather(x, run, c0, t);
        engine_.forward_layer_batch(l, xc, n_ctx + c0, kvp, fo);
        scatter(xc, x, run, c0, t);
      });
      for (std::size_t i = 0; i < run.size(); ++i) bytes_end[static_cast<std::size_t>(run[i])] += kv[i].bytes();
    }
    std::vector<int> pruned;
    for (int s = 0; s < S; ++s) {
      WindowResult& out = res[static_cast<std::size_t>(s)];
      // before the eviction (with the lookahead's slots), or at the end
      out.bytes_peak = std::max(r.cache.bytes() + lookahead_bytes(scorer), bytes_end[static_cast<std::size_t>(s)]);
      if (first[static_cast<std::size_t>(s)] < c.n_layers)
        pruned.push_back(s);
      else
        out.metrics = compare_logits(r.logits, r.logits, r.targets);  // nothing pruned: the reference
    }
    if (pruned.empty()) return res;
    std::vector<RowMatrix> logits(static_cast<std::size_t>(S));
    for (int s : pruned) logits[static_cast<std::size_t>(s)].resize(tc, c.vocab_size);
    for_chunks(tc, [&](int c0, int t) {  // per chunk, as the full run
      scatter(engine_.logits(gather(x, pruned, c0, t), nullptr, n_ctx + c0), logits, pruned, c0, t);
    });
    const Eigen::MatrixXd full = log_softmax_rows(r.logits);  // once for all plans
    parallel_tasks(static_cast<int>(pruned.size()), [&](int i) {
      const std::size_t s = static_cast<std::size_t>(pruned[static_cast<std::size_t>(i)]);
      LlamaEngine::check_finite(logits[s], n_ctx, "the logits");
      res[s].metrics = compare_log_softmax(full, logits[s], r.targets);
    });
    return res;
  }
  // For a sliding-window layer l: drops the slots of `kv` (a copy of the context's layer) that no
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

  // Plan `keep`'s accounting before it runs (budgets, bytes, the layer-tokens it will run), into
  // `out`; `bytes_end` gets the KV bytes that the layers below its first pruned layer hold at the
  // end (the full context + continuation). Returns that layer (n_layers: it prunes none).
  int start_plan(const Reference& r, int n_ctx, int tc, const Budgets& keep, WindowResult& out,
                 std::size_t& bytes_end) const {
    const LlamaConfig& c = engine_.config();
    int first = c.n_layers;
    out.budgets = keep.per_layer(c.n_layers, n_ctx, c.n_kv_heads);
    for (int l = 0; l < c.n_layers; ++l) {
      out.bytes_full += layer_bytes(n_ctx);
      out.bytes_kept += head_token_bytes(keep.tokens(l, n_ctx, c.n_kv_heads));
      if (keep.prunes(l, n_ctx) && first == c.n_layers) first = l;
    }
    for (int l = 0; l < first; ++l) bytes_end += r.cache.layer(l).bytes() + layer_bytes(tc);
    out.bytes_full_peak = r.full_peak;
    layer_tokens_ += static_cast<long long>(c.n_layers - first) * tc;
    return first;
  }
  // f(c0, t) for the chunks [c0, c0 + t) of `n` continuation rows (EvalConfig::chunk_size each).
  template <class F>
  void for_chunks(int n, F&& f) const {
    for (int c0 = 0; c0 < n; c0 += cfg_.chunk_size) f(c0, std::min(cfg_.chunk_size, n - c0));
  }
  // Rows [c0, c0 + t) of m[s] for each s of `which`, stacked in that order (`gather`), and back.
  static RowMatrix gather(const std::vector<RowMatrix>& m, const std::vector<int>& which, int c0, int t) {
    RowMatrix out(static_cast<Eigen::Index>(which.size()) * t, m[static_cast<std::size_t>(which.front())].cols());
    for (std::size_t i = 0; i < which.size(); ++i)
      out.middleRows(static_cast<Eigen::Index>(i) * t, t) = m[static_cast<std::size_t>(which[i])].middleRows(c0, t);
    return out;
  }
  static void scatter(const RowMatrix& rows, std::vector<RowMatrix>& m, const std::vector<int>& which, int c0, int t) {
    for (std::size_t i = 0; i < which.size(); ++i)
      m[static_cast<std::size_t>(which[i])].middleRows(c0, t) = rows.middleRows(static_cast<Eigen::Index>(i) * t, t);
  }

  WindowResult run_naive(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const EvalWindow& win = windows_[static_cast<std::size_t>(w)];
    const int n_ctx = static_cast<int>(win.context.size());
    ForwardOptions opt;
    opt.chunk_size = cfg_.chunk_size;
    opt.all_logits = false;
    // full run from scratch
    // (the oracle observes the full run's continuation)
    std::vector<TokenScorer> sc = scorers_of(scorer, static_cast<int>(win.continuation.size()));
    const bool oracle = is_oracle(scorer), lookahead = !oracle && sc.front().config().lookahead > 0;
    HostCache full = engine_.make_cache();
    engine_.prefill(win.context, 0, full, opt);
    ForwardOptions fo = opt;
    if (oracle) fo.observer = observe_into(sc);
    const RowMatrix lf = engine_.teacher_force(win.continuation, n_ctx, full, fo);
    if (oracle) keep_context_state(sc, n_ctx);
    // pruned run from scratch
    HostCache cache = engine_.make_cache();
    ForwardOptions po = opt;
    if ((!lookahead || sc.front().config().context_weight > 0.0) && !oracle) po.observer = observe_into(sc);
    const RowMatrix last = engine_.prefill(win.context, 0, cache, po);
    if (lookahead) observe_lookahead(engine_, cache, last_argmax(last), n_ctx, {&sc});
    WindowResult res;
    res.budgets = keep.per_layer(c.n_layers, n_ctx, c.n_kv_heads);
    res.bytes_full = cache.bytes();
    res.bytes_full_peak = full.bytes();
    drop_outside_windows(cache, sc, c.layer_window);  // a local layer: only the slots its window still sees
    const std::vector<LayerScores> scores = layer_scores(sc, cache, wo());
    std::vector<std::vector<int>> per_head(static_cast<std::size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l)
      per_head[static_cast<std::size_t>(l)] =
          head_keep(keep, cache.layer(l), scores[static_cast<std::size_t>(l)], keep.start(l, c.n_kv_heads));
    evict(cache, scores, per_head, cfg_.protection);
    res.bytes_kept = cache.bytes();
    const RowMatrix lp = engine_.teacher_force(win.continuation, n_ctx, cache, opt);
    res.bytes_peak = std::max(res.bytes_full + lookahead_bytes(scorer), cache.bytes());
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

  // A plan evicted after every prefill chunk (EvalConfig::chunked_plans): a schedule with the
  // plan's budgets as fixed targets.
  WindowResult run_chunked_plan(int w, int scorer, const Budgets& keep) const {
    const LlamaConfig& c = engine_.config();
    const int n_ctx = static_cast<int>(windows_[static_cast<std::size_t>(w)].context.size());
    ScheduleConfig sc = schedule_base(scorer);
    sc.targets.length = n_ctx;
    sc.targets.split = !keep.per_head() || keep.resplit;
    for (int l = 0; l < c.n_layers; ++l) sc.targets.keep.push_back(keep.start(l, c.n_kv_heads));
    WindowResult res = run_schedule(w, sc, ScheduleEval::kPrefill, /*evict_at_end=*/false);
    res.budgets = keep.per_layer(c.n_layers, n_ctx, c.n_kv_heads);
    return res;
  }
  // A schedule's settings with the evaluator's scorer, protection, head split and projections.
  ScheduleConfig schedule_base(int scorer, ScheduleConfig sc = {}) const {
    sc.scorer = cfg_.scorers[static_cast<std::size_t>(scorer)];
    sc.protection = cfg_.protection;
    sc.head_allocation = cfg_.head_allocation;
    sc.head_alpha = cfg_.head_alpha;
    sc.output_projections = wo();
    sc.layer_window = engine_.config().layer_window;
    return sc;
  }

  // A schedule over window w's prefill (and its continuation with kDecode); `evict_at_end`: one
  // more eviction after the last chunk whatever the interval (`evict_now`).
  WindowResult run_schedule(int w, const ScheduleConfig& sc, ScheduleEval mode, bool evict_at_end = true) const {
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
        fo.observe_from = schedule.observe_from(t);  // only the rows the next eviction scores
        lp.middleRows(t0, t) = engine_.teacher_force(block, n_ctx + t0, cache, fo);
        res.bytes_peak = std::max(res.bytes_peak, cache.bytes());
        schedule.after_decode_step(cache);
        t0 += t;
      }
      return lp;
    };
    return run_evicting(
        w, schedule.observer(), [&](int, HostCache& cache) { schedule.after_chunk(cache); },
        [&](HostCache& cache) {
          if (evict_at_end) schedule.evict_now(cache);
        },
        continuation);
  }

  const LlamaEngine& engine_;
  std::vector<EvalWindow> windows_;
  EvalConfig cfg_;
  std::vector<Reference> refs_;
  OutputProjections wo_storage_;      // owns the float copies of stored (F16, quantized) wo that wo_ views
  std::vector<OutputProjection> wo_;  // per layer, when a scorer is output-aware
  mutable std::atomic<long long> layer_tokens_{0};
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
