#pragma once
/// @file detail/layer_core.hpp
/// @brief The storage core shared by the host layers (`HostLayer`, `LayerView` of kv_cache.hpp,
/// `PagedLayer` of paged_cache.hpp): shape, per-head original positions (whose count is the
/// head's size), the checked `append`, `append_head` and `compact`, `bytes` and `max_size`.
/// What differs between layer types, where a
/// (head, slot) row lives and how a head makes room for one more token, is supplied by the
/// derived class (CRTP, no virtual calls):
/// - `T* key(int h, int slot)`, `T* value(int h, int slot)`: the rows of `head_dim` elements;
/// - `void reserve_append(int h)`: room for one more token in head h (h < 0: in every head),
///   all-or-nothing: when it throws, nothing changed;
/// - `void compact_rows(int h, const std::int32_t* kept, int n_kept, std::size_t streaming_min_bytes)`:
///   moves row kept[i] of head h to slot i (kept validated, strictly ascending), the positions
///   are the core's.
///
/// `StridedCore` adds the strided addressing of `HostLayer` and `LayerView` (element
/// `(h, slot, d)` at `base[h * head_stride + slot * token_stride + d]`,
/// detail/strided_rows.hpp); its derived class supplies `key_base()` and `value_base()`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "depthkv/detail/compact_runs.hpp"
#include "depthkv/detail/scalar.hpp"
#include "depthkv/error.hpp"

namespace depthkv {
namespace detail {

/// Checks that `kept` (length n_kept) is strictly ascending and inside [0, size).
inline void check_kept_slots(const std::int32_t* kept, int n_kept, int size, int head) {
  DEPTHKV_CHECK(n_kept >= 0 && n_kept <= size,
                "head " << head << ": " << n_kept << " kept slots for " << size << " tokens");
  DEPTHKV_CHECK(n_kept == 0 || kept != nullptr, "head " << head << ": null kept slots");
  for (int i = 0; i < n_kept; ++i) {
    DEPTHKV_CHECK(kept[i] >= 0 && kept[i] < size,
                  "head " << head << ": kept slot " << kept[i] << " outside [0, " << size << ")");
    DEPTHKV_CHECK(i == 0 || kept[i] > kept[i - 1],
                  "head " << head << ": kept slots not strictly ascending at index " << i);
  }
}

/// Shape, sizes and positions of one layer, and the operations every host layer type shares.
template <typename T, class Derived>
class LayerCore {
 public:
  using Scalar = T;

  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  /// Tokens held by KV head `h`.
  int size(int h) const { return static_cast<int>(positions_[static_cast<std::size_t>(h)].size()); }
  /// Largest `size(h)` over the heads.
  int max_size() const {
    std::size_t m = 0;
    for (const auto& p : positions_) m = std::max(m, p.size());
    return static_cast<int>(m);
  }
  /// Original positions of the tokens held by head h (`size(h)` entries, ascending).
  const std::int32_t* positions(int h) const { return positions_[static_cast<std::size_t>(h)].data(); }

  /// Appends one token to every head, all-or-nothing.
  /// @param k keys, `[n_kv_heads][head_dim]` floats
  /// @param v values, `[n_kv_heads][head_dim]` floats
  /// @param position original sequence position; must exceed every position already held
  /// @throws Error when the position does not increase or a head has no room (LayerView: full)
  void append(const float* k, const float* v, std::int32_t position) {
    for (int h = 0; h < n_kv_heads_; ++h) check_position(h, position);
    derived().reserve_append(-1);
    for (int h = 0; h < n_kv_heads_; ++h)
      write_row(h, k + static_cast<std::size_t>(h) * static_cast<std::size_t>(head_dim_),
                v + static_cast<std::size_t>(h) * static_cast<std::size_t>(head_dim_), position);
  }

  /// Appends one token to head `h` only (`k`, `v`: `head_dim` floats).
  /// @throws Error when `h` is out of range, the position does not increase or the head has no room
  void append_head(int h, const float* k, const float* v, std::int32_t position) {
    check_head(h);
    check_position(h, position);
    derived().reserve_append(h);
    write_row(h, k, v, position);
  }

  /// Keeps only slots `kept[0..n_kept)` of head h (strictly ascending), moved to the front in
  /// order. Validates before any change.
  /// @param streaming_min_bytes heads whose slots span at least this many bytes (per array) are
  ///   written with non-temporal stores (SIZE_MAX: never; detail/compact_runs.hpp)
  /// @throws Error on an out-of-range head, out-of-range or unsorted slots
  void compact(int h, const std::int32_t* kept, int n_kept,
               std::size_t streaming_min_bytes = kDefaultStreamingMinBytes) {
    check_head(h);
    check_kept_slots(kept, n_kept, size(h), h);
    derived().compact_rows(h, kept, n_kept, streaming_min_bytes);
    std::vector<std::int32_t>& pos = positions_[static_cast<std::size_t>(h)];
    compact_runs(pos.data(), 1, 1, kept, n_kept);
    pos.resize(static_cast<std::size_t>(n_kept));
  }

  /// Bytes of keys and values held (sum over heads of size(h) * head_dim * 2 * sizeof(T)).
  std::size_t bytes() const {
    std::size_t tokens = 0;
    for (const auto& p : positions_) tokens += p.size();
    return tokens * static_cast<std::size_t>(head_dim_) * 2 * sizeof(T);
  }

 protected:
  LayerCore() = default;

  /// Sets the shape; every head holds `length` tokens at positions 0..length-1.
  void init_core(int n_kv_heads, int head_dim, int length) {
    DEPTHKV_CHECK(n_kv_heads >= 1 && head_dim >= 1,
                  "n_kv_heads and head_dim must be >= 1, got " << n_kv_heads << " and " << head_dim);
    DEPTHKV_CHECK(length >= 0, "length must be >= 0, got " << length);
    n_kv_heads_ = n_kv_heads;
    head_dim_ = head_dim;
    positions_.assign(static_cast<std::size_t>(n_kv_heads), std::vector<std::int32_t>());
    for (auto& p : positions_) {
      p.resize(static_cast<std::size_t>(length));
      for (int i = 0; i < length; ++i) p[static_cast<std::size_t>(i)] = i;
    }
  }
  /// Reserves position entries for `capacity` tokens per head.
  void reserve_positions(int capacity) {
    for (auto& p : positions_) p.reserve(static_cast<std::size_t>(capacity));
  }
  /// Releases position entries beyond each head's size.
  void shrink_positions() {
    for (auto& p : positions_) p.shrink_to_fit();
  }
  /// Replaces head h's positions (`size(h)` strictly ascending, non-negative values).
  void assign_positions(int h, const std::int32_t* pos) {
    check_head(h);
    const int n = size(h);
    DEPTHKV_CHECK(n == 0 || pos != nullptr, "head " << h << ": null positions");
    for (int i = 0; i < n; ++i)
      DEPTHKV_CHECK(pos[i] >= 0 && (i == 0 || pos[i] > pos[i - 1]),
                    "head " << h << ": positions not strictly ascending and non-negative at " << i);
    std::copy(pos, pos + n, positions_[static_cast<std::size_t>(h)].begin());
  }
  /// Keeps the first n positions of head h (n <= size(h)).
  void truncate(int h, int n) { positions_[static_cast<std::size_t>(h)].resize(static_cast<std::size_t>(n)); }
  /// Back to the empty default state (a moved-from layer).
  void clear_core() noexcept {
    n_kv_heads_ = 0;
    head_dim_ = 0;
    positions_.clear();
  }
  void check_head(int h) const {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
  }

  int n_kv_heads_ = 0;
  int head_dim_ = 0;

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }

  void check_position(int h, std::int32_t position) const {
    const int n = size(h);
    DEPTHKV_CHECK(position >= 0, "position must be >= 0, got " << position);
    DEPTHKV_CHECK(n == 0 || positions(h)[n - 1] < position,
                  "head " << h << ": position " << position << " does not follow the last held position "
                          << positions(h)[n - 1]);
  }
  /// Writes (h, size(h)) and records its position; room was reserved.
  void write_row(int h, const float* k, const float* v, std::int32_t position) {
    std::vector<std::int32_t>& pos = positions_[static_cast<std::size_t>(h)];
    pos.push_back(position);  // first: may allocate (throws before any row is written)
    const int n = static_cast<int>(pos.size()) - 1;
    T* kd = derived().key(h, n);
    T* vd = derived().value(h, n);
    for (int d = 0; d < head_dim_; ++d) {
      kd[d] = to_scalar<T>(k[d]);
      vd[d] = to_scalar<T>(v[d]);
    }
  }

  std::vector<std::vector<std::int32_t>> positions_;  // [head][i]; size(h) = positions_[h].size()
};

/// LayerCore with strided rows: element `(h, slot, d)` at `base[h * head_stride + slot *
/// token_stride + d]` of the keys (likewise values), for any strides whose rows do not overlap
/// (detail/strided_rows.hpp). The derived class supplies `key_base()` and `value_base()`.
template <typename T, class Derived>
class StridedCore : public LayerCore<T, Derived> {
 public:
  /// Slots per head.
  int capacity() const { return capacity_; }
  /// Elements between consecutive slots of one head.
  std::ptrdiff_t token_stride() const { return token_stride_; }
  /// Elements between the same slot of consecutive heads.
  std::ptrdiff_t head_stride() const { return head_stride_; }

  T* key(int h, int slot) { return derived().key_base() + offset(h, slot); }
  const T* key(int h, int slot) const { return derived().key_base() + offset(h, slot); }
  T* value(int h, int slot) { return derived().value_base() + offset(h, slot); }
  const T* value(int h, int slot) const { return derived().value_base() + offset(h, slot); }

 protected:
  StridedCore() = default;

  void set_layout(int capacity, std::ptrdiff_t head_stride, std::ptrdiff_t token_stride) {
    capacity_ = capacity;
    head_stride_ = head_stride;
    token_stride_ = token_stride;
  }

  /// Moves the rows of one head; rows of other heads are never read or written, whatever the
  /// layout (they do not overlap this head's rows), so heads compact in any order or concurrently.
  /// Within the head, row kept[i] >= i moves to slot i in increasing i: a row is overwritten only
  /// after every kept row at or below it has moved (compact_runs).
  void compact_rows(int h, const std::int32_t* kept, int n_kept, std::size_t streaming_min_bytes) {
    compact_runs(key(h, 0), token_stride_, this->head_dim_, kept, n_kept, streaming_min_bytes);
    compact_runs(value(h, 0), token_stride_, this->head_dim_, kept, n_kept, streaming_min_bytes);
  }

  int capacity_ = 0;
  std::ptrdiff_t head_stride_ = 0;
  std::ptrdiff_t token_stride_ = 0;

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
  std::ptrdiff_t offset(int h, int slot) const {
    return static_cast<std::ptrdiff_t>(h) * head_stride_ + static_cast<std::ptrdiff_t>(slot) * token_stride_;
  }
};

}  // namespace detail
}  // namespace depthkv
