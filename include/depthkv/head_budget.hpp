#pragma once
/// @file head_budget.hpp
/// @brief Splitting one layer's budget across its KV heads: uniform (every head keeps the same
/// count) or adaptive (AdaKV: the best tokens of all heads jointly, with a per-head floor).
/// `head_budgets` returns the per-head keep counts that `evict_layer` / `evict` take.
///
/// ## Definitions
/// A layer with H KV heads, head h holding n_h tokens, gets the budget `keep` tokens per head
/// (what `BudgetAllocator` gives every head of the layer), i.e. the layer total
///     T = sum_h min(keep, n_h).
/// p_h = protected_count(n_h, n_sink, n_recent) (the first n_sink and the last n_recent slots,
/// `Protection`; they count inside every head's budget, as in the evictor).
/// - `kUniform`: k_h = min(keep, n_h).
/// - `kAdaptive` (AdaKV, Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive
///   Budget Allocation for Efficient LLM Inference", arXiv 2407.11550; kvpress's AdaKVPress):
///   every head first gets its floor f_h = min(n_h, max(p_h, floor(alpha * keep))): its
///   protected slots plus its f_h - p_h best unprotected slots. The remaining T - sum_h f_h
///   tokens are the best of all heads' other unprotected slots taken together, and
///   k_h = f_h + (how many of those are head h's). "Best" is the evictor's order (score
///   descending, then position ascending; across heads, at equal score and position the lower
///   head wins), so `evict_layer(layer, scores, k, prot)` keeps exactly the tokens chosen here.
///   alpha = 1 gives the uniform split; alpha = 0 no floor beyond the protection.
///   kvpress's `alpha_safeguard` default is 0.2 (`kDefaultHeadAlpha`).
/// In both modes sum_h k_h == T exactly and p_h <= k_h <= n_h (or k_h = n_h when n_h <= keep).
/// Scores are compared across heads as they are: attention-based scores of a layer share one
/// scale (each query row sums to 1 over the slots).
///
/// ## Cost
/// O(sum_h n_h): per head one selection of its floor, then one selection over the pooled
/// candidates (detail/radix_select.hpp, the evictor's selection).
///
/// @code
/// depthkv::LayerScores s = scorer.scores(layer);
/// std::vector<int> k = depthkv::head_budgets(depthkv::HeadAllocation::kAdaptive, layer, s,
///                                            /*keep=*/budget[l], prot);   // alpha 0.2
/// depthkv::evict_layer(layer, s, k, prot);
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "depthkv/detail/radix_select.hpp"
#include "depthkv/detail/select_common.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/selection.hpp"

namespace depthkv {

/// How a layer's budget is split across its KV heads (head_budget.hpp).
enum class HeadAllocation { kUniform, kAdaptive };

/// AdaKV's per-head floor fraction (kvpress `AdaKVPress.alpha_safeguard`).
constexpr double kDefaultHeadAlpha = 0.2;

/// "uniform" or "adaptive".
inline std::string to_string(HeadAllocation a) { return a == HeadAllocation::kAdaptive ? "adaptive" : "uniform"; }

/// Inverse of `to_string(HeadAllocation)`.
/// @throws Error on another name
inline HeadAllocation parse_head_allocation(const std::string& name) {
  if (name == "uniform") return HeadAllocation::kUniform;
  if (name == "adaptive") return HeadAllocation::kAdaptive;
  DEPTHKV_FAIL("unknown head allocation '" << name << "' (expected uniform or adaptive)");
}

/// Per-head keep counts of one layer (file comment).
/// @param scores scores[h][slot] (n_h = scores[h].size(); no NaN)
/// @param positions positions[h]: n_h positions of head h's slots (ties: earlier stays), or an
///   empty vector for the slot order
/// @param keep tokens per head (>= 0; >= every head's protected count unless it holds <= keep)
/// @param alpha the adaptive floor fraction, in [0, 1] (ignored by kUniform)
/// @return k[h], summing to sum_h min(keep, n_h)
/// @throws Error on no heads, a negative keep, a keep below a head's protected count, negative
///   protection, alpha outside [0, 1] or NaN, a positions vector of the wrong size, or a NaN
///   score (naming the head and slot)
inline std::vector<int> head_budgets(HeadAllocation mode, const LayerScores& scores,
                                     const std::vector<const std::int32_t*>& positions, int keep, Protection prot,
                                     double alpha = kDefaultHeadAlpha) {
  const int H = static_cast<int>(scores.size());
  DEPTHKV_CHECK(H >= 1, "no heads");
  DEPTHKV_CHECK(keep >= 0, "keep must be >= 0, got " << keep);
  DEPTHKV_CHECK(prot.n_sink >= 0 && prot.n_recent >= 0,
                "protection must be >= 0, got n_sink " << prot.n_sink << ", n_recent " << prot.n_recent);
  DEPTHKV_CHECK(alpha >= 0.0 && alpha <= 1.0, "alpha " << alpha << " outside [0, 1]");  // false for NaN
  DEPTHKV_CHECK(positions.empty() || static_cast<int>(positions.size()) == H,
                "" << positions.size() << " position rows for " << H << " heads");
  std::vector<int> k(static_cast<std::size_t>(H));
  for (int h = 0; h < H; ++h) {
    const int n = static_cast<int>(scores[static_cast<std::size_t>(h)].size());
    const int p = detail::protected_count(n, prot.n_sink, prot.n_recent);
    DEPTHKV_CHECK(keep >= n || keep >= p,
                  "head " << h << ": keep " << keep << " < " << p << " protected tokens (of " << n << ")");
    const int bad = [&] {  // bit test: safe under -ffast-math
      const std::vector<float>& s = scores[static_cast<std::size_t>(h)];
      for (int j = 0; j < n; ++j)
        if ((detail::float_bits(s[static_cast<std::size_t>(j)]) & 0x7FFFFFFFu) > 0x7F800000u) return j;
      return -1;
    }();
    DEPTHKV_CHECK(bad < 0, "head " << h << ": NaN score at slot " << bad);
    k[static_cast<std::size_t>(h)] = std::min(keep, n);
  }
  if (mode == HeadAllocation::kUniform) return k;

  const int floor_n = static_cast<int>(std::floor(alpha * static_cast<double>(keep)));
  long long remaining = 0;
  std::vector<float> pool_scores;      // the candidates of every head, head by head
  std::vector<std::int32_t> pool_pos;  // their positions
  std::vector<int> pool_head;          // their head
  detail::SelectWorkspace ws;
  std::vector<std::int32_t> chosen;
  for (int h = 0; h < H; ++h) {
    const std::vector<float>& s = scores[static_cast<std::size_t>(h)];
    const int n = static_cast<int>(s.size());
    const std::int32_t* pos = positions.empty() ? nullptr : positions[static_cast<std::size_t>(h)];
    DEPTHKV_CHECK(n == 0 || positions.empty() || pos != nullptr, "head " << h << ": null positions");
    const int p = detail::protected_count(n, prot.n_sink, prot.n_recent);
    const int f = std::min(n, std::max(p, floor_n));
    remaining += k[static_cast<std::size_t>(h)] - f;
    k[static_cast<std::size_t>(h)] = f;
    if (f >= n) continue;
    // the unprotected slots are [lo, hi); the floor takes their f - p best, the rest compete
    const int lo = std::min(prot.n_sink, n);
    const int hi = std::max(lo, n - std::min(prot.n_recent, n));
    chosen.clear();
    detail::select_best(detail::FloatKeys{s.data()}, pos, lo, hi, f - p, ws, chosen);
    std::size_t c = 0;
    for (int j = lo; j < hi; ++j) {
      if (c < chosen.size() && chosen[c] == j) {
        ++c;
        continue;
      }
      pool_scores.push_back(s[static_cast<std::size_t>(j)]);
      pool_pos.push_back(pos ? pos[j] : j);
      pool_head.push_back(h);
    }
  }
  chosen.clear();
  const int n_pool = static_cast<int>(pool_scores.size());
  detail::select_best(detail::FloatKeys{pool_scores.data()}, pool_pos.data(), 0, n_pool,
                      static_cast<int>(std::min<long long>(remaining, n_pool)), ws, chosen);
  for (std::int32_t i : chosen) ++k[static_cast<std::size_t>(pool_head[static_cast<std::size_t>(i)])];
  return k;
}

/// `head_budgets` for a layer's heads (the positions are the layer's).
/// @throws Error as `head_budgets`, and when the scores' shape differs from the layer's
template <class Layer>
std::vector<int> head_budgets(HeadAllocation mode, const Layer& layer, const LayerScores& scores, int keep,
                              Protection prot, double alpha = kDefaultHeadAlpha) {
  DEPTHKV_CHECK(static_cast<int>(scores.size()) == layer.n_kv_heads(),
                "scores have " << scores.size() << " heads, layer " << layer.n_kv_heads());
  std::vector<const std::int32_t*> pos(static_cast<std::size_t>(layer.n_kv_heads()));
  for (int h = 0; h < layer.n_kv_heads(); ++h) {
    DEPTHKV_CHECK(static_cast<int>(scores[static_cast<std::size_t>(h)].size()) == layer.size(h),
                  "head " << h << ": " << scores[static_cast<std::size_t>(h)].size() << " scores for "
                                        << layer.size(h) << " tokens");
    pos[static_cast<std::size_t>(h)] = layer.positions(h);
  }
  return head_budgets(mode, scores, pos, keep, prot, alpha);
}

/// `head_budgets` for every layer of a cache: layer l's heads split `keep_per_layer[l]`; the
/// result is what the per-head `evict(cache, scores, keep_per_head, prot)` takes.
/// @throws Error as `head_budgets` (naming the layer), or when the layer counts differ
template <class Layer>
std::vector<std::vector<int>> head_budgets(HeadAllocation mode, const KVCache<Layer>& cache,
                                           const std::vector<LayerScores>& scores,
                                           const std::vector<int>& keep_per_layer, Protection prot,
                                           double alpha = kDefaultHeadAlpha) {
  DEPTHKV_CHECK(static_cast<int>(scores.size()) == cache.n_layers(),
                "scores have " << scores.size() << " layers, cache " << cache.n_layers());
  DEPTHKV_CHECK(static_cast<int>(keep_per_layer.size()) == cache.n_layers(),
                "keep has " << keep_per_layer.size() << " layers, cache " << cache.n_layers());
  std::vector<std::vector<int>> out(keep_per_layer.size());
  for (int l = 0; l < cache.n_layers(); ++l) {
    try {
      out[static_cast<std::size_t>(l)] = head_budgets(mode, cache.layer(l), scores[static_cast<std::size_t>(l)],
                                                      keep_per_layer[static_cast<std::size_t>(l)], prot, alpha);
    } catch (const Error& e) {
      const std::string prefix = "head_budgets: ";
      std::string m = e.message();
      if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
      throw Error(prefix + "layer " + std::to_string(l) + ": " + m);
    }
  }
  return out;
}

}  // namespace depthkv
