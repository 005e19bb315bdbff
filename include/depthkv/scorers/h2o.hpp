#pragma once
/// @file scorers/h2o.hpp
/// @brief `H2ORule`: the built-in scorers "h2o", "h2o-v1" and "h2o-v2" (formulas:
/// token_scorer.hpp): cumulative attention s_j = sum_i a_ij, optionally times ||V_j||_1 or
/// ||V_j||_2. State: one float per slot and KV head (the sum over the group's query heads and
/// every observed row, added in arrival order).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "depthkv/scoring_rule.hpp"

namespace depthkv {

/// Cumulative attention (H2O), plain or value-aware.
///
/// @code
/// depthkv::H2ORule rule(depthkv::H2ORule::ValueNorm::kL2, /*n_kv_heads=*/8);   // "h2o-v2"
/// @endcode
class H2ORule : public ScoringRule {
 public:
  /// The value-norm factor: none ("h2o"), ||V_j||_1 ("h2o-v1"), ||V_j||_2 ("h2o-v2").
  enum class ValueNorm { kNone, kL1, kL2 };

  /// @param norm the value-norm factor
  /// @param n_kv_heads KV heads of the layer (>= 1)
  H2ORule(ValueNorm norm, int n_kv_heads) : norm_(norm), acc_(static_cast<std::size_t>(n_kv_heads)) {}

  std::unique_ptr<ScoringRule> clone() const override { return std::make_unique<H2ORule>(*this); }
  bool allows_output_aware() const override { return norm_ == ValueNorm::kNone; }
  void reset() override { acc_.assign(acc_.size(), {}); }

  void observe(const AttentionBlock& b) override {
    std::vector<float>& a = acc_[static_cast<std::size_t>(b.kv_head)];
    if (static_cast<int>(a.size()) < b.n) a.resize(static_cast<std::size_t>(b.n), 0.0f);
    float* ad = a.data();
    for (int r = 0; r < b.n_queries; ++r) {
      const float* row = b.row(r);
      for (int j = 0; j < b.n; ++j) ad[j] += row[j];
    }
  }

  void compact(int kv_head, const std::int32_t* kept, int n_kept) override {
    keep_slots(acc_[static_cast<std::size_t>(kv_head)], kept, n_kept);
  }

  void score(int kv_head, const LayerReader& layer, std::vector<float>& s) const override {
    const std::vector<float>& a = acc_[static_cast<std::size_t>(kv_head)];
    std::copy(a.begin(), a.end(), s.begin());
    if (norm_ == ValueNorm::kNone) return;
    const bool l1 = norm_ == ValueNorm::kL1;
    const int n = static_cast<int>(s.size()), hd = layer.head_dim();
    constexpr int kBlock = 64;  // value rows read per call
    std::vector<float> v(static_cast<std::size_t>(kBlock) * static_cast<std::size_t>(hd));
    for (int j0 = 0; j0 < n; j0 += kBlock) {
      const int m = std::min(kBlock, n - j0);
      layer.values(kv_head, j0, m, v.data());
      for (int j = 0; j < m; ++j) {
        const float* x = v.data() + static_cast<std::ptrdiff_t>(j) * hd;
        float norm = 0.0f;
        for (int d = 0; d < hd; ++d) norm += l1 ? std::fabs(x[d]) : x[d] * x[d];
        s[static_cast<std::size_t>(j0 + j)] *= l1 ? norm : std::sqrt(norm);
      }
    }
  }

 private:
  ValueNorm norm_;
  std::vector<std::vector<float>> acc_;  // [kv][slot]
};

}  // namespace depthkv
