#pragma once
/// @file scorers/key_norm.hpp
/// @brief `KeyNormRule`: the built-in scorer "knorm" (formula: token_scorer.hpp):
/// s_j = -||K_j||_2. Reads the layer's keys only: it observes nothing and keeps no state.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "depthkv/scoring_rule.hpp"

namespace depthkv {

/// Key-norm: a low key norm means an important token.
///
/// @code
/// depthkv::KeyNormRule rule;
/// @endcode
class KeyNormRule : public ScoringRule {
 public:
  std::unique_ptr<ScoringRule> clone() const override { return std::make_unique<KeyNormRule>(*this); }
  bool observes() const override { return false; }
  void reset() override {}
  void observe(const AttentionBlock&) override {}
  void compact(int, const std::int32_t*, int) override {}

  void score(int kv_head, const LayerReader& layer, std::vector<float>& s) const override {
    const int n = static_cast<int>(s.size()), hd = layer.head_dim();
    constexpr int kBlock = 64;  // key rows read per call
    std::vector<float> k(static_cast<std::size_t>(kBlock) * static_cast<std::size_t>(hd));
    for (int j0 = 0; j0 < n; j0 += kBlock) {
      const int m = std::min(kBlock, n - j0);
      layer.keys(kv_head, j0, m, k.data());
      for (int j = 0; j < m; ++j) {
        const float* x = k.data() + static_cast<std::ptrdiff_t>(j) * hd;
        float sq = 0.0f;
        for (int d = 0; d < hd; ++d) sq += x[d] * x[d];
        s[static_cast<std::size_t>(j0 + j)] = -std::sqrt(sq);
      }
    }
  }
};

}  // namespace depthkv
