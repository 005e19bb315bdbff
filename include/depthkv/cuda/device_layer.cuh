#pragma once
/// @file cuda/device_layer.cuh
/// @brief Device storage types for `KVCache`: `DeviceLayer<T>` (owns device memory) and
/// `DeviceLayerView<T>` (non-owning, over device memory an engine already owns).
///
/// Layout (both): keys and values each `[n_kv_heads][capacity][head_dim]` of `T` (`float`,
/// `__half`, `__nv_bfloat16`); element `(h, slot, d)` at `keys[h * head_stride + slot *
/// token_stride + d]`; original positions `int32 [n_kv_heads][capacity]` in device memory.
/// Head h holds `size(h)` tokens in slots `[0, size(h))`, positions ascending.
///
/// They satisfy the host side of the Layer concept of kv_cache.hpp: `Scalar`, `n_kv_heads()`,
/// `head_dim()`, `capacity()`, `size(h)`, `max_size()`, `bytes()`, `bytes_allocated()`,
/// `shrink_to_fit()`, and `key/value/positions` (device addresses, never dereferenced on the
/// host). Token data is moved with `upload_head`/`download_head` (host <-> device) and evicted on
/// the device with `depthkv::cuda::Evict` (evict.cuh), out-of-place into a second layer:
///
/// @code
/// depthkv::cuda::DeviceLayer<__nv_bfloat16> a(n_kv, hd, max_len), b(n_kv, hd, max_len);
/// for (int h = 0; h < n_kv; ++h) (void)a.upload_head(h, k_host[h], v_host[h], pos_host[h], len);
/// std::vector<depthkv::cuda::EvictRow> rows;
/// depthkv::cuda::append_evict_rows(rows, a, b, d_scores, max_len, keep.data(), 4, 64);
/// // upload rows, depthkv::cuda::Evict<__nv_bfloat16>(...), then swap(a, b) (ping-pong)
/// @endcode

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "depthkv/cuda/detail/device_storage.hpp"
#include "depthkv/error.hpp"

namespace depthkv {
namespace cuda {

/// Non-owning device layer over an engine's device memory (the engine keeps ownership; the view
/// holds only pointers, strides and the per-head sizes).
///
/// @code
/// // engine: bf16 k_cache[n_kv][max_seq][hd], v_cache likewise, int32 pos[n_kv][max_seq], len tokens
/// depthkv::cuda::DeviceLayerView<__nv_bfloat16> view(k_cache, v_cache, pos, n_kv, hd, max_seq, len);
/// @endcode
template <typename T>
class DeviceLayerView : public detail::DeviceStorage<T> {
 public:
  DeviceLayerView() = default;
  /// @param d_keys, d_values device storage (not owned, must outlive the view)
  /// @param d_positions device positions `[n_kv_heads][position_head_stride]`, or null
  /// @param length tokens held by every head
  /// @param head_stride elements between heads (default `capacity * token_stride`)
  /// @param token_stride elements between tokens (default `head_dim`)
  /// @param position_head_stride entries between heads' positions (default `capacity`)
  /// @throws Error on null storage, bad shape or overlapping strides
  DeviceLayerView(T* d_keys, T* d_values, std::int32_t* d_positions, int n_kv_heads, int head_dim, int capacity,
                  int length = 0, std::ptrdiff_t head_stride = -1, std::ptrdiff_t token_stride = -1,
                  std::ptrdiff_t position_head_stride = -1) {
    this->init(d_keys, d_values, d_positions, n_kv_heads, head_dim, capacity, length, head_stride, token_stride,
               position_head_stride);
  }
  /// No-op: the engine owns the memory.
  void shrink_to_fit() {}
};

/// Owning device layer: keys, values and positions in `cudaMalloc`ed memory, dense layout.
/// Move-only. Construction and `reserve`/`shrink_to_fit` allocate (and throw Error when CUDA
/// fails); nothing else allocates.
template <typename T>
class DeviceLayer : public detail::DeviceStorage<T> {
 public:
  DeviceLayer() = default;
  /// @param n_kv_heads KV heads (>= 1), @param head_dim elements per token (>= 1), @param capacity slots per head
  /// @throws Error on a bad shape or when cudaMalloc fails
  DeviceLayer(int n_kv_heads, int head_dim, int capacity) {
    DEPTHKV_CHECK(n_kv_heads >= 1 && head_dim >= 1 && capacity >= 0,
                  "bad shape [" << n_kv_heads << "][" << capacity << "][" << head_dim << "]");
    T* k = nullptr;
    T* v = nullptr;
    std::int32_t* p = nullptr;
    allocate(n_kv_heads, head_dim, capacity, k, v, p);
    this->init(k, v, p, n_kv_heads, head_dim, capacity, 0, -1, -1, -1);
  }
  ~DeviceLayer() { release(); }
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;
  DeviceLayer(DeviceLayer&& o) noexcept { this->swap_storage(o); }
  DeviceLayer& operator=(DeviceLayer&& o) noexcept {
    if (this != &o) {
      release();
      this->swap_storage(o);
    }
    return *this;
  }
  /// Exchanges storage with `o` (ping-pong after an out-of-place eviction).
  void swap(DeviceLayer& o) noexcept { this->swap_storage(o); }
  friend void swap(DeviceLayer& a, DeviceLayer& b) noexcept { a.swap(b); }

  /// A non-owning view of this layer's storage with the current sizes (a snapshot: sizes set on
  /// the view are not copied back).
  DeviceLayerView<T> view() const {
    DeviceLayerView<T> v(this->keys_, this->values_, this->positions_, this->n_kv_heads_, this->head_dim_,
                         this->capacity_, 0, this->head_stride_, this->token_stride_, this->position_head_stride_);
    for (int h = 0; h < this->n_kv_heads_; ++h) v.set_size(h, this->size(h));
    return v;
  }

  /// Copies `length` tokens of head h from the host and sets `size(h) = length`.
  /// @param h_keys, h_values host `[length][head_dim]`; @param h_positions host `[length]`, ascending
  /// @return the CUDA error of the copies (the host buffers must stay valid until the stream reaches them)
  /// @throws Error when h or length is out of range
  [[nodiscard]] cudaError_t upload_head(int h, const T* h_keys, const T* h_values, const std::int32_t* h_positions,
                                        int length, cudaStream_t stream = nullptr) {
    DEPTHKV_CHECK(h >= 0 && h < this->n_kv_heads_, "head " << h << " outside [0, " << this->n_kv_heads_ << ")");
    DEPTHKV_CHECK(length >= 0 && length <= this->capacity_, "length " << length << " outside [0, " << this->capacity_ << "]");
    DEPTHKV_CHECK(length == 0 || (h_keys != nullptr && h_values != nullptr && h_positions != nullptr), "null host data");
    this->set_size(h, length);
    if (length == 0) return cudaSuccess;
    const std::size_t bytes = static_cast<std::size_t>(length) * static_cast<std::size_t>(this->head_dim_) * sizeof(T);
    cudaError_t e = cudaMemcpyAsync(this->key(h, 0), h_keys, bytes, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(this->value(h, 0), h_values, bytes, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(this->positions(h), h_positions, static_cast<std::size_t>(length) * sizeof(std::int32_t),
                          cudaMemcpyHostToDevice, stream);
    return e;
  }

  /// Copies head h's `size(h)` tokens to the host (`[size(h)][head_dim]` keys and values,
  /// `[size(h)]` positions; any pointer may be null).
  [[nodiscard]] cudaError_t download_head(int h, T* h_keys, T* h_values, std::int32_t* h_positions,
                                          cudaStream_t stream = nullptr) const {
    DEPTHKV_CHECK(h >= 0 && h < this->n_kv_heads_, "head " << h << " outside [0, " << this->n_kv_heads_ << ")");
    const int n = this->size(h);
    if (n == 0) return cudaSuccess;
    const std::size_t bytes = static_cast<std::size_t>(n) * static_cast<std::size_t>(this->head_dim_) * sizeof(T);
    cudaError_t e = cudaSuccess;
    if (h_keys != nullptr) e = cudaMemcpyAsync(h_keys, this->key(h, 0), bytes, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess && h_values != nullptr)
      e = cudaMemcpyAsync(h_values, this->value(h, 0), bytes, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess && h_positions != nullptr)
      e = cudaMemcpyAsync(h_positions, this->positions(h), static_cast<std::size_t>(n) * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream);
    return e;
  }

  /// Grows the capacity to at least `capacity` slots, keeping the held tokens (synchronous).
  /// @throws Error when CUDA fails
  void reserve(int capacity) {
    DEPTHKV_CHECK(capacity >= 0, "capacity must be >= 0, got " << capacity);
    if (capacity > this->capacity_) reallocate(capacity);
  }
  /// Reallocates to exactly `max_size()` slots per head, releasing the rest (synchronous).
  void shrink_to_fit() {
    if (this->max_size() != this->capacity_) reallocate(this->max_size());
  }

 private:
  static void allocate(int nh, int hd, int cap, T*& k, T*& v, std::int32_t*& p) {
    k = nullptr;
    v = nullptr;
    p = nullptr;
    const std::size_t elems = static_cast<std::size_t>(nh) * static_cast<std::size_t>(cap) * static_cast<std::size_t>(hd);
    if (elems == 0) return;
    cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&k), elems * sizeof(T));
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&v), elems * sizeof(T));
    if (e == cudaSuccess)
      e = cudaMalloc(reinterpret_cast<void**>(&p), static_cast<std::size_t>(nh) * static_cast<std::size_t>(cap) * sizeof(std::int32_t));
    if (e != cudaSuccess) {
      if (k != nullptr) (void)cudaFree(k);
      if (v != nullptr) (void)cudaFree(v);
      k = nullptr;
      v = nullptr;
      p = nullptr;
      DEPTHKV_FAIL("cudaMalloc of a [" << nh << "][" << cap << "][" << hd << "] layer failed: " << cudaGetErrorString(e));
    }
  }

  void reallocate(int new_capacity) {
    DEPTHKV_CHECK(new_capacity >= this->max_size(), "capacity " << new_capacity << " below held tokens " << this->max_size());
    T* k = nullptr;
    T* v = nullptr;
    std::int32_t* p = nullptr;
    allocate(this->n_kv_heads_, this->head_dim_, new_capacity, k, v, p);
    const int held = this->max_size();
    cudaError_t e = cudaSuccess;
    if (held > 0) {
      const std::size_t row = static_cast<std::size_t>(this->head_dim_) * sizeof(T);
      const std::size_t width = static_cast<std::size_t>(held) * row;
      const std::size_t spitch = static_cast<std::size_t>(this->head_stride_) * sizeof(T);
      const std::size_t dpitch = static_cast<std::size_t>(new_capacity) * row;
      const std::size_t h = static_cast<std::size_t>(this->n_kv_heads_);
      e = cudaMemcpy2D(k, dpitch, this->keys_, spitch, width, h, cudaMemcpyDeviceToDevice);
      if (e == cudaSuccess) e = cudaMemcpy2D(v, dpitch, this->values_, spitch, width, h, cudaMemcpyDeviceToDevice);
      if (e == cudaSuccess)
        e = cudaMemcpy2D(p, static_cast<std::size_t>(new_capacity) * sizeof(std::int32_t), this->positions_,
                         static_cast<std::size_t>(this->position_head_stride_) * sizeof(std::int32_t),
                         static_cast<std::size_t>(held) * sizeof(std::int32_t), h, cudaMemcpyDeviceToDevice);
    }
    if (e != cudaSuccess) {
      (void)cudaFree(k);
      (void)cudaFree(v);
      (void)cudaFree(p);
      DEPTHKV_FAIL("reallocating a device layer failed: " << cudaGetErrorString(e));
    }
    std::vector<int> sizes = this->sizes_;
    release();
    this->init(k, v, p, static_cast<int>(sizes.size()), this->head_dim_, new_capacity, 0, -1, -1, -1);
    for (int i = 0; i < static_cast<int>(sizes.size()); ++i) this->set_size(i, sizes[static_cast<std::size_t>(i)]);
  }

  void release() noexcept {
    if (this->keys_ != nullptr) (void)cudaFree(this->keys_);
    if (this->values_ != nullptr) (void)cudaFree(this->values_);
    if (this->positions_ != nullptr) (void)cudaFree(this->positions_);
    this->keys_ = nullptr;
    this->values_ = nullptr;
    this->positions_ = nullptr;
  }
};

}  // namespace cuda
}  // namespace depthkv
