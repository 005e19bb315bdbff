#pragma once
/// @file lookahead.hpp
/// @brief Lookahead observation (`ScorerConfig::lookahead`), engine-neutral: the scorers observe
/// the attention of the model's own next G greedy tokens after the context instead of the
/// context's queries; then the G tokens are removed again (Eigen only; the engine is a step
/// function).
///
/// ## The loop
/// With G = the largest lookahead of the scorer sets, the first token `first_token` (the argmax
/// of the context's last logits) at position `pos0` (the context's next position):
/// 1. for g = 0 .. G-1: `token = step(token, pos0 + g, observer)` runs one decode step on the full
///    cache (appending one slot to every head) and returns the argmax of its logits; the
///    observer feeds set k's scorers (`sets[k][layer]`, `TokenScorer::observe_block`) while
///    g < G_k, the set's own lookahead;
/// 2. the G appended slots are removed from every head (a prefix compaction, which moves nothing);
/// 3. every scorer keeps the state of the context's slots only (`TokenScorer::compact` with the
///    first `size(h)` slots),
/// so that `layer_scores(sets[k], cache, ...)` scores the context as it was. Before step 1 every
/// scorer is told that the lookahead's rows begin (`TokenScorer::begin_lookahead`): a scorer with
/// `ScorerConfig::context_weight` > 0 keeps the context's rows it observed during the prefill
/// apart from the lookahead's and adds their window score (token_scorer.hpp). Cost: G decode steps
/// over the full cache; the cache holds G more tokens per head meanwhile.
///
/// ## Errors
/// A set whose lookahead is 0 or differs across its layers, a scorer count other than the
/// layers, or `pos0 + G > max_positions` (positions the model was not trained for) throw
/// `depthkv::Error` before any step. An exception from `step` is rethrown after the cache is
/// restored to the context (the scorers are reset then).
///
/// @code
/// depthkv::observe_lookahead(cache, first_token, n_ctx, {&scorers}, seq_len,
///     [&](int token, std::int32_t pos, const depthkv::AttentionObserver& obs) {
///       return argmax(my_engine.decode(token, pos, cache, obs));   // one step, observed
///     });
/// @endcode

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {

/// One greedy decode step of the lookahead: feeds `token` at position `pos` on the cache (one
/// slot appended to every head), calls `observer` with the step's attention rows, and returns
/// the argmax of the step's logits (the next token).
using LookaheadStep = std::function<int(int token, std::int32_t pos, const AttentionObserver& observer)>;

namespace detail {

/// G = the largest lookahead of `sets` (each set: one scorer per layer, one lookahead >= 1).
inline int lookahead_tokens(const std::vector<std::vector<TokenScorer>*>& sets, int n_layers) {
  int G = 0;
  for (const std::vector<TokenScorer>* set : sets) {
    DEPTHKV_CHECK(set != nullptr && static_cast<int>(set->size()) == n_layers,
                  "lookahead: " << (set ? set->size() : 0) << " scorers for " << n_layers << " layers");
    const int g = set->empty() ? 0 : set->front().config().lookahead;
    DEPTHKV_CHECK(g >= 1, "lookahead: a scorer set without lookahead");
    for (const TokenScorer& s : *set)
      DEPTHKV_CHECK(s.config().lookahead == g, "lookahead: scorers of one set differ (" << g << ", "
                                                                                      << s.config().lookahead << ")");
    G = std::max(G, g);
  }
  return G;
}

/// Compacts every head of `layer` (or its scorer) to its first `n[h]` slots.
template <class Compact>
void keep_prefix(int n_heads, const std::vector<int>& n, Compact&& compact) {
  std::vector<std::int32_t> prefix;
  for (int h = 0; h < n_heads; ++h) {
    const int k = n[static_cast<std::size_t>(h)];
    prefix.resize(static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) prefix[static_cast<std::size_t>(i)] = i;
    compact(h, prefix.data(), k);
  }
}

/// Removes what was appended to `cache` since its heads held `sizes[l][h]` slots.
template <class Layer>
void restore_sizes(KVCache<Layer>& cache, const std::vector<std::vector<int>>& sizes) {
  for (int l = 0; l < cache.n_layers(); ++l) {
    auto& layer = cache.layer(l);
    const std::vector<int>& n = sizes[static_cast<std::size_t>(l)];
    keep_prefix(layer.n_kv_heads(), n, [&](int h, const std::int32_t* slots, int k) {
      if (layer.size(h) != k) layer.compact(h, slots, k);
    });
  }
}

}  // namespace detail

/// Lookahead observation (see the file comment).
/// @param cache the cache holding the context (the G steps append to it; restored on return)
/// @param first_token the first greedy token (argmax of the context's last logits)
/// @param pos0 its position (the context's length)
/// @param sets scorer sets, one scorer per layer each, every scorer of a set with the same lookahead
/// @param max_positions the model's context: pos0 + G must not exceed it
/// @param step one observed greedy decode step (`LookaheadStep`)
/// @throws Error on an invalid set or a lookahead beyond `max_positions` (nothing changed), or
///   what `step` throws (the cache holds the context again, the scorers are reset)
template <class Layer>
void observe_lookahead(KVCache<Layer>& cache, int first_token, std::int32_t pos0,
                       const std::vector<std::vector<TokenScorer>*>& sets, int max_positions, const LookaheadStep& step) {
  const int L = cache.n_layers();
  const int G = detail::lookahead_tokens(sets, L);
  DEPTHKV_CHECK(static_cast<long long>(pos0) + G <= max_positions,
                "lookahead: " << G << " greedy tokens after a context of " << pos0
                              << " tokens do not fit the model's context of " << max_positions << " tokens (at most "
                              << std::max<long long>(0, static_cast<long long>(max_positions) - pos0) << " here)");
  std::vector<std::vector<int>> sizes(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < cache.layer(l).n_kv_heads(); ++h) sizes[static_cast<std::size_t>(l)].push_back(cache.layer(l).size(h));
  int g = 0;
  const AttentionObserver observer = [&sets, &g](int layer, int q_head, std::int32_t q_pos0, int n_queries,
                                                 const float* probs, int ld, int n) {
    for (std::vector<TokenScorer>* set : sets)
      if (g < set->front().config().lookahead)
        (*set)[static_cast<std::size_t>(layer)].observe_block(q_head, q_pos0, n_queries, probs, ld, n);
  };
  for (std::vector<TokenScorer>* set : sets)
    for (TokenScorer& s : *set) s.begin_lookahead();
  try {
    int token = first_token;
    for (g = 0; g < G; ++g) token = step(token, pos0 + g, observer);
  } catch (...) {
    detail::restore_sizes(cache, sizes);
    for (std::vector<TokenScorer>* set : sets)
      for (TokenScorer& s : *set) s.reset();
    throw;
  }
  detail::restore_sizes(cache, sizes);
  for (std::vector<TokenScorer>* set : sets)
    for (int l = 0; l < L; ++l) {
      TokenScorer& s = (*set)[static_cast<std::size_t>(l)];
      const int H = cache.layer(l).n_kv_heads();
      std::vector<int> n(static_cast<std::size_t>(H));
      for (int h = 0; h < H; ++h) n[static_cast<std::size_t>(h)] = std::min(s.observed_size(h), cache.layer(l).size(h));
      detail::keep_prefix(H, n, [&s](int h, const std::int32_t* slots, int k) { s.compact(h, slots, k); });
    }
}

}  // namespace depthkv
