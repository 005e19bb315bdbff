#pragma once
/// @file prune_spec.hpp
/// @brief `PruneSpec`: the whole description of how a sequence's KV cache is pruned (Eigen only).
///
/// A spec names
/// - the scorer (`ScorerConfig`: kind, SnapKV window/kernel/pooling, output-aware, lookahead);
/// - the protection (sink and recent tokens every head keeps, inside the budget);
/// - the budget (`Budget`: a keep ratio of the tokens seen, or a token total over all layers);
/// - the allocation policy (`AllocationPolicy`, head-optimal included) and, for optimal, the
///   number of tiers of its layer budgets (`tiers`, budget_allocator.hpp "Tiers"; 0: no limit);
/// - the head split (`HeadSplitSpec`: how each layer's budget is divided across its KV heads);
/// - the schedule (`ScheduleSpec`: oneshot, chunked or decode, with chunk and interval);
/// - the safeguard floor of the curve-based policies (`Safeguard`).
/// `validate()` checks every field once and names the bad one. The JSON form (profile_io.hpp,
/// `prune_spec_to_json` / `prune_spec_from_json`) is also a profile's record of the selection
/// its curves were measured under. What a spec needs besides itself (the profile's curves, the
/// output projections of an output-aware scorer) is passed beside it, never inside it.
///
/// @code
/// depthkv::PruneSpec spec;
/// spec.scorer = depthkv::scorer_config("snapkv");         // a built-in or registered scorer
/// spec.protection = {4, 16};
/// spec.budget = depthkv::Budget::keep(0.2);
/// spec.policy = depthkv::AllocationPolicy::kOptimal;
/// spec.validate();                                         // throws depthkv::Error naming the field
/// depthkv::BudgetRequest req = spec.budget_request(std::vector<int>(n_layers, 384));
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "depthkv/budget_allocator.hpp"
#include "depthkv/error.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/scorer_registry.hpp"
#include "depthkv/selection.hpp"
#include "depthkv/sensitivity_profile.hpp"

namespace depthkv {

/// "none", "max" or "avg".
inline std::string to_string(Pooling p) {
  return p == Pooling::kNone ? "none" : p == Pooling::kAvg ? "avg" : "max";
}

/// Inverse of `to_string(Pooling)`.
/// @throws Error on another name
inline Pooling parse_pooling(const std::string& name) {
  for (Pooling p : {Pooling::kNone, Pooling::kMax, Pooling::kAvg})
    if (to_string(p) == name) return p;
  DEPTHKV_FAIL("unknown pooling '" << name << "' (expected none, max or avg)");
}

/// The global budget: a keep ratio r of the tokens seen (B = llround(r * sum of the layers'
/// lengths)) or a fixed total of B tokens over all layers.
class Budget {
 public:
  /// A keep ratio (valid in [0, 1]; `PruneSpec::validate` checks it).
  static Budget keep(double ratio) {
    Budget b;
    b.is_ratio_ = true;
    b.ratio_ = ratio;
    return b;
  }
  /// A token total over all layers (valid when >= 0).
  static Budget tokens(long long total) {
    Budget b;
    b.is_ratio_ = false;
    b.total_ = total;
    return b;
  }
  bool is_ratio() const { return is_ratio_; }
  /// The keep ratio (only when `is_ratio()`).
  double ratio() const { return ratio_; }
  /// The token total (only when `!is_ratio()`).
  long long total_tokens() const { return total_; }
  /// @throws Error on a ratio outside [0, 1] or NaN, or a negative total (naming `budget`)
  void validate() const {
    if (is_ratio_)
      DEPTHKV_CHECK(std::isfinite(ratio_) && ratio_ >= 0.0 && ratio_ <= 1.0,
                    "budget: keep ratio " << ratio_ << " is outside [0, 1]");
    else
      DEPTHKV_CHECK(total_ >= 0, "budget: total_tokens " << total_ << " is negative");
  }
  /// Sets `req.keep_ratio` or `req.total_tokens` (and the other to unset).
  void apply_to(BudgetRequest& req) const {
    req.keep_ratio = is_ratio_ ? ratio_ : -1.0;
    req.total_tokens = is_ratio_ ? -1 : total_;
  }
  bool operator==(const Budget& o) const {
    return is_ratio_ == o.is_ratio_ && (is_ratio_ ? ratio_ == o.ratio_ : total_ == o.total_);
  }
  bool operator!=(const Budget& o) const { return !(*this == o); }

 private:
  bool is_ratio_ = true;
  double ratio_ = 1.0;
  long long total_ = 0;
};

/// When a sequence is evicted: once after the whole context (oneshot), after every prefill
/// chunk (chunked), or after every chunk and every `interval` decoded tokens (decode).
enum class ScheduleMode { kOneshot, kChunked, kDecode };

/// "oneshot", "chunked" or "decode".
inline std::string to_string(ScheduleMode m) {
  return m == ScheduleMode::kChunked ? "chunked" : m == ScheduleMode::kDecode ? "decode" : "oneshot";
}

/// Inverse of `to_string(ScheduleMode)`.
/// @throws Error on another name
inline ScheduleMode parse_schedule_mode(const std::string& name) {
  for (ScheduleMode m : {ScheduleMode::kOneshot, ScheduleMode::kChunked, ScheduleMode::kDecode})
    if (to_string(m) == name) return m;
  DEPTHKV_FAIL("unknown schedule '" << name << "' (expected oneshot, chunked or decode)");
}

/// The schedule of evictions (`EvictionSchedule`, eviction_schedule.hpp).
struct ScheduleSpec {
  ScheduleMode mode = ScheduleMode::kOneshot;
  int chunk = 1024;  ///< prefill chunk (>= 1); chunked and decode evict after each
  int interval = 1;  ///< chunked, decode: evict once this many tokens were appended (>= 1)
  bool operator==(const ScheduleSpec& o) const { return mode == o.mode && chunk == o.chunk && interval == o.interval; }
};

/// The safeguard floor of the curve-based policies (`BudgetRequest::min_tokens`): automatic
/// (n_sink + n_recent + `margin` per layer, the margin halved until every floor fits the
/// budget: `BudgetRequest::safeguard_shrink`), off, or a fixed number of tokens (the uniform
/// allocation when the floors do not fit).
struct Safeguard {
  enum class Mode { kAuto, kOff, kTokens };
  Mode mode = Mode::kAuto;
  int tokens = 0;                   ///< kTokens: the floor per layer (>= 1)
  int margin = kSafeguardMargin;    ///< kAuto: tokens above the protected ones (>= 0)

  /// From the safeguard's minimum tokens per layer as one integer: -1 automatic, 0 off, N >= 1
  /// a floor of N tokens.
  static Safeguard from_min_tokens(int min_tokens) {
    Safeguard s;
    s.mode = min_tokens < 0 ? Mode::kAuto : min_tokens == 0 ? Mode::kOff : Mode::kTokens;
    s.tokens = min_tokens > 0 ? min_tokens : 0;
    return s;
  }
  /// The inverse of `from_min_tokens`: this safeguard's minimum tokens per layer as one integer
  /// (-1 automatic, 0 off, N tokens).
  int min_tokens() const { return mode == Mode::kAuto ? -1 : mode == Mode::kOff ? 0 : tokens; }
  /// The floor per layer under `prot` (0: off).
  int floor(const Protection& prot) const {
    return mode == Mode::kAuto ? prot.n_sink + prot.n_recent + margin : mode == Mode::kOff ? 0 : tokens;
  }
  bool operator==(const Safeguard& o) const { return mode == o.mode && tokens == o.tokens && margin == o.margin; }
};

/// How each layer's budget is split across its KV heads (head_budget.hpp).
struct HeadSplitSpec {
  HeadAllocation mode = HeadAllocation::kUniform;
  double alpha = kDefaultHeadAlpha;  ///< kAdaptive: each head's floor fraction, in [0, 1]
  bool operator==(const HeadSplitSpec& o) const { return mode == o.mode && alpha == o.alpha; }
};

namespace detail {
/// The one check of each bound (the spec's and the structs built from it call these).
inline void check_head_alpha(double alpha) {
  DEPTHKV_CHECK(std::isfinite(alpha) && alpha >= 0.0 && alpha <= 1.0, "head_split.alpha " << alpha << " outside [0, 1]");
}
inline void check_protection(const Protection& p) {
  DEPTHKV_CHECK(p.n_sink >= 0 && p.n_recent >= 0,
                "protection must be >= 0, got n_sink " << p.n_sink << ", n_recent " << p.n_recent);
}
inline void check_interval(int interval) {
  DEPTHKV_CHECK(interval >= 1, "schedule.interval must be >= 1, got " << interval);
}
}  // namespace detail

/// The whole description of how a sequence is pruned (see the file comment).
struct PruneSpec {
  ScorerConfig scorer;                                    ///< the token scorer of every layer
  Protection protection{4, 16};                           ///< tokens every head keeps (inside the budget; the CLI's and Python's defaults)
  Budget budget = Budget::keep(1.0);                      ///< the global budget
  AllocationPolicy policy = AllocationPolicy::kUniform;   ///< the split across layers (or heads)
  int tiers = 0;                                          ///< optimal: at most this many tiers (0: no limit)
  HeadSplitSpec head_split;                               ///< the split of a layer's budget across heads
  ScheduleSpec schedule;                                  ///< when evictions happen
  Safeguard safeguard;                                    ///< the curve-based policies' floor

  /// Checks every field once.
  /// @throws Error naming the first bad field and its bound: scorer.window < 1, an even or
  ///   non-positive scorer.kernel, scorer.lookahead < 0, scorer.context_weight negative, not
  ///   finite or > 0 without a lookahead, output-aware or lookahead with a kind
  ///   that has none, negative protection, a budget outside its range, head_split.alpha outside
  ///   [0, 1], schedule.chunk or schedule.interval < 1, a lookahead with a chunked or decode
  ///   schedule (the lookahead needs the whole context first), safeguard.tokens < 1 in kTokens
  ///   mode, a negative safeguard.margin, negative tiers or tiers > 0 with a policy other than
  ///   optimal
  void validate() const {
    DEPTHKV_CHECK(scorer.window >= 1, "scorer.window must be >= 1, got " << scorer.window);
    DEPTHKV_CHECK(scorer.kernel >= 1 && scorer.kernel % 2 == 1, "scorer.kernel must be odd and >= 1, got " << scorer.kernel);
    DEPTHKV_CHECK(scorer.lookahead >= 0, "scorer.lookahead must be >= 0, got " << scorer.lookahead);
    DEPTHKV_CHECK(scorer.context_weight >= 0.0 && std::isfinite(scorer.context_weight),
                  "scorer.context_weight must be finite and >= 0, got " << scorer.context_weight);
    DEPTHKV_CHECK(scorer.context_weight == 0.0 || scorer.lookahead > 0,
                  "scorer.context_weight " << scorer.context_weight << " needs scorer.lookahead > 0");
    if (scorer.name.empty()) {  // a registered scorer's traits are checked when its rule is made
      const bool attention_kind = scorer.kind == ScorerKind::kH2O || scorer.kind == ScorerKind::kSnapKV ||
                                  scorer.kind == ScorerKind::kTOVA;
      DEPTHKV_CHECK(!scorer.output_aware || attention_kind,
                    "scorer.output_aware: only for h2o, snapkv and tova, not " << to_string(scorer.kind));
      DEPTHKV_CHECK(scorer.lookahead == 0 || (scorer.kind != ScorerKind::kKeyNorm && scorer.kind != ScorerKind::kKeyDiff),
                    "scorer.lookahead: " << to_string(scorer.kind) << " observes no attention");
    }
    detail::check_protection(protection);
    budget.validate();
    detail::check_head_alpha(head_split.alpha);
    DEPTHKV_CHECK(schedule.chunk >= 1, "schedule.chunk must be >= 1, got " << schedule.chunk);
    detail::check_interval(schedule.interval);
    DEPTHKV_CHECK(scorer.lookahead == 0 || schedule.mode == ScheduleMode::kOneshot,
                  "schedule." << to_string(schedule.mode) << " evicts while the context is read; scorer.lookahead ("
                              << scorer.lookahead << ") needs the whole context first: use schedule oneshot");
    DEPTHKV_CHECK(safeguard.mode != Safeguard::Mode::kTokens || safeguard.tokens >= 1,
                  "safeguard.tokens must be >= 1, got " << safeguard.tokens);
    DEPTHKV_CHECK(safeguard.margin >= 0, "safeguard.margin must be >= 0, got " << safeguard.margin);
    DEPTHKV_CHECK(tiers >= 0, "tiers must be >= 0 (0: no limit), got " << tiers);
    DEPTHKV_CHECK(tiers == 0 || policy == AllocationPolicy::kOptimal,
                  "tiers (" << tiers << "): only the optimal policy takes tiers, not " << to_string(policy));
  }

  /// The allocator request for layers of `lengths` tokens: the budget, floors from the
  /// protection (`protection_floors`), the safeguard floor, pyramid's window (the scorer's
  /// observation window) and the tiers.
  BudgetRequest budget_request(const std::vector<int>& lengths) const {
    BudgetRequest req;
    req.lengths = lengths;
    budget.apply_to(req);
    req.floors = protection_floors(lengths, protection);
    req.window = scorer.window;
    req.min_tokens = safeguard.floor(protection);
    req.safeguard_shrink = safeguard.mode == Safeguard::Mode::kAuto;
    req.tiers = tiers;
    return req;
  }

  /// Whether the output-aware / head-split settings differ from the defaults (false, uniform,
  /// kDefaultHeadAlpha): only then does the selection record write and describe them.
  bool has_head_settings() const {
    return scorer.output_aware || head_split.mode != HeadAllocation::kUniform || head_split.alpha != kDefaultHeadAlpha;
  }
  /// Whether the token selection (protection, scorer window/kernel/pooling, output-aware, head
  /// split, lookahead) equals `o`'s; the scorer kind, context weight, budget, policy, schedule
  /// and safeguard are not compared (curves measured with the lookahead alone serve any context
  /// weight: it blends the scores, the budgets stay the curves').
  bool same_selection(const PruneSpec& o) const {
    return protection.n_sink == o.protection.n_sink && protection.n_recent == o.protection.n_recent &&
           scorer.window == o.scorer.window && scorer.kernel == o.scorer.kernel && scorer.pooling == o.scorer.pooling &&
           scorer.output_aware == o.scorer.output_aware && head_split == o.head_split &&
           scorer.lookahead == o.scorer.lookahead;
  }
  /// "sinks=S recent=R obs_window=W kernel=K pooling=P", followed by
  /// " output_aware=0|1 head_alloc=A head_alpha=X" when `has_head_settings()` and
  /// " lookahead=G" when G > 0 and " context_weight=W" when W > 0.
  std::string describe_selection() const {
    std::ostringstream os;
    os << "sinks=" << protection.n_sink << " recent=" << protection.n_recent << " obs_window=" << scorer.window
       << " kernel=" << scorer.kernel << " pooling=" << to_string(scorer.pooling);
    if (has_head_settings())
      os << " output_aware=" << (scorer.output_aware ? 1 : 0) << " head_alloc=" << to_string(head_split.mode)
         << " head_alpha=" << head_split.alpha;
    if (scorer.lookahead > 0) os << " lookahead=" << scorer.lookahead;
    if (scorer.context_weight > 0.0) os << " context_weight=" << scorer.context_weight;
    if (scorer.span_pooling) os << " span_pooling=1";
    return os.str();
  }
};

/// What a spec's policy reads besides the spec (pointers: the caller owns the curves).
struct PolicyData {
  const SensitivityProfile* layer_curves = nullptr;  ///< proportional (without robustness), optimal
  const SensitivityProfile* head_curves = nullptr;   ///< head-optimal: n_layers * n_kv_heads rows (l * H + h)
  int n_kv_heads = 0;                                ///< the head curves' KV heads per layer
  std::vector<double> infonce;                       ///< mga, mlma*: per-layer InfoNCE losses
  /// The model's per-layer sliding windows (0: a global layer; `LlamaConfig::layer_window`):
  /// a local layer is capped at window - 1 tokens (`window_caps`). Empty: no local layers.
  std::vector<int> layer_window;
  /// `scorer.span_pooling`: per original position p, the first position of the span holding p
  /// (span_start[p] <= p, non-decreasing; positions at or beyond its size are spans of their own),
  /// e.g. `llama::token_span_starts`. Must outlive its use.
  const std::vector<std::int32_t>* span_start = nullptr;
};

/// A keep ratio whose tokens (llround(ratio x sum(lengths))) fall below the protected ones (the
/// sum of `protection_floors(lengths, spec.protection)`) becomes a token total of the protected
/// ones, as `keep_tokens` raises a schedule's targets: a short context keeps its protected tokens
/// instead of an infeasible request. A token total is left as it is.
/// @return whether the budget was raised
inline bool raise_to_protection(PruneSpec& spec, const std::vector<int>& lengths) {
  if (!spec.budget.is_ratio()) return false;
  long long held = 0, floors = 0;
  for (int n : lengths) held += n;
  for (int f : protection_floors(lengths, spec.protection)) floors += f;
  if (std::llround(spec.budget.ratio() * static_cast<double>(held)) >= floors) return false;
  spec.budget = Budget::tokens(floors);
  return true;
}

/// The budgets of one allocation: per layer (`layers`, every head of layer l keeps layers[l]),
/// and with head-optimal per head too (`heads[l][h]`; `layers[l]` is then the mean, rounded).
/// With `PruneSpec::tiers` > 0, `tier[l]` is layer l's tier (`AllocationInfo::tier`); else empty.
struct Allocation {
  std::vector<int> layers;
  std::vector<std::vector<int>> heads;
  std::vector<int> tier;
};

/// Allocates `spec`'s budget over layers of `lengths` tokens (`PruneSpec::budget_request` plus
/// `data`, local layers capped by `data.layer_window`): `BudgetAllocator` for a layer policy,
/// `head_optimal_budgets` for head-optimal.
/// @throws Error on an invalid spec, a policy without the data it reads, or an infeasible request
inline Allocation allocate(const PruneSpec& spec, const std::vector<int>& lengths, const PolicyData& data) {
  spec.validate();
  BudgetRequest req = spec.budget_request(lengths);
  req.infonce = data.infonce;
  cap_to_windows(req, data.layer_window);
  Allocation a;
  if (!is_head_policy(spec.policy)) {
    AllocationInfo info;
    a.layers = BudgetAllocator().allocate(spec.policy, req, data.layer_curves, &info);
    a.tier = info.tier;
    return a;
  }
  DEPTHKV_CHECK(data.head_curves != nullptr && data.n_kv_heads >= 1, "policy head-optimal needs head curves");
  a.heads = head_optimal_budgets(*data.head_curves, data.n_kv_heads, req);
  a.layers = detail::mean_per_layer(a.heads);
  return a;
}

/// Field-for-field equality of two specs.
inline bool operator==(const PruneSpec& a, const PruneSpec& b) {
  return a.same_selection(b) && a.scorer.context_weight == b.scorer.context_weight &&
         a.scorer.span_pooling == b.scorer.span_pooling &&
         scorer_name(a.scorer) == scorer_name(b.scorer) && a.budget == b.budget && a.policy == b.policy &&
         a.tiers == b.tiers &&
         a.schedule == b.schedule && a.safeguard == b.safeguard;
}
inline bool operator!=(const PruneSpec& a, const PruneSpec& b) { return !(a == b); }

}  // namespace depthkv
