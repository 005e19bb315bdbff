#pragma once
/// @file token_scorer.hpp
/// @brief `TokenScorer`: per-layer token-importance accumulators fed with attention
/// probabilities (GQA-aware), producing the `LayerScores` (selection.hpp) that eviction reads.
/// `TokenScorer` checks the arguments and keeps the bookkeeping (positions, coverage, the
/// output-aware rescaling); the score itself is a `ScoringRule` (scoring_rule.hpp), one type per
/// scorer: the built-in ones below (scorers/*.hpp) or one registered by name (scorer_registry.hpp).
///
/// ## Built-in scorers (`ScorerKind`; s_j is the score of slot j of one KV head; a_ij the
/// attention probability of query i on slot j; the sums over i run over every observed query
/// position and over every query head of the KV head's group)
/// - `kH2O` ("h2o"), H2O (Zhang et al. 2023, arXiv 2306.14048) as used by DepthKV
///   (arXiv 2604.24647): cumulative attention  s_j = sum_i a_ij.
/// - `kH2OValueL1` ("h2o-v1"), value-aware H2O (DepthKV):  s_j = ||V_j||_1 * sum_i a_ij.
/// - `kH2OValueL2` ("h2o-v2"), value-aware H2O (DepthKV):  s_j = ||V_j||_2 * sum_i a_ij.
/// - `kSnapKV` ("snapkv"), SnapKV (Li et al. 2024, arXiv 2404.14469): the attention of the last
///   `window` observed query positions, u_j = sum_{i in window} a_ij, then 1-D pooling along the
///   slots with an odd `kernel` and `padding = kernel / 2`, same-size output, as SnapKV's
///   `F.max_pool1d` / `F.avg_pool1d` (PyTorch defaults):
///   max: s_j = max_{|t - j| <= kernel/2, 0 <= t < n} u_t (the window is clipped at the edges);
///   avg: s_j = (sum_{|t - j| <= kernel/2, 0 <= t < n} u_t) / kernel (`count_include_pad=True`:
///   zero padding, so edge windows still divide by `kernel`); none: s_j = u_j.
/// - `kTOVA` ("tova"), TOVA (Oren et al. 2024, arXiv 2401.06104): the attention of the last
///   observed query position only, s_j = a_{last,j} (summed over the group's query heads).
/// - `kKeyNorm` ("knorm"), key-norm (Devoto et al. 2024, arXiv 2406.11430): s_j = -||K_j||_2
///   (a low key norm means an important token); needs no observations.
/// - `kKeyDiff` ("keydiff"), KeyDiff (Park et al. 2025, arXiv 2504.15364; kvpress's
///   KeyDiffPress): s_j = -cos(K_j, a) with a = (1/n) sum_t K_t / ||K_t|| over the KV head's n
///   slots (a key pointing away from the head's mean key direction is kept); needs no
///   observations. The scores of one eviction depend on the slots it sees (the mean).
/// - `kSnapKVKeyDiff` ("snapkv-keydiff"): s_j = max(r^S_j, r^K_j) / n with r^S_j and r^K_j the
///   ranks (0 .. n-1, ascending by score, ties by slot) of slot j among the head's n slots under
///   SnapKV (its window, kernel and pooling) and under KeyDiff: a top-k keeps the slots either
///   rule ranks high (the context end's attention and the keys far from the head's mean). Reads
///   the keys; observes as SnapKV.
///
/// ## Lookahead (`ScorerConfig::lookahead` = G > 0)
/// The scorer is fed the attention rows of the G lookahead queries only (`observe_lookahead`,
/// lookahead.hpp): the sums over i above run over those G positions, SnapKV's window is G
/// (instead of `window`), TOVA's last position is the last lookahead token.
/// With `ScorerConfig::context_weight` w > 0 the scorer observes the context's queries too (rows
/// before `begin_lookahead`, which `observe_lookahead` calls) and adds their SnapKV window score,
/// scaled to the lookahead score's mass: s_j = l_j + w * (L / C) * c_j (scorer_config.hpp).
///
/// ## Output-aware rescaling (`ScorerConfig::output_aware`)
/// CriticalKV (Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output
/// Perturbation Perspective", arXiv 2502.03805): a token matters by its attention weight times
/// the size of what its value adds to the attention output. With W_o the layer's output
/// projection, `[dim][n_heads * head_dim]`, and W_o^{(q)} its `dim x head_dim` block of the
/// columns [q * head_dim, (q + 1) * head_dim) (query head q's share of the output), slot j of KV
/// head h gets
///     n_j = (1 / G) * sum_{q in group(h)} ||W_o^{(q)} V_j||_1      (G = n_heads / n_kv_heads)
///     s'_j = (s_j + kOutputAwareEpsilon) * n_j                      (kOutputAwareEpsilon = 1e-4)
/// where s_j is the kind's score above (after SnapKV's pooling) and V_j the slot's value row
/// (`head_dim`). `output_contribution_norms` computes n_j. It applies to h2o, snapkv and tova
/// (attention-based, >= 0); h2o-v1/v2 already weight by ||V_j|| and knorm and keydiff are not
/// attention-based, so those combinations are refused. The epsilon, the L1 norm and the mean
/// over the group's query heads are kvpress's (`CriticalKVPress.vwl1norm`). kvpress also keeps a
/// first stage (`first_stage_ratio` 0.5: half of each head's budget goes to the best tokens by
/// the unscaled score); depthkv does not: a scorer's scores do not depend on the budget (one set
/// of scores serves every keep ratio of a profile and the cross-head split of head_budget.hpp),
/// so the rescaled score alone ranks the tokens.
///
/// ## Output-norm cache
/// `scores` computes n_j for every slot at every call. `cached_scores` (what `score_and_evict` and
/// `EvictionSchedule` call) gives the same scores bit for bit but keeps n_j per slot and KV head
/// and computes it only for the slots appended since its last call, so that an eviction every
/// `interval` tokens costs O(new tokens) in the projection. The cache is valid as long as the
/// layer's slots change only by appending and by the evictions reported through `compact` (kept
/// slot i <- kept_slots[i]): the contract the observed rows already rely on. A caller that
/// replaces the layer's values otherwise (truncates and re-appends, reuses the scorer for another
/// sequence) calls `reset` (or makes a new scorer). The cache remembers the layer object (its
/// address) and the `OutputProjection` view (pointer, shape, strides) it was filled from: a call
/// with another one rebuilds it from scratch. A call finding a KV head that holds fewer slots than
/// are cached throws `Error` (slots were evicted without `compact`) and changes nothing.
///
/// ## GQA
/// With `n_heads` query heads and `n_kv_heads` KV heads, query head q belongs to KV head
/// `q / (n_heads / n_kv_heads)`. Every accumulator lives per KV head: the rows of the group's query
/// heads are summed into it as they arrive (nothing is stored per query head).
///
/// ## Memory
/// H2O kinds keep one float per slot and KV head. SnapKV keeps, per KV head, only the rows of the
/// last `window` distinct query positions observed (a sorted ring; each row is the sum over the
/// group); TOVA keeps one such row. Key-norm keeps nothing.
///
/// ## Adding a scorer
/// One file and one registration line, nothing else: the file defines a `ScoringRule`
/// (scoring_rule.hpp: `observe` a validated block of attention rows, `score` one KV head from a
/// `LayerReader`, `compact` after an eviction, `reset`, `clone`, and the traits `observes` and
/// `allows_output_aware`); the line registers its factory under a name,
///     const depthkv::ScorerRegistration kMine("mine", [](const depthkv::ScorerConfig& cfg, int n_heads,
///                                                        int n_kv_heads) { return make_mine(cfg, n_kv_heads); });
/// (or `depthkv::register_scorer("mine", factory)` at start-up). `depthkv::scorer_config("mine")`
/// then selects it (`ScorerConfig::name`) wherever a `ScorerConfig` goes (`EvictionSchedule`,
/// `make_scorers`, the evaluation), and `scorer_name` gives the name back. TokenScorer validates
/// every input before the rule sees it, applies the output-aware rescaling when the rule allows
/// it, and refuses lookahead for a rule that observes nothing. The GPU score kernels
/// (cuda/score.cuh) compute built-in kinds only.
///
/// ## Slots that were never attended
/// A layer may hold more slots than the observed rows covered (e.g. tokens appended after the last
/// observation); those slots have no attention mass, so their attention-based score is 0.
/// A layer holding fewer slots than observed is an error (the scorer was not compacted after an
/// eviction).
///
/// @code
/// depthkv::TokenScorer scorer({depthkv::ScorerKind::kSnapKV, /*window=*/32, /*kernel=*/7,
///                              depthkv::Pooling::kMax}, n_heads, n_kv_heads);
/// for (int q = 0; q < n_heads; ++q)   // probs: [n_queries][ld], row i for position pos0 + i
///   scorer.observe_block(q, pos0, n_queries, probs[q], ld, layer.size(q / group));
/// depthkv::LayerScores s = scorer.scores(layer);            // s[kv_head][slot]
/// // output-aware: scorer.scores(layer, &wo) with
/// //   depthkv::OutputProjection wo{w_o.data(), dim, n_heads, head_dim};   // [dim][n_heads*head_dim]
/// // ... evict with depthkv::evict_layer(layer, s, keep, prot), then for every KV head h:
/// scorer.compact(h, ev.kept_slots[h].data(), static_cast<int>(ev.kept_slots[h].size()));
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "depthkv/detail/scalar.hpp"
#include "depthkv/error.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/scorer_registry.hpp"
#include "depthkv/scorers/snapkv.hpp"
#include "depthkv/scoring_rule.hpp"
#include "depthkv/selection.hpp"

namespace depthkv {

/// A non-owning view of one layer's attention output projection W_o, the matrix that maps the
/// concatenated head outputs `[n_heads * head_dim]` to the model dimension `[dim]`. Element
/// (r, c) (output r, input column c = q * head_dim + d) is `data[r * row_stride + c * col_stride]`.
/// The defaults (`row_stride` 0 = n_heads * head_dim, `col_stride` 1) are the row-major
/// `[dim][n_heads * head_dim]` layout of PyTorch's `o_proj.weight`, llama2.c's and GGUF's
/// `wo`; an engine that stores the transpose `[n_heads * head_dim][dim]` row-major passes
/// `row_stride = 1, col_stride = dim`.
struct OutputProjection {
  const float* data = nullptr;
  int dim = 0;            ///< output rows (the model dimension)
  int n_heads = 0;        ///< query heads
  int head_dim = 0;       ///< columns per query head
  std::int64_t row_stride = 0;  ///< elements between rows (0: n_heads * head_dim)
  std::int64_t col_stride = 1;  ///< elements between columns
};

namespace detail {

/// The checks of `output_contribution_norms` (its @throws) on `wo` against `layer`.
/// @return the row stride (`wo.row_stride`, or n_heads * head_dim for 0)
template <class Layer>
std::int64_t check_output_projection(const Layer& layer, const OutputProjection& wo) {
  DEPTHKV_CHECK(wo.data != nullptr, "output projection: null data");
  DEPTHKV_CHECK(wo.dim >= 1, "output projection: dim must be >= 1, got " << wo.dim);
  DEPTHKV_CHECK(wo.head_dim == layer.head_dim(),
                "output projection: head_dim " << wo.head_dim << ", layer " << layer.head_dim());
  DEPTHKV_CHECK(wo.n_heads >= 1 && wo.n_heads % layer.n_kv_heads() == 0,
                "output projection: n_heads " << wo.n_heads << " is not a positive multiple of the layer's "
                                              << layer.n_kv_heads() << " KV heads");
  const std::int64_t rs = wo.row_stride == 0 ? static_cast<std::int64_t>(wo.n_heads) * wo.head_dim : wo.row_stride;
  DEPTHKV_CHECK(rs >= 1 && wo.col_stride >= 1,
                "output projection: strides must be >= 1, got row " << rs << ", column " << wo.col_stride);
  return rs;
}

/// n_j of slots [j_begin, j_end) of KV head `h` into out[0, j_end - j_begin), `wo` checked
/// (`check_output_projection`, row stride `rs`): one matrix product W_o^{(q)} [V_j ...] per query
/// head q of the group over blocks of up to 256 slots starting at j_begin. Each slot is its own
/// column of the products, and every column is computed the same way: a block's columns are
/// padded (columns whose results are ignored) to a multiple of 8 and to at least
/// `EIGEN_GEMM_TO_COEFFBASED_THRESHOLD - dim - head_dim`, so that every product is Eigen's
/// blocked matrix-matrix product (not its matrix-vector or small coefficient-wise product, which
/// sum in other orders) and every slot lies in a full panel of its kernel (panel width 4; the
/// columns of a partial panel round differently when dim is not a multiple of the SIMD width).
/// So n_j does not depend on which other slots share its block: the tests pin this bit for bit
/// (output_norm_cache_test.cpp), and the scorer's per-slot cache (`TokenScorer::cached_scores`)
/// relies on it. `v` and `y` are scratch.
template <class Layer>
void output_norms_range(const Layer& layer, const OutputProjection& wo, std::int64_t rs, int h, int j_begin, int j_end,
                        float* out, Eigen::MatrixXf& v, Eigen::MatrixXf& y) {
  using Strided = Eigen::Map<const Eigen::MatrixXf, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;
  const int hd = wo.head_dim, group = wo.n_heads / layer.n_kv_heads();
  constexpr int kBlock = 256;  // slots per product
  const int min_cols = EIGEN_GEMM_TO_COEFFBASED_THRESHOLD - wo.dim - hd;  // < 20
  v.setZero(hd, kBlock);
  std::fill(out, out + (j_end - j_begin), 0.0f);
  for (int j0 = j_begin; j0 < j_end; j0 += kBlock) {
    const int m = std::min(kBlock, j_end - j0), cols = (std::max(m, min_cols) + 7) / 8 * 8;  // <= kBlock
    float* o = out + (j0 - j_begin);
    for (int j = 0; j < m; ++j) {
      const auto* row = layer.value(h, j0 + j);
      for (int d = 0; d < hd; ++d) v(d, j) = detail::to_float(row[d]);
    }
    for (int g = 0; g < group; ++g) {
      const int q = h * group + g;
      const Strided w(wo.data + static_cast<std::int64_t>(q) * hd * wo.col_stride, wo.dim, hd,
                      Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(wo.col_stride, rs));
      y.noalias() = w * v.leftCols(cols);
      for (int j = 0; j < m; ++j) o[j] += y.col(j).cwiseAbs().sum();
    }
    for (int j = 0; j < m; ++j) o[j] /= static_cast<float>(group);
  }
}

}  // namespace detail

/// n_j of the output-aware rescaling for every slot of `layer` (file comment):
/// n[h][j] = (1 / G) * sum_{q in group(h)} ||W_o^{(q)} V_{h,j}||_1, G = n_heads / n_kv_heads.
/// @return n[h][slot], row h of length layer.size(h)
/// @throws Error on a null matrix, dim < 1, a head_dim other than the layer's, a head count that
///   is not a positive multiple of the layer's KV heads, or a non-positive stride
template <class Layer>
LayerScores output_contribution_norms(const Layer& layer, const OutputProjection& wo) {
  const std::int64_t rs = detail::check_output_projection(layer, wo);
  LayerScores out(static_cast<std::size_t>(layer.n_kv_heads()));
  Eigen::MatrixXf v, y;
  for (int h = 0; h < layer.n_kv_heads(); ++h) {
    std::vector<float>& o = out[static_cast<std::size_t>(h)];
    o.assign(static_cast<std::size_t>(layer.size(h)), 0.0f);
    detail::output_norms_range(layer, wo, rs, h, 0, layer.size(h), o.data(), v, y);
  }
  return out;
}

/// Token-importance accumulator of one layer (see the file comment for the scorers, GQA and
/// memory): checks every argument, keeps the positions and coverage, and runs the scorer's
/// `ScoringRule` (scoring_rule.hpp; built-in or registered, `make_scoring_rule`).
///
/// @code
/// depthkv::TokenScorer scorer({}, /*n_heads=*/32, /*n_kv_heads=*/8);   // H2O
/// scorer.observe(/*q_head=*/5, /*q_pos=*/100, probs, /*n=*/101);     // one attention row
/// depthkv::LayerScores s = scorer.scores(layer);
/// @endcode
class TokenScorer {
 public:
  /// @param cfg the scorer (`kind`, or a registered `name`) and its parameters
  /// @param n_heads query heads (>= 1, a multiple of n_kv_heads)
  /// @param n_kv_heads KV heads (>= 1)
  /// @throws Error on bad head counts, window < 1, an even or non-positive kernel, an unknown
  ///   scorer name, output-aware scoring for a scorer that does not allow it, a negative
  ///   lookahead or one for a scorer that observes nothing (key-norm)
  TokenScorer(ScorerConfig cfg, int n_heads, int n_kv_heads)
      : cfg_(std::move(cfg)), n_heads_(n_heads), n_kv_heads_(n_kv_heads) {
    DEPTHKV_CHECK(n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0,
                  "n_heads " << n_heads << " must be a positive multiple of n_kv_heads " << n_kv_heads);
    DEPTHKV_CHECK(cfg_.window >= 1, "window must be >= 1, got " << cfg_.window);
    DEPTHKV_CHECK(cfg_.kernel >= 1 && cfg_.kernel % 2 == 1, "kernel must be odd and >= 1, got " << cfg_.kernel);
    rule_ = make_scoring_rule(cfg_, n_heads, n_kv_heads);
    DEPTHKV_CHECK(!cfg_.output_aware || rule_->allows_output_aware(),
                  "output-aware scoring applies to h2o, snapkv and tova, not " << scorer_name(cfg_));
    DEPTHKV_CHECK(cfg_.lookahead >= 0, "lookahead must be >= 0, got " << cfg_.lookahead);
    DEPTHKV_CHECK(cfg_.lookahead == 0 || rule_->observes(),
                  "lookahead applies to attention-based scorers, not " << scorer_name(cfg_));
    DEPTHKV_CHECK(cfg_.context_weight >= 0.0 && std::isfinite(cfg_.context_weight),
                  "context_weight must be finite and >= 0, got " << cfg_.context_weight);
    DEPTHKV_CHECK(cfg_.context_weight == 0.0 || cfg_.lookahead > 0,
                  "context_weight " << cfg_.context_weight << " needs a lookahead (without one the scorer observes the context)");
    if (cfg_.context_weight > 0.0) {
      ScorerConfig c = cfg_;
      c.lookahead = 0;
      context_rule_ = std::make_unique<SnapKVRule>(c, n_kv_heads);
    }
    group_ = n_heads / n_kv_heads;
    reset();
  }
  TokenScorer(const TokenScorer& o)
      : cfg_(o.cfg_),
        n_heads_(o.n_heads_),
        n_kv_heads_(o.n_kv_heads_),
        group_(o.group_),
        rule_(o.rule_ ? o.rule_->clone() : nullptr),
        context_rule_(o.context_rule_ ? o.context_rule_->clone() : nullptr),
        in_lookahead_(o.in_lookahead_),
        n_obs_(o.n_obs_),
        last_pos_(o.last_pos_),
        norms_(o.norms_),
        norms_layer_(o.norms_layer_),
        norms_wo_(o.norms_wo_) {}
  TokenScorer(TokenScorer&&) noexcept = default;
  TokenScorer& operator=(const TokenScorer& o) {
    if (this != &o) *this = TokenScorer(o);
    return *this;
  }
  TokenScorer& operator=(TokenScorer&&) noexcept = default;
  ~TokenScorer() = default;

  const ScorerConfig& config() const { return cfg_; }
  int n_heads() const { return n_heads_; }
  int n_kv_heads() const { return n_kv_heads_; }
  /// The scoring rule (its state: the accumulated observations).
  const ScoringRule& rule() const { return *rule_; }
  /// How many of the latest observed query positions the scores depend on
  /// (`ScoringRule::positions_needed`: SnapKV its window, TOVA 1); 0 when every observed row counts
  /// (H2O, or a context window beside a lookahead); -1 when the rule observes nothing (key-norm).
  int positions_needed() const {
    if (!rule_->observes()) return -1;
    return context_rule_ ? 0 : rule_->positions_needed();
  }
  /// Slots of KV head `kv_head` covered by the observed rows (0 for key-norm).
  int observed_size(int kv_head) const {
    check_kv_head(kv_head);
    return n_obs_[static_cast<std::size_t>(kv_head)];
  }

  /// Forgets every observation (and the lookahead phase) and empties the output-norm cache.
  void reset() {
    rule_->reset();
    if (context_rule_) context_rule_->reset();
    in_lookahead_ = false;
    n_obs_.assign(static_cast<std::size_t>(n_kv_heads_), 0);
    last_pos_.assign(static_cast<std::size_t>(n_heads_), -1);
    norms_.assign(static_cast<std::size_t>(n_kv_heads_), {});
    norms_layer_ = nullptr;
    norms_wo_ = OutputProjection();
  }

  /// Slots of KV head `kv_head` whose output-aware norm n_j is cached (`cached_scores`).
  int cached_norms(int kv_head) const {
    check_kv_head(kv_head);
    return static_cast<int>(norms_[static_cast<std::size_t>(kv_head)].size());
  }

  /// Marks the start of the lookahead's rows: with `ScorerConfig::context_weight` > 0, the rows
  /// observed before feed the context window, the rows after the lookahead score (without it
  /// nothing changes). `observe_lookahead` calls it before its first step; `reset` undoes it.
  void begin_lookahead() { in_lookahead_ = true; }

  /// One attention-probability row of query head `q_head` at sequence position `q_pos` over the
  /// first `n` slots of its KV head (slot order; masked entries are 0). Rows of one query head
  /// arrive with non-decreasing q_pos. `n` may grow from call to call (appended tokens).
  /// @param probs `n` probabilities (finite, >= 0)
  /// @throws Error on a bad head, a negative or decreasing position, n < 0, or a NaN, infinite or
  ///   negative probability; the scorer is unchanged then
  void observe(int q_head, std::int32_t q_pos, const float* probs, int n) {
    observe_block(q_head, q_pos, 1, probs, n, n);
  }

  /// A block of `n_queries` rows (row-major, leading dimension `ld`) for consecutive positions
  /// q_pos0, q_pos0+1, ...; each row covers `n` slots. All rows are validated before any is added.
  /// @throws Error as `observe`, and when ld < n or n_queries < 0
  void observe_block(int q_head, std::int32_t q_pos0, int n_queries, const float* probs, int ld, int n) {
    check_block(q_head, q_pos0, n_queries, probs, ld, n);
    if (n_queries == 0) return;
    const int kv = q_head / group_;
    const AttentionBlock block{q_head, kv, q_pos0, n_queries, probs, ld, n};
    if (context_rule_ && !in_lookahead_)
      context_rule_->observe(block);
    else if (rule_->observes())
      rule_->observe(block);
    last_pos_[static_cast<std::size_t>(q_head)] = q_pos0 + n_queries - 1;
    if (rule_->observes()) n_obs_[static_cast<std::size_t>(kv)] = std::max(n_obs_[static_cast<std::size_t>(kv)], n);
  }

  /// Scores per KV head for the tokens the layer holds now (value-aware and key-norm scorers
  /// read the layer's V / K; output-aware ones V and `wo`).
  /// @param wo the layer's output projection (`OutputProjection`): required when
  ///   `config().output_aware`, ignored otherwise (may be null then)
  /// @return scores[h][slot], row h of length layer.size(h)
  /// @throws Error when the layer's KV head count differs from the scorer's, a head holds fewer
  ///   slots than were observed, an output-aware scorer gets no projection, or the projection's
  ///   shape does not match (n_heads, head_dim)
  template <class Layer>
  LayerScores scores(const Layer& layer, const OutputProjection* wo = nullptr) const {
    check_scored_layer(layer.n_kv_heads(), wo, [&layer](int h) { return layer.size(h); });
    LayerScores out = rule_scores(layer);
    if (cfg_.output_aware) rescale(out, output_contribution_norms(layer, *wo));
    return out;
  }

  /// `scores(layer, wo)`, bit for bit, with the output-aware norms n_j taken from the scorer's
  /// per-slot cache (file comment, "Output-norm cache"): only the slots appended since the last
  /// call are computed, then cached. Without `config().output_aware` it is `scores`.
  /// @throws Error as `scores`, and when a KV head of the layer the cache was filled from holds
  ///   fewer slots than are cached (slots evicted without `compact`); the scorer is unchanged then
  template <class Layer>
  LayerScores cached_scores(const Layer& layer, const OutputProjection* wo = nullptr) {
    if (!cfg_.output_aware) return scores(layer, wo);
    check_scored_layer(layer.n_kv_heads(), wo, [&layer](int h) { return layer.size(h); });
    update_norm_cache(layer, *wo);
    LayerScores out = rule_scores(layer);
    rescale(out, norms_);
    return out;
  }

  /// Keeps the accumulated state of the kept slots only, in order (slot i <- kept_slots[i]), after
  /// an eviction of KV head `kv_head`; later observations (chunked prefill) accumulate on the
  /// survivors. Kept slots past the observed ones carry no state (score 0). The output-norm cache
  /// is compacted the same way (kept slots past the cached ones are computed when next scored).
  /// @param kept_slots strictly ascending slots, >= 0 (e.g. `LayerEviction::kept_slots[h]`)
  /// @throws Error on a bad head or unsorted / negative slots; the scorer is unchanged then
  void compact(int kv_head, const std::int32_t* kept_slots, int n_kept) {
    check_kv_head(kv_head);
    DEPTHKV_CHECK(n_kept >= 0, "n_kept must be >= 0, got " << n_kept);
    DEPTHKV_CHECK(n_kept == 0 || kept_slots != nullptr, "null kept slots");
    for (int i = 0; i < n_kept; ++i)
      DEPTHKV_CHECK(kept_slots[i] >= 0 && (i == 0 || kept_slots[i] > kept_slots[i - 1]),
                    "KV head " << kv_head << ": kept slots not strictly ascending and >= 0 at index " << i);
    rule_->compact(kv_head, kept_slots, n_kept);
    if (context_rule_) context_rule_->compact(kv_head, kept_slots, n_kept);
    const std::size_t kv = static_cast<std::size_t>(kv_head);
    int i = 0;
    while (i < n_kept && kept_slots[i] < n_obs_[kv]) ++i;
    n_obs_[kv] = i;
    std::vector<float>& c = norms_[kv];  // the cached slots stay a prefix: kept_slots[k] >= k
    int k = 0;
    for (; k < n_kept && kept_slots[k] < static_cast<int>(c.size()); ++k)
      c[static_cast<std::size_t>(k)] = c[static_cast<std::size_t>(kept_slots[k])];
    c.resize(static_cast<std::size_t>(k));
  }

 private:
  // The rule's scores (plus the context window's) of every KV head, before any rescaling.
  template <class Layer>
  LayerScores rule_scores(const Layer& layer) const {
    LayerScores out(static_cast<std::size_t>(n_kv_heads_));
    const LayerReader reader(layer);
    for (int h = 0; h < n_kv_heads_; ++h) {
      std::vector<float>& s = out[static_cast<std::size_t>(h)];
      s.assign(static_cast<std::size_t>(layer.size(h)), 0.0f);
      rule_->score(h, reader, s);
      if (context_rule_) add_context_score(h, reader, s);
    }
    return out;
  }

  // The output-aware rescaling s'_j = (s_j + eps) * n_j (file comment); norms[h] covers s[h].
  static void rescale(LayerScores& s, const LayerScores& norms) {
    for (std::size_t h = 0; h < s.size(); ++h) {
      std::vector<float>& sh = s[h];
      const std::vector<float>& nh = norms[h];
      for (std::size_t j = 0; j < sh.size(); ++j) sh[j] = (sh[j] + kOutputAwareEpsilon) * nh[j];
    }
  }

  static bool same_projection(const OutputProjection& a, const OutputProjection& b) {
    return a.data == b.data && a.dim == b.dim && a.n_heads == b.n_heads && a.head_dim == b.head_dim &&
           a.row_stride == b.row_stride && a.col_stride == b.col_stride;
  }

  // Brings the norm cache to the layer's slots (file comment, "Output-norm cache"): rebuilt for
  // another layer object or projection view, else extended by the appended slots; every check
  // comes before the first change.
  template <class Layer>
  void update_norm_cache(const Layer& layer, const OutputProjection& wo) {
    const std::int64_t rs = detail::check_output_projection(layer, wo);
    const bool same = norms_layer_ == static_cast<const void*>(&layer) && same_projection(norms_wo_, wo);
    for (int h = 0; same && h < n_kv_heads_; ++h) {
      const std::size_t cached = norms_[static_cast<std::size_t>(h)].size();
      DEPTHKV_CHECK(static_cast<std::size_t>(layer.size(h)) >= cached,
                    "KV head " << h << ": layer holds " << layer.size(h) << " tokens but the output-norm cache "
                               << cached << " (compact the scorer after evicting, or reset it)");
    }
    if (!same) {
      for (std::vector<float>& c : norms_) c.clear();
      norms_layer_ = &layer;
      norms_wo_ = wo;
    }
    Eigen::MatrixXf v, y;
    for (int h = 0; h < n_kv_heads_; ++h) {
      std::vector<float>& c = norms_[static_cast<std::size_t>(h)];
      const int old = static_cast<int>(c.size()), n = layer.size(h);
      if (n == old) continue;
      c.resize(static_cast<std::size_t>(n));
      detail::output_norms_range(layer, wo, rs, h, old, n, c.data() + old, v, y);
    }
  }

  // s_j += w * (L / C) * c_j with c the context window's score of KV head h (scorer_config.hpp).
  void add_context_score(int h, const LayerReader& reader, std::vector<float>& s) const {
    std::vector<float> c(s.size(), 0.0f);
    context_rule_->score(h, reader, c);
    double L = 0.0, C = 0.0;
    for (std::size_t j = 0; j < s.size(); ++j) {
      L += s[j];
      C += c[j];
    }
    if (C <= 0.0) return;
    const double f = cfg_.context_weight * (L > 0.0 ? L : 1.0) / C;
    for (std::size_t j = 0; j < s.size(); ++j) s[j] = static_cast<float>(s[j] + f * c[j]);
  }

  void check_kv_head(int h) const {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "KV head " << h << " outside [0, " << n_kv_heads_ << ")");
  }

  // observe_block's checks (nothing changes before they pass).
  void check_block(int q_head, std::int32_t q_pos0, int n_queries, const float* probs, int ld, int n) const {
    DEPTHKV_CHECK(q_head >= 0 && q_head < n_heads_, "query head " << q_head << " outside [0, " << n_heads_ << ")");
    DEPTHKV_CHECK(n_queries >= 0, "n_queries must be >= 0, got " << n_queries);
    DEPTHKV_CHECK(n >= 0, "n must be >= 0, got " << n);
    DEPTHKV_CHECK(ld >= n, "leading dimension " << ld << " < n " << n);
    DEPTHKV_CHECK(q_pos0 >= 0, "query position must be >= 0, got " << q_pos0);
    const std::int32_t last = last_pos_[static_cast<std::size_t>(q_head)];
    DEPTHKV_CHECK(q_pos0 >= last, "query head " << q_head << ": position " << q_pos0
                                                << " precedes the last observed position " << last);
    DEPTHKV_CHECK(static_cast<std::int64_t>(q_pos0) + n_queries - 1 <= INT32_MAX, "query positions overflow");
    if (n_queries == 0) return;
    DEPTHKV_CHECK(n == 0 || probs != nullptr, "null probabilities");
    for (int r = 0; r < n_queries; ++r) check_row(q_head, q_pos0 + r, probs + static_cast<std::ptrdiff_t>(r) * ld, n);
  }

  // Every probability of a row is finite and >= 0.
  static void check_row(int q_head, std::int32_t q_pos, const float* row, int n) {
    bool ok = true;
    for (int j = 0; j < n; ++j) ok &= (row[j] >= 0.0f && row[j] <= std::numeric_limits<float>::max());  // false for NaN, inf
    if (ok) return;
    for (int j = 0; j < n; ++j)
      DEPTHKV_CHECK(row[j] >= 0.0f && std::isfinite(row[j]), "query head " << q_head << " position " << q_pos << " slot "
                                                                         << j << ": probability " << row[j]
                                                                         << " is not finite and >= 0");
  }

  // scores()'s checks: the projection of an output-aware scorer, the head count, the coverage.
  template <class SizeOf>
  void check_scored_layer(int layer_kv_heads, const OutputProjection* wo, SizeOf size_of) const {
    if (cfg_.output_aware) {
      DEPTHKV_CHECK(wo != nullptr, "output-aware scorer: no output projection given");
      DEPTHKV_CHECK(wo->n_heads == n_heads_,
                    "output projection has " << wo->n_heads << " query heads, scorer " << n_heads_);
    }
    DEPTHKV_CHECK(layer_kv_heads == n_kv_heads_, "layer has " << layer_kv_heads << " KV heads, scorer " << n_kv_heads_);
    for (int h = 0; h < n_kv_heads_; ++h)
      DEPTHKV_CHECK(size_of(h) >= n_obs_[static_cast<std::size_t>(h)],
                    "KV head " << h << ": layer holds " << size_of(h) << " tokens but "
                               << n_obs_[static_cast<std::size_t>(h)]
                               << " slots were observed (compact the scorer after evicting)");
  }

  ScorerConfig cfg_;
  int n_heads_ = 0;
  int n_kv_heads_ = 0;
  int group_ = 1;
  std::unique_ptr<ScoringRule> rule_;    // the scorer's state
  std::unique_ptr<ScoringRule> context_rule_;  // context_weight > 0: the context's SnapKV window
  bool in_lookahead_ = false;            // begin_lookahead called (rows feed rule_)
  std::vector<int> n_obs_;               // [kv] slots covered by observed rows
  std::vector<std::int32_t> last_pos_;   // [q_head] last observed position, -1 before any
  LayerScores norms_;                    // [kv][slot] cached n_j (cached_scores), a prefix of the slots
  const void* norms_layer_ = nullptr;    // the layer object norms_ was filled from
  OutputProjection norms_wo_;            // the projection view norms_ was computed with
};

}  // namespace depthkv
