#pragma once
/// @file paged_cache.hpp
/// @brief Paged KV storage as serving engines keep it (vLLM, FlashInfer, TensorRT-LLM, SGLang):
/// `BlockPool<T>`, fixed-size blocks of `block_size` tokens shared by many sequences and layers,
/// and `PagedLayer<T>`, one layer of one sequence whose tokens live in pool blocks listed by a
/// block table (one per layer, or one per (layer, KV head) so that heads keep different counts).
///
/// ## Block layouts (as FlashInfer's `kv_layout` and vLLM's cache tensors define them)
/// A block holds `block_size` tokens of `n_kv_heads` heads, `head_dim` elements each, for keys
/// and (separately) values:
/// - `PagedLayout::kNHD`: `[block_size][n_kv_heads][head_dim]` (vLLM's default; FlashInfer "NHD");
/// - `PagedLayout::kHND`: `[n_kv_heads][block_size][head_dim]` (FlashInfer "HND").
/// The pool's keys are `[num_blocks][block]`, values likewise: FlashInfer's `(k_cache, v_cache)`
/// pair of `[max_num_pages, page_size, num_kv_heads, head_dim]` (NHD) tensors, or vLLM's
/// `(2, num_blocks, block_size, num_kv_heads, head_size)` with values after all the keys. A pool
/// can own its memory or adopt the engine's.
///
/// ## Tables, eviction and the pool
/// - `PagedTables::kPerLayer`: one table for the layer; the pool's blocks hold every head
///   (pool `n_kv_heads` = the layer's). Slot s of head h is in block `table[s / block_size]`, at
///   in-block slot `s % block_size`. The layer holds `ceil(max_size() / block_size)` blocks.
/// - `PagedTables::kPerHead`: one table per KV head over a pool of single-head blocks (pool
///   `n_kv_heads` = 1; NHD and HND coincide); head h holds `ceil(size(h) / block_size)` blocks.
/// `append` takes a block from the pool when a head's last block is full (all heads' blocks at
/// once, all-or-nothing). A pool without enough free blocks is an `Error` ("pool exhausted"),
/// never an overwrite; `blocks_to_append()` (one token) and `blocks_for_tokens(n)` (n tokens) are
/// the back-pressure signals an engine checks first. The reference engine checks
/// `blocks_for_tokens` of every layer against its pool before a forward pass touches the cache,
/// so that a short pool leaves the sequence as it was.
/// `compact` (the evictor's) moves the survivors of a head to its first slots, in position order;
/// `shrink_to_fit` (called by `evict` unless `EvictOptions::shrink` is false) then returns every
/// block beyond the fewest that hold the survivors to the pool. `clear()` and the destructor
/// return all of them. Blocks are never shared: a layer is move-only.
///
/// ## Threads
/// `compact` on different heads of a layer is safe concurrently (rows of different heads never
/// overlap; the pool is not touched). `BlockPool::allocate`/`release` lock the pool, so layers
/// of different sequences, or the evictor's concurrent `shrink_to_fit` on different layers, may
/// share one pool.
///
/// ## Export for paged-attention kernels
/// `append_page_table(out, layer)` appends the layer's tables in FlashInfer's CSR form: page ids
/// `indices`, `indptr` (one more entry per request) and `last_page_len` (tokens in each request's
/// last page, 0 for an empty request). Per-layer tables: one request of `max_size()` tokens (heads
/// holding fewer leave stale rows at their end: mask them, or use per-head tables); per-head
/// tables: one request per KV head (a kernel then sees one KV head per request).
///
/// The paged layer satisfies the Layer concept of kv_cache.hpp except `token_stride()` (a head's
/// rows are strided only inside a block): the evictor, the scorers and `KVCache` take it, and the
/// reference engine gathers a head's rows through `key`/`value` before attention.
///
/// @code
/// depthkv::BlockPool<Eigen::half> pool(/*num_blocks=*/4096, /*block_size=*/16, n_kv, hd);
/// depthkv::KVCache<depthkv::PagedLayer<Eigen::half>> seq;
/// for (int l = 0; l < n_layers; ++l) seq.add_layer(depthkv::PagedLayer<Eigen::half>(pool, n_kv, hd));
/// if (seq.layer(l).blocks_to_append() > pool.num_free()) { /* back-pressure: wait or preempt */ }
/// seq.layer(l).append(k_row, v_row, pos);
/// depthkv::evict(seq, scores, keep, prot);                      // freed blocks go back to the pool
/// depthkv::PageTable pt;
/// depthkv::append_page_table(pt, seq.layer(l));                 // indices / indptr / last_page_len
/// @endcode

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include <vector>

#include "depthkv/detail/large_page_allocator.hpp"
#include "depthkv/detail/layer_core.hpp"
#include "depthkv/error.hpp"

namespace depthkv {

/// Order of a block's elements (file comment).
enum class PagedLayout { kNHD, kHND };
/// One block table per layer, or one per (layer, KV head) (file comment).
enum class PagedTables { kPerLayer, kPerHead };

/// A pool of `num_blocks` key blocks and as many value blocks, each `block_size` tokens of
/// `n_kv_heads` x `head_dim` elements in `layout`. Blocks are handed out whole, all-or-nothing;
/// the pool tracks which are in use (`in_use`, `num_free`, `check`). Not copyable or movable
/// (layers keep a pointer to it).
///
/// @code
/// depthkv::BlockPool<float> pool(1024, 16, n_kv, hd);                    // owns its memory
/// depthkv::BlockPool<float> adopted(k_ptr, v_ptr, 1024, 16, n_kv, hd);   // over an engine's blocks
/// @endcode
template <typename T>
class BlockPool {
 public:
  using Scalar = T;

  /// Owning pool. @throws Error on non-positive dimensions or a negative block count
  BlockPool(int num_blocks, int block_size, int n_kv_heads, int head_dim, PagedLayout layout = PagedLayout::kNHD) {
    init(num_blocks, block_size, n_kv_heads, head_dim, layout);
    owned_keys_.resize(static_cast<std::size_t>(num_blocks) * block_elements());
    owned_values_.resize(owned_keys_.size());
    keys_ = owned_keys_.data();
    values_ = owned_values_.data();
  }
  /// Pool over an engine's memory: `keys`, `values` each `[num_blocks][block]` (not owned).
  /// @throws Error on null storage, bad dimensions, or key and value storage that overlap
  BlockPool(T* keys, T* values, int num_blocks, int block_size, int n_kv_heads, int head_dim,
            PagedLayout layout = PagedLayout::kNHD) {
    init(num_blocks, block_size, n_kv_heads, head_dim, layout);
    DEPTHKV_CHECK(num_blocks == 0 || (keys != nullptr && values != nullptr), "null key or value storage");
    const std::size_t bytes = static_cast<std::size_t>(num_blocks) * block_elements() * sizeof(T);
    const auto k0 = reinterpret_cast<std::uintptr_t>(keys), v0 = reinterpret_cast<std::uintptr_t>(values);
    DEPTHKV_CHECK(num_blocks == 0 || k0 + bytes <= v0 || v0 + bytes <= k0, "key and value blocks overlap");
    keys_ = keys;
    values_ = values;
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  PagedLayout layout() const { return layout_; }
  /// Elements of one key (or value) block: block_size * n_kv_heads * head_dim.
  std::size_t block_elements() const {
    return static_cast<std::size_t>(block_size_) * static_cast<std::size_t>(n_kv_heads_) *
           static_cast<std::size_t>(head_dim_);
  }
  /// Bytes of K and V in one block.
  std::size_t block_bytes() const { return 2 * block_elements() * sizeof(T); }
  /// Elements between consecutive slots of one head inside a block (NHD: n_kv_heads * head_dim; HND: head_dim).
  std::ptrdiff_t token_stride() const {
    return layout_ == PagedLayout::kNHD ? static_cast<std::ptrdiff_t>(n_kv_heads_) * head_dim_ : head_dim_;
  }
  /// Elements between heads inside a block (NHD: head_dim; HND: block_size * head_dim).
  std::ptrdiff_t head_stride() const {
    return layout_ == PagedLayout::kNHD ? head_dim_ : static_cast<std::ptrdiff_t>(block_size_) * head_dim_;
  }

  /// Free blocks now.
  int num_free() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(free_.size());
  }
  /// Blocks in use now.
  int num_used() const { return num_blocks_ - num_free(); }
  /// Whether block b is in use. @throws Error when b is out of range
  bool in_use(std::int32_t b) const {
    check_block(b);
    std::lock_guard<std::mutex> lock(mutex_);
    return used_[static_cast<std::size_t>(b)] != 0;
  }

  /// Takes `n` free blocks (appended to `out`), all or none.
  /// @throws Error ("pool exhausted") when fewer than n are free; nothing is taken then
  void allocate(int n, std::vector<std::int32_t>& out) {
    DEPTHKV_CHECK(n >= 0, "block count must be >= 0, got " << n);
    out.reserve(out.size() + static_cast<std::size_t>(n));  // may throw: before anything is taken
    std::lock_guard<std::mutex> lock(mutex_);
    DEPTHKV_CHECK(static_cast<int>(free_.size()) >= n, "pool exhausted: " << n << " blocks needed, "
                                                                          << free_.size() << " of " << num_blocks_
                                                                          << " free");
    for (int i = 0; i < n; ++i) {
      const std::int32_t b = free_.back();
      free_.pop_back();
      used_[static_cast<std::size_t>(b)] = 1;
      out.push_back(b);
    }
  }
  /// Returns `n` blocks in use to the pool, all or none.
  /// @throws Error when a block is out of range, not in use, or listed twice; nothing is returned then
  void release(const std::int32_t* blocks, int n) {
    DEPTHKV_CHECK(n >= 0 && (n == 0 || blocks != nullptr), "bad block list of " << n);
    for (int i = 0; i < n; ++i) check_block(blocks[i]);
    std::lock_guard<std::mutex> lock(mutex_);
    for (int i = 0; i < n; ++i) {
      char& u = used_[static_cast<std::size_t>(blocks[i])];
      if (u != 1) {  // undo the marks of this call before failing
        for (int j = 0; j < i; ++j) used_[static_cast<std::size_t>(blocks[j])] = 1;
        DEPTHKV_FAIL("block " << blocks[i] << (u == 2 ? " listed twice" : " is not in use"));
      }
      u = 2;  // marked in this call
    }
    for (int i = 0; i < n; ++i) {
      used_[static_cast<std::size_t>(blocks[i])] = 0;
      free_.push_back(blocks[i]);  // capacity num_blocks: never allocates
    }
  }

  /// Checks the pool's own accounting: every block is either free (listed once) or in use.
  /// @return true when consistent
  bool check() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<char> seen(static_cast<std::size_t>(num_blocks_), 0);
    for (std::int32_t b : free_) {
      if (b < 0 || b >= num_blocks_ || seen[static_cast<std::size_t>(b)] || used_[static_cast<std::size_t>(b)] != 0)
        return false;
      seen[static_cast<std::size_t>(b)] = 1;
    }
    for (int b = 0; b < num_blocks_; ++b)
      if (!seen[static_cast<std::size_t>(b)] && used_[static_cast<std::size_t>(b)] != 1) return false;
    return true;
  }

  /// Element offset of row (block b, head h, in-block slot s) from `keys_data()` (or `values_data()`).
  std::size_t row_offset(std::int32_t b, int h, int s) const {
    return static_cast<std::size_t>(b) * block_elements() +
           static_cast<std::size_t>(h * head_stride() + s * token_stride());
  }
  /// Key row of (block b, head h, in-block slot s): `head_dim` contiguous elements.
  T* key(std::int32_t b, int h, int s) const { return keys_ + row_offset(b, h, s); }
  /// Value row of (block b, head h, in-block slot s).
  T* value(std::int32_t b, int h, int s) const { return values_ + row_offset(b, h, s); }
  /// Base of the key blocks (`[num_blocks][block]`) and of the value blocks.
  T* keys_data() const { return keys_; }
  T* values_data() const { return values_; }

 private:
  void init(int num_blocks, int block_size, int n_kv_heads, int head_dim, PagedLayout layout) {
    DEPTHKV_CHECK(num_blocks >= 0, "num_blocks must be >= 0, got " << num_blocks);
    DEPTHKV_CHECK(block_size >= 1 && n_kv_heads >= 1 && head_dim >= 1,
                  "block_size, n_kv_heads and head_dim must be >= 1, got " << block_size << ", " << n_kv_heads
                                                                           << ", " << head_dim);
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    n_kv_heads_ = n_kv_heads;
    head_dim_ = head_dim;
    layout_ = layout;
    used_.assign(static_cast<std::size_t>(num_blocks), 0);
    free_.reserve(static_cast<std::size_t>(num_blocks));
    for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);  // block 0 is handed out first
  }
  void check_block(std::int32_t b) const {
    DEPTHKV_CHECK(b >= 0 && b < num_blocks_, "block " << b << " outside [0, " << num_blocks_ << ")");
  }

  int num_blocks_ = 0;
  int block_size_ = 0;
  int n_kv_heads_ = 0;
  int head_dim_ = 0;
  PagedLayout layout_ = PagedLayout::kNHD;
  T* keys_ = nullptr;
  T* values_ = nullptr;
  std::vector<T, detail::LargePageAllocator<T>> owned_keys_, owned_values_;
  mutable std::mutex mutex_;
  std::vector<std::int32_t> free_;  // free block ids (a stack)
  std::vector<char> used_;          // [block]: 1 in use, 0 free (2: being released)
};

/// One layer of one sequence in pool blocks (file comment). Move-only; returns its blocks to the
/// pool on destruction.
///
/// @tparam T stored element type (`float`, `Eigen::half`, `Eigen::bfloat16`).
template <typename T>
class PagedLayer : public detail::LayerCore<T, PagedLayer<T>> {
  friend class detail::LayerCore<T, PagedLayer<T>>;

 public:
  PagedLayer() = default;
  /// @param pool the block pool (must outlive the layer); its `head_dim` must match, its
  ///   `n_kv_heads` must be `n_kv_heads` (per-layer tables) or 1 (per-head tables)
  /// @throws Error on mismatched dimensions
  PagedLayer(BlockPool<T>& pool, int n_kv_heads, int head_dim, PagedTables tables = PagedTables::kPerLayer)
      : pool_(&pool), tables_mode_(tables) {
    this->init_core(n_kv_heads, head_dim, 0);
    DEPTHKV_CHECK(pool.head_dim() == head_dim, "pool head_dim " << pool.head_dim() << " != layer head_dim " << head_dim);
    if (tables == PagedTables::kPerLayer)
      DEPTHKV_CHECK(pool.n_kv_heads() == n_kv_heads, "per-layer tables need a pool of " << n_kv_heads
                                                                                        << " KV heads, got "
                                                                                        << pool.n_kv_heads());
    else
      DEPTHKV_CHECK(pool.n_kv_heads() == 1, "per-head tables need a pool of single-head blocks, got "
                                                << pool.n_kv_heads() << " heads per block");
    tables_.assign(tables == PagedTables::kPerLayer ? 1 : static_cast<std::size_t>(n_kv_heads), {});
  }
  ~PagedLayer() { release_blocks(); }
  PagedLayer(const PagedLayer&) = delete;
  PagedLayer& operator=(const PagedLayer&) = delete;
  PagedLayer(PagedLayer&& o) noexcept
      : detail::LayerCore<T, PagedLayer<T>>(std::move(o)),
        pool_(o.pool_),
        tables_mode_(o.tables_mode_),
        tables_(std::move(o.tables_)) {
    o.tables_.clear();
    o.clear_core();
  }
  PagedLayer& operator=(PagedLayer&& o) noexcept {
    if (this != &o) {
      release_blocks();
      detail::LayerCore<T, PagedLayer<T>>::operator=(std::move(o));
      pool_ = o.pool_;
      tables_mode_ = o.tables_mode_;
      tables_ = std::move(o.tables_);
      o.tables_.clear();
      o.clear_core();
    }
    return *this;
  }

  PagedTables tables() const { return tables_mode_; }
  /// Tokens per block.
  int block_size() const { return pool_ == nullptr ? 0 : pool_->block_size(); }
  /// The pool this layer takes its blocks from.
  BlockPool<T>& pool() const { return *pool_; }
  /// Block table of head h (per-layer tables: the same for every head): block ids in slot order.
  const std::vector<std::int32_t>& block_table(int h = 0) const { return tables_[table_index(h)]; }
  /// Blocks held, all tables.
  int num_blocks_held() const {
    std::size_t n = 0;
    for (const auto& t : tables_) n += t.size();
    return static_cast<int>(n);
  }
  /// Slots head h can hold without taking a block.
  int capacity(int h) const { return static_cast<int>(block_table(h).size()) * block_size(); }
  /// Blocks the next `append` (h < 0) or `append_head(h)` takes from the pool (0 or more): the
  /// back-pressure signal; the append fails when the pool has fewer free.
  int blocks_to_append(int h = -1) const {
    if (tables_mode_ == PagedTables::kPerLayer) {
      const int n = h < 0 ? this->max_size() : this->size(h);
      return n == capacity(0) ? 1 : 0;
    }
    int need = 0;
    for (int i = h < 0 ? 0 : h; i < (h < 0 ? this->n_kv_heads_ : h + 1); ++i) need += this->size(i) == capacity(i);
    return need;
  }

  /// Blocks that appending `n` more tokens to every head takes from the pool (0 or more): what an
  /// engine checks against `pool().num_free()` before a forward pass of `n` tokens, so that a
  /// short pool is found before any layer is touched. 0 for a layer without a pool.
  /// @throws Error when n < 0
  int blocks_for_tokens(int n) const {
    DEPTHKV_CHECK(n >= 0, "token count must be >= 0, got " << n);
    if (pool_ == nullptr) return 0;
    const long long bs = block_size();
    long long need = 0;
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const int held = tables_mode_ == PagedTables::kPerLayer ? this->max_size() : this->size(static_cast<int>(t));
      need += std::max(0LL, (held + static_cast<long long>(n) + bs - 1) / bs - static_cast<long long>(tables_[t].size()));
    }
    return static_cast<int>(std::min<long long>(need, std::numeric_limits<int>::max()));
  }

  /// Key row of head h at slot `slot` (`head_dim` contiguous elements).
  T* key(int h, int slot) const { return row(pool_->keys_data(), h, slot); }
  /// Value row of head h at slot `slot`.
  T* value(int h, int slot) const { return row(pool_->values_data(), h, slot); }

  /// Returns every block beyond the fewest that hold each table's tokens to the pool.
  void shrink_to_fit() {
    if (pool_ == nullptr) return;
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const int held = tables_mode_ == PagedTables::kPerLayer ? this->max_size() : this->size(static_cast<int>(t));
      const std::size_t need = static_cast<std::size_t>((held + block_size() - 1) / block_size());
      std::vector<std::int32_t>& tab = tables_[t];
      if (tab.size() > need) {
        pool_->release(tab.data() + need, static_cast<int>(tab.size() - need));
        tab.resize(need);
      }
    }
  }
  /// Drops every token and returns all blocks to the pool (the sequence ends).
  void clear() {
    release_blocks();
    for (int h = 0; h < this->n_kv_heads_; ++h) this->truncate(h, 0);
  }

  /// Bytes of pool storage this layer holds (blocks x `BlockPool::block_bytes`).
  std::size_t bytes_allocated() const {
    return pool_ == nullptr ? 0 : static_cast<std::size_t>(num_blocks_held()) * pool_->block_bytes();
  }

 private:
  std::size_t table_index(int h) const {
    return tables_mode_ == PagedTables::kPerLayer ? 0 : static_cast<std::size_t>(h);
  }
  T* row(T* base, int h, int slot) const {
    const int bs = pool_->block_size();
    const std::int32_t b = tables_[table_index(h)][static_cast<std::size_t>(slot / bs)];
    const int ph = tables_mode_ == PagedTables::kPerLayer ? h : 0;  // head inside the block
    return base + pool_->row_offset(b, ph, slot % bs);
  }

  /// Room for one more token in head h (h < 0: every head): takes the needed blocks at once.
  void reserve_append(int h) {
    const int need = blocks_to_append(h);
    if (need == 0) return;
    // the tables that grow, each reserved first so that no push_back below allocates
    std::vector<std::size_t> grow;
    if (tables_mode_ == PagedTables::kPerLayer) {
      grow.push_back(0);
    } else {
      for (int i = h < 0 ? 0 : h; i < (h < 0 ? this->n_kv_heads_ : h + 1); ++i)
        if (this->size(i) == capacity(i)) grow.push_back(static_cast<std::size_t>(i));
    }
    for (std::size_t t : grow) tables_[t].reserve(tables_[t].size() + 1);
    std::vector<std::int32_t> got;
    pool_->allocate(need, got);  // throws before anything changes when the pool is short
    for (std::size_t k = 0; k < grow.size(); ++k) tables_[grow[k]].push_back(got[k]);
  }

  /// Moves row kept[i] of head h to slot i, row by row (distinct rows never overlap; rows of other
  /// heads are not touched). The blocks stay held until shrink_to_fit.
  void compact_rows(int h, const std::int32_t* kept, int n_kept, std::size_t /*streaming_min_bytes*/) {
    const std::size_t row_bytes = static_cast<std::size_t>(this->head_dim_) * sizeof(T);
    for (int i = 0; i < n_kept; ++i) {
      if (kept[i] == i) continue;
      std::memcpy(key(h, i), key(h, kept[i]), row_bytes);
      std::memcpy(value(h, i), value(h, kept[i]), row_bytes);
    }
  }

  void release_blocks() noexcept {
    if (pool_ == nullptr) return;
    for (auto& t : tables_) {
      // blocks of a table are in use by this layer only: release cannot fail
      try {
        pool_->release(t.data(), static_cast<int>(t.size()));
      } catch (...) {
      }
      t.clear();
    }
  }

  BlockPool<T>* pool_ = nullptr;
  PagedTables tables_mode_ = PagedTables::kPerLayer;
  std::vector<std::vector<std::int32_t>> tables_;
};

/// Page tables of a batch of requests in FlashInfer's CSR form: request r's pages are
/// `indices[indptr[r] .. indptr[r + 1])`, in slot order, and its last page holds
/// `last_page_len[r]` tokens (1..block_size; 0 for a request with no tokens and no pages).
struct PageTable {
  std::vector<std::int32_t> indptr{0};
  std::vector<std::int32_t> indices;
  std::vector<std::int32_t> last_page_len;
  /// Requests listed.
  int size() const { return static_cast<int>(last_page_len.size()); }
};

/// Appends `layer`'s requests to `out`: one of `max_size()` tokens (per-layer tables) or one per
/// KV head of `size(h)` tokens (per-head tables). Only the pages that hold tokens are listed.
/// A per-layer table is one length for every head, so its heads must hold the same number of
/// tokens (after per-head budgets the shorter heads' tail slots hold stale rows that a kernel
/// would attend to: such layers need `PagedTables::kPerHead`).
/// @throws Error when `out.indptr` does not end at `out.indices.size()`, the layer has no pool,
///   or a per-layer table's heads hold different token counts; `out` is then unchanged
template <typename T>
void append_page_table(PageTable& out, const PagedLayer<T>& layer) {
  DEPTHKV_CHECK(!out.indptr.empty() && out.indptr.back() == static_cast<std::int32_t>(out.indices.size()),
                "indptr does not end at the number of indices");
  const int bs = layer.block_size();
  DEPTHKV_CHECK(bs >= 1, "the layer has no block pool (default-constructed or moved from)");
  const int n_req = layer.tables() == PagedTables::kPerLayer ? 1 : layer.n_kv_heads();
  if (layer.tables() == PagedTables::kPerLayer)
    for (int h = 0; h < layer.n_kv_heads(); ++h)
      DEPTHKV_CHECK(layer.size(h) == layer.max_size(),
                    "per-layer page table: KV head " << h << " holds " << layer.size(h) << " tokens, head 0 "
                                                     << layer.size(0) << " (one length for all heads; heads of "
                                                     << "different sizes need per-head tables)");
  for (int r = 0; r < n_req; ++r) {
    const int n = layer.tables() == PagedTables::kPerLayer ? layer.max_size() : layer.size(r);
    const int pages = (n + bs - 1) / bs;
    const std::vector<std::int32_t>& tab = layer.block_table(r);
    out.indices.insert(out.indices.end(), tab.begin(), tab.begin() + pages);
    out.indptr.push_back(static_cast<std::int32_t>(out.indices.size()));
    out.last_page_len.push_back(n == 0 ? 0 : n - (pages - 1) * bs);
  }
}

}  // namespace depthkv
