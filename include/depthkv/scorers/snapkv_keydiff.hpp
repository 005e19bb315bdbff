#pragma once
/// @file scorers/snapkv_keydiff.hpp
/// @brief `SnapKVKeyDiffRule`: the built-in scorer "snapkv-keydiff" (formula: token_scorer.hpp):
/// each slot's score is the larger of its rank fractions under SnapKV (the attention of the
/// observation window, pooled) and KeyDiff (the distance of its key from the head's mean key
/// direction). A top-k of these scores keeps the slots ranked high by either rule, about k/2 of
/// each: the attention of the context's end, and the distinctive keys the end does not attend to
/// (a needle in a haystack, when the question comes after the pruning). State: SnapKV's.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "depthkv/scorer_config.hpp"
#include "depthkv/scorers/key_diff.hpp"
#include "depthkv/scorers/snapkv.hpp"
#include "depthkv/scoring_rule.hpp"
#include "depthkv/selection.hpp"

namespace depthkv {

/// SnapKV and KeyDiff by rank (see the file comment).
///
/// @code
/// depthkv::ScorerConfig cfg;
/// cfg.kind = depthkv::ScorerKind::kSnapKVKeyDiff;
/// depthkv::SnapKVKeyDiffRule rule(cfg, /*n_kv_heads=*/8);
/// @endcode
class SnapKVKeyDiffRule : public ScoringRule {
 public:
  /// @param cfg SnapKV's `window`, `kernel`, `pooling` and `lookahead` (validated by `TokenScorer`)
  /// @param n_kv_heads KV heads of the layer (>= 1)
  SnapKVKeyDiffRule(const ScorerConfig& cfg, int n_kv_heads) : snap_(cfg, n_kv_heads) {}

  std::unique_ptr<ScoringRule> clone() const override { return std::make_unique<SnapKVKeyDiffRule>(*this); }
  int positions_needed() const override { return snap_.positions_needed(); }
  void reset() override { snap_.reset(); }
  void observe(const AttentionBlock& b) override { snap_.observe(b); }
  void compact(int kv_head, const std::int32_t* kept, int n_kept) override { snap_.compact(kv_head, kept, n_kept); }

  /// s_j = max(rank_snapkv(j), rank_keydiff(j)) / n: rank r in [0, n) of slot j among the head's n
  /// slots in ascending score order (ties by slot: the later slot ranks higher). A NaN score
  /// under either rule stays NaN (the evictor refuses it).
  void score(int kv_head, const LayerReader& layer, std::vector<float>& s) const override {
    const std::size_t n = s.size();
    std::vector<float> a(n, 0.0f), b(n, 0.0f);
    snap_.score(kv_head, layer, a);
    key_diff_.score(kv_head, layer, b);
    const std::vector<float> ra = rank_fractions(a), rb = rank_fractions(b);
    for (std::size_t j = 0; j < n; ++j)
      s[j] = std::isnan(a[j]) || std::isnan(b[j]) ? a[j] + b[j] : std::max(ra[j], rb[j]);
  }

 private:
  SnapKVRule snap_;
  KeyDiffRule key_diff_;
};

}  // namespace depthkv
