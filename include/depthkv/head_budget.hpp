#pragma once
/// @file head_budget.hpp
/// @brief Splitting one layer's budget across its KV heads: uniform (every head keeps the same
/// count) or adaptive (AdaKV: the best tokens of all heads jointly, with a per-head floor);
/// and head-level curve-optimal budgets over all (layer, KV head) pairs from measured head
/// curves (LU-KV, `head_optimal_budgets`). `head_budgets` returns the per-head keep counts that
/// `evict_layer` / `evict` take.
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
/// The per-head form takes a starting budget keep_h per head instead of one `keep`
/// (T = sum_h min(keep_h, n_h), f_h from alpha * keep_h).
///
/// ## Head-level optimal (`head_optimal_budgets`)
/// Unit u = l * H + h is (layer l, KV head h), with the curve g_u(r) = loss when only that head
/// keeps the fraction r (`SensitivityProfiler` over L * H units, e.g.
/// `llama::PruningEvaluator::head_function`). The budgets minimise sum_u hull(g_u)(b_u / n_u)
/// under sum_u b_u = H * B, exactly as `AllocationPolicy::kOptimal` does over layers.
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

#include "depthkv/budget_allocator.hpp"
#include "depthkv/detail/radix_select.hpp"
#include "depthkv/detail/select_common.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/selection.hpp"
#include "depthkv/sensitivity_profile.hpp"

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

namespace detail {

/// @return the first slot of `s` holding a NaN, or -1 (a bit test: safe under -ffast-math)
inline int first_nan_slot(const std::vector<float>& s) {
  const int n = static_cast<int>(s.size());
  for (int j = 0; j < n; ++j)
    if ((float_bits(s[static_cast<std::size_t>(j)]) & 0x7FFFFFFFu) > 0x7F800000u) return j;
  return -1;
}

/// Validates `head_budgets`' per-head arguments (same meaning as there).
/// @return the uniform split: k[h] = min(keep[h], n_h)
/// @throws Error as `head_budgets` does, except for null positions (checked by the adaptive split)
inline std::vector<int> uniform_head_budgets(const LayerScores& scores,
                                             const std::vector<const std::int32_t*>& positions,
                                             const std::vector<int>& keep, Protection prot, double alpha) {
  const int H = static_cast<int>(scores.size());
  DEPTHKV_CHECK_AS("head_budgets", H >= 1, "no heads");
  DEPTHKV_CHECK_AS("head_budgets", static_cast<int>(keep.size()) == H, "" << keep.size() << " head budgets for " << H << " heads");
  DEPTHKV_CHECK_AS("head_budgets", prot.n_sink >= 0 && prot.n_recent >= 0,
                "protection must be >= 0, got n_sink " << prot.n_sink << ", n_recent " << prot.n_recent);
  DEPTHKV_CHECK_AS("head_budgets", alpha >= 0.0 && alpha <= 1.0, "alpha " << alpha << " outside [0, 1]");  // false for NaN
  DEPTHKV_CHECK_AS("head_budgets", positions.empty() || static_cast<int>(positions.size()) == H,
                "" << positions.size() << " position rows for " << H << " heads");
  std::vector<int> k(static_cast<std::size_t>(H));
  for (int h = 0; h < H; ++h) {
    const int n = static_cast<int>(scores[static_cast<std::size_t>(h)].size());
    const int kh = keep[static_cast<std::size_t>(h)];
    DEPTHKV_CHECK_AS("head_budgets", kh >= 0, "head " << h << ": keep must be >= 0, got " << kh);
    const int p = protected_count(n, prot.n_sink, prot.n_recent);
    DEPTHKV_CHECK_AS("head_budgets", kh >= n || kh >= p,
                  "head " << h << ": keep " << kh << " < " << p << " protected tokens (of " << n << ")");
    const int bad = first_nan_slot(scores[static_cast<std::size_t>(h)]);
    DEPTHKV_CHECK_AS("head_budgets", bad < 0, "head " << h << ": NaN score at slot " << bad);
    k[static_cast<std::size_t>(h)] = std::min(kh, n);
  }
  return k;
}

/// The unprotected slots of every head that its floor did not take, pooled head by head.
struct HeadCandidatePool {
  std::vector<float> scores;      ///< their scores
  std::vector<std::int32_t> pos;  ///< their positions
  std::vector<int> head;          ///< their head
};

/// Adds head `h`'s unprotected slots [lo, hi) other than the sorted slots `chosen` to `pool`.
inline void add_head_candidates(int h, const std::vector<float>& s, const std::int32_t* pos, int lo, int hi,
                                const std::vector<std::int32_t>& chosen, HeadCandidatePool& pool) {
  std::size_t c = 0;
  for (int j = lo; j < hi; ++j) {
    if (c < chosen.size() && chosen[c] == j) {
      ++c;
      continue;
    }
    pool.scores.push_back(s[static_cast<std::size_t>(j)]);
    pool.pos.push_back(pos ? pos[j] : j);
    pool.head.push_back(h);
  }
}

/// The adaptive split (file comment) of validated arguments, from the uniform split `k`: each
/// head's floor, then the best pooled candidates up to the layer total.
/// @param k on entry the uniform split, on return the adaptive one
/// @throws Error on null positions of a non-empty head
inline void adaptive_head_budgets(const LayerScores& scores, const std::vector<const std::int32_t*>& positions,
                                  const std::vector<int>& keep, Protection prot, double alpha, std::vector<int>& k) {
  const int H = static_cast<int>(scores.size());
  long long remaining = 0;
  HeadCandidatePool pool;
  SelectWorkspace ws;
  std::vector<std::int32_t> chosen;
  for (int h = 0; h < H; ++h) {
    const std::vector<float>& s = scores[static_cast<std::size_t>(h)];
    const int n = static_cast<int>(s.size());
    const std::int32_t* pos = positions.empty() ? nullptr : positions[static_cast<std::size_t>(h)];
    DEPTHKV_CHECK_AS("head_budgets", n == 0 || positions.empty() || pos != nullptr,
                     "head " << h << ": null positions");
    const int p = protected_count(n, prot.n_sink, prot.n_recent);
    const int floor_n = static_cast<int>(std::floor(alpha * static_cast<double>(keep[static_cast<std::size_t>(h)])));
    const int f = std::min(n, std::max(p, floor_n));
    remaining += k[static_cast<std::size_t>(h)] - f;
    k[static_cast<std::size_t>(h)] = f;
    if (f >= n) continue;
    // the unprotected slots are [lo, hi); the floor takes their f - p best, the rest compete
    const int lo = std::min(prot.n_sink, n);
    const int hi = std::max(lo, n - std::min(prot.n_recent, n));
    chosen.clear();
    select_best(FloatKeys{s.data()}, pos, lo, hi, f - p, ws, chosen);
    add_head_candidates(h, s, pos, lo, hi, chosen, pool);
  }
  chosen.clear();
  const int n_pool = static_cast<int>(pool.scores.size());
  select_best(FloatKeys{pool.scores.data()}, pool.pos.data(), 0, n_pool,
              static_cast<int>(std::min<long long>(remaining, n_pool)), ws, chosen);
  for (std::int32_t i : chosen) ++k[static_cast<std::size_t>(pool.head[static_cast<std::size_t>(i)])];
}

}  // namespace detail

/// Per-head keep counts of one layer from per-head starting budgets `keep[h]` (file comment,
/// with `keep` per head: T = sum_h min(keep[h], n_h), and the adaptive floor of head h is
/// f_h = min(n_h, max(p_h, floor(alpha * keep[h])))). With every keep[h] equal this is the
/// layer split of the file comment; with the head-level curve-optimal budgets
/// (`head_optimal_budgets`) as the start, kAdaptive keeps the fraction alpha of each head's
/// measured budget and lets the input's scores place the rest among the layer's heads.
/// @param scores scores[h][slot] (n_h = scores[h].size(); no NaN)
/// @param positions positions[h]: n_h positions of head h's slots (ties: earlier stays), or an
///   empty vector for the slot order
/// @param keep keep[h] >= 0 tokens of head h (>= its protected count unless it holds <= keep[h])
/// @param alpha the adaptive floor fraction, in [0, 1] (ignored by kUniform)
/// @return k[h], summing to sum_h min(keep[h], n_h)
/// @throws Error on no heads, a keep vector of another size, a negative keep, a keep below a
///   head's protected count, negative protection, alpha outside [0, 1] or NaN, a positions
///   vector of the wrong size, or a NaN score (naming the head and slot)
inline std::vector<int> head_budgets(HeadAllocation mode, const LayerScores& scores,
                                     const std::vector<const std::int32_t*>& positions, const std::vector<int>& keep,
                                     Protection prot, double alpha = kDefaultHeadAlpha) {
  std::vector<int> k = detail::uniform_head_budgets(scores, positions, keep, prot, alpha);
  if (mode == HeadAllocation::kUniform) return k;
  detail::adaptive_head_budgets(scores, positions, keep, prot, alpha, k);
  return k;
}

/// Per-head keep counts of one layer whose heads keep `keep` tokens each (file comment).
/// @throws Error as the per-head form; a negative keep
inline std::vector<int> head_budgets(HeadAllocation mode, const LayerScores& scores,
                                     const std::vector<const std::int32_t*>& positions, int keep, Protection prot,
                                     double alpha = kDefaultHeadAlpha) {
  DEPTHKV_CHECK(!scores.empty(), "no heads");
  DEPTHKV_CHECK(keep >= 0, "keep must be >= 0, got " << keep);
  return head_budgets(mode, scores, positions, std::vector<int>(scores.size(), keep), prot, alpha);
}

/// `head_budgets` for a layer's heads (the positions are the layer's); `keep` is one count for
/// every head (int) or one per head (std::vector<int>).
/// @throws Error as `head_budgets`, and when the scores' shape differs from the layer's
template <class Layer, class Keep>
std::vector<int> head_budgets(HeadAllocation mode, const Layer& layer, const LayerScores& scores, const Keep& keep,
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

/// The allocator request over (layer, KV head) units that `head_optimal_budgets` solves: unit
/// u = l * n_kv_heads + h has layer l's length, floor and cap; the budget is n_kv_heads * B in
/// tokens, B the layer request's budget (`total_tokens`, or llround(keep_ratio * sum(lengths))
/// as the allocator resolves it: the layer request counts tokens per head, as every head of
/// layer l keeps budget[l]); `min_tokens` and the other parameters are copied.
/// @throws Error on n_kv_heads < 1, floors / caps of another size than the lengths, or tiers > 0
///         (tiers are per-layer budgets of the optimal policy, not per-head)
inline BudgetRequest head_unit_request(const BudgetRequest& layer_req, int n_kv_heads) {
  DEPTHKV_CHECK(n_kv_heads >= 1, "n_kv_heads must be >= 1, got " << n_kv_heads);
  DEPTHKV_CHECK(layer_req.tiers == 0, "tiers " << layer_req.tiers << ": only the optimal policy takes tiers, not '"
                                               << to_string(AllocationPolicy::kHeadOptimal) << "'");
  const std::size_t L = layer_req.lengths.size();
  DEPTHKV_CHECK(layer_req.floors.empty() || layer_req.floors.size() == L,
                "floors has " << layer_req.floors.size() << " entries for " << L << " layers");
  DEPTHKV_CHECK(layer_req.caps.empty() || layer_req.caps.size() == L,
                "caps has " << layer_req.caps.size() << " entries for " << L << " layers");
  BudgetRequest u = layer_req;
  auto repeat = [&](const std::vector<int>& v) {
    std::vector<int> out;
    for (int x : v) out.insert(out.end(), static_cast<std::size_t>(n_kv_heads), x);
    return out;
  };
  u.lengths = repeat(layer_req.lengths);
  u.floors = repeat(layer_req.floors);
  u.caps = repeat(layer_req.caps);
  if (layer_req.total_tokens != -1) {
    u.total_tokens = layer_req.total_tokens * n_kv_heads;
  } else if (std::isfinite(layer_req.keep_ratio) && layer_req.keep_ratio >= 0.0 && layer_req.keep_ratio <= 1.0) {
    long long sum = 0;  // the layer budget B as the allocator resolves it, then H * B
    for (int len : layer_req.lengths) sum += len;
    u.keep_ratio = -1.0;
    u.total_tokens = std::llround(layer_req.keep_ratio * static_cast<double>(sum)) * n_kv_heads;
  }  // otherwise the allocator refuses the ratio
  u.robustness.clear();
  u.infonce.clear();
  return u;
}

namespace detail {

/// kOptimal over the (layer, KV head) units of `u` (n_layers * n_kv_heads entries, unit
/// l * n_kv_heads + h), reshaped to k[l][h].
/// @throws Error on a profile of another row count, or from the allocator
inline std::vector<std::vector<int>> allocate_head_units(const SensitivityProfile& head_profile, int n_kv_heads,
                                                         const BudgetRequest& u, AllocationInfo* info = nullptr) {
  const int L = static_cast<int>(u.lengths.size()) / n_kv_heads;
  DEPTHKV_CHECK(head_profile.n_layers() == L * n_kv_heads,
                "head profile has " << head_profile.n_layers() << " rows for " << L << " layers x " << n_kv_heads
                                    << " KV heads");
  const std::vector<int> flat = BudgetAllocator().allocate(AllocationPolicy::kOptimal, u, &head_profile, info);
  std::vector<std::vector<int>> k(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l)
    k[static_cast<std::size_t>(l)].assign(flat.begin() + static_cast<std::ptrdiff_t>(l) * n_kv_heads,
                                          flat.begin() + static_cast<std::ptrdiff_t>(l + 1) * n_kv_heads);
  return k;
}

}  // namespace detail

/// Head-level curve-optimal budgets (LU-KV: per-(layer, KV head) loss curves and one optimal
/// allocation over all heads under the global budget). `head_profile` row u = l * n_kv_heads + h
/// is the curve "only head h of layer l keeps the fraction r, everything else full"; the
/// allocation is `AllocationPolicy::kOptimal` on `head_unit_request(layer_req, n_kv_heads)`:
/// it minimises sum_u hull_u(b_u / length_u) subject to sum_u b_u = n_kv_heads * B (B: the layer
/// request's budget), the floors and caps of each unit's layer, and the safeguard floor
/// `min_tokens` per head. Since every head of a layer keeping the same count is one of the
/// allocations it chooses from, its predicted loss (sum of the head hulls) is never above that
/// of any layer allocation under the same head curves.
/// @param head_profile the head curves (n_layers * n_kv_heads rows)
/// @param n_kv_heads KV heads per layer
/// @param layer_req lengths per layer (tokens each head holds), the budget, floors, caps
/// @param info optional: what the allocation did (per unit)
/// @return k[l][h]: tokens head h of layer l keeps; sum == n_kv_heads * B
/// @throws Error on a profile of another row count, an invalid profile or an infeasible request
inline std::vector<std::vector<int>> head_optimal_budgets(const SensitivityProfile& head_profile, int n_kv_heads,
                                                          const BudgetRequest& layer_req,
                                                          AllocationInfo* info = nullptr) {
  return detail::allocate_head_units(head_profile, n_kv_heads, head_unit_request(layer_req, n_kv_heads), info);
}

/// Predicted total loss sum_{l,h} f_{l*H+h}(k[l][h] / lengths[l]) of per-head budgets under head
/// curves (`predicted_loss` over the (layer, KV head) units; H = k[l].size() for every l).
/// @param head_profile the head curves (n_layers * H rows)
/// @param k k[l][h]: tokens head h of layer l keeps, 0 <= k[l][h] <= lengths[l]
/// @param lengths tokens each head of layer l holds
/// @param convexified as `predicted_loss`: the hulls (what `head_optimal_budgets` minimises)
/// @throws Error on ragged or mismatched sizes, a budget outside [0, length] or an invalid profile
inline double predicted_head_loss(const SensitivityProfile& head_profile, const std::vector<std::vector<int>>& k,
                                  const std::vector<int>& lengths, bool convexified = true) {
  DEPTHKV_CHECK(k.size() == lengths.size() && !k.empty(),
                "sizes differ: budgets for " << k.size() << " layers, " << lengths.size() << " lengths");
  const std::size_t H = k.front().size();
  std::vector<int> flat, unit_lengths;
  for (std::size_t l = 0; l < k.size(); ++l) {
    DEPTHKV_CHECK(k[l].size() == H, "layer " << l << " has budgets for " << k[l].size() << " KV heads, layer 0 for " << H);
    flat.insert(flat.end(), k[l].begin(), k[l].end());
    unit_lengths.insert(unit_lengths.end(), H, lengths[l]);
  }
  return predicted_loss(head_profile, flat, unit_lengths, convexified);
}

namespace detail {

/// The per-layer budgets of per-head rows: layer l's budget is `round(sum_h rows[l][h] / H_l)`
/// (the mean per head, what a layer of per-head budgets reports as its one budget).
inline std::vector<int> mean_per_layer(const std::vector<std::vector<int>>& rows) {
  std::vector<int> out;
  out.reserve(rows.size());
  for (const std::vector<int>& row : rows) {
    long long t = 0;
    for (int x : row) t += x;
    out.push_back(row.empty() ? 0 : static_cast<int>(std::llround(static_cast<double>(t) / static_cast<double>(row.size()))));
  }
  return out;
}

/// `head_budgets` of layer `l` of a cache, its errors naming the layer.
template <class Layer, class Keep>
std::vector<int> layer_head_budgets(HeadAllocation mode, const Layer& layer, int l, const LayerScores& scores,
                                    const Keep& keep, Protection prot, double alpha) {
  try {
    return head_budgets(mode, layer, scores, keep, prot, alpha);
  } catch (const Error& e) {
    const std::string prefix = "head_budgets: ";
    std::string m = e.message();
    if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
    throw Error(prefix + "layer " + std::to_string(l) + ": " + m);
  }
}

template <class Layer, class Keep>
std::vector<std::vector<int>> head_budgets_all(HeadAllocation mode, const KVCache<Layer>& cache,
                                               const std::vector<LayerScores>& scores, const std::vector<Keep>& keep,
                                               Protection prot, double alpha) {
  DEPTHKV_CHECK(static_cast<int>(scores.size()) == cache.n_layers(),
                "scores have " << scores.size() << " layers, cache " << cache.n_layers());
  DEPTHKV_CHECK(static_cast<int>(keep.size()) == cache.n_layers(),
                "keep has " << keep.size() << " layers, cache " << cache.n_layers());
  std::vector<std::vector<int>> out(keep.size());
  for (int l = 0; l < cache.n_layers(); ++l)
    out[static_cast<std::size_t>(l)] = layer_head_budgets(mode, cache.layer(l), l, scores[static_cast<std::size_t>(l)],
                                                          keep[static_cast<std::size_t>(l)], prot, alpha);
  return out;
}

}  // namespace detail

/// `head_budgets` for every layer of a cache: layer l's heads split `keep_per_layer[l]` (one
/// count for every head of the layer, e.g. `BudgetAllocator`'s budgets); the result is what the
/// per-head `evict(cache, scores, keep_per_head, prot)` takes.
/// @throws Error as `head_budgets` (naming the layer), or when the layer counts differ
template <class Layer>
std::vector<std::vector<int>> head_budgets(HeadAllocation mode, const KVCache<Layer>& cache,
                                           const std::vector<LayerScores>& scores,
                                           const std::vector<int>& keep_per_layer, Protection prot,
                                           double alpha = kDefaultHeadAlpha) {
  return detail::head_budgets_all(mode, cache, scores, keep_per_layer, prot, alpha);
}

/// `head_budgets` for every layer of a cache from per-head starting budgets keep[l][h] (e.g.
/// `head_optimal_budgets`): kUniform returns them clipped to each head's length, kAdaptive
/// re-splits each layer's total by the scores with floors alpha * keep[l][h].
/// @throws Error as `head_budgets` (naming the layer), or when the layer counts differ
template <class Layer>
std::vector<std::vector<int>> head_budgets(HeadAllocation mode, const KVCache<Layer>& cache,
                                           const std::vector<LayerScores>& scores,
                                           const std::vector<std::vector<int>>& keep, Protection prot,
                                           double alpha = kDefaultHeadAlpha) {
  return detail::head_budgets_all(mode, cache, scores, keep, prot, alpha);
}

}  // namespace depthkv
