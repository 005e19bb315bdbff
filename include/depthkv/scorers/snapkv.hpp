#pragma once
/// @file scorers/snapkv.hpp
/// @brief `SnapKVRule`: the built-in scorer "snapkv" (formula: token_scorer.hpp): the summed
/// attention of the last `window` observed query positions (the lookahead positions with
/// lookahead > 0), pooled along the slots. State: per KV head, the rows of those positions.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "depthkv/detail/attention_ring.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/scoring_rule.hpp"

namespace depthkv {

/// SnapKV observation window with pooling.
///
/// @code
/// depthkv::ScorerConfig cfg;
/// cfg.kind = depthkv::ScorerKind::kSnapKV;
/// depthkv::SnapKVRule rule(cfg, /*n_kv_heads=*/8);
/// @endcode
class SnapKVRule : public ScoringRule {
 public:
  /// @param cfg `window`, `kernel`, `pooling` and `lookahead` (validated by `TokenScorer`)
  /// @param n_kv_heads KV heads of the layer (>= 1)
  SnapKVRule(const ScorerConfig& cfg, int n_kv_heads)
      : kernel_(cfg.kernel),
        pooling_(cfg.pooling),
        rings_(static_cast<std::size_t>(n_kv_heads),
               detail::AttentionRing(cfg.lookahead > 0 ? cfg.lookahead : cfg.window)) {}

  std::unique_ptr<ScoringRule> clone() const override { return std::make_unique<SnapKVRule>(*this); }
  bool allows_output_aware() const override { return true; }
  int positions_needed() const override { return rings_.front().capacity(); }
  void reset() override {
    for (detail::AttentionRing& r : rings_) r.clear();
  }
  void observe(const AttentionBlock& b) override { detail::add_block(rings_[static_cast<std::size_t>(b.kv_head)], b); }
  void compact(int kv_head, const std::int32_t* kept, int n_kept) override {
    rings_[static_cast<std::size_t>(kv_head)].compact(kept, n_kept);
  }
  void score(int kv_head, const LayerReader&, std::vector<float>& s) const override {
    rings_[static_cast<std::size_t>(kv_head)].sum_into(s);
    pool(s, kernel_, pooling_);
  }

  /// 1-D pooling along the slots, same-size output, padding kernel / 2 (max: the window clipped
  /// at the edges; avg: the window sum divided by `kernel`; none or kernel 1: unchanged).
  static void pool(std::vector<float>& s, int kernel, Pooling pooling) {
    if (pooling == Pooling::kNone || kernel == 1 || s.empty()) return;
    const int n = static_cast<int>(s.size());
    const int r = kernel / 2;
    const std::vector<float> u(s);
    for (int j = 0; j < n; ++j) {
      const int lo = std::max(0, j - r), hi = std::min(n - 1, j + r);
      if (pooling == Pooling::kMax) {
        float m = u[static_cast<std::size_t>(lo)];
        for (int t = lo + 1; t <= hi; ++t) m = std::max(m, u[static_cast<std::size_t>(t)]);
        s[static_cast<std::size_t>(j)] = m;
      } else {
        float sum = 0.0f;
        for (int t = lo; t <= hi; ++t) sum += u[static_cast<std::size_t>(t)];
        s[static_cast<std::size_t>(j)] = sum / static_cast<float>(kernel);
      }
    }
  }

 private:
  int kernel_;
  Pooling pooling_;
  std::vector<detail::AttentionRing> rings_;  // [kv]
};

}  // namespace depthkv
