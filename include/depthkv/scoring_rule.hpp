#pragma once
/// @file scoring_rule.hpp
/// @brief `ScoringRule`: the interface of one token-importance rule of one layer (H2O, SnapKV,
/// ... or a rule registered by the user, scorer_registry.hpp), the `AttentionBlock` it is fed
/// and the `LayerReader` it scores from. `TokenScorer` (token_scorer.hpp) owns one rule, checks
/// every argument and then calls the rule, so a rule sees only valid input.
///
/// ## What a rule does
/// - `observe(block)`: adds a validated block of attention rows of one query head (`AttentionBlock`:
///   rows of `n` finite probabilities >= 0, positions >= every earlier position of that query
///   head) to the state of its KV head. Called only when `observes()` is true and the block has
///   at least one row.
/// - `score(kv_head, layer, s)`: writes the score of every slot of the KV head into `s`
///   (`s.size() == layer.size(kv_head)`, zero-filled on entry; a higher score means a more
///   important token). Slots past the observed ones carry no attention state.
/// - `compact(kv_head, kept, n_kept)`: after an eviction, keeps the state of the kept slots only,
///   in order (slot i <- kept[i]; `kept` strictly ascending, >= 0, possibly past the state's
///   length). `keep_slots` does it for a per-slot vector.
/// - `reset()`: forgets every observation.
/// - `clone()`: a copy with the same state (`TokenScorer` is copyable).
/// - `observes()`: false for a rule that reads only the layer (key-norm); such a rule is never
///   fed and refuses lookahead. `allows_output_aware()`: whether the output-aware rescaling of
///   `TokenScorer` may multiply this rule's scores (attention-based scores >= 0).
///
/// `score` is const and may run concurrently on different scorers; rules keep no scratch state.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "depthkv/detail/scalar.hpp"

namespace depthkv {

/// A block of `n_queries` attention-probability rows of query head `q_head` (KV head `kv_head`)
/// for the consecutive positions q_pos0, q_pos0 + 1, ...; row r is `probs + r * ld` and covers
/// the first `n` slots of the KV head (slot order, masked entries 0). Validated by `TokenScorer`.
struct AttentionBlock {
  int q_head = 0;
  int kv_head = 0;
  std::int32_t q_pos0 = 0;
  int n_queries = 0;
  const float* probs = nullptr;
  int ld = 0;  ///< elements between rows (>= n)
  int n = 0;   ///< slots covered by every row
  /// Row r (0 <= r < n_queries).
  const float* row(int r) const { return probs + static_cast<std::ptrdiff_t>(r) * ld; }
};

namespace detail {
template <class L, class = void>
struct HasPositions : std::false_type {};
template <class L>
struct HasPositions<L, std::void_t<decltype(std::declval<const L&>().positions(0))>> : std::true_type {};
}  // namespace detail

/// A read-only view of one host layer (any type of the Layer concept, kv_cache.hpp) for a
/// `ScoringRule`: shape, sizes, key and value rows converted to float (`detail::to_float`), and
/// the original positions. The layer must outlive the reader.
///
/// @code
/// depthkv::LayerReader reader(cache.layer(l));
/// std::vector<float> k(static_cast<std::size_t>(reader.head_dim()));
/// reader.keys(/*h=*/0, /*slot0=*/3, /*count=*/1, k.data());   // key row of slot 3 of KV head 0
/// @endcode
class LayerReader {
 public:
  /// @param layer a host layer (pointers returned by its `key` / `value` are dereferenced)
  template <class Layer>
  explicit LayerReader(const Layer& layer)
      : layer_(&layer),
        n_kv_heads_(layer.n_kv_heads()),
        head_dim_(layer.head_dim()),
        size_(&size_of<Layer>),
        rows_(&rows_of<Layer>),
        positions_(&positions_of<Layer>) {}

  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  /// Tokens held by KV head `h`.
  int size(int h) const { return size_(layer_, h); }
  /// Key rows of slots [slot0, slot0 + count) of KV head `h` as floats, into `out`
  /// `[count][head_dim]` (the caller keeps the range inside [0, size(h))).
  void keys(int h, int slot0, int count, float* out) const { rows_(layer_, false, h, slot0, count, out); }
  /// Value rows, as `keys`.
  void values(int h, int slot0, int count, float* out) const { rows_(layer_, true, h, slot0, count, out); }
  /// The original positions of KV head `h`'s tokens (`size(h)` entries, ascending), or null when
  /// the layer type has no `positions(h)`.
  const std::int32_t* positions(int h) const { return positions_(layer_, h); }

 private:
  template <class Layer>
  static int size_of(const void* layer, int h) {
    return static_cast<const Layer*>(layer)->size(h);
  }
  template <class Layer>
  static void rows_of(const void* layer, bool values, int h, int slot0, int count, float* out) {
    const Layer& l = *static_cast<const Layer*>(layer);
    const int hd = l.head_dim();
    for (int i = 0; i < count; ++i) {
      const auto* row = values ? l.value(h, slot0 + i) : l.key(h, slot0 + i);
      float* o = out + static_cast<std::ptrdiff_t>(i) * hd;
      for (int d = 0; d < hd; ++d) o[d] = detail::to_float(row[d]);
    }
  }
  template <class Layer>
  static const std::int32_t* positions_of(const void* layer, int h) {
    if constexpr (detail::HasPositions<Layer>::value) {
      return static_cast<const Layer*>(layer)->positions(h);
    } else {
      (void)layer;
      (void)h;
      return nullptr;
    }
  }

  const void* layer_;
  int n_kv_heads_;
  int head_dim_;
  int (*size_)(const void*, int);
  void (*rows_)(const void*, bool, int, int, int, float*);
  const std::int32_t* (*positions_)(const void*, int);
};

/// One layer's token-importance rule (see the file comment for the contract of each member).
///
/// @code
/// // keeps the most recent tokens: s_j = original position of slot j
/// struct RecentRule : depthkv::ScoringRule {
///   std::unique_ptr<depthkv::ScoringRule> clone() const override { return std::make_unique<RecentRule>(*this); }
///   bool observes() const override { return false; }
///   void reset() override {}
///   void observe(const depthkv::AttentionBlock&) override {}
///   void compact(int, const std::int32_t*, int) override {}
///   void score(int h, const depthkv::LayerReader& layer, std::vector<float>& s) const override {
///     for (std::size_t j = 0; j < s.size(); ++j) s[j] = static_cast<float>(layer.positions(h)[j]);
///   }
/// };
/// @endcode
class ScoringRule {
 public:
  virtual ~ScoringRule() = default;
  /// A copy with the same state.
  virtual std::unique_ptr<ScoringRule> clone() const = 0;
  /// Whether the rule is fed attention rows (false: it reads only the layer; no lookahead).
  virtual bool observes() const { return true; }
  /// Whether the output-aware rescaling may apply to this rule's scores.
  virtual bool allows_output_aware() const { return false; }
  /// How many of the latest observed query positions the scores depend on: w > 0 when the rule
  /// keeps the rows of its last w positions only (earlier rows are dropped as later ones arrive),
  /// 0 when every observed row counts (the default). `EvictionSchedule::observe_from` uses it.
  virtual int positions_needed() const { return 0; }
  /// Forgets every observation.
  virtual void reset() = 0;
  /// Adds a validated block of attention rows (only when `observes()`).
  virtual void observe(const AttentionBlock& block) = 0;
  /// Keeps the state of the kept slots of KV head `kv_head` only, in order.
  /// @param kept strictly ascending slots >= 0, possibly past the state's length
  virtual void compact(int kv_head, const std::int32_t* kept, int n_kept) = 0;
  /// Writes the scores of KV head `kv_head` into `s` (length `layer.size(kv_head)`, zero-filled).
  virtual void score(int kv_head, const LayerReader& layer, std::vector<float>& s) const = 0;

 protected:
  ScoringRule() = default;
  ScoringRule(const ScoringRule&) = default;
  ScoringRule& operator=(const ScoringRule&) = default;
};

/// The base of a rule that reads the layer's keys only (`Derived`'s `score`): it observes nothing
/// and keeps no state. `for_key_blocks` hands the keys of a KV head over in float blocks.
template <class Derived>
class KeyOnlyRule : public ScoringRule {
 public:
  std::unique_ptr<ScoringRule> clone() const override {
    return std::make_unique<Derived>(static_cast<const Derived&>(*this));
  }
  bool observes() const override { return false; }
  void reset() override {}
  void observe(const AttentionBlock&) override {}
  void compact(int, const std::int32_t*, int) override {}

 protected:
  /// Calls `fn(j0, m, k)` for the key rows [j0, j0 + m) of KV head `kv_head`'s first `n` slots,
  /// `k` their `m x head_dim` floats (row-major), in blocks of at most 64 rows.
  template <class Fn>
  static void for_key_blocks(const LayerReader& layer, int kv_head, int n, Fn&& fn) {
    constexpr int kBlock = 64;
    std::vector<float> k(static_cast<std::size_t>(kBlock) * static_cast<std::size_t>(layer.head_dim()));
    for (int j0 = 0; j0 < n; j0 += kBlock) {
      const int m = std::min(kBlock, n - j0);
      layer.keys(kv_head, j0, m, k.data());
      fn(j0, m, static_cast<const float*>(k.data()));
    }
  }
};

/// Keeps the entries of `v` at the kept slots, in order (v[i] <- v[kept[i]]), dropping kept slots
/// at or past `v.size()`: the `compact` of a per-slot state vector.
/// @param kept strictly ascending slots >= 0
inline void keep_slots(std::vector<float>& v, const std::int32_t* kept, int n_kept) {
  const int old = static_cast<int>(v.size());
  int i = 0;
  for (; i < n_kept && kept[i] < old; ++i) v[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>(kept[i])];
  v.resize(static_cast<std::size_t>(i));
}

}  // namespace depthkv
