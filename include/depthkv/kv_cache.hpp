#pragma once
/// @file kv_cache.hpp
/// @brief `KVCache<Layer>`: the per-layer key/value storage of one sequence, each layer with its
/// own capacity, and the two host storage types `HostLayer<T>` (owning) and `LayerView<T>`
/// (non-owning, over an engine's own memory).
///
/// ## The Layer concept
/// A `Layer` stores the keys and values of one transformer layer, per KV head, in position
/// order. Each KV head may hold a different number of tokens (per-head budgets). It provides:
/// - `using Scalar` (the stored element type: `float`, `Eigen::half`, `Eigen::bfloat16`, ...);
/// - `n_kv_heads()`, `head_dim()`, `capacity()` (slots per head), `size(h)` (tokens held by head
///   h), `max_size()` (the largest `size(h)`; `KVCache::lengths`);
/// - `key(h, slot)`, `value(h, slot)`: pointers to `head_dim()` contiguous elements;
///   `token_stride()`: elements from one slot's key (or value) to the next slot's in the same head
///   (>= `head_dim()`; the engine reads a head as a `size(h) x head_dim` matrix with this stride);
/// - `positions(h)`: the original sequence positions of the held tokens, ascending;
/// - `append(k, v, pos)`: one token for every head (`k`, `v` are `[n_kv_heads][head_dim]` floats);
/// - `compact(h, kept_slots, n_kept, streaming_min_bytes)`: keep only the given slots (ascending)
///   of head h, in order (`streaming_min_bytes`: the non-temporal store threshold,
///   `EvictOptions::streaming_min_bytes`; HostLayer and LayerView default it);
/// - `shrink_to_fit()`: release or return unused capacity;
/// - `bytes()`: bytes of K and V really held; `bytes_allocated()`: bytes of storage reserved.
/// Who uses what: the evictor `n_kv_heads`, `size`, `positions`, `compact`, `shrink_to_fit`; the
/// scorers `n_kv_heads`, `size`, `key`, `value`, `head_dim`; the engine `n_kv_heads`, `head_dim`,
/// `size`, `positions`, `append`, `key`, `value`, `token_stride`; `KVCache` `max_size`, `bytes`,
/// `bytes_allocated`, `shrink_to_fit`.
///
/// @code
/// depthkv::KVCache<depthkv::HostLayer<float>> cache;
/// for (int l = 0; l < n_layers; ++l) cache.add_layer(depthkv::HostLayer<float>(n_kv_heads, head_dim));
/// cache.layer(0).append(k_row, v_row, /*position=*/0);   // k_row, v_row: [n_kv_heads][head_dim]
/// std::size_t held = cache.bytes();
/// @endcode

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "depthkv/detail/compact_runs.hpp"
#include "depthkv/detail/large_page_allocator.hpp"
#include "depthkv/detail/scalar.hpp"
#include "depthkv/error.hpp"

namespace depthkv {

namespace detail {

/// Checks that `kept` (length n_kept) is strictly ascending and inside [0, size).
inline void check_kept_slots(const std::int32_t* kept, int n_kept, int size, int head) {
  DEPTHKV_CHECK(n_kept >= 0 && n_kept <= size,
                "head " << head << ": " << n_kept << " kept slots for " << size << " tokens");
  for (int i = 0; i < n_kept; ++i) {
    DEPTHKV_CHECK(kept[i] >= 0 && kept[i] < size,
                  "head " << head << ": kept slot " << kept[i] << " outside [0, " << size << ")");
    DEPTHKV_CHECK(i == 0 || kept[i] > kept[i - 1],
                  "head " << head << ": kept slots not strictly ascending at index " << i);
  }
}

}  // namespace detail

/// Owning host storage of one layer. Layout: keys and values each
/// `[n_kv_heads][capacity][head_dim]`, row-major and contiguous; head h holds `size(h)` tokens
/// in slots `[0, size(h))`, in ascending original position. Key and value blocks of 2 MiB or more
/// are 2 MiB-aligned and advised for transparent huge pages (detail/large_page_allocator.hpp).
///
/// @tparam T stored element type (`float`, `Eigen::half`, `Eigen::bfloat16`).
template <typename T>
class HostLayer {
 public:
  using Scalar = T;

  HostLayer() = default;
  /// @param n_kv_heads number of KV heads (>= 1)
  /// @param head_dim elements per key/value vector (>= 1)
  /// @param capacity initial slots per head (grown on demand by append)
  /// @throws Error on non-positive dimensions or negative capacity
  HostLayer(int n_kv_heads, int head_dim, int capacity = 0)
      : n_kv_heads_(n_kv_heads), head_dim_(head_dim) {
    DEPTHKV_CHECK(n_kv_heads >= 1 && head_dim >= 1,
                  "n_kv_heads and head_dim must be >= 1, got " << n_kv_heads << " and " << head_dim);
    DEPTHKV_CHECK(capacity >= 0, "capacity must be >= 0, got " << capacity);
    sizes_.assign(static_cast<std::size_t>(n_kv_heads), 0);
    reallocate(capacity);
  }

  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  /// Slots allocated per head.
  int capacity() const { return capacity_; }
  /// Tokens held by KV head `h`.
  int size(int h) const { return sizes_[static_cast<std::size_t>(h)]; }
  /// Largest `size(h)` over the heads.
  int max_size() const { return sizes_.empty() ? 0 : *std::max_element(sizes_.begin(), sizes_.end()); }
  /// Elements between consecutive tokens of one head.
  std::ptrdiff_t token_stride() const { return head_dim_; }

  T* key(int h, int slot) { return keys_.data() + offset(h, slot); }
  const T* key(int h, int slot) const { return keys_.data() + offset(h, slot); }
  T* value(int h, int slot) { return values_.data() + offset(h, slot); }
  const T* value(int h, int slot) const { return values_.data() + offset(h, slot); }
  /// Original positions of the tokens held by head h (`size(h)` entries, ascending).
  const std::int32_t* positions(int h) const {
    return positions_.data() + static_cast<std::size_t>(h) * static_cast<std::size_t>(capacity_);
  }

  /// Reserves at least `capacity` slots per head (never shrinks).
  void reserve(int capacity) {
    DEPTHKV_CHECK(capacity >= 0, "capacity must be >= 0, got " << capacity);
    if (capacity > capacity_) reallocate(capacity);
  }

  /// Appends one token to every head.
  /// @param k keys, `[n_kv_heads][head_dim]` floats
  /// @param v values, `[n_kv_heads][head_dim]` floats
  /// @param position original sequence position; must exceed every position already held
  /// @throws Error when the position does not increase
  void append(const float* k, const float* v, std::int32_t position) {
    for (int h = 0; h < n_kv_heads_; ++h) check_position(h, position);
    for (int h = 0; h < n_kv_heads_; ++h)
      append_head(h, k + static_cast<std::size_t>(h) * head_dim_, v + static_cast<std::size_t>(h) * head_dim_, position);
  }

  /// Appends one token to head `h` only (`k`, `v`: `head_dim` floats).
  /// @throws Error when `h` is out of range or the position does not increase
  void append_head(int h, const float* k, const float* v, std::int32_t position) {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
    check_position(h, position);
    int& n = sizes_[static_cast<std::size_t>(h)];
    if (n == capacity_) reallocate(std::max(16, capacity_ * 2));
    T* kd = key(h, n);
    T* vd = value(h, n);
    for (int d = 0; d < head_dim_; ++d) {
      kd[d] = detail::to_scalar<T>(k[d]);
      vd[d] = detail::to_scalar<T>(v[d]);
    }
    positions_[static_cast<std::size_t>(h) * static_cast<std::size_t>(capacity_) + static_cast<std::size_t>(n)] = position;
    ++n;
  }

  /// Keeps only slots `kept[0..n_kept)` of head h (strictly ascending), moved to the front in
  /// order. Validates before any change.
  /// @param streaming_min_bytes heads whose slots span at least this many bytes (per array) are
  ///   written with non-temporal stores (SIZE_MAX: never; detail/compact_runs.hpp)
  /// @throws Error on out-of-range or unsorted slots
  void compact(int h, const std::int32_t* kept, int n_kept,
               std::size_t streaming_min_bytes = detail::kDefaultStreamingMinBytes) {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
    detail::check_kept_slots(kept, n_kept, size(h), h);
    std::int32_t* pos = positions_.data() + static_cast<std::size_t>(h) * static_cast<std::size_t>(capacity_);
    detail::compact_runs(key(h, 0), token_stride(), head_dim_, kept, n_kept, streaming_min_bytes);
    detail::compact_runs(value(h, 0), token_stride(), head_dim_, kept, n_kept, streaming_min_bytes);
    detail::compact_runs(pos, 1, 1, kept, n_kept);
    sizes_[static_cast<std::size_t>(h)] = n_kept;
  }

  /// Reallocates to exactly `max_size()` slots per head, releasing the rest.
  void shrink_to_fit() {
    if (max_size() != capacity_) reallocate(max_size());
  }

  /// Bytes of keys and values held (sum over heads of size(h) * head_dim * 2 * sizeof(T)).
  std::size_t bytes() const {
    std::size_t tokens = 0;
    for (int n : sizes_) tokens += static_cast<std::size_t>(n);
    return tokens * static_cast<std::size_t>(head_dim_) * 2 * sizeof(T);
  }
  /// Bytes of key/value storage allocated.
  std::size_t bytes_allocated() const { return (keys_.capacity() + values_.capacity()) * sizeof(T); }

 private:
  std::size_t offset(int h, int slot) const {
    return (static_cast<std::size_t>(h) * static_cast<std::size_t>(capacity_) + static_cast<std::size_t>(slot)) *
           static_cast<std::size_t>(head_dim_);
  }
  void check_position(int h, std::int32_t position) const {
    const int n = size(h);
    DEPTHKV_CHECK(position >= 0, "position must be >= 0, got " << position);
    DEPTHKV_CHECK(n == 0 || positions(h)[n - 1] < position,
                  "head " << h << ": position " << position << " does not follow the last held position "
                          << positions(h)[n - 1]);
  }
  void reallocate(int new_capacity) {
    assert_fits(new_capacity);
    const std::size_t hd = static_cast<std::size_t>(head_dim_);
    Storage k(static_cast<std::size_t>(n_kv_heads_) * static_cast<std::size_t>(new_capacity) * hd);
    Storage v(k.size());
    std::vector<std::int32_t> p(static_cast<std::size_t>(n_kv_heads_) * static_cast<std::size_t>(new_capacity));
    for (int h = 0; h < n_kv_heads_; ++h) {
      const std::size_t n = static_cast<std::size_t>(size(h));
      const std::size_t src = static_cast<std::size_t>(h) * static_cast<std::size_t>(capacity_);
      const std::size_t dst = static_cast<std::size_t>(h) * static_cast<std::size_t>(new_capacity);
      if (n == 0) continue;
      std::memcpy(k.data() + dst * hd, keys_.data() + src * hd, n * hd * sizeof(T));
      std::memcpy(v.data() + dst * hd, values_.data() + src * hd, n * hd * sizeof(T));
      std::memcpy(p.data() + dst, positions_.data() + src, n * sizeof(std::int32_t));
    }
    keys_.swap(k);
    values_.swap(v);
    positions_.swap(p);
    capacity_ = new_capacity;
  }
  void assert_fits(int new_capacity) const {
    DEPTHKV_CHECK(new_capacity >= max_size(), "capacity " << new_capacity << " below held tokens " << max_size());
  }

  int n_kv_heads_ = 0;
  int head_dim_ = 0;
  int capacity_ = 0;
  std::vector<int> sizes_;
  using Storage = std::vector<T, detail::LargePageAllocator<T>>;  // 2 MiB pages for large layers
  Storage keys_;
  Storage values_;
  std::vector<std::int32_t> positions_;
};

/// Non-owning view over key/value memory an engine already owns, so the engine adopts depthkv
/// without copying its cache. Element `(h, slot, d)` of the keys is at
/// `keys[h * head_stride + slot * token_stride + d]` (likewise values); the shape is
/// `[n_kv_heads][capacity][head_dim]`, the elements of one token contiguous. The view owns only
/// the small bookkeeping (per-head sizes and original positions). Appends beyond `capacity`
/// throw; `shrink_to_fit()` is a no-op (the freed slots stay with the engine for reuse).
///
/// @code
/// // engine memory: float k_cache[n_kv][max_seq][hd], v_cache likewise, `len` tokens filled
/// depthkv::LayerView<float> view(k_cache, v_cache, n_kv, hd, max_seq, /*length=*/len);
/// @endcode
template <typename T>
class LayerView {
 public:
  using Scalar = T;

  LayerView() = default;
  /// @param keys, values the engine's storage (not owned, must outlive the view)
  /// @param length tokens already held by every head (positions 0..length-1)
  /// @param head_stride elements between heads (default `capacity * head_dim`)
  /// @param token_stride elements between tokens (default `head_dim`, must be >= head_dim)
  /// @throws Error on null storage, non-positive dimensions or inconsistent strides
  LayerView(T* keys, T* values, int n_kv_heads, int head_dim, int capacity, int length = 0,
            std::ptrdiff_t head_stride = -1, std::ptrdiff_t token_stride = -1)
      : keys_(keys), values_(values), n_kv_heads_(n_kv_heads), head_dim_(head_dim), capacity_(capacity) {
    DEPTHKV_CHECK(keys != nullptr && values != nullptr, "null key or value storage");
    DEPTHKV_CHECK(n_kv_heads >= 1 && head_dim >= 1 && capacity >= 0,
                  "bad shape [" << n_kv_heads << "][" << capacity << "][" << head_dim << "]");
    DEPTHKV_CHECK(length >= 0 && length <= capacity, "length " << length << " outside [0, " << capacity << "]");
    token_stride_ = token_stride < 0 ? head_dim : token_stride;
    head_stride_ = head_stride < 0 ? static_cast<std::ptrdiff_t>(capacity) * token_stride_ : head_stride;
    DEPTHKV_CHECK(token_stride_ >= head_dim, "token_stride " << token_stride_ << " < head_dim " << head_dim);
    DEPTHKV_CHECK(n_kv_heads == 1 || head_stride_ >= static_cast<std::ptrdiff_t>(capacity) * token_stride_,
                  "head_stride " << head_stride_ << " overlaps the previous head");
    sizes_.assign(static_cast<std::size_t>(n_kv_heads), length);
    positions_.resize(static_cast<std::size_t>(n_kv_heads) * static_cast<std::size_t>(capacity));
    for (int h = 0; h < n_kv_heads; ++h)
      for (int i = 0; i < length; ++i) positions_[static_cast<std::size_t>(h) * capacity + i] = i;
  }

  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int capacity() const { return capacity_; }
  int size(int h) const { return sizes_[static_cast<std::size_t>(h)]; }
  int max_size() const { return sizes_.empty() ? 0 : *std::max_element(sizes_.begin(), sizes_.end()); }
  std::ptrdiff_t token_stride() const { return token_stride_; }
  std::ptrdiff_t head_stride() const { return head_stride_; }

  T* key(int h, int slot) { return keys_ + h * head_stride_ + slot * token_stride_; }
  const T* key(int h, int slot) const { return keys_ + h * head_stride_ + slot * token_stride_; }
  T* value(int h, int slot) { return values_ + h * head_stride_ + slot * token_stride_; }
  const T* value(int h, int slot) const { return values_ + h * head_stride_ + slot * token_stride_; }
  const std::int32_t* positions(int h) const {
    return positions_.data() + static_cast<std::size_t>(h) * static_cast<std::size_t>(capacity_);
  }

  /// Sets head h's original positions (`size(h)` ascending values), e.g. after adopting a cache
  /// that was already pruned by the engine.
  /// @throws Error when the positions are not strictly ascending and non-negative
  void set_positions(int h, const std::int32_t* pos) {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
    for (int i = 0; i < size(h); ++i)
      DEPTHKV_CHECK(pos[i] >= 0 && (i == 0 || pos[i] > pos[i - 1]), "positions not strictly ascending at " << i);
    std::copy(pos, pos + size(h), positions_.begin() + static_cast<std::ptrdiff_t>(h) * capacity_);
  }

  /// Appends one token to every head; see HostLayer::append.
  /// @throws Error when any head is full or the position does not increase
  void append(const float* k, const float* v, std::int32_t position) {
    for (int h = 0; h < n_kv_heads_; ++h) check_append(h, position);
    for (int h = 0; h < n_kv_heads_; ++h)
      append_head(h, k + static_cast<std::size_t>(h) * head_dim_, v + static_cast<std::size_t>(h) * head_dim_, position);
  }
  void append_head(int h, const float* k, const float* v, std::int32_t position) {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
    check_append(h, position);
    int& n = sizes_[static_cast<std::size_t>(h)];
    T* kd = key(h, n);
    T* vd = value(h, n);
    for (int d = 0; d < head_dim_; ++d) {
      kd[d] = detail::to_scalar<T>(k[d]);
      vd[d] = detail::to_scalar<T>(v[d]);
    }
    positions_[static_cast<std::size_t>(h) * capacity_ + n] = position;
    ++n;
  }

  /// See HostLayer::compact.
  void compact(int h, const std::int32_t* kept, int n_kept,
               std::size_t streaming_min_bytes = detail::kDefaultStreamingMinBytes) {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
    detail::check_kept_slots(kept, n_kept, size(h), h);
    std::int32_t* pos = positions_.data() + static_cast<std::size_t>(h) * capacity_;
    detail::compact_runs(key(h, 0), token_stride_, head_dim_, kept, n_kept, streaming_min_bytes);
    detail::compact_runs(value(h, 0), token_stride_, head_dim_, kept, n_kept, streaming_min_bytes);
    detail::compact_runs(pos, 1, 1, kept, n_kept);
    sizes_[static_cast<std::size_t>(h)] = n_kept;
  }

  /// No-op: the engine owns the memory; slots past `size(h)` are free for its reuse.
  void shrink_to_fit() {}

  std::size_t bytes() const {
    std::size_t tokens = 0;
    for (int n : sizes_) tokens += static_cast<std::size_t>(n);
    return tokens * static_cast<std::size_t>(head_dim_) * 2 * sizeof(T);
  }
  /// Bytes of the engine's storage this view spans.
  std::size_t bytes_allocated() const {
    return static_cast<std::size_t>(n_kv_heads_) * static_cast<std::size_t>(capacity_) *
           static_cast<std::size_t>(head_dim_) * 2 * sizeof(T);
  }

 private:
  void check_append(int h, std::int32_t position) const {
    const int n = size(h);
    DEPTHKV_CHECK(n < capacity_, "head " << h << " is full (capacity " << capacity_ << ")");
    DEPTHKV_CHECK(position >= 0, "position must be >= 0, got " << position);
    DEPTHKV_CHECK(n == 0 || positions(h)[n - 1] < position,
                  "head " << h << ": position " << position << " does not follow " << positions(h)[n - 1]);
  }

  T* keys_ = nullptr;
  T* values_ = nullptr;
  int n_kv_heads_ = 0;
  int head_dim_ = 0;
  int capacity_ = 0;
  std::ptrdiff_t head_stride_ = 0;
  std::ptrdiff_t token_stride_ = 0;
  std::vector<int> sizes_;
  std::vector<std::int32_t> positions_;
};

/// The KV cache of one sequence: one `Layer` per transformer layer, each with its own capacity
/// and, after eviction, its own number of tokens per KV head.
///
/// @tparam Layer a storage type satisfying the Layer concept above (`HostLayer<T>`,
///   `LayerView<T>`, or a CUDA device layer).
template <typename Layer>
class KVCache {
 public:
  using LayerType = Layer;

  KVCache() = default;
  explicit KVCache(std::vector<Layer> layers) : layers_(std::move(layers)) {}

  /// Adds a layer at the end and returns it.
  Layer& add_layer(Layer layer) {
    layers_.push_back(std::move(layer));
    return layers_.back();
  }
  int n_layers() const { return static_cast<int>(layers_.size()); }
  /// @throws Error when `l` is out of range
  Layer& layer(int l) {
    check_layer(l);
    return layers_[static_cast<std::size_t>(l)];
  }
  const Layer& layer(int l) const {
    check_layer(l);
    return layers_[static_cast<std::size_t>(l)];
  }

  /// Bytes of K and V held by layer `l`.
  std::size_t bytes(int l) const { return layer(l).bytes(); }
  /// Bytes of K and V held, all layers.
  std::size_t bytes() const {
    std::size_t b = 0;
    for (const auto& L : layers_) b += L.bytes();
    return b;
  }
  /// `bytes(l)` for every layer.
  std::vector<std::size_t> bytes_per_layer() const {
    std::vector<std::size_t> b;
    b.reserve(layers_.size());
    for (const auto& L : layers_) b.push_back(L.bytes());
    return b;
  }
  /// Bytes of storage allocated, all layers.
  std::size_t bytes_allocated() const {
    std::size_t b = 0;
    for (const auto& L : layers_) b += L.bytes_allocated();
    return b;
  }
  /// Tokens held by each layer (its largest per-head size).
  std::vector<int> lengths() const {
    std::vector<int> n;
    for (const auto& L : layers_) n.push_back(L.max_size());
    return n;
  }
  /// Releases unused capacity in every layer.
  void shrink_to_fit() {
    for (auto& L : layers_) L.shrink_to_fit();
  }

 private:
  void check_layer(int l) const {
    DEPTHKV_CHECK(l >= 0 && l < n_layers(), "layer " << l << " outside [0, " << n_layers() << ")");
  }
  std::vector<Layer> layers_;
};

}  // namespace depthkv
