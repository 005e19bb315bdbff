#pragma once
/// @file kv_cache.hpp
/// @brief `KVCache<Layer>`: the per-layer key/value storage of one sequence, each layer with its
/// own capacity, and the two host storage types `HostLayer<T>` (owning) and `LayerView<T>`
/// (non-owning, over an engine's own memory).
///
/// ## The Layer concept
/// A `Layer` stores the keys and values of one transformer layer, per KV head, in position
/// order. Each KV head may hold a different number of tokens (per-head budgets). Members, and who
/// uses each (E: evictor, evictor.hpp; S: scorers, token_scorer.hpp; G: the engine's forward pass;
/// C: `KVCache`; P: eviction schedule and evaluation, eviction_schedule.hpp and an engine's
/// evaluation loop, through `KVCache`):
/// - `using Scalar`: the stored element type (`float`, `Eigen::half`, `Eigen::bfloat16`, ...) (G);
/// - `int n_kv_heads()`, `int head_dim()` (E, S, G, P);
/// - `int size(int h)`: tokens held by head h, in slots `[0, size(h))` (E, S, G);
/// - `int max_size()`: the largest `size(h)` (C: `KVCache::lengths`, used by P);
/// - `capacity()`: slots per head available without a new allocation (tests, CUDA planning;
///   `PagedLayer::capacity(h)` per head);
/// - `key(h, slot)`, `value(h, slot)`: pointers to `head_dim()` contiguous elements (S, G);
/// - `std::ptrdiff_t token_stride()`: elements from one slot's key (or value) to the next slot's
///   in the same head, >= `head_dim()` (G reads a head as a `size(h) x head_dim` matrix with this
///   stride; strided layers only: `PagedLayer`, paged_cache.hpp, has none, and the engine then
///   reads its rows one by one through `key`/`value`);
/// - `const std::int32_t* positions(int h)`: the original positions of the held tokens,
///   ascending (E, G);
/// - `append(k, v, pos)`: one token for every head, all-or-nothing (`k`, `v` are
///   `[n_kv_heads][head_dim]` floats) (G); `append_head(h, k, v, pos)`: one token for head h;
/// - `compact(h, kept_slots, n_kept, streaming_min_bytes)`: keep only the given slots (strictly
///   ascending) of head h, in order (`streaming_min_bytes`: the non-temporal store threshold,
///   `EvictOptions::streaming_min_bytes`; HostLayer and LayerView default it) (E); with
///   `EvictOptions::n_threads` != 1 it runs concurrently on different heads of a layer;
/// - `shrink_to_fit()`: release or return unused capacity (E, C);
/// - `std::size_t bytes()`: bytes of K and V really held (C, P); `bytes_allocated()`: bytes of
///   storage reserved (C).
/// `HostLayer`, `LayerView` and `PagedLayer` share one implementation of the bookkeeping and of
/// `append`, `append_head`, `compact`, `bytes` and `max_size` (detail/layer_core.hpp).
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
#include "depthkv/detail/layer_core.hpp"
#include "depthkv/detail/scalar.hpp"
#include "depthkv/detail/strided_rows.hpp"
#include "depthkv/error.hpp"

namespace depthkv {

/// Owning host storage of one layer. Layout: keys and values each
/// `[n_kv_heads][capacity][head_dim]`, row-major and contiguous; head h holds `size(h)` tokens
/// in slots `[0, size(h))`, in ascending original position. Key and value blocks of 2 MiB or more
/// are 2 MiB-aligned and advised for transparent huge pages (detail/large_page_allocator.hpp).
/// `append`, `append_head`, `compact`, `bytes`, `max_size` and the addressing are the storage
/// core's (detail/layer_core.hpp), shared with `LayerView`.
///
/// @tparam T stored element type (`float`, `Eigen::half`, `Eigen::bfloat16`).
template <typename T>
class HostLayer : public detail::StridedCore<T, HostLayer<T>> {
  using Core = detail::StridedCore<T, HostLayer<T>>;
  friend class detail::LayerCore<T, HostLayer<T>>;
  friend class detail::StridedCore<T, HostLayer<T>>;

 public:
  HostLayer() = default;
  /// @param n_kv_heads number of KV heads (>= 1)
  /// @param head_dim elements per key/value vector (>= 1)
  /// @param capacity initial slots per head (grown on demand by append)
  /// @throws Error on non-positive dimensions or negative capacity
  HostLayer(int n_kv_heads, int head_dim, int capacity = 0) {
    this->init_core(n_kv_heads, head_dim, 0);
    DEPTHKV_CHECK(capacity >= 0, "capacity must be >= 0, got " << capacity);
    reallocate(capacity);
  }

  /// Reserves at least `capacity` slots per head (never shrinks).
  void reserve(int capacity) {
    DEPTHKV_CHECK(capacity >= 0, "capacity must be >= 0, got " << capacity);
    if (capacity > this->capacity_) reallocate(capacity);
  }

  /// Reallocates to exactly `max_size()` slots per head, releasing the rest.
  void shrink_to_fit() {
    if (this->max_size() != this->capacity_) reallocate(this->max_size());
    this->shrink_positions();
  }

  /// Bytes of key/value storage allocated.
  std::size_t bytes_allocated() const { return (keys_.capacity() + values_.capacity()) * sizeof(T); }

 private:
  T* key_base() { return keys_.data(); }
  const T* key_base() const { return keys_.data(); }
  T* value_base() { return values_.data(); }
  const T* value_base() const { return values_.data(); }

  /// Room for one more token in head h (h < 0: every head): doubles the capacity (at least 16).
  void reserve_append(int h) {
    const int n = h < 0 ? this->max_size() : this->size(h);
    if (n == this->capacity_) reallocate(std::max(16, this->capacity_ * 2));
  }

  void reallocate(int new_capacity) {
    DEPTHKV_CHECK(new_capacity >= this->max_size(),
                  "capacity " << new_capacity << " below held tokens " << this->max_size());
    const std::size_t hd = static_cast<std::size_t>(this->head_dim_);
    Storage k(static_cast<std::size_t>(this->n_kv_heads_) * static_cast<std::size_t>(new_capacity) * hd);
    Storage v(k.size());
    const std::size_t dst_head = static_cast<std::size_t>(new_capacity) * hd;
    for (int h = 0; h < this->n_kv_heads_; ++h) {
      const std::size_t n = static_cast<std::size_t>(this->size(h));
      if (n == 0) continue;
      std::memcpy(k.data() + static_cast<std::size_t>(h) * dst_head, this->key(h, 0), n * hd * sizeof(T));
      std::memcpy(v.data() + static_cast<std::size_t>(h) * dst_head, this->value(h, 0), n * hd * sizeof(T));
    }
    this->reserve_positions(new_capacity);
    keys_.swap(k);
    values_.swap(v);
    this->set_layout(new_capacity, static_cast<std::ptrdiff_t>(dst_head), static_cast<std::ptrdiff_t>(hd));
  }

  using Storage = std::vector<T, detail::LargePageAllocator<T>>;  // 2 MiB pages for large layers
  Storage keys_;
  Storage values_;
};

/// Non-owning view over key/value memory an engine already owns, so the engine adopts depthkv
/// without copying its cache. Element `(h, slot, d)` of the keys is at
/// `keys[h * head_stride + slot * token_stride + d]` (likewise values): any layout in which the
/// `head_dim` elements of one (head, slot) row are contiguous and no two rows overlap, e.g.
/// - HF per sequence, `[n_kv_heads][capacity][head_dim]`: the default strides
///   (head_stride = capacity * token_stride, token_stride = head_dim);
/// - llama.cpp, token-major `[capacity][n_kv_heads * head_dim]`: head_stride = head_dim,
///   token_stride = n_kv_heads * head_dim;
/// - either with padding, or K and V interleaved in one buffer (`values` between the key rows).
/// The strides are checked (detail/strided_rows.hpp): two (head, slot) rows, or a key row and a
/// value row, that overlap are an error naming the stride. The view owns only the small
/// bookkeeping (per-head original positions, whose count is the head's size). Compaction moves
/// only the rows of the compacted head (never padding or other heads' rows), so heads keep
/// different tokens in any layout. Appends beyond `capacity` throw; `shrink_to_fit()` is a no-op
/// (the freed slots stay with the engine for reuse).
///
/// @code
/// // HF: float k_cache[n_kv][max_seq][hd], v_cache likewise, `len` tokens filled
/// depthkv::LayerView<float> hf(k_cache, v_cache, n_kv, hd, max_seq, /*length=*/len);
/// // llama.cpp: k_l, v_l are [kv_size][n_kv * hd], `len` cells filled
/// depthkv::LayerView<Eigen::half> lc(k_l, v_l, n_kv, hd, kv_size, len, /*head_stride=*/hd,
///                                    /*token_stride=*/n_kv * hd);
/// @endcode
template <typename T>
class LayerView : public detail::StridedCore<T, LayerView<T>> {
  friend class detail::LayerCore<T, LayerView<T>>;
  friend class detail::StridedCore<T, LayerView<T>>;

 public:
  LayerView() = default;
  /// @param keys, values the engine's storage (not owned, must outlive the view)
  /// @param n_kv_heads KV heads (>= 1), @param head_dim elements per row (>= 1)
  /// @param capacity slots per head (>= 0)
  /// @param length tokens already held by every head (positions 0..length-1)
  /// @param head_stride elements between heads, >= 0 (-1: `capacity * token_stride`)
  /// @param token_stride elements between tokens of a head, >= 0 (-1: `head_dim`)
  /// @throws Error on null storage, non-positive dimensions, a length outside [0, capacity], a
  ///   negative stride, or strides under which two rows overlap (the message names the stride)
  LayerView(T* keys, T* values, int n_kv_heads, int head_dim, int capacity, int length = 0,
            std::ptrdiff_t head_stride = -1, std::ptrdiff_t token_stride = -1)
      : keys_(keys), values_(values) {
    DEPTHKV_CHECK(keys != nullptr && values != nullptr, "null key or value storage");
    DEPTHKV_CHECK(n_kv_heads >= 1 && head_dim >= 1 && capacity >= 0,
                  "bad shape [" << n_kv_heads << "][" << capacity << "][" << head_dim << "]");
    DEPTHKV_CHECK(length >= 0 && length <= capacity, "length " << length << " outside [0, " << capacity << "]");
    const std::ptrdiff_t ts = token_stride == -1 ? head_dim : token_stride;
    const std::ptrdiff_t hs = head_stride == -1 ? static_cast<std::ptrdiff_t>(capacity) * ts : head_stride;
    detail::check_row_strides(n_kv_heads, head_dim, capacity, hs, ts);
    detail::check_kv_rows_disjoint(keys, values, n_kv_heads, head_dim, capacity, hs, ts);
    this->init_core(n_kv_heads, head_dim, length);
    this->reserve_positions(capacity);
    this->set_layout(capacity, hs, ts);
  }

  /// Sets head h's original positions (`size(h)` ascending values), e.g. after adopting a cache
  /// that was already pruned by the engine.
  /// @throws Error when h is out of range or the positions are not strictly ascending and non-negative
  void set_positions(int h, const std::int32_t* pos) { this->assign_positions(h, pos); }

  /// No-op: the engine owns the memory; slots past `size(h)` are free for its reuse.
  void shrink_to_fit() {}

  /// Bytes of the engine's key/value rows this view addresses
  /// (n_kv_heads * capacity * head_dim * 2 * sizeof(T); padding not counted).
  std::size_t bytes_allocated() const {
    return static_cast<std::size_t>(this->n_kv_heads_) * static_cast<std::size_t>(this->capacity_) *
           static_cast<std::size_t>(this->head_dim_) * 2 * sizeof(T);
  }

 private:
  T* key_base() { return keys_; }
  const T* key_base() const { return keys_; }
  T* value_base() { return values_; }
  const T* value_base() const { return values_; }

  /// Room for one more token in head h (h < 0: every head): an error when full.
  void reserve_append(int h) {
    for (int i = h < 0 ? 0 : h; i < (h < 0 ? this->n_kv_heads_ : h + 1); ++i)
      DEPTHKV_CHECK(this->size(i) < this->capacity_, "head " << i << " is full (capacity " << this->capacity_ << ")");
  }

  T* keys_ = nullptr;
  T* values_ = nullptr;
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

/// Drops from KV head `h` of `layer` the slots holding positions in [from, through] (slots are
/// held in position order, so they form one run) and keeps the others in order: what a
/// sliding-window layer does with the positions no later query can see.
/// @param kept receives the kept slots' indices before the drop (for per-slot state kept beside
///   the layer, e.g. `TokenScorer::compact`); untouched when nothing is dropped
/// @return the slots dropped
template <class Layer>
int drop_positions(Layer& layer, int h, std::int64_t from, std::int64_t through, std::vector<std::int32_t>& kept) {
  const int n = layer.size(h);
  const std::int32_t* pos = layer.positions(h);
  const auto lo = [&](std::int64_t p) { return static_cast<int>(std::lower_bound(pos, pos + n, p) - pos); };
  const int a = lo(from), b = through < from ? a : std::max(a, lo(through + 1));
  if (b == a) return 0;
  kept.clear();
  for (int i = 0; i < n; ++i)
    if (i < a || i >= b) kept.push_back(i);
  layer.compact(h, kept.data(), static_cast<int>(kept.size()));
  return b - a;
}

}  // namespace depthkv
