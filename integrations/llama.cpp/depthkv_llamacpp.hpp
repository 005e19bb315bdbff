#pragma once
/// @file depthkv_llamacpp.hpp
/// @brief depthkv's budgets, scorers and selection driving a llama.cpp context with the tiered KV
/// cache of `patches/` (one sequence, CPU, flash attention off).
///
/// - `plan_tiers`: depthkv's allocator (`allocate`, prune_spec.hpp) gives every layer its budget
///   for the final length; layers of one allocator tier (`PruneSpec::tiers`, optimal policy) or,
///   without tiers, of one budget form one llama.cpp tier, sized to the largest budget among
///   them (without tiers, budgets one token apart share a tier: the allocator's rounding); or
///   (`TierGrouping::kLayer`) every layer is a tier of its own, at its own budget.
///   Sliding-window layers stay in llama.cpp's window cache (no tier) and outside the budget: the
///   keep ratio is of the other layers' tokens (the allocator sees the window layers at length 0).
/// - `Session`: owns the `llama_context` built with those tiers. `prefill` feeds the prompt one
///   ubatch (`PruneSpec::schedule.chunk` tokens) per `llama_decode`; `step` decodes one token.
///   The attention probabilities `kq_soft_max-<layer>` are read through `cb_eval` for the rows
///   the scorers need (`TokenScorer::positions_needed`, as `EvictionSchedule::observe_from`);
///   their columns are cells, mapped to positions with `llama_memory_tier_cell_pos`, and each
///   query head's rows go to the layer's `TokenScorer` in position order (the engine's
///   `AttentionObserver` contract).
/// - Eviction, after every ubatch and every `schedule.interval` decoded tokens: tier t with final
///   budget b_t of n_final tokens keeps `keep_tokens(b_t / n_final, seen, protection)` of the
///   `seen` tokens (`TargetPlan`'s rule). A tier keeps one position set for all its layers and KV
///   heads, so each position's score is the mean, over them, of its rank fraction among the
///   held positions (0 lowest, 1 highest); `select_keep` picks the kept set (sinks and recent
///   window protected), `llama_memory_seq_rm_positions` removes the rest from that tier only and
///   the tier's scorers are compacted to the kept slots.
/// Only scorers that read attention alone (h2o, snapkv, tova) run: a tier exposes no K/V rows.
/// A tier's cells are its budget plus one ubatch (rounded up to 32), so the KV bytes
/// follow the budgets, not the sequence.

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <depthkv/eviction_schedule.hpp>
#include <depthkv/evictor.hpp>
#include <depthkv/prune_spec.hpp>
#include <depthkv/token_scorer.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace depthkv {
namespace llamacpp {

/// Layers grouped into llama.cpp tiers, with each tier's final budget.
struct TierPlan {
  std::vector<std::uint32_t> tier_of_layer;  ///< [n_layer]; sliding-window layers: 0 (not read)
  std::vector<int> budget;                   ///< [n_tiers] tokens kept of `n_final`
  std::vector<bool> swa;                     ///< [n_layer] a sliding-window layer (llama.cpp's window cache)
  int n_final = 0;                           ///< the sequence length the budgets are for
  int n_tiers() const { return static_cast<int>(budget.size()); }
};

/// How `plan_tiers` groups layers: by budget (the fewest caches: one per allocator tier, or per
/// budget) or one tier per layer (each layer keeps its own position set, at its own budget).
enum class TierGrouping { kBudget, kLayer };

/// The tiers of `spec` for a sequence of `n_final` tokens (see the file comment).
/// @param swa per layer, whether llama.cpp keeps it in its sliding-window cache (empty: none)
/// @throws Error as `allocate`, on a bad `n_final`, or when every layer is a window layer
inline TierPlan plan_tiers(const PruneSpec& spec, const PolicyData& data, int n_layer, std::vector<bool> swa,
                           int n_final, TierGrouping grouping = TierGrouping::kBudget) {
  DEPTHKV_CHECK(n_layer >= 1 && n_final >= 1, "plan_tiers: n_layer " << n_layer << ", n_final " << n_final);
  if (swa.empty()) swa.assign(static_cast<std::size_t>(n_layer), false);
  DEPTHKV_CHECK(static_cast<int>(swa.size()) == n_layer, "plan_tiers: " << swa.size() << " SWA flags for "
                                                                        << n_layer << " layers");
  DEPTHKV_CHECK(!is_head_policy(spec.policy), "a llama.cpp tier keeps one position set: no per-head policy ("
                                                  << to_string(spec.policy) << ")");
  std::vector<int> lengths(static_cast<std::size_t>(n_layer), n_final);
  for (int l = 0; l < n_layer; ++l)
    if (swa[static_cast<std::size_t>(l)]) lengths[static_cast<std::size_t>(l)] = 0;  // llama.cpp's, outside the budget
  PolicyData d = data;
  d.layer_window.clear();
  const Allocation a = allocate(spec, lengths, d);
  TierPlan p;
  p.n_final = n_final;
  p.swa = swa;
  p.tier_of_layer.assign(static_cast<std::size_t>(n_layer), 0);
  std::vector<int> key;  // the allocator's tier, or the budget itself, of each tier made
  for (int l = 0; l < n_layer; ++l) {
    if (swa[static_cast<std::size_t>(l)]) continue;
    const int b = a.layers[static_cast<std::size_t>(l)];
    const int k = grouping == TierGrouping::kLayer ? l : a.tier.empty() ? b : a.tier[static_cast<std::size_t>(l)];
    auto it = std::find_if(key.begin(), key.end(), [&](int x) {  // budgets 1 token apart share a tier (rounding)
      return grouping == TierGrouping::kBudget && a.tier.empty() ? std::abs(x - k) <= 1 : x == k;
    });
    if (it == key.end()) {
      key.push_back(k);
      p.budget.push_back(b);
      it = key.end() - 1;
    }
    const std::size_t t = static_cast<std::size_t>(it - key.begin());
    p.budget[t] = std::max(p.budget[t], b);
    p.tier_of_layer[static_cast<std::size_t>(l)] = static_cast<std::uint32_t>(t);
  }
  DEPTHKV_CHECK(!p.budget.empty(), "plan_tiers: every layer is a sliding-window layer");
  return p;
}

/// What a `Session` did.
struct SessionReport {
  int evictions = 0;             ///< eviction rounds that removed positions
  long long removed = 0;         ///< positions removed, summed over tiers
  long long observed_rows = 0;   ///< attention rows (query head x token) handed to the scorers
};

/// One sequence on a tiered llama.cpp context (see the file comment). Not copyable.
class Session {
 public:
  /// @param model the loaded model (outlives the session)
  /// @param spec what to keep: its scorer, protection, schedule.chunk (the ubatch) and
  ///   schedule.interval (decode evictions); the budget is `plan`'s
  /// @param n_ctx the context's positions (at least `plan.n_final`)
  /// @throws Error on a scorer that reads K/V, a decode interval above the chunk, a plan that
  ///   does not match the model, or a context llama.cpp refuses to create
  Session(llama_model* model, const PruneSpec& spec, TierPlan plan, int n_ctx, int n_threads)
      : spec_(spec), plan_(std::move(plan)) {
    spec.validate();
    const ScorerKind k = spec.scorer.kind;
    DEPTHKV_CHECK(k == ScorerKind::kH2O || k == ScorerKind::kSnapKV || k == ScorerKind::kTOVA,
                  "a llama.cpp tier exposes no K/V rows: the scorer must be h2o, snapkv or tova, not "
                      << to_string(k));
    DEPTHKV_CHECK(!spec.scorer.output_aware && spec.scorer.lookahead == 0,
                  "output-aware and lookahead scorers do not run on llama.cpp tiers");
    n_layer_ = llama_model_n_layer(model);
    n_head_ = llama_model_n_head(model);
    n_head_kv_ = llama_model_n_head_kv(model);
    DEPTHKV_CHECK(static_cast<int>(plan_.tier_of_layer.size()) == n_layer_,
                  "the plan has " << plan_.tier_of_layer.size() << " layers, the model " << n_layer_);
    DEPTHKV_CHECK(n_ctx >= plan_.n_final, "n_ctx " << n_ctx << " < the plan's length " << plan_.n_final);
    ubatch_ = spec.schedule.chunk;
    DEPTHKV_CHECK(spec.schedule.interval <= ubatch_, "schedule.interval " << spec.schedule.interval
                                                         << " > schedule.chunk " << ubatch_
                                                         << ": a tier holds its budget plus one ubatch of tokens");
    scorers_ = make_scorers(n_layer_, spec.scorer, n_head_, n_head_kv_);
    held_.resize(plan_.budget.size());
    cap_.resize(static_cast<std::size_t>(n_layer_));
    std::vector<std::uint32_t> cells(plan_.budget.begin(), plan_.budget.end());
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = static_cast<std::uint32_t>(n_ctx);
    cp.n_batch = cp.n_ubatch = static_cast<std::uint32_t>(ubatch_);  // one ubatch per llama_decode
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // the probabilities exist only without FA
    cp.swa_full = false;  // window layers: their window plus one ubatch
    cp.n_kv_tiers = static_cast<std::uint32_t>(cells.size());
    cp.kv_tier_of_layer = plan_.tier_of_layer.data();
    cp.kv_tier_cells = cells.data();
    cp.cb_eval = &Session::cb_eval;
    cp.cb_eval_user_data = this;
    ctx_ = llama_init_from_model(model, cp);
    DEPTHKV_CHECK(ctx_ != nullptr, "llama.cpp refused the tiered context (see its log)");
    mem_ = llama_get_memory(ctx_);
    n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model));
  }
  ~Session() { llama_free(ctx_); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Feeds the prompt at positions 0.., evicting after every ubatch.
  /// @return the logits of its last token (`n_vocab` floats, valid until the next call)
  /// @throws Error on an empty prompt, a second prefill or a failed `llama_decode`
  const float* prefill(const std::vector<llama_token>& prompt) {
    DEPTHKV_CHECK(!prompt.empty() && pos_ == 0, "prefill: an empty prompt or a second prefill");
    for (std::size_t i = 0; i < prompt.size(); i += static_cast<std::size_t>(ubatch_)) {
      const int n = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(ubatch_), prompt.size() - i));
      decode(prompt.data() + i, n, pos_ + n);
      evict();
    }
    prompt_len_ = pos_;
    return llama_get_logits_ith(ctx_, -1);
  }
  /// Decodes `token` at the next position; evicts every `schedule.interval` tokens.
  /// @return its logits (valid until the next call)
  /// @throws Error before a prefill or on a failed `llama_decode`
  const float* step(llama_token token) {
    DEPTHKV_CHECK(prompt_len_ > 0, "step: no prefill yet");
    const int interval = spec_.schedule.interval;
    const int due = ((pos_ - prompt_len_) / interval + 1) * interval + prompt_len_;  // the next eviction point
    decode(&token, 1, due);
    if (pos_ >= due) evict();
    return llama_get_logits_ith(ctx_, -1);
  }
  int position() const { return pos_; }
  int n_vocab() const { return n_vocab_; }
  llama_context* context() { return ctx_; }
  const TierPlan& plan() const { return plan_; }
  const SessionReport& report() const { return report_; }

 private:
  // Rows of kq_soft_max-<il> captured in one llama_decode: [n_head][n_rows][n_kv].
  struct Captured {
    bool have = false;
    int n_kv = 0, n_rows = 0, t0 = 0;
    std::vector<float> data;
  };
  // A tier's held positions as the scorers' layer: sizes and positions, no K/V (the scorers that
  // run here never read them).
  struct TierView {
    int heads = 0;
    const std::vector<std::int32_t>* pos = nullptr;
    float zero[1] = {0.0f};
    int n_kv_heads() const { return heads; }
    int head_dim() const { return 1; }
    int size(int) const { return static_cast<int>(pos->size()); }
    const std::int32_t* positions(int) const { return pos->data(); }
    const float* key(int, int) const { return zero; }
    const float* value(int, int) const { return zero; }
  };

  static int layer_of(const char* name) {
    static const char prefix[] = "kq_soft_max-";
    if (std::strncmp(name, prefix, sizeof(prefix) - 1) != 0) return -1;
    return std::atoi(name + sizeof(prefix) - 1);
  }
  static bool cb_eval(ggml_tensor* t, bool ask, void* ud) {
    Session* s = static_cast<Session*>(ud);
    const int il = layer_of(t->name);
    if (il < 0 || il >= s->n_layer_ || s->plan_.swa[static_cast<std::size_t>(il)]) return !ask;  // not wanted
    if (ask) return true;
    s->capture(t, il);
    return true;
  }
  // Copies the rows of positions >= obs_from_ (ne0 = cells, ne1 = ubatch tokens, ne2 = query heads).
  void capture(const ggml_tensor* t, int il) {
    Captured& c = cap_[static_cast<std::size_t>(il)];
    c.have = false;
    if (t->type != GGML_TYPE_F32 || t->ne[3] != 1 || t->nb[1] != static_cast<std::size_t>(t->ne[0]) * sizeof(float) ||
        t->nb[2] != t->nb[1] * static_cast<std::size_t>(t->ne[1]) || static_cast<int>(t->ne[2]) != n_head_) {
      error_ = std::string("unexpected layout of ") + t->name;
      return;
    }
    const int n_kv = static_cast<int>(t->ne[0]), n_tok = static_cast<int>(t->ne[1]);
    const int t0 = std::max(0, obs_from_ - ub_p0_);
    if (t0 >= n_tok) return;
    c.have = true;
    c.n_kv = n_kv;
    c.n_rows = n_tok - t0;
    c.t0 = t0;
    c.data.resize(static_cast<std::size_t>(n_head_) * c.n_rows * n_kv);
    for (int h = 0; h < n_head_; ++h)
      ggml_backend_tensor_get(const_cast<ggml_tensor*>(t), c.data.data() + static_cast<std::size_t>(h) * c.n_rows * n_kv,
                              h * t->nb[2] + static_cast<std::size_t>(t0) * t->nb[1],
                              static_cast<std::size_t>(c.n_rows) * n_kv * sizeof(float));
  }

  // One llama_decode of n tokens; the next eviction comes after position `evict_at` - 1.
  void decode(const llama_token* tokens, int n, int evict_at) {
    obs_from_ = first_observed_position(scorers_, evict_at);
    ub_p0_ = pos_;
    for (Captured& c : cap_) c.have = false;
    DEPTHKV_CHECK(llama_decode(ctx_, llama_batch_get_one(const_cast<llama_token*>(tokens), n)) == 0,
                  "llama_decode failed at position " << pos_);
    DEPTHKV_CHECK(error_.empty(), error_);
    pos_ += n;
    observe();
  }
  // The captured rows, gathered over each tier's held positions in position order, to the scorers.
  // Refreshes held_, which evict() then reads (it runs after a decode only).
  void observe() {
    for (int t = 0; t < plan_.n_tiers(); ++t) {
      held_cells(t);
      const std::vector<std::pair<std::int32_t, int>>& held = held_[static_cast<std::size_t>(t)];
      const int n_slots = static_cast<int>(held.size());
      for (int il = 0; il < n_layer_; ++il) {
        const Captured& c = cap_[static_cast<std::size_t>(il)];
        if (!c.have || plan_.swa[static_cast<std::size_t>(il)] ||
            static_cast<int>(plan_.tier_of_layer[static_cast<std::size_t>(il)]) != t)
          continue;
        rows_.assign(static_cast<std::size_t>(c.n_rows) * n_slots, 0.0f);
        for (int h = 0; h < n_head_; ++h) {
          for (int r = 0; r < c.n_rows; ++r) {
            const float* src = c.data.data() + (static_cast<std::size_t>(h) * c.n_rows + r) * c.n_kv;
            float* dst = rows_.data() + static_cast<std::size_t>(r) * n_slots;
            for (int j = 0; j < n_slots; ++j) dst[j] = held[j].second < c.n_kv ? src[held[j].second] : 0.0f;
          }
          scorers_[static_cast<std::size_t>(il)].observe_block(h, ub_p0_ + c.t0, c.n_rows, rows_.data(), n_slots,
                                                               n_slots);
          report_.observed_rows += c.n_rows;
        }
      }
    }
  }
  // held_[t] = tier t's (position, cell) pairs of sequence 0, by position.
  void held_cells(int t) {
    std::vector<std::pair<std::int32_t, int>>& held = held_[static_cast<std::size_t>(t)];
    const std::int32_t n = llama_memory_tier_cell_pos(mem_, 0, t, nullptr, 0);
    DEPTHKV_CHECK(n >= 0, "llama_memory_tier_cell_pos refused tier " << t);
    cell_pos_.assign(static_cast<std::size_t>(n), -1);
    llama_memory_tier_cell_pos(mem_, 0, t, cell_pos_.data(), n);
    held.clear();
    for (int i = 0; i < n; ++i)
      if (cell_pos_[static_cast<std::size_t>(i)] >= 0) held.push_back({cell_pos_[static_cast<std::size_t>(i)], i});
    std::sort(held.begin(), held.end());
  }
  // Every tier over its budget for the tokens seen: mean rank over its layers and KV heads,
  // select_keep, removal from that tier, scorers compacted.
  void evict() {
    bool any = false;
    for (int t = 0; t < plan_.n_tiers(); ++t) {
      const std::vector<std::pair<std::int32_t, int>>& held = held_[static_cast<std::size_t>(t)];  // observe()'s
      const int n = static_cast<int>(held.size());
      const double ratio = static_cast<double>(plan_.budget[static_cast<std::size_t>(t)]) / plan_.n_final;
      const int k = keep_tokens(ratio, pos_, spec_.protection);
      if (n <= k) continue;
      std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = held[static_cast<std::size_t>(i)].first;
      const std::vector<float> agg = tier_scores(t, pos);
      const std::vector<std::int32_t> kept = select_keep(agg.data(), pos.data(), n, k, spec_.protection);
      std::vector<llama_pos> drop;
      std::size_t j = 0;
      for (int i = 0; i < n; ++i) {
        if (j < kept.size() && kept[j] == i) {
          ++j;
          continue;
        }
        drop.push_back(pos[static_cast<std::size_t>(i)]);
      }
      DEPTHKV_CHECK(llama_memory_seq_rm_positions(mem_, 0, t, drop.data(), static_cast<std::int32_t>(drop.size())),
                    "llama_memory_seq_rm_positions refused tier " << t);
      for (int il = 0; il < n_layer_; ++il)
        if (!plan_.swa[static_cast<std::size_t>(il)] &&
            static_cast<int>(plan_.tier_of_layer[static_cast<std::size_t>(il)]) == t)
          for (int h = 0; h < n_head_kv_; ++h)
            scorers_[static_cast<std::size_t>(il)].compact(h, kept.data(), static_cast<int>(kept.size()));
      report_.removed += static_cast<long long>(drop.size());
      any = true;
    }
    report_.evictions += any;
  }
  // Each held position's mean rank fraction (`rank_fractions`) over tier t's layers and KV heads.
  std::vector<float> tier_scores(int t, const std::vector<std::int32_t>& pos) const {
    const std::size_t n = pos.size();
    std::vector<double> sum(n, 0.0);
    TierView view;
    view.heads = n_head_kv_;
    view.pos = &pos;
    int count = 0;
    for (int il = 0; il < n_layer_; ++il) {
      if (plan_.swa[static_cast<std::size_t>(il)] || static_cast<int>(plan_.tier_of_layer[static_cast<std::size_t>(il)]) != t)
        continue;
      for (const std::vector<float>& row : scorers_[static_cast<std::size_t>(il)].scores(view)) {
        const std::vector<float> r = rank_fractions(row);
        for (std::size_t i = 0; i < n; ++i) sum[i] += r[i];
        ++count;
      }
    }
    std::vector<float> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(sum[i] / std::max(1, count));
    return out;
  }

  PruneSpec spec_;
  TierPlan plan_;
  llama_context* ctx_ = nullptr;
  llama_memory_t mem_ = nullptr;
  int n_layer_ = 0, n_head_ = 0, n_head_kv_ = 0, n_vocab_ = 0, ubatch_ = 0;
  int pos_ = 0, prompt_len_ = 0, ub_p0_ = 0, obs_from_ = 0;
  std::vector<TokenScorer> scorers_;
  std::vector<Captured> cap_;
  std::vector<std::int32_t> cell_pos_;
  std::vector<std::vector<std::pair<std::int32_t, int>>> held_;  // per tier
  std::vector<float> rows_;
  std::string error_;
  SessionReport report_;
};

}  // namespace llamacpp
}  // namespace depthkv
