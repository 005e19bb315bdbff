#pragma once
/// @file scorer_config.hpp
/// @brief What a token scorer computes: `ScorerKind` (the built-in scorers, with their short
/// names), the SnapKV `Pooling`, and `ScorerConfig`. Shared by the host `TokenScorer`
/// (token_scorer.hpp, where the formulas are) and the GPU score kernels (cuda/score.cuh), which
/// compute built-in kinds only. Scorers registered at run time (scorer_registry.hpp) are named
/// by `ScorerConfig::name`; `scorer_name` and `scorer_config` (scorer_registry.hpp) map names
/// of both to configurations and back.

#include <string>

#include "depthkv/error.hpp"

namespace depthkv {

/// Which built-in token-importance score a `TokenScorer` computes (formulas: token_scorer.hpp).
enum class ScorerKind { kH2O, kH2OValueL1, kH2OValueL2, kSnapKV, kTOVA, kKeyNorm, kKeyDiff, kSnapKVKeyDiff };

/// Short name of a scorer kind: "h2o", "h2o-v1", "h2o-v2", "snapkv", "tova", "knorm", "keydiff",
/// "snapkv-keydiff".
inline std::string to_string(ScorerKind kind) {
  switch (kind) {
    case ScorerKind::kH2O:
      return "h2o";
    case ScorerKind::kH2OValueL1:
      return "h2o-v1";
    case ScorerKind::kH2OValueL2:
      return "h2o-v2";
    case ScorerKind::kSnapKV:
      return "snapkv";
    case ScorerKind::kTOVA:
      return "tova";
    case ScorerKind::kKeyNorm:
      return "knorm";
    case ScorerKind::kKeyDiff:
      return "keydiff";
    case ScorerKind::kSnapKVKeyDiff:
      return "snapkv-keydiff";
  }
  return "unknown";
}

/// Inverse of `to_string(ScorerKind)` (built-in names only; `scorer_config`, scorer_registry.hpp,
/// also knows the registered scorers).
/// @throws Error on an unknown name
inline ScorerKind parse_scorer_kind(const std::string& name) {
  for (ScorerKind k : {ScorerKind::kH2O, ScorerKind::kH2OValueL1, ScorerKind::kH2OValueL2,
                       ScorerKind::kSnapKV, ScorerKind::kTOVA, ScorerKind::kKeyNorm, ScorerKind::kKeyDiff,
                       ScorerKind::kSnapKVKeyDiff})
    if (to_string(k) == name) return k;
  DEPTHKV_FAIL("unknown scorer kind '" << name
                                       << "' (expected h2o, h2o-v1, h2o-v2, snapkv, tova, knorm, keydiff or snapkv-keydiff)");
}

/// Pooling of SnapKV scores along the slots.
enum class Pooling { kNone, kMax, kAvg };

/// Configuration of a `TokenScorer`.
struct ScorerConfig {
  /// The built-in scorer (ignored when `name` is set).
  ScorerKind kind = ScorerKind::kH2O;
  /// SnapKV observation window: the last `window` query positions (>= 1; checked for every kind).
  /// The default is every surface's (the CLI's `--obs-window`, Python's `DEFAULT_OBS_WINDOW`).
  int window = 16;
  /// SnapKV pooling kernel (odd, >= 1; checked for every kind).
  int kernel = 7;
  /// SnapKV pooling (ignored by the other kinds).
  Pooling pooling = Pooling::kMax;
  /// Output-aware rescaling (CriticalKV): the attention-based score of every slot is multiplied
  /// by the L1 norm of the value's contribution to the attention output, (s_j + 1e-4) * n_j with
  /// n_j the mean over the KV head's query heads q of ||W_o^{(q)} V_j||_1 (formula, shapes and
  /// GQA rule: token_scorer.hpp). For h2o, snapkv and tova only; `TokenScorer::scores` then
  /// needs the layer's output projection.
  bool output_aware = false;
  /// Lookahead observation (>= 0; 0 = off): the scorer observes the attention of the model's
  /// own next `lookahead` tokens, greedy-decoded after the context on the full cache and then
  /// removed from it, instead of the context's queries (`observe_lookahead`, lookahead.hpp, runs
  /// it for any engine through a step function). H2O then sums the
  /// lookahead rows, SnapKV takes all of them as its observation window (`window` is not used),
  /// TOVA the last one. For h2o, h2o-v1, h2o-v2, snapkv and tova. As Lookahead Q-Cache (Wang et
  /// al. 2025, arXiv 2505.20334) does with pseudo queries: the queries that read the pruned cache
  /// come after the context, and these are the model's best guess of them.
  int lookahead = 0;
  /// With a lookahead: the weight w of the context's own observation window beside the
  /// lookahead's queries (>= 0, finite; 0 = off: the lookahead's queries only; > 0 needs
  /// lookahead > 0). The scorer then also observes the context's queries, and slot j of a KV
  /// head scores
  ///     s_j = l_j + w * (L / C) * c_j      (L = sum_t l_t, or 1 when 0; c_j = 0 when C = 0)
  /// where l_j is the kind's lookahead score (after pooling), c_j the SnapKV score of the
  /// context's last `window` query positions pooled with `kernel` and `pooling` (for every kind),
  /// and L, C their sums over the head's slots: both parts carry the same mass at w = 1, so a token
  /// that SnapKV's own window ranks high stays high whatever the lookahead attends to (LAQ++,
  /// Wang et al. 2025, arXiv 2505.20334, combines the two query sets). The output-aware rescaling
  /// applies to s_j. JSON and spec name: "context_weight".
  double context_weight = 0.0;
  /// Span pooling: before the selection every slot's score becomes the largest score of the
  /// slots of its KV head that hold the same span (a word or a digit run: `PolicyData::span_start`
  /// says which positions form one), so that a number or a name is kept or dropped whole, up to
  /// the budget's edge. JSON and spec name: "span_pooling" (written when true).
  bool span_pooling = false;
  /// A registered scorer's name (`register_scorer`, scorer_registry.hpp); empty: the built-in
  /// `kind`. The other fields are passed to the registered factory, and `TokenScorer` checks
  /// `window`, `kernel`, `output_aware` and `lookahead` for every scorer.
  std::string name{};
};

/// The epsilon of the output-aware rescaling (s_j + kOutputAwareEpsilon) * n_j (kvpress's
/// CriticalKVPress default).
constexpr float kOutputAwareEpsilon = 1e-4f;

}  // namespace depthkv
