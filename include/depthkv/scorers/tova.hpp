#pragma once
/// @file scorers/tova.hpp
/// @brief `TOVARule`: the built-in scorer "tova" (formula: token_scorer.hpp): the attention of
/// the last observed query position, summed over the group's query heads. State: per KV head,
/// the row of that position.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "depthkv/detail/attention_ring.hpp"
#include "depthkv/scoring_rule.hpp"

namespace depthkv {

/// TOVA: the last query's attention.
///
/// @code
/// depthkv::TOVARule rule(/*n_kv_heads=*/8);
/// @endcode
class TOVARule : public ScoringRule {
 public:
  /// @param n_kv_heads KV heads of the layer (>= 1)
  explicit TOVARule(int n_kv_heads) : rings_(static_cast<std::size_t>(n_kv_heads), detail::AttentionRing(1)) {}

  std::unique_ptr<ScoringRule> clone() const override { return std::make_unique<TOVARule>(*this); }
  int positions_needed() const override { return 1; }
  bool allows_output_aware() const override { return true; }
  void reset() override {
    for (detail::AttentionRing& r : rings_) r.clear();
  }
  void observe(const AttentionBlock& b) override { detail::add_block(rings_[static_cast<std::size_t>(b.kv_head)], b); }
  void compact(int kv_head, const std::int32_t* kept, int n_kept) override {
    rings_[static_cast<std::size_t>(kv_head)].compact(kept, n_kept);
  }
  void score(int kv_head, const LayerReader&, std::vector<float>& s) const override {
    rings_[static_cast<std::size_t>(kv_head)].sum_into(s);
  }

 private:
  std::vector<detail::AttentionRing> rings_;  // [kv]
};

}  // namespace depthkv
