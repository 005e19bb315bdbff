#pragma once
/// @file scorers/key_diff.hpp
/// @brief `KeyDiffRule`: the built-in scorer "keydiff" (formula: token_scorer.hpp):
/// s_j = -cos(K_j, a), a = mean_t K_t / ||K_t|| over the KV head's slots. Reads the layer's keys
/// only: it observes nothing and keeps no state.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "depthkv/scoring_rule.hpp"

namespace depthkv {

/// KeyDiff: a key far in direction from the head's mean key direction means a distinctive,
/// important token. Norms below 1e-12 count as 1e-12 in the mean, a cosine's denominator is at
/// least 1e-8 (torch's `F.normalize` and `F.cosine_similarity`, as kvpress's KeyDiffPress).
///
/// @code
/// depthkv::KeyDiffRule rule;
/// @endcode
class KeyDiffRule : public KeyOnlyRule<KeyDiffRule> {
 public:
  void score(int kv_head, const LayerReader& layer, std::vector<float>& s) const override {
    const int n = static_cast<int>(s.size()), hd = layer.head_dim();
    if (n == 0) return;
    std::vector<double> anchor(static_cast<std::size_t>(hd), 0.0);
    for_key_blocks(layer, kv_head, n, [&](int, int m, const float* k) {  // the mean of the unit keys
      for (int j = 0; j < m; ++j) {
        const float* x = k + static_cast<std::ptrdiff_t>(j) * hd;
        const double inv = 1.0 / std::max(norm(x, hd), 1e-12);
        for (int d = 0; d < hd; ++d) anchor[static_cast<std::size_t>(d)] += x[d] * inv;
      }
    });
    double an = 0.0;
    for (double& a : anchor) {
      a /= n;
      an += a * a;
    }
    an = std::sqrt(an);
    for_key_blocks(layer, kv_head, n, [&](int j0, int m, const float* k) {
      for (int j = 0; j < m; ++j) {
        const float* x = k + static_cast<std::ptrdiff_t>(j) * hd;
        double dot = 0.0;
        for (int d = 0; d < hd; ++d) dot += x[d] * anchor[static_cast<std::size_t>(d)];
        s[static_cast<std::size_t>(j0 + j)] = static_cast<float>(-dot / std::max(norm(x, hd) * an, 1e-8));
      }
    });
  }

 private:
  static double norm(const float* x, int hd) {
    double sq = 0.0;
    for (int d = 0; d < hd; ++d) sq += static_cast<double>(x[d]) * x[d];
    return std::sqrt(sq);
  }
};

}  // namespace depthkv
