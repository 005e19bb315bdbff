#pragma once
/// @file selection.hpp
/// @brief The vocabulary shared by token scoring and eviction: `LayerScores` (one score per slot
/// and KV head) and `Protection` (sink and recent tokens that eviction always keeps).
///
/// A scorer produces `LayerScores` for a layer; the evictor keeps, in every KV head h, the
/// protected slots plus the highest-scoring remaining slots up to the head's budget.
///
/// @code
/// depthkv::LayerScores s = scorer.scores(layer);                 // s[kv_head][slot]
/// depthkv::Protection prot{/*n_sink=*/4, /*n_recent=*/32};
/// depthkv::evict_layer(layer, s, keep_per_head, prot);
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace depthkv {

/// Tokens that eviction always keeps: the first `n_sink` slots (attention sinks) and the last
/// `n_recent` slots of each KV head. They count inside the keep budget.
struct Protection {
  int n_sink = 0;
  int n_recent = 0;
};

/// Scores of one layer: scores[h][slot], one row per KV head, row length == layer.size(h).
/// A higher score means a more important token.
using LayerScores = std::vector<std::vector<float>>;

/// r[j] = rank(j) / n: the rank of v[j] among the n scores, ascending by (score, index), so ties
/// rank the later index higher; NaN scores rank lowest. Scores on different scales become
/// comparable (several rules, heads or layers averaged into one keep order).
inline std::vector<float> rank_fractions(const std::vector<float>& v) {
  const std::size_t n = v.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&v](std::size_t x, std::size_t y) {
    const bool nx = std::isnan(v[x]), ny = std::isnan(v[y]);
    if (nx || ny) return nx && !ny;
    return v[x] < v[y];
  });
  std::vector<float> r(n);
  for (std::size_t i = 0; i < n; ++i) r[order[i]] = static_cast<float>(i) / static_cast<float>(n);
  return r;
}

}  // namespace depthkv
