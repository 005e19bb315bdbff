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

}  // namespace depthkv
