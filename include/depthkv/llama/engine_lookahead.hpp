#pragma once
/// @file llama/engine_lookahead.hpp
/// @brief The reference engine's side of the core scorers: one `TokenScorer` per layer of a
/// model, the lookahead observation (`depthkv::observe_lookahead`, lookahead.hpp) with this
/// engine's decode step, the model's greedy continuation of a context, and the NLL of a
/// context's last tokens measured during its prefill (`TailNll`, the signal of
/// `preset_trusts_input`).

#include <algorithm>
#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/lookahead.hpp"
#include "depthkv/metrics.hpp"
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

/// The mean NLL (nats) of a context's last `n` tokens under the model, taken from the prefill
/// that reads the context: `TailNll(engine, context, n, opt)` hooks `opt.capture` to keep the
/// last layer's output rows at positions [size - 1 - n, size - 1) (the rows that predict those
/// tokens); after `engine.prefill(context, 0, cache, opt)`, `nll()` applies the classifier to
/// them. n is clamped to size - 1 (the first token has no prediction). The hook replaces any
/// capture `opt` had; `opt` must outlive the prefill only, the TailNll the `nll()` call.
class TailNll {
 public:
  /// @throws Error on n < 1 or a context of fewer than 2 tokens
  TailNll(const LlamaEngine& engine, const std::vector<int>& context, int n, ForwardOptions& opt)
      : engine_(engine), context_(context) {
    DEPTHKV_CHECK(n >= 1, "context NLL: need n >= 1 tokens, got " << n);
    DEPTHKV_CHECK(context.size() >= 2, "context NLL: the context holds " << context.size() << " token(s), need 2");
    n = std::min(n, static_cast<int>(context.size()) - 1);
    first_ = static_cast<int>(context.size()) - 1 - n;
    rows_ = RowMatrix(n, engine.config().dim);
    const int last_layer = engine.config().n_layers - 1, first = first_;
    RowMatrix& rows = rows_;
    opt.capture_points = capture_bit(CapturePoint::kLayerOutput);
    opt.capture = [&rows, first, n, last_layer](int l, CapturePoint, std::int32_t p0, const RowMatrix& x) {
      if (l != last_layer) return;
      for (Eigen::Index i = 0; i < x.rows(); ++i) {
        const long long p = p0 + i;
        if (p >= first && p < first + n) rows.row(static_cast<Eigen::Index>(p - first)) = x.row(i);
      }
    };
  }
  TailNll(const TailNll&) = delete;  // the hook refers to this object's rows
  TailNll& operator=(const TailNll&) = delete;

  /// The tokens measured.
  int n_tokens() const { return static_cast<int>(rows_.rows()); }
  /// The mean NLL of the measured tokens (after the prefill).
  double nll() const {
    const RowMatrix logits = engine_.logits(rows_, nullptr, first_);
    const std::vector<int> targets(context_.end() - rows_.rows(), context_.end());
    return compare_logits(logits, logits, targets).nll_full;
  }

 private:
  const LlamaEngine& engine_;
  const std::vector<int>& context_;
  int first_ = 0;
  RowMatrix rows_;
};

}  // namespace llama
}  // namespace depthkv
