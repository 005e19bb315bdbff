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
class KeyNormRule : public KeyOnlyRule<KeyNormRule> {
 public:
  void score(int kv_head, const LayerReader& layer, std::vector<float>& s) const override {
    const int hd = layer.head_dim();
    for_key_blocks(layer, kv_head, static_cast<int>(s.size()), [&](int j0, int m, const float* k) {
      for (int j = 0; j < m; ++j) {
        const float* x = k + static_cast<std::ptrdiff_t>(j) * hd;
        float sq = 0.0f;
        for (int d = 0; d < hd; ++d) sq += x[d] * x[d];
        s[static_cast<std::size_t>(j0 + j)] = -std::sqrt(sq);
      }
    });
  }
};

}  // namespace depthkv
