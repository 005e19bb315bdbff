#pragma once
/// @file llama/pruned_generation.hpp
/// @brief `PrunedGeneration`: the library's prefill-evict-decode driver on the reference engine.
/// One object runs one sequence on one cache:
/// - `prefill(prompt)` feeds the prompt in chunks of `ForwardOptions::chunk_size`;
///   - a chunked or decode spec (`ScheduleSpec`): an `EvictionSchedule` evicts after every chunk
///     (each chunk's attention observed from `EvictionSchedule::observe_from` on: the same bytes);
///   - a oneshot spec (unless its budget keeps everything, a keep ratio of 1): the prompt's attention is observed, then (lookahead > 0) the model's next
///     `lookahead` greedy tokens are decoded on the full cache, observed and removed
///     (`observe_lookahead`), then every layer is scored, budgeted and evicted once
///     (`score_and_evict`); a keep ratio below the protected tokens (a short prompt) keeps the
///     protected tokens, as `keep_tokens` does for a schedule;
/// - `feed(tokens, n)` feeds the next piece of a prompt instead (a serving loop's chunk; scheduled
///   or no spec);
/// - `step(token)` decodes one token at the next position; a schedule evicts every
///   `schedule.interval` tokens;
/// - `step_batch(gens, tokens)` decodes one token for each of several generations in one batched
///   forward (a serving loop's decode step: the weights read once for all), each evicting as `step`;
/// - `teacher_force(tokens)` feeds known tokens and returns every position's logits, evicting as
///   `step` would (what an evaluation of a continuation on the pruned cache needs);
/// - `prefill_shared(gens, prompt, full)` then each `adopt(full)`: one forward pass of a prompt
///   observed by several oneshot generations, each then pruning its own copy (a comparison of
///   methods on one prompt).
/// Resolved schedule settings (`detail::ScheduleConfig`, e.g. fixed per-layer targets) replace the
/// spec through the second constructor (the evaluator's chunked plans).
///
/// With a preset name (preset.hpp) and a oneshot spec, the preset's per-input rule runs inside
/// the prefill: the mean NLL of the prompt's last `kPresetTrustTokens` tokens is taken from the
/// prefill itself (`TailNll`), and a prompt the rule distrusts (`preset_trusts_input`) is served
/// by `preset_fallback_spec` instead, whose scorers observed the same prefill. A schedule evicts
/// before the prompt's NLL is known, so a chunked spec is served as given.
///
/// Local (sliding-window) layers are capped at their window and their out-of-window slots freed
/// (`LlamaConfig::layer_window`), whatever the curves' `layer_window` says.
///
/// A `PrunedGeneration` holds the observers it installs, so it is neither copied nor moved.
///
/// @code
/// using namespace depthkv;
/// llama::LlamaEngine engine(model);
/// PruneSpec spec;                                   // what to keep: uniform H2O, keep 20%
/// spec.budget = Budget::keep(0.2);
/// llama::ForwardOptions run;                        // how the engine runs: chunk, threads
/// llama::PrunedGeneration<llama::HostCacheF16> g(engine, engine.make_cache<Eigen::half>(), spec, {}, nullptr, run);
/// llama::RowMatrix logits = g.prefill(prompt);       // [1 x vocab], the prompt's last position
/// int token = llama::last_argmax(logits);
/// for (int i = 0; i < 64; ++i) token = llama::last_argmax(g.step(token));
/// // g.report().prune.budgets: the tokens each layer kept
/// @endcode

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "depthkv/lookahead.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {
namespace llama {

/// What a `PrunedGeneration` did to its cache, for reports.
struct GenerationReport {
  PruneSpec spec;             ///< the spec that chose the kept tokens (the fallback's when distrusted)
  bool pruned = false;        ///< the oneshot eviction ran after the prompt
  PruneReport prune;          ///< its per-layer budgets and bytes before and after (a schedule: the
                              ///< budgets of its last eviction)
  bool raised_to_protection = false;  ///< its keep ratio fell below the protected tokens, which it kept
  bool rule_ran = false;      ///< the preset's per-input rule ran
  bool trusted = true;        ///< its verdict (false: the fallback served the prompt)
  double context_nll = 0.0;   ///< its signal: mean NLL (nats) of the prompt's last `nll_tokens`
  int nll_tokens = 0;
  int lookahead = 0;          ///< the lookahead's decode steps (0: none ran)
  double prefill_ms = 0.0, lookahead_ms = 0.0;
  std::size_t peak_bytes = 0; ///< the most bytes the cache held after any chunk or decode step
  int evictions = 0;          ///< the schedule's evictions (0 without one)
  double schedule_ms = 0.0;   ///< time inside the schedule's evictions (scoring, allocation, eviction)
  long long tokens_seen = 0;  ///< the tokens appended so far (prompt and decoded)
};

/// The prefill-evict-decode driver (see the file comment). `Cache` is a `KVCache` of any layer
/// type the engine fills (`HostCache`, `HostCacheF16`, paged or token-major layouts).
///
/// `Engine` is `LlamaEngine` or an engine of your own with
/// - `config()`: an object with `n_layers`, `n_heads`, `n_kv_heads`, `vocab_size`, `seq_len` and
///   `layer_window` (a `std::vector<int>`, one sliding window per layer, 0 or empty: none);
/// - `forward(const int* tokens, int n, std::int32_t pos0, Cache& cache, const ForwardOptions& opt)`:
///   appends the n tokens' keys and values to every layer of `cache`, passes each layer's
///   attention probabilities to `opt.observer` (rows of positions >= `opt.observe_from`; more
///   rows are allowed), calls `opt.after_chunk` (when set) after the call or after each chunk of
///   its own, and returns the logits `[1 x vocab]` of the last token (`opt.all_logits` is false).
/// The preset's per-input rule reads the prompt's NLL from `LlamaEngine`'s activations, so it
/// needs `LlamaEngine` (examples/own_engine.cpp runs the driver on an engine of its own).
template <class Cache, class Engine = LlamaEngine>
class PrunedGeneration {
 public:
  /// @param engine the model's engine (outlives this object)
  /// @param cache an empty cache of the engine's shape
  /// @param spec what to keep (nullopt: the full cache, nothing observed or evicted)
  /// @param curves what the spec's policy reads from a profile (`policy_curves`; empty for
  ///   uniform and pyramid)
  /// @param wo the model's output projections for an output-aware scorer (outlive this object;
  ///   null otherwise)
  /// @param run how the engine runs: `chunk_size`, threads, SIMD cap; its `after_chunk` (optional)
  ///   is called after every append (prefill chunk, fed piece, decoded token), before the driver's
  ///   eviction, e.g. to measure a peak (its observer, capture and all_logits are the driver's)
  /// @param preset a preset whose per-input rule serves the prompt ("": none)
  /// @param evict shrinking and threads of a schedule's evictions (`EvictionSchedule`; e.g.
  ///   `shrink` off keeps the capacity of a cache sized for its budget)
  /// @throws Error on an invalid spec, an output-aware scorer without `wo`, a policy without the
  ///   curves it reads, or an unknown preset
  PrunedGeneration(const Engine& engine, Cache cache, std::optional<PruneSpec> spec, PolicyCurves curves,
                   const OutputProjections* wo, const ForwardOptions& run, const std::string& preset = "",
                   const EvictOptions& evict = EvictOptions())
      : engine_(engine), cache_(std::move(cache)), spec_(std::move(spec)), curves_(std::move(curves)), wo_(wo),
        preset_(preset) {
    run_.chunk_size = run.chunk_size;
    run_.n_threads = run.n_threads;
    run_.max_simd_level = run.max_simd_level;
    run_.stats = run.stats;
    run_.all_logits = false;
    on_append_ = run.after_chunk;
    curves_.layer_window = engine.config().layer_window;
    if (!spec_) return;
    spec_->validate();
    DEPTHKV_CHECK(!spec_->scorer.output_aware || wo_, "an output-aware scorer needs the model's output projections");
    if (!preset_.empty()) check_preset_name(preset_);
    DEPTHKV_CHECK((preset_.empty() || std::is_same<Engine, LlamaEngine>::value),
                  "the preset's per-input rule reads the prompt's NLL from LlamaEngine's activations: "
                  "with another engine, run the preset's spec without its name");
    report_.spec = *spec_;
    (void)depthkv::detail::prune_settings(*spec_, curves_.data(), wo_views(*spec_));  // refuses missing curves now
    if (spec_->schedule.mode != ScheduleMode::kOneshot) {
      const auto& c = engine.config();
      schedule_ = std::make_unique<EvictionSchedule>(*spec_, curves_.data(), c.n_layers, c.n_heads, c.n_kv_heads,
                                                     wo_views(*spec_), evict);
    }
  }
  /// Resolved schedule settings (`detail::ScheduleConfig`, e.g. the fixed per-layer targets of a
  /// plan, `detail::TargetPlan`) instead of a spec: `prefill`, `feed`, `step` and `teacher_force` evict
  /// as with a scheduled spec.
  /// @throws Error on invalid settings (`EvictionSchedule`)
  PrunedGeneration(const Engine& engine, Cache cache, depthkv::detail::ScheduleConfig schedule, const ForwardOptions& run)
      : PrunedGeneration(engine, std::move(cache), std::nullopt, PolicyCurves{}, nullptr, run) {
    const auto& c = engine.config();
    schedule_ = std::make_unique<EvictionSchedule>(std::move(schedule), c.n_layers, c.n_heads, c.n_kv_heads);
  }
  PrunedGeneration(const PrunedGeneration&) = delete;
  PrunedGeneration& operator=(const PrunedGeneration&) = delete;

  /// Feeds `prompt` at positions 0.. and prunes as the spec says (see the file comment). With a
  /// schedule and `evict_at_end`, the last chunk's attention is observed whole and the cache is
  /// evicted to the budget after it whatever the interval (`EvictionSchedule::evict_now`), so that
  /// what follows the prompt starts on the final budget.
  /// @return the logits of the prompt's last position `[1 x vocab]`
  /// @throws Error on an empty prompt, a second prefill, a prompt (plus lookahead) beyond the
  ///   model's context, or as the engine and the allocator
  RowMatrix prefill(const std::vector<int>& prompt, bool evict_at_end = false) {
    check_prompt(engine_, prompt, "prefill");
    DEPTHKV_CHECK(pos_ == 0 && !shared_, "prefill: this generation is already prefilled (" << pos_ << " positions)");
    const bool oneshot = spec_ && !schedule_ && !keeps_all(*spec_);
    const auto t0 = std::chrono::steady_clock::now();
    RowMatrix logits;
    Observed obs;
    if (schedule_) {  // chunk by chunk, each observing only the rows its eviction scores
      const int n = static_cast<int>(prompt.size()), chunk = std::max(1, run_.chunk_size);
      for (int p0 = 0; p0 < n; p0 += chunk) {
        const bool last = p0 + chunk >= n;
        logits = feed_piece(prompt.data() + p0, std::min(chunk, n - p0), last && evict_at_end);
      }
      if (evict_at_end) {
        const auto t1 = std::chrono::steady_clock::now();
        schedule_->evict_now(cache_);
        report_.schedule_ms += ms_since(t1);
        note_evictions();
      }
    } else {
      ForwardOptions opt = run_;
      if (oneshot) observe_prompt(prompt, opt, obs);
      if (on_append_) opt.after_chunk = [this](int done, std::int32_t next) { after_append(false, done, next); };
      logits = engine_.forward(prompt.data(), static_cast<int>(prompt.size()), 0, cache_, opt);
      pos_ = static_cast<std::int32_t>(prompt.size());
    }
    report_.prefill_ms = ms_since(t0);
    report_.tokens_seen = pos_;
    track_peak();
    if (oneshot) {
      obs.measure_tail();
      prune_prompt(logits, obs);
    }
    return logits;
  }

  /// One prefill of `prompt` for several generations on one engine, each with a oneshot spec or
  /// none (no schedule: a schedule evicts during its own prefill), none prefilled: a single
  /// forward pass (the first generation's `ForwardOptions`) appends the prompt to `full`, an
  /// empty cache, and its attention feeds every generation's scorers (the presets' rules share
  /// one NLL measurement). Each generation then takes its copy with `adopt(full)`, which prunes it
  /// as `prefill(prompt)` would have: the same kept tokens, logits and report but `prefill_ms`
  /// (the shared pass's). So comparing n methods on one prompt costs one prefill, n cache copies
  /// and n prunings (and lookaheads). The generations' `after_chunk` hooks are not called (the
  /// pass appends to `full`).
  /// @return the logits of the prompt's last position `[1 x vocab]`
  /// @throws Error on no generations, generations of different engines, a schedule, a generation
  ///   already prefilled, a non-empty `full`, or as `prefill` (before any generation changes)
  static RowMatrix prefill_shared(const std::vector<PrunedGeneration*>& gens, const std::vector<int>& prompt,
                                  Cache& full) {
    DEPTHKV_CHECK(!gens.empty(), "prefill_shared: no generations");
    for (std::size_t i = 0; i < gens.size(); ++i) {
      const PrunedGeneration& g = *gens[i];
      DEPTHKV_CHECK(&g.engine_ == &gens[0]->engine_, "prefill_shared: generation " << i << " runs another engine");
      DEPTHKV_CHECK(!g.schedule_, "prefill_shared: generation " << i << " has a schedule, which evicts during its "
                                  "own prefill: call its prefill");
      DEPTHKV_CHECK(g.pos_ == 0 && !g.shared_, "prefill_shared: generation " << i << " is already prefilled");
    }
    const Engine& engine = gens[0]->engine_;
    check_prompt(engine, prompt, "prefill_shared");
    for (int n : full.lengths()) DEPTHKV_CHECK(n == 0, "prefill_shared: the cache to fill is not empty");
    ForwardOptions opt = gens[0]->run_;
    std::vector<AttentionObserver> observers;
    std::vector<std::unique_ptr<Shared>> states;
    Observed* tail_owner = nullptr;
    std::int32_t observe_from = std::numeric_limits<std::int32_t>::max();  // the earliest row any scorer uses
    for (PrunedGeneration* g : gens) {
      states.push_back(std::make_unique<Shared>());
      if (!g->spec_ || keeps_all(*g->spec_)) continue;
      ForwardOptions o;
      Observed& obs = states.back()->obs;
      g->observe_prompt(prompt, o, obs, /*measure_tail=*/tail_owner == nullptr);
      if (o.observer) {
        observers.push_back(o.observer);
        observe_from = std::min(observe_from, o.observe_from);
      }
      if (obs.tail) {
        tail_owner = &obs;
        opt.capture = o.capture;
        opt.capture_points = o.capture_points;
      }
    }
    opt.observe_from = observe_from;
    if (!observers.empty())
      opt.observer = [&observers](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
        for (const AttentionObserver& f : observers) f(l, q, p0, nq, pr, ld, n);
      };
    const auto t0 = std::chrono::steady_clock::now();
    const RowMatrix logits = engine.forward(prompt.data(), static_cast<int>(prompt.size()), 0, full, opt);
    const double ms = ms_since(t0);
    if (tail_owner) tail_owner->measure_tail();
    for (std::size_t i = 0; i < gens.size(); ++i) {
      Shared& st = *states[i];
      if (tail_owner && st.obs.fallback_spec) {
        st.obs.tail_nll = tail_owner->tail_nll;
        st.obs.tail_tokens = tail_owner->tail_tokens;
      }
      st.logits = logits;
      st.n = static_cast<std::int32_t>(prompt.size());
      st.full = &full;
      gens[i]->report_.prefill_ms = ms;
      gens[i]->shared_ = std::move(states[i]);
    }
    return logits;
  }

  /// After `prefill_shared`: this generation's copy of its cache, pruned as `prefill` prunes.
  /// @return the logits of the prompt's last position `[1 x vocab]`
  /// @throws Error when no `prefill_shared` included this generation, on a second call, or as
  ///   the pruning (the generation then holds the unpruned copy)
  RowMatrix adopt(const Cache& full) {
    DEPTHKV_CHECK(shared_ && pos_ == 0, "adopt: " << (shared_ ? "this generation already adopted its cache"
                                                              : "no prefill_shared included this generation"));
    DEPTHKV_CHECK(&full == shared_->full, "adopt: not the cache its prefill_shared filled");
    cache_ = full;
    pos_ = shared_->n;
    report_.tokens_seen = pos_;
    track_peak();
    if (spec_ && !keeps_all(*spec_)) prune_prompt(shared_->logits, shared_->obs);
    return shared_->logits;
  }

  /// Feeds the next `n` prompt tokens at the next position, as one piece of a prefill (a serving
  /// loop that interleaves sequences feeds one chunk per step): a schedule evicts after it as after
  /// a prefill chunk. Without a spec or with a scheduled one only (a oneshot spec prunes after the
  /// whole prompt: `prefill`).
  /// @return the logits of the piece's last position `[1 x vocab]`
  /// @throws Error on n < 1, a oneshot spec, or as the engine (the position does not advance then)
  RowMatrix feed(const int* tokens, int n) {
    DEPTHKV_CHECK(n >= 1, "feed: need at least one token, got " << n);
    DEPTHKV_CHECK(!shared_ || pos_ > 0, "feed: a shared prefill is pending: adopt its cache first");
    DEPTHKV_CHECK(!spec_ || schedule_ || keeps_all(*spec_), "feed: a oneshot spec prunes after the whole prompt: use prefill");
    return feed_piece(tokens, n, false);
  }

  /// Decodes `token` at the next position (a schedule evicts every interval).
  /// @return its logits `[1 x vocab]`
  /// @throws Error before `prefill`, beyond the model's context, or as the engine
  RowMatrix step(int token) {
    DEPTHKV_CHECK(pos_ > 0, "step: prefill a prompt first");
    ForwardOptions opt = run_;
    if (schedule_) {
      opt.observer = schedule_->observer();
      opt.observe_from = schedule_->observe_from();  // only the rows the next eviction scores
    }
    RowMatrix logits = engine_.forward(&token, 1, pos_, cache_, opt);
    ++pos_;
    report_.tokens_seen = pos_;
    after_append(true, 1, pos_);
    return logits;
  }

  /// Decodes one token for each of several generations on one engine in one batched forward
  /// (`LlamaEngine::decode_batch`: each weight matrix read once for all), each at its own
  /// position on its own cache, then evicts each as its `step` would. Row s equals
  /// `gens[s]->step(tokens[s])` up to the rounding of products over more rows. The generations'
  /// `after_chunk` hooks run one after the other, after the forward.
  /// @return logits `[S x vocab]`, row s of `gens[s]`
  /// @throws Error on no generations, sizes that differ, a generation given twice, generations of
  ///   different engines, one not prefilled or with a shared prefill pending, or as the engine
  ///   (then no generation changed)
  static RowMatrix step_batch(const std::vector<PrunedGeneration*>& gens, const std::vector<int>& tokens) {
    DEPTHKV_CHECK(!gens.empty() && gens.size() == tokens.size(),
                  "step_batch: " << gens.size() << " generations and " << tokens.size() << " tokens");
    std::vector<Cache*> caches;
    std::vector<std::int32_t> positions;
    std::vector<ForwardOptions> per_seq(gens.size());
    for (std::size_t s = 0; s < gens.size(); ++s) {
      PrunedGeneration* g = gens[s];
      DEPTHKV_CHECK(g != nullptr, "step_batch: generation " << s << " is null");
      DEPTHKV_CHECK(&g->engine_ == &gens.front()->engine_, "step_batch: generation " << s << " runs on another engine");
      for (std::size_t u = 0; u < s; ++u) DEPTHKV_CHECK(gens[u] != g, "step_batch: generation " << s << " is given twice");
      DEPTHKV_CHECK(g->pos_ > 0, "step_batch: generation " << s << " has no prefilled prompt");
      if (g->schedule_) {
        per_seq[s].observer = g->schedule_->observer();
        per_seq[s].observe_from = g->schedule_->observe_from();  // only the rows the next eviction scores
      }
      caches.push_back(&g->cache_);
      positions.push_back(g->pos_);
    }
    const PrunedGeneration& first = *gens.front();
    RowMatrix logits = first.engine_.decode_batch(tokens, positions, caches, first.run_, per_seq);
    for (PrunedGeneration* g : gens) {
      ++g->pos_;
      g->report_.tokens_seen = g->pos_;
      g->after_append(true, 1, g->pos_);
    }
    return logits;
  }

  /// Teacher-forces `tokens` at the next positions, appending them, and returns the logits of
  /// every one `[n x vocab]` (row i predicts the token after `tokens[i]`; the engine's `forward`
  /// must honour `opt.all_logits`). A schedule evicts as `step` would, token by token: the tokens
  /// go in blocks that end where it evicts. Without one nothing is evicted.
  /// @throws Error before `prefill`, on no tokens, or as the engine
  RowMatrix teacher_force(const std::vector<int>& tokens) {
    DEPTHKV_CHECK(pos_ > 0, "teacher_force: prefill a prompt first");
    DEPTHKV_CHECK(!tokens.empty(), "teacher_force: no tokens");
    const int n = static_cast<int>(tokens.size());
    RowMatrix out(n, engine_.config().vocab_size);
    for (int t0 = 0; t0 < n;) {
      ForwardOptions opt = run_;
      opt.all_logits = true;
      int t = n - t0;
      if (schedule_) {
        t = static_cast<int>(std::min<long long>(t, std::max<long long>(1, schedule_->config().interval - schedule_->pending())));
        opt.observer = schedule_->observer();
        opt.observe_from = schedule_->observe_from(t);  // only the rows the next eviction scores
      }
      out.middleRows(t0, t) = engine_.forward(tokens.data() + t0, t, pos_, cache_, opt);
      pos_ += t;
      report_.tokens_seen = pos_;
      after_append(true, t, pos_);
      t0 += t;
    }
    return out;
  }

  Cache& cache() { return cache_; }
  const Cache& cache() const { return cache_; }
  /// The next position (the tokens fed so far).
  std::int32_t position() const { return pos_; }
  const GenerationReport& report() const { return report_; }

 private:
  /// The scorers a oneshot prune observes with, and the rule's.
  struct Observed {
    std::vector<TokenScorer> scorers, fallback;
    std::optional<PruneSpec> fallback_spec;
    std::unique_ptr<TailNll> tail;  ///< the rule's measurement during the prefill (null: none, or another's)
    double tail_nll = 0.0;          ///< its result after the prefill (`measure_tail`)
    int tail_tokens = 0;
    void measure_tail() {
      if (!tail) return;
      tail_nll = tail->nll();
      tail_tokens = tail->n_tokens();
      tail.reset();
    }
  };
  /// What `prefill_shared` left for `adopt`.
  struct Shared {
    Observed obs;
    RowMatrix logits;
    std::int32_t n = 0;
    const Cache* full = nullptr;  ///< the cache the shared pass filled
  };

  /// The first prompt position (of `n`) whose attention rows `scorers` use: every row of an
  /// accumulating scorer (H2O: 0), the last w of one that keeps its last w positions
  /// (`TokenScorer::positions_needed`: SnapKV its window), none (INT32_MAX) when none observes.
  /// `ForwardOptions::observe_from` then spares the engine forming the other rows' probabilities;
  /// the scores are the same bytes.
  static std::int32_t first_row_needed(const std::vector<TokenScorer>& scorers, std::int32_t n) {
    std::int32_t first = std::numeric_limits<std::int32_t>::max();
    for (const TokenScorer& s : scorers) {
      const int need = s.positions_needed();
      if (need == 0) return 0;
      if (need > 0) first = std::min(first, std::max<std::int32_t>(0, n - need));
    }
    return first;
  }

  /// Refuses an empty prompt or ids outside the vocabulary (before any chunk: the cache stays empty).
  static void check_prompt(const Engine& engine, const std::vector<int>& prompt, const char* func) {
    DEPTHKV_CHECK(!prompt.empty(), func << ": the prompt holds no tokens");
    const int vocab = engine.config().vocab_size;
    for (std::size_t i = 0; i < prompt.size(); ++i)
      DEPTHKV_CHECK(prompt[i] >= 0 && prompt[i] < vocab,
                    func << ": token " << prompt[i] << " at position " << i << " is outside the vocabulary of " << vocab);
  }

  /// A budget that keeps everything (a keep ratio of 1): nothing to observe or evict.
  static bool keeps_all(const PruneSpec& s) { return s.budget.is_ratio() && s.budget.ratio() >= 1.0; }

  /// `feed` without its checks; `observe_all`: every row of the piece observed (an `evict_now`
  /// follows it).
  RowMatrix feed_piece(const int* tokens, int n, bool observe_all) {
    ForwardOptions opt = run_;
    if (schedule_) {
      opt.observer = schedule_->observer();
      opt.observe_from = observe_all ? 0 : schedule_->observe_from(n);  // only the rows the next eviction scores
    }
    RowMatrix logits = engine_.forward(tokens, n, pos_, cache_, opt);
    pos_ += n;
    report_.tokens_seen = pos_;
    after_append(false, n, pos_);
    return logits;
  }

  const std::vector<OutputProjection>* wo_views(const PruneSpec& s) const {
    return s.scorer.output_aware && wo_ ? &wo_->views() : nullptr;
  }

  static double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  void track_peak() { report_.peak_bytes = std::max(report_.peak_bytes, cache_.bytes()); }

  void after_append(bool decode_step, int done, std::int32_t next_pos) {
    track_peak();
    if (on_append_) on_append_(done, next_pos);
    if (!schedule_) return;
    const auto t0 = std::chrono::steady_clock::now();
    if (decode_step) schedule_->after_decode_step(cache_);
    else schedule_->after_chunk(cache_);
    report_.schedule_ms += ms_since(t0);
    note_evictions();
  }

  void note_evictions() {
    if (schedule_->n_evictions() == report_.evictions) return;
    report_.evictions = schedule_->n_evictions();
    report_.prune.budgets = schedule_->budgets();
  }

  /// Installs the oneshot prune's observers (and the preset rule's) on `opt`.
  /// `measure_tail`: this prefill measures the rule's NLL (false: another generation's does).
  void observe_prompt(const std::vector<int>& prompt, ForwardOptions& opt, Observed& obs, bool measure_tail = true) {
    const auto& c = engine_.config();
    obs.scorers = depthkv::make_scorers(c.n_layers, spec_->scorer, c.n_heads, c.n_kv_heads);
    const bool own = spec_->scorer.lookahead == 0 || spec_->scorer.context_weight > 0.0;  // else: the lookahead only
    const auto n = static_cast<std::int32_t>(prompt.size());
    opt.observe_from = own ? first_row_needed(obs.scorers, n) : std::numeric_limits<std::int32_t>::max();
    if (preset_.empty()) {
      if (own && opt.observe_from < n) opt.observer = observe_into(obs.scorers);
      return;
    }
    obs.fallback_spec = preset_fallback_spec(preset_, *spec_);
    obs.fallback = depthkv::make_scorers(c.n_layers, obs.fallback_spec->scorer, c.n_heads, c.n_kv_heads);
    opt.observe_from = std::min(opt.observe_from, first_row_needed(obs.fallback, n));
    opt.observer = [&obs, own](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
      if (own) obs.scorers[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
      obs.fallback[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
    };
    if constexpr (std::is_same<Engine, LlamaEngine>::value)
      if (measure_tail && prompt.size() >= 2) obs.tail = std::make_unique<TailNll>(engine_, prompt, kPresetTrustTokens, opt);
  }

  /// The preset rule's verdict, then the lookahead and the oneshot eviction.
  void prune_prompt(const RowMatrix& logits, Observed& obs) {
    PruneSpec spec = *spec_;
    if (obs.fallback_spec) {
      report_.rule_ran = true;
      report_.context_nll = obs.tail_nll;
      report_.nll_tokens = obs.tail_tokens;
      report_.trusted = preset_trusts_input(preset_, report_.context_nll, engine_.config().vocab_size);
      if (!report_.trusted) {
        spec = *obs.fallback_spec;
        obs.scorers = std::move(obs.fallback);
      }
    }
    if (spec.scorer.lookahead > 0) {
      const auto t1 = std::chrono::steady_clock::now();
      depthkv::observe_lookahead(cache_, last_argmax(logits), pos_, {&obs.scorers}, engine_.config().seq_len,
                                 [this](int token, std::int32_t pos, const AttentionObserver& observer) {
                                   ForwardOptions o;
                                   o.observer = observer;
                                   o.all_logits = false;
                                   return last_argmax(engine_.forward(&token, 1, pos, cache_, o));
                                 });
      report_.lookahead_ms = ms_since(t1);
      report_.lookahead = spec.scorer.lookahead;
    }
    if (depthkv::raise_to_protection(spec, cache_.lengths())) report_.raised_to_protection = true;
    report_.prune = score_and_evict(cache_, obs.scorers, spec, curves_.data(), wo_views(spec));
    report_.pruned = true;
    report_.spec = spec;
  }

  const Engine& engine_;
  Cache cache_;
  std::optional<PruneSpec> spec_;
  PolicyCurves curves_;
  const OutputProjections* wo_;
  std::string preset_;
  ForwardOptions run_;
  std::function<void(int, std::int32_t)> on_append_;
  std::unique_ptr<EvictionSchedule> schedule_;
  std::unique_ptr<Shared> shared_;  ///< set by `prefill_shared` for `adopt`
  std::int32_t pos_ = 0;
  GenerationReport report_;
};

}  // namespace llama
}  // namespace depthkv
