#pragma once
/// @file llama/engine_lookahead.hpp
/// @brief The reference engine's side of the core scorers: one `TokenScorer` per layer of a
/// model, the lookahead observation (`depthkv::observe_lookahead`, lookahead.hpp) with this
/// engine's decode step, and the model's greedy continuation of a context.

#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/lookahead.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {
namespace llama {

/// One `TokenScorer` per layer of the model.
/// @throws Error on an invalid scorer configuration
inline std::vector<TokenScorer> make_scorers(const LlamaConfig& config, const ScorerConfig& scorer) {
  return depthkv::make_scorers(config.n_layers, scorer, config.n_heads, config.n_kv_heads);
}
using depthkv::make_scorers;

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

/// The model's greedy continuation: `n` tokens after a context held by `cache`, token 0 =
/// `first_token` (the argmax of the context's last logits), token i = the argmax of the logits
/// of one `forward` step of token i - 1 at position `pos0 + i - 1` (the lookahead's step, so its
/// G tokens are the first G of this). Runs on a copy of `cache` (`n - 1` steps).
/// @return the `n` tokens
/// @throws Error when `pos0 + n - 1` exceeds the model's context, or as `LlamaEngine::forward`
template <class Layer>
std::vector<int> greedy_continuation(const LlamaEngine& engine, KVCache<Layer> cache, int first_token, std::int32_t pos0,
                                     int n) {
  DEPTHKV_CHECK(n >= 0 && static_cast<long long>(pos0) + n <= engine.config().seq_len,
                "greedy continuation: " << n << " tokens after " << pos0 << " do not fit the model's context of "
                                        << engine.config().seq_len << " tokens");
  std::vector<int> out;
  int token = first_token;
  for (int i = 0; i < n; ++i) {
    out.push_back(token);
    if (i + 1 == n) break;
    const RowMatrix logits = engine.forward(&token, 1, pos0 + i, cache, ForwardOptions());
    Eigen::Index next = 0;
    logits.row(0).maxCoeff(&next);
    token = static_cast<int>(next);
  }
  return out;
}

}  // namespace llama
}  // namespace depthkv
