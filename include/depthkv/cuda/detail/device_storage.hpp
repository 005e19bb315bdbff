#pragma once
/// @file cuda/detail/device_storage.hpp
/// @brief Host-side bookkeeping shared by `DeviceLayer<T>` and `DeviceLayerView<T>` (no CUDA
/// headers, so it is unit-tested on the CPU): device pointers, shape, strides and the per-head
/// token counts, which live on the host because the host plans every eviction.
///
/// Layout: element `(h, slot, d)` of the keys is at `keys[h * head_stride + slot * token_stride + d]`
/// (likewise values), the shape `[n_kv_heads][capacity][head_dim]`, for any strides under which no
/// two rows overlap (head-major, token-major as llama.cpp, padded: detail/strided_rows.hpp); the
/// original position of `(h, slot)` is at `positions[h * position_head_stride + slot]` (device memory, may be absent).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "depthkv/detail/strided_rows.hpp"
#include "depthkv/error.hpp"

namespace depthkv {
namespace cuda {
namespace detail {

/// Pointers, shape and host-side sizes of a device layer. Pointers returned by `key`, `value`
/// and `positions` are device addresses: never dereference them on the host.
template <typename T>
class DeviceStorage {
 public:
  using Scalar = T;

  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  /// Slots per head.
  int capacity() const { return capacity_; }
  /// Tokens held by KV head `h` (host bookkeeping).
  int size(int h) const { return sizes_[static_cast<std::size_t>(h)]; }
  /// Largest `size(h)`.
  int max_size() const { return sizes_.empty() ? 0 : *std::max_element(sizes_.begin(), sizes_.end()); }
  /// Elements between consecutive tokens of one head.
  std::ptrdiff_t token_stride() const { return token_stride_; }
  /// Elements between heads.
  std::ptrdiff_t head_stride() const { return head_stride_; }
  /// Position entries between heads.
  std::ptrdiff_t position_head_stride() const { return position_head_stride_; }

  /// Device address of head h's key at `slot`.
  T* key(int h, int slot) const { return keys_ + offset(h, slot); }
  /// Device address of head h's value at `slot`.
  T* value(int h, int slot) const { return values_ + offset(h, slot); }
  /// Device address of head h's original positions (`size(h)` entries, ascending), or null.
  std::int32_t* positions(int h) const {
    return positions_ == nullptr ? nullptr : positions_ + static_cast<std::ptrdiff_t>(h) * position_head_stride_;
  }
  /// Base device addresses.
  T* keys_data() const { return keys_; }
  T* values_data() const { return values_; }
  std::int32_t* positions_data() const { return positions_; }

  /// Records that head h now holds `n` tokens (after an eviction or the engine's own appends).
  /// @throws Error when h or n is out of range
  void set_size(int h, int n) {
    DEPTHKV_CHECK(h >= 0 && h < n_kv_heads_, "head " << h << " outside [0, " << n_kv_heads_ << ")");
    DEPTHKV_CHECK(n >= 0 && n <= capacity_, "size " << n << " outside [0, " << capacity_ << "]");
    sizes_[static_cast<std::size_t>(h)] = n;
  }
  /// Sets every head's size to `n`.
  void set_sizes(int n) {
    for (int h = 0; h < n_kv_heads_; ++h) set_size(h, n);
  }

  /// Bytes of K and V held (sum over heads of size(h) * head_dim * 2 * sizeof(T)).
  std::size_t bytes() const {
    std::size_t tokens = 0;
    for (int n : sizes_) tokens += static_cast<std::size_t>(n);
    return tokens * static_cast<std::size_t>(head_dim_) * 2u * sizeof(T);
  }
  /// Bytes of K and V storage spanned (n_kv_heads * capacity * head_dim * 2 * sizeof(T) when dense).
  std::size_t bytes_allocated() const {
    if (n_kv_heads_ == 0) return 0;
    const std::size_t span = static_cast<std::size_t>(n_kv_heads_ - 1) * static_cast<std::size_t>(head_stride_) +
                             static_cast<std::size_t>(capacity_) * static_cast<std::size_t>(token_stride_);
    return span * 2u * sizeof(T);
  }

 protected:
  DeviceStorage() = default;

  /// Sets pointers and shape; `length` tokens in every head. Negative strides mean dense defaults.
  void init(T* keys, T* values, std::int32_t* positions, int n_kv_heads, int head_dim, int capacity, int length,
            std::ptrdiff_t head_stride, std::ptrdiff_t token_stride, std::ptrdiff_t position_head_stride) {
    DEPTHKV_CHECK(n_kv_heads >= 1 && head_dim >= 1 && capacity >= 0,
                  "bad shape [" << n_kv_heads << "][" << capacity << "][" << head_dim << "]");
    DEPTHKV_CHECK(length >= 0 && length <= capacity, "length " << length << " outside [0, " << capacity << "]");
    DEPTHKV_CHECK((keys != nullptr && values != nullptr) || capacity == 0, "null key or value storage");
    keys_ = keys;
    values_ = values;
    positions_ = positions;
    n_kv_heads_ = n_kv_heads;
    head_dim_ = head_dim;
    capacity_ = capacity;
    token_stride_ = token_stride < 0 ? head_dim : token_stride;
    head_stride_ = head_stride < 0 ? static_cast<std::ptrdiff_t>(capacity) * token_stride_ : head_stride;
    position_head_stride_ = position_head_stride < 0 ? capacity : position_head_stride;
    DEPTHKV_CHECK(token_stride_ >= head_dim, "token_stride " << token_stride_ << " < head_dim " << head_dim);
    depthkv::detail::check_row_strides(n_kv_heads, head_dim, capacity, head_stride_, token_stride_);
    if (keys != nullptr && values != nullptr)
      depthkv::detail::check_kv_rows_disjoint(keys, values, n_kv_heads, head_dim, capacity, head_stride_,
                                              token_stride_);
    DEPTHKV_CHECK(positions == nullptr || n_kv_heads == 1 || position_head_stride_ >= capacity,
                  "position_head_stride " << position_head_stride_ << " < capacity " << capacity);
    sizes_.assign(static_cast<std::size_t>(n_kv_heads), length);
  }

  void swap_storage(DeviceStorage& o) noexcept {
    std::swap(keys_, o.keys_);
    std::swap(values_, o.values_);
    std::swap(positions_, o.positions_);
    std::swap(n_kv_heads_, o.n_kv_heads_);
    std::swap(head_dim_, o.head_dim_);
    std::swap(capacity_, o.capacity_);
    std::swap(head_stride_, o.head_stride_);
    std::swap(token_stride_, o.token_stride_);
    std::swap(position_head_stride_, o.position_head_stride_);
    sizes_.swap(o.sizes_);
  }

  std::ptrdiff_t offset(int h, int slot) const {
    return static_cast<std::ptrdiff_t>(h) * head_stride_ + static_cast<std::ptrdiff_t>(slot) * token_stride_;
  }

  T* keys_ = nullptr;
  T* values_ = nullptr;
  std::int32_t* positions_ = nullptr;
  int n_kv_heads_ = 0;
  int head_dim_ = 0;
  int capacity_ = 0;
  std::ptrdiff_t head_stride_ = 0;
  std::ptrdiff_t token_stride_ = 0;
  std::ptrdiff_t position_head_stride_ = 0;
  std::vector<int> sizes_;
};

}  // namespace detail
}  // namespace cuda
}  // namespace depthkv
