#pragma once
/// @file budget_allocator.hpp
/// @brief `BudgetAllocator`: a global KV budget (tokens, or a keep ratio of the current length)
/// -> integer per-layer keep counts that sum exactly to it, with per-layer floors and caps, by one
/// of several policies (uniform, PyramidKV, the DepthKV paper's proportional rule, middle-layer
/// protection, curve-optimal, and the paper's InfoNCE-guided MGA / MLMA-k / MLP).
///
/// ## Common steps (every policy)
/// 1. The budget B: `total_tokens`, or `llround(keep_ratio * sum(lengths))`.
/// 2. Bounds per layer: floor F_l (default 0; a floor above the layer's length is lowered to the
///    length: a layer cannot keep more than it holds) and cap C_l (default the length; a cap may
///    not exceed the length). Infeasible requests throw `Error`: sum F > B, B > sum C, F_l > C_l.
/// 3. The policy computes real per-layer targets t_l.
/// 4. ONE rounding routine (`detail::round_to_budget`) turns targets into integers: a
///    water-filling clamp x_l = clamp(t_l + lambda, F_l, C_l) with the common shift lambda that
///    makes sum x = B (lambda = 0 when the targets already fit), then largest-remainder rounding
///    (the leftover tokens go to the largest fractional parts; equal parts: lower layer first).
///    The result sums exactly to B and respects every floor and cap; it is deterministic.
///
/// ## Policies
/// - `uniform`: t_l = the common water level, i.e. every layer B/L, clamped to its bounds.
/// - `pyramid` (PyramidKV, Cai et al. 2024, as implemented in KVCache-Factory's
///   `PyramidKVCluster`): with B' = B/L the per-layer average budget, w = `window`, beta = `beta`
///   (20): min = (B'-w)/beta, max = 2(B'-w) - min; if max >= q - w (q = the smallest cap, i.e.
///   KVCache-Factory's `q_len`) then max = q - w, min = 2(B'-w) - max. Layer l gets
///   max - (max-min) l/(L-1) + w: linear from layer 0 (max) to the last layer (min), plus the
///   window. KVCache-Factory uses integer division here; depthkv keeps the real values and rounds
///   once (step 4), so the sum is exact. B' <= w or L == 1: uniform.
/// - `proportional` (the DepthKV paper, arXiv 2604.24647): layer l's pruning ratio
///   p_l = alpha * s_l, proportional to its robustness score s_l (`robustness` when given, else
///   s_l = 1 / (sens_l + `sensitivity_eps`), sens_l = layer l's profiled sensitivity: by default
///   the mean of its measured loss over the probed keep ratios, a budget-independent summary, so
///   the real-valued shares grow with the global budget; with `sensitivity_keep_ratio` = r in
///   (0, 1], the loss read off the measured curve at r by `SensitivityProfile::loss_at`).
///   Each layer's pruning ratio is capped at `max_prune_ratio` (0.7: the layer keeps at least
///   K_l = ceil((1 - 0.7) * length) tokens, a whole number, so saturated layers are stable under
///   rounding); alpha is solved so that the pruned tokens sum exactly to sum(lengths) - B, which
///   is the paper's "redistribute the excess over the unsaturated layers (in proportion to their
///   scores) until the mean is exact". Layer 0 is never pruned (`protect_layer0`, default on).
///   The mean pruning ratio is token-weighted (exactly the paper's mean when all layers hold the
///   same number of tokens).
///   When the global pruning ratio is too high for the cap (the paper only ran 60%), the cap is
///   lifted just enough: every unprotected layer sits at its lowered cap floor, which moves
///   linearly from K_l (at budget sum K) down to the hard floor F_l (at budget sum F); for equal
///   floors and equal lengths this is the smallest common cap that fits. `AllocationInfo::prune_cap` reports the
///   largest real pruning ratio used. When even pruning every other layer to its floor cannot
///   keep layer 0 full, layer 0 keeps everything above the other layers' floors
///   (`AllocationInfo::protected_reduced`).
/// - `middle`: the `n_middle` middle layers (first index (L - n_middle) / 2) kept full, the rest
///   uniform. When the budget cannot keep them full they share all of the budget above the other
///   layers' floors (water-filled) and the others stay at their floors.
/// - `optimal` (depthkv): minimise sum_l f_l(b_l) subject to sum b_l = B and the bounds, where
///   f_l(b) = h_l(b / length_l) and h_l is the lower convex hull of layer l's measured curve:
///   the probed points, the point (1.0, 0), and below the smallest probed ratio the extension
///   of the first segment's slope down to ratio 0 (see `SensitivityProfile::loss_at`). The
///   integer problem is separable convex, so greedy marginal gains are exact: starting from the
///   floors, tokens go to the layer with the largest loss decrease per token (ties: the lower
///   layer), taken a whole hull segment at a time. The allocation at B+1 extends the one at B,
///   so budgets never decrease as B grows.
/// - `mga` (the paper's metric-guided allocation): `proportional` with s_l = `infonce[l]` (lower
///   InfoNCE = more critical layer = less pruning), the same cap, layer 0 unpruned.
/// - `mlma2`, `mlma4`, `mlma6` (the paper's MLMA-k): the k middle layers kept full, the rest split
///   as `mga` (layer 0 also unpruned when `protect_layer0`).
/// - `mlp`: the two middle layers kept full, the rest uniform (`middle` with n_middle = 2).
///
/// ## Tiers (`tiers` = k, optimal only)
/// Paged serving engines share one block table among the layers of a group (vLLM's KV-cache
/// groups), so per-layer budgets free memory only when the layers fall into a few groups.
/// With k in [1, L) the optimal policy returns budgets in at most k tiers:
/// - A tier is a set of layers whose budgets are the uniform policy's split of the tier's total
///   over them (the common water level within their floors and caps, then largest remainder,
///   lower layer first). So within a tier the budgets differ by at most one token: a tier of m
///   layers and total T holds floor(T / m) in m - (T mod m) layers and one token more in the
///   others (when every floor <= T / m <= every cap; a layer whose floor or cap excludes the
///   level holds that bound instead). The result has at most 2k distinct values, at most k when
///   each tier's total is a multiple of its size; `AllocationInfo::tier` names each layer's tier.
///   An engine that stores one length per tier sizes it at the tier's largest budget (at most
///   one token above any of its layers').
/// - The sum is exactly B, floors and caps hold, and the result is deterministic.
/// - Search: b* = the unrestricted optimal budgets; layers ordered by ascending b* (ties: lower
///   layer first); tiers are contiguous runs of that order. For each t in [1, k], dynamic
///   programming over the run boundaries finds the t runs of least summed predicted loss when
///   each run's total is its share of b* (the sum of b* over it); then tokens move between the
///   runs (steps of 2^p tokens down to 1, the best single move each time) while a move lowers
///   the predicted loss. Of the k candidates the one of least predicted loss wins (ties: fewer
///   tiers), so the predicted loss never rises with k.
/// - What it is not: the optimum over all partitions (runs of the b* order only; exact when the
///   curves do not cross in that order) nor over all run totals (the balancing stops at a local
///   minimum of single moves).
/// - k = 1: the uniform split over the effective floors (the uniform policy when `min_tokens` is
///   0). k >= L: exactly the unrestricted optimal budgets. k = 0: no limit (the default).
///   When the safeguard falls back to uniform, that is one tier. Other policies refuse k > 0.
///
/// ## The safeguard floor (`min_tokens`, proportional/optimal/mga/mlma*)
/// Curve-optimal budgets can starve a layer, and a starved layer can collapse on text unlike the
/// calibration text. `min_tokens` raises every layer's floor to min(min_tokens, cap) (e.g. sinks +
/// the scorer's window + a margin). The default is 0 (off). A safeguard never makes a request
/// infeasible: when the budget cannot give every layer its safeguard floor, the result is the
/// `uniform` allocation (the safeguard takes the whole budget) and
/// `AllocationInfo::safeguard_fallback` is set; with `safeguard_shrink` the margin of each
/// layer's safeguard floor above its hard floor, m_l = max(F_l, min(min_tokens, C_l)) - F_l, is
/// halved instead (integer division, all layers together) until the floors fit the budget: a
/// short context keeps part of the margin and some room to allocate, and there is no fallback.
///
/// @code
/// depthkv::BudgetRequest req;
/// req.lengths = std::vector<int>(n_layers, 384);   // tokens each layer holds now
/// req.keep_ratio = 0.2;                            // or req.total_tokens = ...
/// req.floors = std::vector<int>(n_layers, n_sink + n_recent);
/// depthkv::BudgetAllocator alloc;
/// std::vector<int> keep = alloc.allocate(depthkv::AllocationPolicy::kOptimal, req, &profile);
/// // sum(keep) == llround(0.2 * 384 * n_layers); evict(cache, scores, keep, protection);
/// @endcode

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "depthkv/detail/allocator_math.hpp"
#include "depthkv/error.hpp"
#include "depthkv/selection.hpp"
#include "depthkv/sensitivity_profile.hpp"

namespace depthkv {

/// How the global budget is split across layers (see the file comment for each formula).
enum class AllocationPolicy {
  kUniform,       ///< "uniform"
  kPyramid,       ///< "pyramid" (PyramidKV)
  kProportional,  ///< "proportional" (DepthKV paper, robustness from the profile or user scores)
  kMiddle,        ///< "middle" (n_middle middle layers full, rest uniform)
  kOptimal,       ///< "optimal" (minimum predicted loss on the convexified curves)
  kMGA,           ///< "mga" (proportional with InfoNCE scores)
  kMLMA2,         ///< "mlma2" (2 middle layers full, rest by InfoNCE)
  kMLMA4,         ///< "mlma4"
  kMLMA6,         ///< "mlma6"
  kMLP,           ///< "mlp" (2 middle layers full, rest uniform)
  /// "head-optimal" (LU-KV): minimum predicted loss over (layer, KV head) units from per-head
  /// curves (`head_optimal_budgets`, head_budget.hpp); gives per-head budgets, so
  /// `BudgetAllocator::allocate` (per layer) refuses it.
  kHeadOptimal,
};

/// @return the policy's name: "uniform", "pyramid", "proportional", "middle", "optimal", "mga",
///         "mlma2", "mlma4", "mlma6", "mlp"
inline std::string to_string(AllocationPolicy p) {
  switch (p) {
    case AllocationPolicy::kUniform: return "uniform";
    case AllocationPolicy::kPyramid: return "pyramid";
    case AllocationPolicy::kProportional: return "proportional";
    case AllocationPolicy::kMiddle: return "middle";
    case AllocationPolicy::kOptimal: return "optimal";
    case AllocationPolicy::kMGA: return "mga";
    case AllocationPolicy::kMLMA2: return "mlma2";
    case AllocationPolicy::kMLMA4: return "mlma4";
    case AllocationPolicy::kMLMA6: return "mlma6";
    case AllocationPolicy::kMLP: return "mlp";
    case AllocationPolicy::kHeadOptimal: return "head-optimal";
  }
  return "unknown";
}

/// @return every layer policy (all but kHeadOptimal, which allocates per KV head), in enum order
inline std::vector<AllocationPolicy> all_allocation_policies() {
  return {AllocationPolicy::kUniform, AllocationPolicy::kPyramid, AllocationPolicy::kProportional,
          AllocationPolicy::kMiddle,  AllocationPolicy::kOptimal, AllocationPolicy::kMGA,
          AllocationPolicy::kMLMA2,   AllocationPolicy::kMLMA4,   AllocationPolicy::kMLMA6,
          AllocationPolicy::kMLP};
}

/// @return the names of every policy, in enum order, joined by `sep` ("uniform, pyramid, ...")
inline std::string allocation_policy_names(const std::string& sep = ", ") {
  std::string out;
  for (AllocationPolicy p : all_allocation_policies()) out += (out.empty() ? "" : sep) + to_string(p);
  return out;
}

/// @param name one of the names `to_string(AllocationPolicy)` returns (a layer policy or "head-optimal")
/// @return the policy
/// @throws Error on an unknown name (the message lists the valid ones)
inline AllocationPolicy parse_allocation_policy(const std::string& name) {
  for (AllocationPolicy p : all_allocation_policies()) {
    if (to_string(p) == name) return p;
  }
  if (name == to_string(AllocationPolicy::kHeadOptimal)) return AllocationPolicy::kHeadOptimal;
  DEPTHKV_FAIL("unknown allocation policy '" << name << "' (expected " << allocation_policy_names() << " or "
                                             << to_string(AllocationPolicy::kHeadOptimal) << ")");
}

/// @return true when `policy` gives per-(layer, KV head) budgets from head curves (head-optimal)
inline bool is_head_policy(AllocationPolicy policy) { return policy == AllocationPolicy::kHeadOptimal; }

/// @return true when `policy` reads a `SensitivityProfile` (optimal; proportional without
///         user robustness scores)
inline bool policy_needs_profile(AllocationPolicy policy, bool has_robustness = false) {
  return policy == AllocationPolicy::kOptimal || (policy == AllocationPolicy::kProportional && !has_robustness);
}

/// @return true when `policy` reads `BudgetRequest::infonce` (mga, mlma2, mlma4, mlma6)
inline bool policy_needs_infonce(AllocationPolicy policy) {
  return policy == AllocationPolicy::kMGA || policy == AllocationPolicy::kMLMA2 ||
         policy == AllocationPolicy::kMLMA4 || policy == AllocationPolicy::kMLMA6;
}

/// A budget request: the layers' current lengths, the global budget (exactly one of
/// `total_tokens` and `keep_ratio`), optional bounds, and the policies' parameters.
struct BudgetRequest {
  std::vector<int> lengths;      ///< tokens each layer holds now (>= 0); caps default to these
  long long total_tokens = -1;   ///< global budget in tokens (-1: use keep_ratio)
  double keep_ratio = -1.0;      ///< or: global keep ratio in [0, 1] of sum(lengths) (-1: unset)
  std::vector<int> floors;       ///< per-layer minimum (empty: 0), e.g. sinks + recent window
  std::vector<int> caps;         ///< per-layer maximum (empty: the length), <= length
  int min_tokens = 0;            ///< safeguard floor (proportional, optimal, mga, mlma*); 0 = off
  bool safeguard_shrink = false; ///< floors that do not fit: halve their margins (true) or uniform
  int window = 32;               ///< pyramid: the window w kept in every layer
  double beta = 20.0;            ///< pyramid: min = (B' - w) / beta
  int n_middle = 2;              ///< middle: layers kept full
  double max_prune_ratio = 0.7;  ///< proportional/mga/mlma*: per-layer pruning-ratio cap
  bool protect_layer0 = true;    ///< proportional/mga/mlma*: layer 0 never pruned
  std::vector<double> robustness;   ///< proportional: user robustness scores (>= 0), one per layer
  double sensitivity_eps = 1e-6;    ///< proportional: s_l = 1 / (sens_l + eps)
  /// proportional: where sens_l is read: <= 0 = mean loss over the probed ratios (default),
  /// else the curve's loss at this keep ratio (e.g. the paper's single ablation ratio)
  double sensitivity_keep_ratio = 0.0;
  std::vector<double> infonce;      ///< mga/mlma*: per-layer InfoNCE loss (>= 0)
  /// optimal: at most this many tiers of per-layer budgets (see "Tiers" in the file comment);
  /// 0 = no limit (the exact curve-optimal budgets). Other policies refuse a value above 0.
  int tiers = 0;
};

/// Caps for sliding-window layers: layer l with `window[l]` = W > 0 (it attends only to the W
/// positions up to its query) never uses more than W - 1 earlier tokens, so its cap is
/// min(lengths[l], W - 1); other layers (window 0, or `window` empty) keep `lengths[l]`. With
/// these caps in `BudgetRequest::caps` the allocator gives the tokens a local layer cannot use
/// to the layers that can.
/// @throws Error when `window` is neither empty nor one entry per layer, or holds a negative value
inline std::vector<int> window_caps(const std::vector<int>& lengths, const std::vector<int>& window) {
  DEPTHKV_CHECK(window.empty() || window.size() == lengths.size(),
                "window has " << window.size() << " entries for " << lengths.size() << " layers");
  std::vector<int> caps = lengths;
  for (std::size_t l = 0; l < window.size(); ++l) {
    DEPTHKV_CHECK(window[l] >= 0, "layer " << l << ": window " << window[l] << " is negative");
    if (window[l] > 0) caps[l] = std::min(caps[l], window[l] - 1);
  }
  return caps;
}

/// A budget beyond what the layers can hold is the whole of it: when `req`'s budget (its tokens,
/// or its keep ratio of the lengths' sum) exceeds the sum of `req.caps` (e.g. local layers capped
/// at their window), `req` asks for that sum in tokens instead. No caps: unchanged.
inline void clamp_budget_to_caps(BudgetRequest& req) {
  if (req.caps.empty()) return;
  long long sum_caps = 0, sum_len = 0;
  for (std::size_t l = 0; l < req.caps.size() && l < req.lengths.size(); ++l) {
    sum_caps += req.caps[l];
    sum_len += req.lengths[l];
  }
  const long long total = req.total_tokens >= 0 ? req.total_tokens
                          : req.keep_ratio >= 0 ? std::llround(req.keep_ratio * static_cast<double>(sum_len))
                                                : -1;
  if (total > sum_caps) {
    req.total_tokens = sum_caps;
    req.keep_ratio = -1.0;
  }
}

/// Applies `window_caps` to `req` (caps = min(its caps or lengths, the windows' caps); floors
/// lowered to the caps; a budget above the caps' sum lowered to it, as `total_tokens`). No-op
/// when no layer has a window.
inline void cap_to_windows(BudgetRequest& req, const std::vector<int>& window) {
  bool any = false;
  for (int w : window) any = any || w > 0;
  if (!any) return;
  std::vector<int> caps = window_caps(req.lengths, window);
  if (!req.caps.empty()) {
    DEPTHKV_CHECK(req.caps.size() == caps.size(), "caps has " << req.caps.size() << " entries for " << caps.size() << " layers");
    for (std::size_t l = 0; l < caps.size(); ++l) caps[l] = std::min(caps[l], req.caps[l]);
  }
  req.caps = caps;
  for (std::size_t l = 0; l < req.floors.size() && l < caps.size(); ++l) req.floors[l] = std::min(req.floors[l], caps[l]);
  clamp_budget_to_caps(req);
}

/// Tokens the default safeguard floor adds to the protected ones (README "Safeguard floor").
inline constexpr int kSafeguardMargin = 8;

/// The floors eviction under `prot` implies for `BudgetRequest::floors`: a head never keeps fewer
/// than its protected tokens, so floor[l] = min(lengths[l], n_sink + n_recent).
inline std::vector<int> protection_floors(const std::vector<int>& lengths, const Protection& prot) {
  std::vector<int> floors(lengths.size());
  for (std::size_t l = 0; l < lengths.size(); ++l) floors[l] = std::min(lengths[l], prot.n_sink + prot.n_recent);
  return floors;
}

/// The safeguard floor for `BudgetRequest::min_tokens`: `min_tokens` when >= 0, else (-1) the
/// default n_sink + n_recent + kSafeguardMargin.
inline int safeguard_floor(const Protection& prot, int min_tokens = -1) {
  return min_tokens >= 0 ? min_tokens : prot.n_sink + prot.n_recent + kSafeguardMargin;
}

/// What an allocation did besides the budgets (for reports).
struct AllocationInfo {
  long long total = 0;               ///< the resolved global budget B
  std::vector<int> floors;           ///< effective floors (hard floors raised by the safeguard)
  std::vector<int> caps;             ///< effective caps
  double prune_cap = std::numeric_limits<double>::quiet_NaN();  ///< proportional family: cap used (after lifting)
  bool safeguard_fallback = false;   ///< min_tokens could not be met for every layer: uniform used
  bool protected_reduced = false;    ///< protected layers (layer 0 / middle) could not be kept full
  /// optimal with `BudgetRequest::tiers` > 0: each layer's tier (0, 1, ...: tier 0 holds the
  /// layers of the smallest unrestricted optimal budgets); empty otherwise
  std::vector<int> tier;
  std::vector<double> scores;        ///< proportional family: the robustness scores used
};

namespace detail {

struct AllocContext {
  int n = 0;
  std::vector<int> len, floors, caps;
  long long total = 0;
  long long sum_len = 0;
};

inline long long sum_of(const std::vector<int>& v) {
  long long s = 0;
  for (int x : v) s += x;
  return s;
}

inline AllocContext prepare_request(const BudgetRequest& req) {
  AllocContext c;
  c.n = static_cast<int>(req.lengths.size());
  c.len = req.lengths;
  for (int l = 0; l < c.n; ++l) {
    DEPTHKV_CHECK(c.len[static_cast<std::size_t>(l)] >= 0, "layer " << l << ": negative length " << c.len[static_cast<std::size_t>(l)]);
  }
  c.sum_len = sum_of(c.len);
  const bool has_total = req.total_tokens != -1;
  const bool has_ratio = !(req.keep_ratio == -1.0);
  DEPTHKV_CHECK(has_total != has_ratio, (has_total ? "both total_tokens and keep_ratio are set; set exactly one"
                                                   : "neither total_tokens nor keep_ratio is set; set exactly one"));
  if (has_total) {
    DEPTHKV_CHECK(req.total_tokens >= 0, "total_tokens " << req.total_tokens << " is negative");
    c.total = req.total_tokens;
  } else {
    DEPTHKV_CHECK(std::isfinite(req.keep_ratio) && req.keep_ratio >= 0.0 && req.keep_ratio <= 1.0,
                  "keep_ratio " << req.keep_ratio << " is outside [0, 1]");
    c.total = std::llround(req.keep_ratio * static_cast<double>(c.sum_len));
  }
  if (req.caps.empty()) {
    c.caps = c.len;
  } else {
    DEPTHKV_CHECK(req.caps.size() == c.len.size(),
                  "caps has " << req.caps.size() << " entries for " << c.n << " layers");
    c.caps = req.caps;
    for (int l = 0; l < c.n; ++l) {
      const auto i = static_cast<std::size_t>(l);
      DEPTHKV_CHECK(c.caps[i] >= 0 && c.caps[i] <= c.len[i],
                    "layer " << l << ": cap " << c.caps[i] << " outside [0, length " << c.len[i] << "]");
    }
  }
  if (req.floors.empty()) {
    c.floors.assign(c.len.size(), 0);
  } else {
    DEPTHKV_CHECK(req.floors.size() == c.len.size(),
                  "floors has " << req.floors.size() << " entries for " << c.n << " layers");
    c.floors = req.floors;
    for (int l = 0; l < c.n; ++l) {
      const auto i = static_cast<std::size_t>(l);
      DEPTHKV_CHECK(c.floors[i] >= 0, "layer " << l << ": negative floor " << c.floors[i]);
      c.floors[i] = std::min(c.floors[i], c.len[i]);
      DEPTHKV_CHECK(c.floors[i] <= c.caps[i],
                    "layer " << l << ": floor " << c.floors[i] << " above cap " << c.caps[i]);
    }
  }
  const long long sf = sum_of(c.floors), sc = sum_of(c.caps);
  DEPTHKV_CHECK(sf <= c.total, "infeasible: the floors sum to " << sf << " tokens, above the budget of "
                                                                << c.total << " tokens");
  DEPTHKV_CHECK(c.total <= sc, "infeasible: the budget of " << c.total << " tokens exceeds the sum of the caps ("
                                                           << sc << " tokens)");
  DEPTHKV_CHECK(req.min_tokens >= 0, "min_tokens " << req.min_tokens << " is negative");
  DEPTHKV_CHECK(req.tiers >= 0, "tiers " << req.tiers << " is negative (0: no limit)");
  return c;
}

/// Real targets of a uniform split of `budget` over the layers in `idx` (common water level).
inline void uniform_targets(const std::vector<int>& idx, const std::vector<int>& floors, const std::vector<int>& caps,
                            double budget, std::vector<double>& t) {
  if (idx.empty()) return;
  std::vector<double> a(idx.size(), 0.0), d(idx.size(), 1.0), lo(idx.size()), hi(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    lo[i] = floors[static_cast<std::size_t>(idx[i])];
    hi[i] = caps[static_cast<std::size_t>(idx[i])];
  }
  const std::vector<double> x = water_fill(a, d, lo, hi, budget);
  for (std::size_t i = 0; i < idx.size(); ++i) t[static_cast<std::size_t>(idx[i])] = x[i];
}

inline std::vector<int> allocate_uniform(const AllocContext& c, const std::vector<int>& floors) {
  std::vector<int> all(static_cast<std::size_t>(c.n));
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> t(static_cast<std::size_t>(c.n), 0.0);
  uniform_targets(all, floors, c.caps, static_cast<double>(c.total), t);
  return round_to_budget(t, floors, c.caps, c.total);
}

inline std::vector<int> allocate_pyramid(const AllocContext& c, int window, double beta) {
  DEPTHKV_CHECK(window >= 0, "pyramid: negative window " << window);
  DEPTHKV_CHECK(std::isfinite(beta) && beta > 0.0, "pyramid: beta " << beta << " must be > 0");
  const int L = c.n;
  const double avg = L > 0 ? static_cast<double>(c.total) / L : 0.0;
  const double w = window;
  const double base = avg - w;
  if (L <= 1 || base <= 0.0) return allocate_uniform(c, c.floors);
  double mn = base / beta;
  double mx = 2.0 * base - mn;
  const double q = *std::min_element(c.caps.begin(), c.caps.end());
  if (mx >= q - w && q - w >= base) {  // KVCache-Factory: max_num >= q_len - window_size
    mx = q - w;
    mn = 2.0 * base - mx;
  }
  std::vector<double> t(static_cast<std::size_t>(L));
  for (int l = 0; l < L; ++l) t[static_cast<std::size_t>(l)] = mx - (mx - mn) * l / (L - 1) + w;
  return round_to_budget(t, c.floors, c.caps, c.total);
}

/// Layer indices of the k middle layers of L: [(L - k) / 2, (L - k) / 2 + k).
inline std::vector<int> middle_layers(int L, int k, const char* policy) {
  DEPTHKV_CHECK(k >= 0, policy << ": negative number of middle layers " << k);
  DEPTHKV_CHECK(k <= L, policy << ": " << k << " middle layers requested but the model has only " << L << " layers");
  std::vector<int> m;
  for (int i = 0; i < k; ++i) m.push_back((L - k) / 2 + i);
  return m;
}

/// Shared staging of the policies with protected (kept-full) layers. `rest` fills the real
/// targets of the unprotected layers given their budget; it is called only when the protected
/// layers can be kept at their caps.
template <class Rest>
std::vector<int> allocate_with_protected(const AllocContext& c, const std::vector<int>& floors,
                                         const std::vector<bool>& prot, AllocationInfo* info, Rest rest) {
  std::vector<int> p_idx, o_idx;
  long long floors_o = 0, caps_p = 0;
  for (int l = 0; l < c.n; ++l) {
    const auto i = static_cast<std::size_t>(l);
    if (prot[i]) {
      p_idx.push_back(l);
      caps_p += c.caps[i];
    } else {
      o_idx.push_back(l);
      floors_o += floors[i];
    }
  }
  std::vector<double> t(static_cast<std::size_t>(c.n), 0.0);
  const long long avail = c.total - floors_o;
  if (avail < caps_p) {
    // The protected layers cannot all be full: they share everything above the others' floors.
    if (info) info->protected_reduced = true;
    for (int l : o_idx) t[static_cast<std::size_t>(l)] = floors[static_cast<std::size_t>(l)];
    uniform_targets(p_idx, floors, c.caps, static_cast<double>(avail), t);
  } else {
    for (int l : p_idx) t[static_cast<std::size_t>(l)] = c.caps[static_cast<std::size_t>(l)];
    rest(o_idx, static_cast<double>(c.total - caps_p), t);
  }
  return round_to_budget(t, floors, c.caps, c.total);
}

/// Floors raised by the safeguard: max(F_l, min(min_tokens, C_l)); with `shrink`, their margins
/// above F_l halved together until they fit the budget or are 0 (see the file comment).
inline std::vector<int> safeguard_floors(const AllocContext& c, int min_tokens, bool shrink = false) {
  std::vector<int> e = c.floors;
  for (std::size_t l = 0; l < e.size(); ++l) e[l] = std::max(e[l], std::min(min_tokens, c.caps[l]));
  while (shrink && sum_of(e) > c.total && e != c.floors)
    for (std::size_t l = 0; l < e.size(); ++l) e[l] = c.floors[l] + (e[l] - c.floors[l]) / 2;
  return e;
}

/// The proportional rule on the unprotected layers `idx` with budget `budget` (see the file
/// comment): keep_l = clamp(len_l - alpha s_l len_l, K_l, C_l), K_l the pruning-cap floor.
inline void proportional_targets(const AllocContext& c, const std::vector<int>& floors, const std::vector<double>& s,
                                 double max_prune, const std::vector<int>& idx, double budget, std::vector<double>& t,
                                 AllocationInfo* info, const char* policy) {
  if (idx.empty()) return;
  // Cap floors in whole tokens: K_l = max(F_l, min(C_l, ceil((1 - cap) len_l))).
  std::vector<double> kc(idx.size()), fl(idx.size());
  double sum_kc = 0.0, sum_fl = 0.0;
  for (std::size_t j = 0; j < idx.size(); ++j) {
    const auto i = static_cast<std::size_t>(idx[j]);
    const double m = std::max(0.0, std::ceil((1.0 - max_prune) * c.len[i] - 1e-9));
    kc[j] = std::max<double>(floors[i], std::min<double>(c.caps[i], m));
    fl[j] = floors[i];
    sum_kc += kc[j];
    sum_fl += fl[j];
  }
  if (sum_kc > budget) {
    // Lifted cap: every layer is at its (lowered) cap floor; the floors move together and
    // linearly from the cap floors K (at budget sum K) down to the hard floors (at sum F), so
    // the shares stay continuous and non-decreasing in the budget.
    const double theta = sum_kc > sum_fl ? (budget - sum_fl) / (sum_kc - sum_fl) : 1.0;
    double worst = max_prune;
    for (std::size_t j = 0; j < idx.size(); ++j) {
      const auto i = static_cast<std::size_t>(idx[j]);
      const double x = fl[j] + theta * (kc[j] - fl[j]);
      t[i] = x;
      if (c.len[i] > 0 && x < c.caps[i]) worst = std::max(worst, 1.0 - x / c.len[i]);
    }
    if (info) info->prune_cap = worst;
    return;
  }
  if (info) info->prune_cap = max_prune;
  std::vector<double> a, d, lo, hi;
  bool any_prunable_weight = false;
  double sum_caps = 0.0;
  for (std::size_t j = 0; j < idx.size(); ++j) {
    const auto i = static_cast<std::size_t>(idx[j]);
    a.push_back(c.len[i]);
    d.push_back(s[i] * c.len[i]);
    lo.push_back(kc[j]);
    hi.push_back(c.caps[i]);
    sum_caps += c.caps[i];
    if (d.back() > 0.0 && lo.back() < hi.back()) any_prunable_weight = true;
  }
  DEPTHKV_CHECK(budget >= sum_caps || any_prunable_weight,
                policy << ": every prunable layer has robustness score 0, nothing can be pruned proportionally");
  const std::vector<double> x = water_fill(a, d, lo, hi, budget);
  for (std::size_t j = 0; j < idx.size(); ++j) t[static_cast<std::size_t>(idx[j])] = x[j];
}

inline std::vector<double> checked_scores(const std::vector<double>& v, int n, const char* what, const char* policy) {
  DEPTHKV_CHECK(static_cast<int>(v.size()) == n,
                policy << ": " << what << " has " << v.size() << " entries for " << n << " layers");
  for (std::size_t l = 0; l < v.size(); ++l) {
    DEPTHKV_CHECK(std::isfinite(v[l]) && v[l] >= 0.0,
                  policy << ": " << what << " of layer " << l << " is NaN, infinite or negative (" << v[l] << ")");
  }
  return v;
}

inline void check_profile(const SensitivityProfile* profile, int n, const char* policy) {
  DEPTHKV_CHECK(profile != nullptr, "policy '" << policy << "' needs a SensitivityProfile, none was given");
  profile->validate();
  DEPTHKV_CHECK(profile->n_layers() == n, "policy '" << policy << "': the profile has " << profile->n_layers()
                                                      << " layers, the request " << n);
}

inline std::vector<int> allocate_optimal(const AllocContext& c, const std::vector<int>& floors,
                                         const SensitivityProfile& p) {
  struct Cursor {
    LossCurve hull;
    std::size_t seg = 0;
  };
  std::vector<Cursor> cur(static_cast<std::size_t>(c.n));
  std::vector<int> b = floors;
  for (int l = 0; l < c.n; ++l) cur[static_cast<std::size_t>(l)].hull = lower_hull(raw_curve(p, l));
  // Next run of equal marginal gains of layer l: (gain per token, number of tokens).
  auto next_run = [&](int l) -> std::pair<double, long long> {
    const auto i = static_cast<std::size_t>(l);
    const int cap = c.caps[i];
    if (b[i] >= cap) return {0.0, 0};
    const double len = c.len[i];
    Cursor& cu = cur[i];
    const auto& hx = cu.hull.x;
    const auto& hy = cu.hull.y;
    while (cu.seg + 2 < hx.size() && hx[cu.seg + 1] * len <= b[i]) ++cu.seg;
    const double v = hx[cu.seg + 1] * len;  // token position where this hull segment ends
    if (static_cast<double>(b[i]) + 1.0 <= v) {
      const long long end = std::min<long long>(cap, static_cast<long long>(std::floor(v)));
      const double gain = (hy[cu.seg] - hy[cu.seg + 1]) / ((hx[cu.seg + 1] - hx[cu.seg]) * len);
      return {gain, end - b[i]};
    }
    return {cu.hull.eval(b[i] / len) - cu.hull.eval((b[i] + 1) / len), 1};
  };
  struct Item {
    double gain;
    int layer;
    long long count;
  };
  auto worse = [](const Item& x, const Item& y) {  // priority: larger gain, then lower layer
    return x.gain < y.gain || (x.gain == y.gain && x.layer > y.layer);
  };
  std::priority_queue<Item, std::vector<Item>, decltype(worse)> heap(worse);
  for (int l = 0; l < c.n; ++l) {
    const auto r = next_run(l);
    if (r.second > 0) heap.push({r.first, l, r.second});
  }
  long long remaining = c.total - sum_of(b);
  while (remaining > 0) {
    assert(!heap.empty());
    const Item it = heap.top();
    heap.pop();
    const long long take = std::min(it.count, remaining);
    b[static_cast<std::size_t>(it.layer)] += static_cast<int>(take);
    remaining -= take;
    if (remaining == 0) break;
    const auto r = next_run(it.layer);
    if (r.second > 0) heap.push({r.first, it.layer, r.second});
  }
  std::vector<double> t(b.begin(), b.end());
  return round_to_budget(t, floors, c.caps, c.total);
}

/// The loss model of the tier search: layer l's convexified curve f_l read at b / length_l (0 for
/// a layer of length 0, as `predicted_loss`), and a tier's split of its total over its layers.
struct TierModel {
  const AllocContext* c = nullptr;
  const std::vector<int>* floors = nullptr;  ///< the effective floors (safeguard included)
  std::vector<LossCurve> hull;

  TierModel(const AllocContext& ctx, const std::vector<int>& e, const SensitivityProfile& p) : c(&ctx), floors(&e) {
    for (int l = 0; l < ctx.n; ++l) hull.push_back(lower_hull(raw_curve(p, l)));
  }
  double loss(int l, int b) const {
    const auto i = static_cast<std::size_t>(l);
    return c->len[i] > 0 ? hull[i].eval(static_cast<double>(b) / c->len[i]) : 0.0;
  }
  /// The uniform policy's split of `total` over `members` (ascending layers): the common water
  /// level within their floors and caps, then largest remainder (lower layer first).
  std::vector<int> split(const std::vector<int>& members, long long total) const {
    std::vector<int> f, cp, local(members.size());
    for (int l : members) {
      f.push_back((*floors)[static_cast<std::size_t>(l)]);
      cp.push_back(c->caps[static_cast<std::size_t>(l)]);
    }
    std::iota(local.begin(), local.end(), 0);
    std::vector<double> t(members.size(), 0.0);
    uniform_targets(local, f, cp, static_cast<double>(total), t);
    return round_to_budget(t, f, cp, total);
  }
  /// Predicted loss of `members` under `split(members, total)`.
  double tier_loss(const std::vector<int>& members, long long total) const {
    const std::vector<int> b = split(members, total);
    double s = 0.0;
    for (std::size_t i = 0; i < members.size(); ++i) s += loss(members[i], b[i]);
    return s;
  }
};

/// One tier: its layers (ascending), its total and the totals it may take (sum of its floors,
/// sum of its caps), and its predicted loss at `total`.
struct Tier {
  std::vector<int> members;
  long long total = 0, lo = 0, hi = 0;
  double loss = 0.0;
};

/// The tier of the run order[i, j), its total the sum of the unrestricted budgets `opt` over it.
inline Tier make_tier(const TierModel& m, const std::vector<int>& order, const std::vector<int>& opt, int i, int j) {
  Tier t;
  t.members.assign(order.begin() + i, order.begin() + j);
  std::sort(t.members.begin(), t.members.end());
  for (int l : t.members) {
    const auto u = static_cast<std::size_t>(l);
    t.total += opt[u];
    t.lo += (*m.floors)[u];
    t.hi += m.c->caps[u];
  }
  t.loss = m.tier_loss(t.members, t.total);
  return t;
}

/// For every t in [1, k]: the partition of `order` into exactly t contiguous runs of least
/// summed tier loss (each run's total fixed to its unrestricted total), by dynamic programming
/// over the run boundaries. Ties: the earlier boundary.
/// @return parts[t - 1] = the run ends of the best t-run partition (ascending, last = n)
inline std::vector<std::vector<int>> partition_runs(const TierModel& m, const std::vector<int>& order,
                                                    const std::vector<int>& opt, int k) {
  const int n = static_cast<int>(order.size());
  const double inf = std::numeric_limits<double>::infinity();
  auto at = [n](int i, int j) { return static_cast<std::size_t>(i) * static_cast<std::size_t>(n + 1) + static_cast<std::size_t>(j); };
  std::vector<double> cost(at(n, n) + 1, inf);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j <= n; ++j) cost[at(i, j)] = make_tier(m, order, opt, i, j).loss;
  // best[t][j]: least loss of order[0, j) in exactly t runs; from[t][j]: where its last run starts
  std::vector<std::vector<double>> best(static_cast<std::size_t>(k + 1), std::vector<double>(static_cast<std::size_t>(n + 1), inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(static_cast<std::size_t>(n + 1), -1));
  best[0][0] = 0.0;
  for (int t = 1; t <= k; ++t)
    for (int j = t; j <= n; ++j)
      for (int i = t - 1; i < j; ++i) {
        const double v = best[static_cast<std::size_t>(t - 1)][static_cast<std::size_t>(i)] + cost[at(i, j)];
        if (v < best[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)]) {
          best[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)] = v;
          from[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)] = i;
        }
      }
  std::vector<std::vector<int>> parts;
  for (int t = 1; t <= k; ++t) {
    std::vector<int> ends;
    for (int j = n, s = t; s > 0; j = from[static_cast<std::size_t>(s)][static_cast<std::size_t>(j)], --s) ends.push_back(j);
    std::reverse(ends.begin(), ends.end());
    parts.push_back(ends);
  }
  return parts;
}

/// Moves tokens between tiers while that lowers the summed predicted loss: steps of s tokens
/// (s = powers of two, largest first, down to 1), each time the single move (one tier gives s,
/// another takes s, both within their floors and caps) of the largest decrease, until no move
/// of s lowers the loss by more than 1e-12 relative. The totals keep their sum.
inline void balance_tiers(const TierModel& m, std::vector<Tier>& tiers) {
  long long step = 1, span = 0;
  for (const Tier& t : tiers) span = std::max(span, t.hi - t.lo);
  while (step * 2 <= span) step *= 2;
  const std::size_t k = tiers.size();
  for (; step >= 1; step /= 2) {
    for (;;) {
      double sum = 0.0;
      std::vector<double> down(k, std::numeric_limits<double>::infinity()), up(k, std::numeric_limits<double>::infinity());
      for (std::size_t g = 0; g < k; ++g) {
        const Tier& t = tiers[g];
        sum += t.loss;
        if (t.total - step >= t.lo) down[g] = m.tier_loss(t.members, t.total - step);
        if (t.total + step <= t.hi) up[g] = m.tier_loss(t.members, t.total + step);
      }
      double gain = 1e-12 * std::max(1.0, std::abs(sum));
      std::size_t from = k, to = k;
      for (std::size_t a = 0; a < k; ++a)
        for (std::size_t b = 0; b < k; ++b) {
          const double g = tiers[a].loss + tiers[b].loss - down[a] - up[b];  // inf terms never win
          if (a != b && g > gain) std::tie(gain, from, to) = std::make_tuple(g, a, b);
        }
      if (from == k) break;
      tiers[from].total -= step;
      tiers[from].loss = down[from];
      tiers[to].total += step;
      tiers[to].loss = up[to];
    }
  }
}

/// Layers in ascending `opt` order (ties: the lower layer first).
inline std::vector<int> ascending_order(const std::vector<int>& opt) {
  std::vector<int> order(opt.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return opt[static_cast<std::size_t>(a)] < opt[static_cast<std::size_t>(b)]; });
  return order;
}

/// Each layer its own tier, numbered in `ascending_order(opt)` (tiers >= n_layers).
inline std::vector<int> tier_ranks(const std::vector<int>& opt) {
  const std::vector<int> order = ascending_order(opt);
  std::vector<int> rank(opt.size());
  for (std::size_t r = 0; r < order.size(); ++r) rank[static_cast<std::size_t>(order[r])] = static_cast<int>(r);
  return rank;
}

/// The tiered optimal budgets (see "Tiers" in the file comment) from the unrestricted ones `opt`:
/// for each t <= k, the best t-run partition of the layers in ascending `opt` order, its totals
/// balanced; the one of least predicted loss (ties: fewer tiers). Fills `info->tier`.
inline std::vector<int> allocate_tiers(const TierModel& m, const std::vector<int>& opt, int k, AllocationInfo* info) {
  const int n = static_cast<int>(opt.size());
  const std::vector<int> order = ascending_order(opt);
  std::vector<Tier> chosen;
  double chosen_loss = std::numeric_limits<double>::infinity();
  for (const std::vector<int>& ends : partition_runs(m, order, opt, std::min(k, n))) {
    std::vector<Tier> tiers;
    for (std::size_t r = 0, i = 0; r < ends.size(); i = static_cast<std::size_t>(ends[r++]))
      tiers.push_back(make_tier(m, order, opt, static_cast<int>(i), ends[r]));
    balance_tiers(m, tiers);
    double loss = 0.0;
    for (const Tier& t : tiers) loss += t.loss;
    if (loss < chosen_loss) std::tie(chosen, chosen_loss) = std::make_pair(tiers, loss);
  }
  std::vector<int> b(static_cast<std::size_t>(n)), tier(static_cast<std::size_t>(n));
  for (std::size_t g = 0; g < chosen.size(); ++g) {
    const std::vector<int> part = m.split(chosen[g].members, chosen[g].total);
    for (std::size_t i = 0; i < part.size(); ++i) {
      b[static_cast<std::size_t>(chosen[g].members[i])] = part[i];
      tier[static_cast<std::size_t>(chosen[g].members[i])] = static_cast<int>(g);
    }
  }
  if (info) info->tier = tier;
  return b;
}

/// Resets `*info` (when given) to the request's budget, floors and caps.
inline void start_allocation_info(const AllocContext& c, AllocationInfo* info) {
  if (!info) return;
  *info = AllocationInfo{};
  info->total = c.total;
  info->floors = c.floors;
  info->caps = c.caps;
}

/// @return [n] true for the k middle layers (`middle_layers(n, k, policy)`)
/// @throws Error as `middle_layers`
inline std::vector<bool> middle_protection(int n, int k, const char* policy) {
  std::vector<bool> prot(static_cast<std::size_t>(n), false);
  for (int l : middle_layers(n, k, policy)) prot[static_cast<std::size_t>(l)] = true;
  return prot;
}

/// The middle and mlp policies: the middle layers (k = req.n_middle; 2 for mlp) keep their
/// floors' share first (protected), the others split the rest uniformly.
inline std::vector<int> allocate_middle(AllocationPolicy policy, const AllocContext& c, const BudgetRequest& req,
                                        AllocationInfo* info) {
  const std::string name = to_string(policy);
  const int k = policy == AllocationPolicy::kMLP ? 2 : req.n_middle;
  const std::vector<bool> prot = middle_protection(c.n, k, name.c_str());
  return allocate_with_protected(c, c.floors, prot, info,
                                 [&](const std::vector<int>& idx, double budget, std::vector<double>& t) {
                                   uniform_targets(idx, c.floors, c.caps, budget, t);
                                 });
}

/// @return the middle layers the proportional-family `policy` protects: 2, 4, 6 for mlma2/4/6, else 0
inline int mlma_middle_count(AllocationPolicy policy) {
  return policy == AllocationPolicy::kMLMA2 ? 2
         : policy == AllocationPolicy::kMLMA4 ? 4
         : policy == AllocationPolicy::kMLMA6 ? 6 : 0;
}

/// The robustness scores s_l of the proportional family: the request's robustness (proportional),
/// else 1 / (sens_l + eps) from the profile (proportional; sens_l the loss at
/// `sensitivity_keep_ratio`, or the mean over ratios when that is <= 0), else the request's
/// InfoNCE losses (mga, mlma*).
/// @throws Error on missing/NaN/negative scores, a missing or invalid profile, a bad eps or ratio
inline std::vector<double> proportional_scores(AllocationPolicy policy, const AllocContext& c,
                                               const BudgetRequest& req, const SensitivityProfile* profile,
                                               const char* name) {
  if (policy != AllocationPolicy::kProportional) return checked_scores(req.infonce, c.n, "infonce", name);
  if (!req.robustness.empty()) return checked_scores(req.robustness, c.n, "robustness", name);
  check_profile(profile, c.n, name);
  DEPTHKV_CHECK_AS("allocate_proportional_family",
                   std::isfinite(req.sensitivity_eps) && req.sensitivity_eps > 0.0,
                   name << ": sensitivity_eps " << req.sensitivity_eps << " must be > 0");
  const double r = req.sensitivity_keep_ratio;
  DEPTHKV_CHECK_AS("allocate_proportional_family", std::isfinite(r) && r <= 1.0,
                   name << ": sensitivity_keep_ratio " << r << " must be <= 1 (<= 0: mean over ratios)");
  std::vector<double> s;
  for (int l = 0; l < c.n; ++l) {
    const double sens = r > 0.0 ? profile->loss_at(l, r) : profile->loss.row(l).mean();
    s.push_back(1.0 / (sens + req.sensitivity_eps));
  }
  return s;
}

}  // namespace detail

/// Splits a global KV budget across layers. Stateless; all inputs are in the request (and the
/// profile for the curve-based policies). See the file comment for the policies' formulas.
///
/// @code
/// depthkv::BudgetRequest req;
/// req.lengths = {512, 512, 512, 512};
/// req.total_tokens = 1024;
/// auto keep = depthkv::BudgetAllocator().allocate(depthkv::AllocationPolicy::kPyramid, req);
/// @endcode
class BudgetAllocator {
 public:
  /// @param policy the split rule
  /// @param req lengths, budget, bounds and policy parameters
  /// @param profile the loss curves (needed by optimal, and by proportional without
  ///        `req.robustness`; ignored otherwise); its layer count must equal `req.lengths.size()`
  /// @param info optional: filled with what the allocation did (effective floors, lifted cap, ...)
  /// @return per-layer keep counts: sum == the budget, floors <= keep <= caps
  /// @throws Error on an infeasible or malformed request (floors above the budget, budget above
  ///         the sum of caps, a cap above the length, a floor above a cap, both or neither of
  ///         total_tokens/keep_ratio, a missing or invalid profile, a profile/lengths layer-count
  ///         mismatch, missing/NaN/negative robustness or InfoNCE scores, more middle layers than
  ///         layers, a bad pyramid window/beta or pruning cap, negative tiers, tiers > 0 with a
  ///         policy other than optimal)
  std::vector<int> allocate(AllocationPolicy policy, const BudgetRequest& req,
                            const SensitivityProfile* profile = nullptr, AllocationInfo* info = nullptr) const {
    const detail::AllocContext c = detail::prepare_request(req);
    DEPTHKV_CHECK(req.tiers == 0 || policy == AllocationPolicy::kOptimal,
                  "tiers " << req.tiers << ": only the optimal policy takes tiers, not '" << to_string(policy) << "'");
    detail::start_allocation_info(c, info);
    switch (policy) {
      case AllocationPolicy::kUniform: return detail::allocate_uniform(c, c.floors);
      case AllocationPolicy::kPyramid: return detail::allocate_pyramid(c, req.window, req.beta);
      case AllocationPolicy::kMiddle:
      case AllocationPolicy::kMLP: return detail::allocate_middle(policy, c, req, info);
      case AllocationPolicy::kOptimal: return allocate_optimal_policy(c, req, profile, info);
      case AllocationPolicy::kProportional:
      case AllocationPolicy::kMGA:
      case AllocationPolicy::kMLMA2:
      case AllocationPolicy::kMLMA4:
      case AllocationPolicy::kMLMA6:
        return allocate_proportional_family(policy, c, req, profile, info);
      case AllocationPolicy::kHeadOptimal:
        DEPTHKV_FAIL("policy head-optimal gives per-head budgets: use head_optimal_budgets (head_budget.hpp)");
    }
    DEPTHKV_FAIL("unknown allocation policy " << static_cast<int>(policy));
    return {};
  }

 private:
  /// The optimal policy: the curve-optimal split (`detail::allocate_optimal`) above the safeguard
  /// floors, restricted to `req.tiers` tiers when that is in [1, n_layers) (`detail::allocate_tiers`),
  /// or the uniform split (one tier) when those floors exceed the budget.
  /// @throws Error on a missing or invalid profile
  static std::vector<int> allocate_optimal_policy(const detail::AllocContext& c, const BudgetRequest& req,
                                                  const SensitivityProfile* profile, AllocationInfo* info) {
    detail::check_profile(profile, c.n, to_string(AllocationPolicy::kOptimal).c_str());
    const std::vector<int> e = detail::safeguard_floors(c, req.min_tokens, req.safeguard_shrink);
    if (info) info->floors = e;
    if (detail::sum_of(e) > c.total) {
      std::vector<int> b = fallback(c, info);
      if (info && req.tiers > 0) info->tier.assign(b.size(), 0);
      return b;
    }
    std::vector<int> b = detail::allocate_optimal(c, e, *profile);
    if (req.tiers > 0 && req.tiers < c.n) return detail::allocate_tiers(detail::TierModel(c, e, *profile), b, req.tiers, info);
    if (info && req.tiers > 0) info->tier = detail::tier_ranks(b);
    return b;
  }

  /// The proportional family (proportional, mga, mlma2/4/6): robustness scores s_l (the request's,
  /// 1 / (sens_l + eps) from the profile, or the InfoNCE losses), protected layers (layer 0 and
  /// the middle layers of mlma*), the safeguard floors, then the capped proportional rule on the
  /// unprotected layers (see the file comment).
  static std::vector<int> allocate_proportional_family(AllocationPolicy policy, const detail::AllocContext& c,
                                                       const BudgetRequest& req,
                                                       const SensitivityProfile* profile,
                                                       AllocationInfo* info) {
    const std::string name = to_string(policy);
    DEPTHKV_CHECK(std::isfinite(req.max_prune_ratio) && req.max_prune_ratio >= 0.0 && req.max_prune_ratio <= 1.0,
                  name << ": max_prune_ratio " << req.max_prune_ratio << " is outside [0, 1]");
    const std::vector<double> s = detail::proportional_scores(policy, c, req, profile, name.c_str());
    if (info) info->scores = s;
    std::vector<bool> prot = detail::middle_protection(c.n, detail::mlma_middle_count(policy), name.c_str());
    if (req.protect_layer0 && c.n > 0) prot[0] = true;
    const std::vector<int> e = detail::safeguard_floors(c, req.min_tokens, req.safeguard_shrink);
    if (info) info->floors = e;
    if (detail::sum_of(e) > c.total) return fallback(c, info);
    return detail::allocate_with_protected(
        c, e, prot, info, [&](const std::vector<int>& idx, double budget, std::vector<double>& t) {
          detail::proportional_targets(c, e, s, req.max_prune_ratio, idx, budget, t, info, name.c_str());
        });
  }

  static std::vector<int> fallback(const detail::AllocContext& c, AllocationInfo* info) {
    if (info) {
      info->safeguard_fallback = true;
      info->floors = c.floors;
    }
    return detail::allocate_uniform(c, c.floors);
  }
};

/// Predicted total loss sum_l f_l(budgets_l / lengths_l) of a budget vector under a profile
/// (the additive model the optimal policy minimises).
/// @param profile the loss curves (validated)
/// @param budgets per-layer keep counts, 0 <= budgets_l <= lengths_l
/// @param lengths per-layer lengths the budgets are taken from (a layer of length 0 adds 0)
/// @param convexified true: the lower convex hull of each curve (what `optimal` minimises);
///        false: the measured piecewise-linear curve
/// @return the predicted total loss
/// @throws Error on a size mismatch, a budget outside [0, length] or an invalid profile
inline double predicted_loss(const SensitivityProfile& profile, const std::vector<int>& budgets,
                             const std::vector<int>& lengths, bool convexified = true) {
  profile.validate();
  DEPTHKV_CHECK(budgets.size() == lengths.size() && static_cast<int>(lengths.size()) == profile.n_layers(),
                "sizes differ: " << budgets.size() << " budgets, " << lengths.size() << " lengths, "
                                 << profile.n_layers() << " profile layers");
  double total = 0.0;
  for (int l = 0; l < profile.n_layers(); ++l) {
    const auto i = static_cast<std::size_t>(l);
    DEPTHKV_CHECK(budgets[i] >= 0 && budgets[i] <= lengths[i],
                  "layer " << l << ": budget " << budgets[i] << " outside [0, " << lengths[i] << "]");
    if (lengths[i] == 0) continue;
    detail::LossCurve curve = detail::raw_curve(profile, l);
    if (convexified) curve = detail::lower_hull(curve);
    total += curve.eval(static_cast<double>(budgets[i]) / lengths[i]);
  }
  return total;
}

}  // namespace depthkv
