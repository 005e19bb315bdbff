#pragma once
/// @file eviction_schedule.hpp
/// @brief The loop an engine runs to keep a sequence's KV cache bounded: per-layer token scorers
/// fed by the engine's attention, scoring, the `BudgetAllocator` split of a global budget, and
/// eviction (Eigen only, engine-agnostic). `score_and_evict` evicts once (after the whole
/// context: "oneshot"); `EvictionSchedule` evicts after every prefill chunk and every `interval`
/// decoded tokens, so that the cache never holds much more than its budget.
///
/// ## The schedule
/// One `EvictionSchedule` per sequence. It owns one `TokenScorer` per layer (fed through
/// `observer()`), the budget (a fixed total of KV tokens over all layers, or a keep ratio of the
/// tokens seen so far), the allocation policy and profile, and the protected tokens. The engine
/// calls `after_chunk(cache)` after each prefill chunk and `after_decode_step(cache)` after each
/// decode step (both do the same thing). A call counts the tokens appended since the last call
/// (every layer must have grown by the same number); once `interval` tokens have been appended
/// since the last eviction and the layers hold more than the global budget B, it
/// 1. re-runs the allocator with `lengths` = the tokens seen by every layer (as oneshot eviction
///    would at this point), `caps` = what each layer holds now (a layer cannot grow back) and
///    floors from the protection, so that the layers sum exactly to B;
/// 2. scores every layer (`TokenScorer::cached_scores`; output-aware scorers read
///    `output_projections` and compute n_j only for the slots appended since), splits
///    each layer's budget across its KV heads (`head_budgets`: `head_allocation`, uniform by
///    default) and evicts (`evict`, `EvictOptions`);
///    with `head_profile` (per-(layer, KV head) curves) step 1 allocates per head instead: the
///    head-level optimal over all (layer, head) units (`head_optimal_budgets`' problem) with
///    lengths = tokens seen, caps = what each head holds now, floors = each head's protected
///    count, and n_kv_heads * B tokens; `head_allocation` adaptive then re-splits each layer's
///    total by the scores with those budgets as the start (`head_budgets`' per-head form);
/// 3. compacts the scorers' state to the kept slots (`TokenScorer::compact`).
/// Between evictions a layer holds at most its budget plus `interval - 1` tokens (plus the last
/// chunk when a chunk is longer than `interval`). With `interval = 1` every call that finds the
/// cache over budget evicts (DepthKV: prune after each prefill chunk); `interval = M` evicts every
/// M decoded tokens, as kvpress's DecodingPress does.
///
/// With `targets` (a `TargetPlan`: fixed final budgets per layer and KV head, for a sequence of
/// known length) instead of a global budget, a call evicts the layers that hold more than their
/// targets for the tokens seen (steps 2 and 3 only, on those layers).
///
/// B = `total_tokens`, or `llround(keep_ratio * L * seen)`, and never below the protected tokens
/// (sum over layers of min(held, n_sink + n_recent)). A schedule whose only call comes after the
/// whole context ("chunked" with one chunk) evicts exactly as `score_and_evict` does.
///
/// ## Errors
/// Invalid input throws `depthkv::Error`; a call that throws leaves the cache, the scorers and
/// the schedule's counters unchanged (everything is validated before the first change), except
/// that an output-aware scorer's norm cache may hold the slots appended since (still valid).
///
/// The schedule takes what to keep as a `PruneSpec` (its scorer, protection, budget, policy,
/// head split and interval); the internal `detail::ScheduleConfig` is that spec resolved
/// (`detail::schedule_config`: the policy's curves and the output projections as pointers).
///
/// @code
/// depthkv::PruneSpec spec;
/// spec.budget = depthkv::Budget::keep(0.2);       // or Budget::tokens(4096)
/// spec.protection = {4, 16};
/// depthkv::EvictionSchedule schedule(spec, {}, n_layers, n_heads, n_kv_heads);
/// opt.observer = schedule.observer();              // the engine calls it with attention rows
/// for (int c0 = 0; c0 < n_ctx; c0 += chunk) {
///   engine.prefill(chunk_tokens(c0), c0, cache, opt);
///   schedule.after_chunk(cache);                   // evicts when over budget
/// }
/// for (int t = 0; t < n_new; ++t) {
///   engine.decode(token, pos++, cache, opt);
///   schedule.after_decode_step(cache);             // evicts every `interval` tokens
/// }
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "depthkv/budget_allocator.hpp"
#include "depthkv/error.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/selection.hpp"
#include "depthkv/sensitivity_profile.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {

/// Called with `(layer, q_head, q_pos0, n_queries, probs, ld, n)`: `TokenScorer::observe_block`'s
/// arguments after the layer index (the same type as `llama::AttentionObserver`).
using AttentionObserver =
    std::function<void(int layer, int q_head, std::int32_t q_pos0, int n_queries, const float* probs, int ld, int n)>;

/// One `TokenScorer` per layer.
/// @throws Error on n_layers < 0 or an invalid scorer configuration / head counts
inline std::vector<TokenScorer> make_scorers(int n_layers, const ScorerConfig& scorer, int n_heads, int n_kv_heads) {
  DEPTHKV_CHECK(n_layers >= 0, "n_layers must be >= 0, got " << n_layers);
  std::vector<TokenScorer> s;
  s.reserve(static_cast<std::size_t>(n_layers));
  for (int l = 0; l < n_layers; ++l) s.emplace_back(scorer, n_heads, n_kv_heads);
  return s;
}

/// The first query position whose attention rows `scorers` use at an eviction that follows
/// position `evict_at - 1`: max(0, evict_at - w), w the largest `positions_needed()` (a scorer
/// that keeps only its last w positions' rows); 0 when a scorer uses every row (H2O);
/// INT32_MAX when none observes (key-norm). Rows before it can go unformed.
inline std::int32_t first_observed_position(const std::vector<TokenScorer>& scorers, long long evict_at) {
  int w = -1;
  for (const TokenScorer& s : scorers) {
    const int need = s.positions_needed();
    if (need == 0) return 0;
    w = std::max(w, need);
  }
  if (w < 0) return std::numeric_limits<std::int32_t>::max();
  return static_cast<std::int32_t>(std::clamp<long long>(evict_at - w, 0, std::numeric_limits<std::int32_t>::max()));
}

/// An observer that feeds `scorers[layer].observe_block` (the vector must outlive the observer
/// and hold one scorer per layer).
inline AttentionObserver observe_into(std::vector<TokenScorer>& scorers) {
  return [&scorers](int layer, int q_head, std::int32_t q_pos0, int n_queries, const float* probs, int ld, int n) {
    scorers[static_cast<std::size_t>(layer)].observe_block(q_head, q_pos0, n_queries, probs, ld, n);
  };
}

/// An observer feeding several scorer sets at once (`sets[k][layer]`), e.g. H2O and SnapKV from
/// one prefill.
inline AttentionObserver observe_into(std::vector<std::vector<TokenScorer>>& sets) {
  return [&sets](int layer, int q_head, std::int32_t q_pos0, int n_queries, const float* probs, int ld, int n) {
    for (auto& s : sets) s[static_cast<std::size_t>(layer)].observe_block(q_head, q_pos0, n_queries, probs, ld, n);
  };
}

/// Scores of every layer of `cache` (`scorers[l].scores(cache.layer(l), &(*wo)[l])`).
/// @param wo one output projection per layer (`OutputProjection`, token_scorer.hpp), needed by
///   output-aware scorers; null otherwise
/// @throws Error when the counts or shapes disagree, or an output-aware scorer gets no projection
template <class Layer>
std::vector<LayerScores> layer_scores(const std::vector<TokenScorer>& scorers, const KVCache<Layer>& cache,
                                      const std::vector<OutputProjection>* wo = nullptr) {
  DEPTHKV_CHECK(static_cast<int>(scorers.size()) == cache.n_layers(),
                scorers.size() << " scorers for " << cache.n_layers() << " layers");
  DEPTHKV_CHECK(wo == nullptr || static_cast<int>(wo->size()) == cache.n_layers(),
                wo->size() << " output projections for " << cache.n_layers() << " layers");
  std::vector<LayerScores> s;
  s.reserve(scorers.size());
  for (int l = 0; l < cache.n_layers(); ++l)
    s.push_back(scorers[static_cast<std::size_t>(l)].scores(
        cache.layer(l), wo ? &(*wo)[static_cast<std::size_t>(l)] : nullptr));
  return s;
}

/// Tokens kept of a row of `n` at keep ratio `ratio`: `round(ratio * n)`, at least the protected
/// count (sinks + recent window, capped at n), at most n; ratio >= 1 keeps all.
/// @throws Error on a negative or NaN ratio
inline int keep_tokens(double ratio, int n, Protection prot) {
  DEPTHKV_CHECK(ratio >= 0.0, "keep ratio must be >= 0, got " << ratio);
  if (ratio >= 1.0) return n;
  const int prot_n = std::min(n, prot.n_sink + prot.n_recent);
  const long long k = std::llround(ratio * static_cast<double>(n));
  return static_cast<int>(std::max<long long>(prot_n, std::min<long long>(k, n)));
}

namespace detail {

/// How the budget of one eviction is found and split, the resolved form of a `PruneSpec`
/// (internal: what `PruneRequest` and `ScheduleConfig` share): the allocation policy, the global
/// budget (`budget.keep_ratio` or `budget.total_tokens`, plus the policy parameters), the curves,
/// the protected tokens and the split across KV heads.
struct PruneSettings {
  AllocationPolicy policy = AllocationPolicy::kUniform;
  BudgetRequest budget;
  const SensitivityProfile* profile = nullptr;  ///< for the curve-based policies (must outlive its use)
  /// Per-(layer, KV head) curves (n_layers * n_kv_heads rows, row l * n_kv_heads + h): when set,
  /// the budgets are head-level optimal (`head_optimal_budgets`; `policy` and `profile` are not
  /// used), then split again by `head_allocation` when that is adaptive.
  const SensitivityProfile* head_profile = nullptr;
  Protection protection;  ///< tokens every head keeps (inside the budget)
  /// How each layer's budget is split across its KV heads (head_budget.hpp) and the adaptive
  /// split's floor fraction.
  HeadAllocation head_allocation = HeadAllocation::kUniform;
  double head_alpha = kDefaultHeadAlpha;
  /// One output projection per layer, for output-aware scorers (`layer_scores`); null otherwise.
  const std::vector<OutputProjection>* output_projections = nullptr;
  /// Per layer 0, or the sliding window W of a local layer (`LlamaConfig::layer_window`; empty:
  /// none): before each eviction a local layer's slots outside its window are dropped
  /// (`drop_outside_windows`) and its budget is capped at W - 1 (`window_caps`).
  std::vector<int> layer_window;
  /// Span pooling (`ScorerConfig::span_pooling`): each position's span start; null: off.
  const std::vector<std::int32_t>* span_start = nullptr;
};

}  // namespace detail

/// Drops, in every layer l with `window[l]` = W > 0, the slots that no query from the next
/// position on can see (positions <= next - W, next = 1 + the newest position any layer holds)
/// and compacts that layer's scorer alike (`TokenScorer::compact`). Slots are held in position
/// order, so the dropped ones are each head's first slots. What a local layer holds then is at
/// most W - 1 slots. The freed capacity stays with the layer (no `shrink_to_fit`: a layer that
/// drops a slot every decode step reuses it for the next append; the next eviction shrinks).
/// @param scorers one per layer, or empty (no scorer state to keep in step)
/// @return the slots dropped, over all layers and heads
/// @throws Error when `window` is neither empty nor one entry per layer, or `scorers` neither
///   empty nor one per layer (nothing is changed then)
template <class Layer>
long long drop_outside_windows(KVCache<Layer>& cache, std::vector<TokenScorer>& scorers, const std::vector<int>& window) {
  DEPTHKV_CHECK(window.empty() || static_cast<int>(window.size()) == cache.n_layers(),
                "window has " << window.size() << " entries for " << cache.n_layers() << " layers");
  DEPTHKV_CHECK(scorers.empty() || static_cast<int>(scorers.size()) == cache.n_layers(),
                scorers.size() << " scorers for " << cache.n_layers() << " layers");
  std::int64_t next = 0;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h)
      if (cache.layer(l).size(h) > 0)
        next = std::max<std::int64_t>(next, cache.layer(l).positions(h)[cache.layer(l).size(h) - 1] + 1LL);
  long long dropped = 0;
  std::vector<std::int32_t> kept;
  for (int l = 0; l < static_cast<int>(window.size()); ++l) {
    const int w = window[static_cast<std::size_t>(l)];
    if (w <= 0) continue;
    for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h) {
      const int d = drop_positions(cache.layer(l), h, std::numeric_limits<std::int32_t>::min(), next - w, kept);
      if (d > 0 && !scorers.empty())
        scorers[static_cast<std::size_t>(l)].compact(h, kept.data(), static_cast<int>(kept.size()));
      dropped += d;
    }
  }
  return dropped;
}

namespace detail {

/// What one eviction (`score_and_evict`) does: `PruneSettings` (`budget.lengths` is filled from
/// the cache). Internal: `prune_request` builds it from a spec.
struct PruneRequest : PruneSettings {
  /// When `budget.floors` is empty, use `protection_floors(lengths, protection)` as floors
  /// (eviction cannot go below the protected count).
  bool floors_from_protection = true;
};

}  // namespace detail

/// What `score_and_evict` (or one eviction of an `EvictionSchedule`) did.
struct PruneReport {
  std::vector<int> lengths;     ///< tokens per layer before (largest head)
  std::vector<int> budgets;     ///< tokens kept per layer (every head; the layer's per-head budget
                                ///< before the cross-head split when that is adaptive; with head
                                ///< curves the mean of the layer's head budgets, rounded)
  std::vector<std::vector<int>> head_budgets;  ///< with head curves: budget[l][h] before the cross-head split
  std::size_t bytes_before = 0; ///< KV bytes held before
  std::size_t bytes_after = 0;  ///< and after
  std::vector<LayerEviction> evictions;
};

namespace detail {

/// How the scores are taken and each layer's budget is split across its heads.
struct HeadSplit {
  HeadAllocation mode = HeadAllocation::kUniform;
  double alpha = kDefaultHeadAlpha;
  const std::vector<OutputProjection>* wo = nullptr;
  const SensitivityProfile* head_profile = nullptr;  ///< head-level optimal budgets when set
  const std::vector<std::int32_t>* span_start = nullptr;  ///< span pooling when set (`pool_over_spans`)
};

/// Span pooling of one layer's scores `s` (one vector per KV head, one score per slot): every
/// slot's score becomes the largest score of the slots of its head whose positions share its
/// span start (`span_start[p]`; a position at or beyond its size is a span of its own). Slots
/// hold ascending positions, so a span's slots are adjacent. A NaN score stays NaN (the evictor
/// refuses it).
template <class Layer>
void pool_over_spans(const Layer& layer, LayerScores& s, const std::vector<std::int32_t>& span_start) {
  const auto n_spans = static_cast<std::int64_t>(span_start.size());
  for (int h = 0; h < layer.n_kv_heads() && h < static_cast<int>(s.size()); ++h) {
    std::vector<float>& v = s[static_cast<std::size_t>(h)];
    const std::int32_t* pos = layer.positions(h);
    const int n = std::min(layer.size(h), static_cast<int>(v.size()));
    const auto span_of = [&](int i) -> std::int64_t {
      return pos[i] < n_spans ? span_start[static_cast<std::size_t>(pos[i])] : pos[i];
    };
    for (int a = 0; a < n;) {
      const std::int64_t id = span_of(a);
      int b = a;
      float m = -std::numeric_limits<float>::infinity();
      for (; b < n && span_of(b) == id; ++b)
        if (v[static_cast<std::size_t>(b)] > m) m = v[static_cast<std::size_t>(b)];
      for (int i = a; i < b; ++i)
        if (!std::isnan(v[static_cast<std::size_t>(i)])) v[static_cast<std::size_t>(i)] = m;
      a = b;
    }
  }
}

/// Tokens every head of the cache holds, summed.
template <class Layer>
long long head_tokens(const KVCache<Layer>& cache) {
  long long n = 0;
  for (int l = 0; l < cache.n_layers(); ++l)
    for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h) n += cache.layer(l).size(h);
  return n;
}

/// Head-level optimal budgets k[l][h] for the cache now: `br` (lengths set; its budget counted
/// per head of a layer) over (layer, head) units with caps = each head's size and floors = each
/// head's protected count.
template <class Layer>
std::vector<std::vector<int>> head_level_budgets(const KVCache<Layer>& cache, const BudgetRequest& br,
                                                 const SensitivityProfile& head_profile, Protection prot) {
  const int H = cache.layer(0).n_kv_heads();
  BudgetRequest layer_req = br;
  layer_req.caps.clear();
  layer_req.floors.clear();
  BudgetRequest u = head_unit_request(layer_req, H);
  u.caps.clear();
  u.floors.clear();
  for (int l = 0; l < cache.n_layers(); ++l) {
    DEPTHKV_CHECK(cache.layer(l).n_kv_heads() == H, "layer " << l << " has " << cache.layer(l).n_kv_heads()
                                                             << " KV heads, layer 0 " << H);
    for (int h = 0; h < H; ++h) {
      const int n = cache.layer(l).size(h);
      u.caps.push_back(std::min(n, u.lengths[u.caps.size()]));
      u.floors.push_back(std::min(n, prot.n_sink + prot.n_recent));
    }
  }
  return allocate_head_units(head_profile, H, u);
}

/// Scores the layers `ids` of the cache, splits each one's per-head starting budgets `start[i]`
/// across its heads (`split.mode` when `resplit`; as given otherwise), evicts them (every layer
/// validated before any is touched) and compacts their scorers: the one score -> split -> evict
/// -> compact step of `score_and_evict` and `EvictionSchedule`.
/// @return one eviction per entry of `ids`
template <class Layer>
std::vector<LayerEviction> split_evict_compact(KVCache<Layer>& cache, std::vector<TokenScorer>& scorers,
                                               const std::vector<int>& ids, const std::vector<std::vector<int>>& start,
                                               bool resplit, Protection prot, const EvictOptions& opt,
                                               const HeadSplit& split) {
  DEPTHKV_CHECK_AS("layer_scores", static_cast<int>(scorers.size()) == cache.n_layers(),
                   scorers.size() << " scorers for " << cache.n_layers() << " layers");
  DEPTHKV_CHECK_AS("layer_scores", split.wo == nullptr || static_cast<int>(split.wo->size()) == cache.n_layers(),
                   split.wo->size() << " output projections for " << cache.n_layers() << " layers");
  std::vector<Layer*> layers;
  std::vector<LayerScores> scores;
  scores.reserve(ids.size());
  for (int l : ids) {
    const auto i = static_cast<std::size_t>(l);
    layers.push_back(&cache.layer(l));
    scores.push_back(scorers[i].cached_scores(cache.layer(l), split.wo ? &(*split.wo)[i] : nullptr));
    if (split.span_start != nullptr) pool_over_spans(cache.layer(l), scores.back(), *split.span_start);
  }
  std::vector<std::vector<int>> keep = start;
  if (resplit && split.mode != HeadAllocation::kUniform)  // reads only; the evictor validates before it mutates
    for (std::size_t i = 0; i < ids.size(); ++i)
      keep[i] = layer_head_budgets(split.mode, *layers[i], ids[i], scores[i], start[i], prot, split.alpha);
  std::vector<const LayerScores*> sp;
  for (const LayerScores& s : scores) sp.push_back(&s);
  std::vector<LayerEviction> ev = evict_layers(layers, sp, keep, prot, opt, ids);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t h = 0; h < ev[i].kept_slots.size(); ++h)
      scorers[static_cast<std::size_t>(ids[i])].compact(static_cast<int>(h), ev[i].kept_slots[h].data(),
                                                        static_cast<int>(ev[i].kept_slots[h].size()));
  return ev;
}

/// Allocates `br` (lengths, caps and floors set), then `split_evict_compact` on every layer.
template <class Layer>
PruneReport allocate_and_evict(KVCache<Layer>& cache, std::vector<TokenScorer>& scorers, AllocationPolicy policy,
                               const BudgetRequest& br, const SensitivityProfile* profile, Protection prot,
                               const EvictOptions& opt, const HeadSplit& split = {}) {
  PruneReport rep;
  rep.lengths = cache.lengths();
  rep.bytes_before = cache.bytes();
  std::vector<std::vector<int>> start;  // per head, before the cross-head split
  if (split.head_profile != nullptr) {  // head-level optimal budgets
    rep.head_budgets = head_level_budgets(cache, br, *split.head_profile, prot);
    start = rep.head_budgets;
    rep.budgets = mean_per_layer(start);
  } else {
    rep.budgets = BudgetAllocator().allocate(policy, br, profile);
    for (int l = 0; l < cache.n_layers(); ++l)
      start.emplace_back(static_cast<std::size_t>(cache.layer(l).n_kv_heads()), rep.budgets[static_cast<std::size_t>(l)]);
  }
  std::vector<int> ids(static_cast<std::size_t>(cache.n_layers()));
  for (int l = 0; l < cache.n_layers(); ++l) ids[static_cast<std::size_t>(l)] = l;
  rep.evictions = split_evict_compact(cache, scorers, ids, start, true, prot, opt, split);
  rep.bytes_after = cache.bytes();
  return rep;
}

/// `score_and_evict` on the resolved request `req` (a spec's, `prune_request`).
template <class Layer>
PruneReport score_and_evict(KVCache<Layer>& cache, std::vector<TokenScorer>& scorers, const PruneRequest& req,
                            const EvictOptions& opt = {}) {
  drop_outside_windows(cache, scorers, req.layer_window);
  BudgetRequest br = req.budget;
  br.lengths = cache.lengths();
  if (!req.layer_window.empty()) {  // a local layer counts as long as the longest layer, capped at what it holds
    const int longest = *std::max_element(br.lengths.begin(), br.lengths.end());
    br.caps = br.lengths;
    for (std::size_t l = 0; l < br.lengths.size(); ++l)
      if (req.layer_window[l] > 0) br.lengths[l] = longest;
    clamp_budget_to_caps(br);  // a keep ratio of the longest layer's length may exceed what they hold
  }
  if (br.floors.empty() && req.floors_from_protection)
    br.floors = protection_floors(br.caps.empty() ? br.lengths : br.caps, req.protection);
  return detail::allocate_and_evict(cache, scorers, req.policy, br, req.profile, req.protection, opt,
                                    {req.head_allocation, req.head_alpha, req.output_projections, req.head_profile,
                                     req.span_start});
}

/// The `PruneSettings` of `spec` with the policy data it reads (the resolved form of a spec: its
/// budget request without lengths, its curves and projections as pointers).
/// @throws Error on an invalid spec, or head-optimal without head curves
inline PruneSettings prune_settings(const PruneSpec& spec, const PolicyData& data,
                                    const std::vector<OutputProjection>* wo) {
  spec.validate();
  DEPTHKV_CHECK(!is_head_policy(spec.policy) || data.head_curves != nullptr, "policy head-optimal needs head curves");
  DEPTHKV_CHECK(!spec.scorer.span_pooling || data.span_start != nullptr,
                "scorer.span_pooling needs the tokens' spans (PolicyData::span_start, e.g. llama::token_span_starts)");
  PruneSettings p;
  p.policy = spec.policy;
  p.budget = spec.budget_request({});
  p.budget.lengths.clear();
  p.budget.floors.clear();
  p.budget.infonce = data.infonce;
  p.profile = policy_needs_profile(spec.policy) ? data.layer_curves : nullptr;
  p.head_profile = is_head_policy(spec.policy) ? data.head_curves : nullptr;
  p.protection = spec.protection;
  p.head_allocation = spec.head_split.mode;
  p.head_alpha = spec.head_split.alpha;
  p.output_projections = wo;
  p.layer_window = data.layer_window;
  p.span_start = spec.scorer.span_pooling ? data.span_start : nullptr;
  return p;
}

/// The `PruneRequest` of `spec` with the policy data it reads.
/// @throws Error on an invalid spec, or head-optimal without head curves
inline PruneRequest prune_request(const PruneSpec& spec, const PolicyData& data,
                                  const std::vector<OutputProjection>* wo = nullptr) {
  PruneRequest req;
  static_cast<PruneSettings&>(req) = prune_settings(spec, data, wo);
  return req;
}

}  // namespace detail

/// One eviction of the whole cache by `spec` (its schedule aside): scores every layer, splits
/// the budget across layers (`BudgetAllocator`) and each layer's across its KV heads, evicts, and
/// compacts the scorers (so that a chunked prefill can continue observing).
/// @param cache the cache after (part of) the prefill
/// @param scorers one per layer, fed during the prefill
/// @param spec what to keep: scorer settings, protection, budget, policy, head split
/// @param data what the spec's policy reads (`policy_curves(...).data()`; empty for uniform)
/// @param wo one output projection per layer for an output-aware scorer (null otherwise)
/// @param opt eviction options (shrinking, threads)
/// @return the per-layer budgets and the bytes held before and after
/// @throws Error on an invalid spec, from the allocator (infeasible budget, missing profile, ...)
///   or the evictor; the cache and the scorers are unchanged then
template <class Layer>
PruneReport score_and_evict(KVCache<Layer>& cache, std::vector<TokenScorer>& scorers, const PruneSpec& spec,
                            const PolicyData& data, const std::vector<OutputProjection>* wo = nullptr,
                            const EvictOptions& opt = {}) {
  return detail::score_and_evict(cache, scorers, detail::prune_request(spec, data, wo), opt);
}

namespace detail {

/// Fixed final budgets of a sequence of known length, reached as it is read (a chunked plan):
/// head h of layer l ends with `keep[l][h]` of the `length` tokens. After `seen < length` tokens
/// its target is `keep_tokens(keep[l][h] / length, seen, protection)` (the same fraction; a
/// budget >= `length` stays as it is), from `length` tokens on `keep[l][h]`. A layer is evicted
/// only when one of its heads holds more than its target. With `split` each layer's targets are
/// split again across its heads by the schedule's `head_allocation` (as allocator budgets are);
/// without it every head keeps its own target.
struct TargetPlan {
  int length = 0;
  std::vector<std::vector<int>> keep;  ///< [layer][KV head]
  bool split = true;

  bool empty() const { return keep.empty(); }
  /// The targets of layer l's heads after `seen` tokens.
  std::vector<int> at(int l, long long seen, Protection prot) const {
    std::vector<int> t = keep[static_cast<std::size_t>(l)];
    for (int& k : t)
      if (seen < length && k < length) k = keep_tokens(static_cast<double>(k) / length, static_cast<int>(seen), prot);
    return t;
  }
};

/// Settings of an `EvictionSchedule`, the resolved form of a spec (internal:
/// `schedule_config` builds it): `PruneSettings` (the global budget is `total_tokens`, fixed
/// KV tokens over all layers, or `keep_ratio` of the tokens seen so far times the layer count,
/// exactly one set; `budget.lengths`, `caps` and `floors` are filled by the schedule and must be
/// empty), the scorer and the interval.
struct ScheduleConfig : PruneSettings {
  ScorerConfig scorer;  ///< the token scorer of every layer
  int interval = 1;     ///< evict once this many tokens were appended (>= 1)
  EvictOptions evict;   ///< shrinking and threads of each eviction
  /// Fixed per-layer (per-head) targets instead of a global budget (`budget` then sets neither
  /// total_tokens nor keep_ratio, and `policy` is not used).
  TargetPlan targets;
};

/// The `ScheduleConfig` of `spec` with the policy data it reads.
/// @param wo one output projection per layer for an output-aware scorer (null otherwise)
/// @throws Error on an invalid spec, or head-optimal without head curves
inline ScheduleConfig schedule_config(const PruneSpec& spec, const PolicyData& data,
                                      const std::vector<OutputProjection>* wo = nullptr) {
  ScheduleConfig sc;
  static_cast<PruneSettings&>(sc) = prune_settings(spec, data, wo);
  sc.scorer = spec.scorer;
  sc.interval = spec.schedule.interval;
  return sc;
}

}  // namespace detail

/// Bounded KV memory for one sequence: scorers, budget and eviction after every prefill chunk and
/// decode step (see the file comment). Not copyable safely while an `observer()` is in use (the
/// observer references this object's scorers: keep the schedule in place).
///
/// @code
/// depthkv::PruneSpec spec;
/// spec.budget = depthkv::Budget::tokens(2048);   // over all layers
/// spec.schedule.interval = 32;
/// depthkv::EvictionSchedule s(spec, {}, n_layers, n_heads, n_kv_heads);
/// opt.observer = s.observer();
/// engine.prefill(chunk, pos0, cache, opt);
/// s.after_chunk(cache);            // cache.bytes() now <= budget + 31 tokens per layer
/// @endcode
class EvictionSchedule {
 public:
  /// @param spec what to keep (scorer, protection, budget, policy, head split, interval; its
  ///   schedule's mode is the caller's: every call may evict)
  /// @param data what the spec's policy reads (`policy_curves(...).data()`; empty for uniform)
  /// @param n_layers, n_heads, n_kv_heads the model's shape (every layer the same heads)
  /// @param wo one output projection per layer for an output-aware scorer (null otherwise)
  /// @param evict shrinking and threads of each eviction
  /// @throws Error as the constructor below, or on an invalid spec
  EvictionSchedule(const PruneSpec& spec, const PolicyData& data, int n_layers, int n_heads, int n_kv_heads,
                   const std::vector<OutputProjection>* wo = nullptr, const EvictOptions& evict = {})
      : EvictionSchedule(with_evict(detail::schedule_config(spec, data, wo), evict), n_layers, n_heads, n_kv_heads) {}

  /// A schedule of resolved settings (`detail::schedule_config`; fixed targets: `TargetPlan`).
  /// @param cfg budget, policy, profile, protection, scorer and interval
  /// @param n_layers, n_heads, n_kv_heads the model's shape (every layer the same heads)
  /// @throws Error on a budget with neither or both of total_tokens / keep_ratio, a ratio outside
  ///   [0, 1], a negative total, preset lengths/caps/floors, interval < 1, a curve-based policy
  ///   without a profile, or an invalid scorer / head counts; with `targets`: a budget set
  ///   too, a length < 1, targets of another shape than the model's, or one below the
  ///   protected count of `length` tokens
  EvictionSchedule(detail::ScheduleConfig cfg, int n_layers, int n_heads, int n_kv_heads) : cfg_(std::move(cfg)) {
    DEPTHKV_CHECK(n_layers >= 1, "n_layers must be >= 1, got " << n_layers);
    if (cfg_.targets.empty())
      check_budget(n_layers, n_kv_heads);
    else
      check_targets(n_layers, n_kv_heads);
    detail::check_interval(cfg_.interval);
    DEPTHKV_CHECK_AS("EvictionSchedule", cfg_.layer_window.empty() || static_cast<int>(cfg_.layer_window.size()) == n_layers,
                     "layer_window has " << cfg_.layer_window.size() << " entries for " << n_layers << " layers");
    for (int w : cfg_.layer_window) DEPTHKV_CHECK_AS("EvictionSchedule", w >= 0, "layer_window holds " << w << " (must be >= 0)");
    DEPTHKV_CHECK(cfg_.scorer.lookahead == 0,
                  "a schedule evicts while the context is read; lookahead (" << cfg_.scorer.lookahead
                      << ") needs the whole context first: use one eviction after the prefill");
    detail::check_protection(cfg_.protection);
    DEPTHKV_CHECK(cfg_.evict.n_threads >= 0, "evict.n_threads must be >= 0, got " << cfg_.evict.n_threads);
    detail::check_head_alpha(cfg_.head_alpha);
    DEPTHKV_CHECK(!cfg_.scorer.output_aware ||
                      (cfg_.output_projections != nullptr && static_cast<int>(cfg_.output_projections->size()) == n_layers),
                  "an output-aware scorer needs one output projection per layer (output_projections)");
    scorers_ = make_scorers(n_layers, cfg_.scorer, n_heads, n_kv_heads);
    held_.assign(static_cast<std::size_t>(n_layers), 0);
  }

  const detail::ScheduleConfig& config() const { return cfg_; }
  int n_layers() const { return static_cast<int>(scorers_.size()); }
  /// The observer to put in the engine's forward options (references this schedule).
  AttentionObserver observer() { return observe_into(scorers_); }
  std::vector<TokenScorer>& scorers() { return scorers_; }
  const std::vector<TokenScorer>& scorers() const { return scorers_; }
  /// Tokens appended to every layer so far (the sequence length).
  long long tokens_seen() const { return seen_; }
  /// Tokens appended since the last eviction.
  long long pending() const { return pending_; }
  /// Evictions done so far.
  int n_evictions() const { return n_evictions_; }
  /// The first sequence position whose attention rows the scorers can still use at an eviction:
  /// `ForwardOptions::observe_from` for the next forward call, which appends `n_tokens` tokens and
  /// is followed by one `after_chunk` / `after_decode_step`, so that the engine forms no
  /// probability rows the scorers would drop unscored. The next eviction comes at the earliest
  /// after the call that appends position e - 1, e = tokens_seen() + max(n_tokens, interval -
  /// pending()); a scorer that keeps only its last w positions' rows
  /// (`TokenScorer::positions_needed`: SnapKV its window, TOVA 1) scores then the rows of
  /// positions >= e - w at most. Returns max(0, e - w) with w the largest over the layers'
  /// scorers; 0 when a scorer uses every row (H2O); INT32_MAX when no scorer observes (key-norm).
  /// Scores, evictions and outputs are the same bytes as with every row observed, provided
  /// evictions come only from `after_chunk` / `after_decode_step` after calls of the lengths
  /// given here (`evict_now` scores at any point: observe every row, 0, in the call before it).
  /// @throws Error on n_tokens < 1
  std::int32_t observe_from(int n_tokens = 1) const {
    DEPTHKV_CHECK(n_tokens >= 1, "observe_from: n_tokens must be >= 1, got " << n_tokens);
    return first_observed_position(scorers_, seen_ + std::max<long long>(n_tokens, cfg_.interval - pending_));
  }
  /// Per-layer budgets of the last eviction (empty before the first).
  const std::vector<int>& budgets() const { return last_.budgets; }
  /// What the last eviction did (empty before the first).
  const PruneReport& last_report() const { return last_; }
  /// The global budget B for `seen` tokens per layer and the current holdings (see the file comment).
  long long global_budget(long long seen, const std::vector<int>& held) const {
    long long b = cfg_.budget.total_tokens != -1
                      ? cfg_.budget.total_tokens
                      : std::llround(cfg_.budget.keep_ratio * static_cast<double>(seen) * static_cast<double>(held.size()));
    return std::max(b, protected_total(held));
  }

  /// Forgets the sequence (scorers, counters): the next call expects an empty cache.
  void reset() {
    for (TokenScorer& s : scorers_) s.reset();
    std::fill(held_.begin(), held_.end(), 0);
    seen_ = pending_ = 0;
    n_evictions_ = 0;
    last_ = PruneReport();
  }

  /// After a prefill chunk: counts the appended tokens and evicts when `interval` tokens were
  /// appended since the last eviction and the cache holds more than the budget.
  /// @return true when it evicted
  /// @throws Error when the cache's layer count differs, a layer shrank or layers grew by
  ///   different counts since the last call, or from the allocator / evictor; the cache, the
  ///   scorers and the counters are unchanged then
  template <class Layer>
  bool after_chunk(KVCache<Layer>& cache) {
    return step(cache);
  }
  /// After a decode step (the same as `after_chunk`).
  template <class Layer>
  bool after_decode_step(KVCache<Layer>& cache) {
    return step(cache);
  }
  /// Counts the appended tokens and evicts now when the cache holds more than the budget,
  /// whatever the interval (e.g. at the end of the prefill, so that decoding starts on budget).
  /// @return true when it evicted
  /// @throws Error as `after_chunk`; nothing changes then
  template <class Layer>
  bool evict_now(KVCache<Layer>& cache) {
    return step(cache, /*force=*/true);
  }

 private:
  // The global budget's checks (the constructor's, without targets).
  void check_budget(int n_layers, int n_kv_heads) const {
    const BudgetRequest& b = cfg_.budget;
    const bool has_total = b.total_tokens != -1, has_ratio = !(b.keep_ratio == -1.0);
    DEPTHKV_CHECK_AS("EvictionSchedule", has_total != has_ratio,
                     "set exactly one of budget.total_tokens and budget.keep_ratio");
    DEPTHKV_CHECK_AS("EvictionSchedule", !has_total || b.total_tokens >= 0,
                     "total_tokens " << b.total_tokens << " is negative");
    DEPTHKV_CHECK_AS("EvictionSchedule",
                     !has_ratio || (std::isfinite(b.keep_ratio) && b.keep_ratio >= 0.0 && b.keep_ratio <= 1.0),
                     "keep_ratio " << b.keep_ratio << " is outside [0, 1]");
    DEPTHKV_CHECK_AS("EvictionSchedule", b.lengths.empty() && b.caps.empty() && b.floors.empty(),
                     "budget.lengths, caps and floors are set by the schedule; leave them empty");
    DEPTHKV_CHECK_AS("EvictionSchedule",
                     cfg_.head_profile != nullptr || cfg_.profile != nullptr ||
                         !policy_needs_profile(cfg_.policy, !b.robustness.empty()),
                     "policy " << to_string(cfg_.policy) << " needs a sensitivity profile");
    DEPTHKV_CHECK_AS("EvictionSchedule", cfg_.head_profile != nullptr || !is_head_policy(cfg_.policy),
                     "policy head-optimal needs head curves");
    if (cfg_.head_profile != nullptr) {
      cfg_.head_profile->validate();
      DEPTHKV_CHECK_AS("EvictionSchedule", cfg_.head_profile->n_layers() == n_layers * n_kv_heads,
                       "head profile has " << cfg_.head_profile->n_layers() << " rows for " << n_layers
                                           << " layers x " << n_kv_heads << " KV heads");
    }
  }
  // The target plan's checks (the constructor's, with targets).
  void check_targets(int n_layers, int n_kv_heads) const {
    const detail::TargetPlan& t = cfg_.targets;
    DEPTHKV_CHECK_AS("EvictionSchedule", cfg_.budget.total_tokens == -1 && cfg_.budget.keep_ratio == -1.0,
                     "targets replace the global budget: leave budget.total_tokens and budget.keep_ratio unset");
    DEPTHKV_CHECK_AS("EvictionSchedule", t.length >= 1, "targets.length must be >= 1, got " << t.length);
    DEPTHKV_CHECK_AS("EvictionSchedule", static_cast<int>(t.keep.size()) == n_layers,
                     "targets for " << t.keep.size() << " layers, model has " << n_layers);
    const int prot = std::min(t.length, cfg_.protection.n_sink + cfg_.protection.n_recent);
    for (std::size_t l = 0; l < t.keep.size(); ++l) {
      DEPTHKV_CHECK_AS("EvictionSchedule", static_cast<int>(t.keep[l].size()) == n_kv_heads,
                       "layer " << l << ": " << t.keep[l].size() << " targets for " << n_kv_heads << " KV heads");
      for (std::size_t h = 0; h < t.keep[l].size(); ++h)
        DEPTHKV_CHECK_AS("EvictionSchedule", t.keep[l][h] >= prot,
                         "layer " << l << " head " << h << ": target " << t.keep[l][h] << " below the " << prot
                                  << " protected tokens");
    }
  }

  long long protected_total(const std::vector<int>& held) const {
    long long p = 0;
    for (int n : held) p += std::min(n, cfg_.protection.n_sink + cfg_.protection.n_recent);
    return p;
  }

  // The cache's lengths now, after checking that every layer grew by the same count since the
  // last call (after the last call local layers held at most their window - 1).
  template <class Layer>
  std::vector<int> grown_lengths(const KVCache<Layer>& cache) const {
    DEPTHKV_CHECK_AS("step", cache.n_layers() == n_layers(),
                     "cache has " << cache.n_layers() << " layers, schedule " << n_layers());
    const std::vector<int> held = cache.lengths();
    // local layers may have freed slots outside their window (the engine does without an
    // observer): the growth is counted on the global layers
    auto local = [&](int l) { return !cfg_.layer_window.empty() && cfg_.layer_window[static_cast<std::size_t>(l)] > 0; };
    int ref = 0;
    while (ref + 1 < n_layers() && local(ref)) ++ref;
    const int grown = held[static_cast<std::size_t>(ref)] - held_[static_cast<std::size_t>(ref)];
    for (int l = 0; l < n_layers(); ++l) {
      if (local(l) && l != ref) continue;
      const int g = held[static_cast<std::size_t>(l)] - held_[static_cast<std::size_t>(l)];
      DEPTHKV_CHECK_AS("step", g >= 0,
                       "layer " << l << " holds " << held[static_cast<std::size_t>(l)] << " tokens, fewer than the "
                                << held_[static_cast<std::size_t>(l)]
                                << " after the last call (evicted outside the schedule?)");
      DEPTHKV_CHECK_AS("step", g == grown,
                       "layer " << l << " grew by " << g << " tokens since the last call, layer " << ref << " by "
                                << grown);
    }
    return held;
  }

  // The tokens appended since the last call (`grown_lengths`' checks).
  template <class Layer>
  int growth(const KVCache<Layer>& cache) const {
    const std::vector<int> held = grown_lengths(cache);
    int ref = 0;
    while (ref + 1 < n_layers() && !cfg_.layer_window.empty() && cfg_.layer_window[static_cast<std::size_t>(ref)] > 0) ++ref;
    return held[static_cast<std::size_t>(ref)] - held_[static_cast<std::size_t>(ref)];
  }

  template <class Layer>
  bool step(KVCache<Layer>& cache, bool force = false) {
    const int grown = growth(cache);
    drop_outside_windows(cache, scorers_, cfg_.layer_window);  // a local layer: at most its window - 1
    const std::vector<int> held = cache.lengths();
    const long long seen = seen_ + grown, pending = pending_ + grown;
    const bool due = force || pending >= cfg_.interval;
    const bool evicted = due && (cfg_.targets.empty() ? evict_to_budget(cache, held, seen) : evict_to_targets(cache, seen));
    // commit (nothing below throws)
    seen_ = seen;
    if (!evicted) {
      pending_ = pending;
      held_ = held;
      return false;
    }
    held_ = cache.lengths();
    pending_ = 0;
    ++n_evictions_;
    return true;
  }

  // An eviction to the global budget when the layers hold more (file comment); sets `last_`.
  template <class Layer>
  bool evict_to_budget(KVCache<Layer>& cache, const std::vector<int>& held, long long seen) {
    long long sum_held = 0;
    for (int n : held) sum_held += n;
    const long long total = global_budget(seen, held);
    // with head curves the budget counts per head: over budget when the heads hold more than H * B
    const long long H = cache.layer(0).n_kv_heads();
    if (cfg_.head_profile != nullptr ? H * total >= detail::head_tokens(cache) : total >= sum_held) return false;
    DEPTHKV_CHECK_AS("step", seen <= static_cast<long long>(std::numeric_limits<int>::max()),
                     "sequence of " << seen << " tokens is too long");
    BudgetRequest br = cfg_.budget;
    br.lengths.assign(held.size(), static_cast<int>(seen));
    bool all_full = true;
    for (int n : held) all_full = all_full && n == seen;
    if (!all_full) br.caps = held;
    br.floors = protection_floors(held, cfg_.protection);
    const long long raw = cfg_.budget.total_tokens != -1
                              ? cfg_.budget.total_tokens
                              : std::llround(cfg_.budget.keep_ratio * static_cast<double>(seen) *
                                             static_cast<double>(held.size()));
    if (raw != total || cfg_.budget.total_tokens != -1) {  // raised to the protected tokens, or fixed
      br.keep_ratio = -1.0;
      br.total_tokens = total;
    }
    last_ = detail::allocate_and_evict(cache, scorers_, cfg_.policy, br, cfg_.profile, cfg_.protection, cfg_.evict,
                                       {cfg_.head_allocation, cfg_.head_alpha, cfg_.output_projections, cfg_.head_profile,
                                        cfg_.span_start});
    return true;
  }

  // An eviction of the layers over their targets (`TargetPlan`); sets `last_`: its head budgets
  // are every layer's targets (capped at what each head holds), its evictions empty for the
  // layers left alone.
  template <class Layer>
  bool evict_to_targets(KVCache<Layer>& cache, long long seen) {
    std::vector<int> ids;
    std::vector<std::vector<int>> start, targets;
    for (int l = 0; l < n_layers(); ++l) {
      std::vector<int> uncapped = cfg_.targets.at(l, seen, cfg_.protection);
      std::vector<int> t = uncapped;  // the report's targets: capped at what each head holds
      bool over = false;
      for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h) {
        over = over || cache.layer(l).size(h) > t[static_cast<std::size_t>(h)];
        t[static_cast<std::size_t>(h)] = std::min(t[static_cast<std::size_t>(h)], cache.layer(l).size(h));
      }
      targets.push_back(std::move(t));
      if (!over) continue;
      ids.push_back(l);
      start.push_back(std::move(uncapped));
    }
    if (ids.empty()) return false;
    PruneReport rep;
    rep.lengths = cache.lengths();
    rep.bytes_before = cache.bytes();
    std::vector<LayerEviction> ev =
        detail::split_evict_compact(cache, scorers_, ids, start, cfg_.targets.split, cfg_.protection, cfg_.evict,
                                    {cfg_.head_allocation, cfg_.head_alpha, cfg_.output_projections, nullptr,
                                     cfg_.span_start});
    rep.evictions.resize(static_cast<std::size_t>(n_layers()));
    for (std::size_t i = 0; i < ids.size(); ++i) rep.evictions[static_cast<std::size_t>(ids[i])] = std::move(ev[i]);
    rep.budgets = detail::mean_per_layer(targets);
    rep.head_budgets = std::move(targets);
    rep.bytes_after = cache.bytes();
    last_ = std::move(rep);
    return true;
  }

  detail::ScheduleConfig cfg_;

  static detail::ScheduleConfig with_evict(detail::ScheduleConfig sc, const EvictOptions& evict) {
    sc.evict = evict;
    return sc;
  }
  std::vector<TokenScorer> scorers_;
  std::vector<int> held_;  // lengths after the last call
  long long seen_ = 0, pending_ = 0;
  int n_evictions_ = 0;
  PruneReport last_;
};

}  // namespace depthkv
