#pragma once
/// @file cuda/detail/paged_plan.hpp
/// @brief Host-safe logic of the CUDA paged compaction (no CUDA headers): the block geometry of
/// a paged pool (`PagedGeometry`, the same offsets as `BlockPool::row_offset`), the per-head
/// descriptor `PagedCompactHead`, the in-order tile schedule of the kernel (which source unit goes
/// to which destination unit), parameter and head validation, and the host-side plan
/// (`plan_paged_compact`): kept counts, new table lengths and the blocks that become free.
///
/// Everything here is compiled by the plain C++ compiler too (`DEPTHKV_HOST_DEVICE` is `inline`
/// off nvcc), so `tests/detail/cuda_paged_plan_test.cpp` runs the kernel's schedule on the CPU
/// with exactly these functions and compares it with `PagedLayer::compact` + `shrink_to_fit`.
///
/// ## What a compaction does (per (layer, KV head))
/// A head holds `n` tokens in slots `0..n-1`; slot `s` is in block `table[s / block_size]` at
/// in-block slot `s % block_size`, head `head_in_block` of the block (per-layer tables: the KV
/// head; per-head tables: 0). `kept[0..n_kept)` are the survivors' slots, strictly ascending (the
/// CPU evictor's order, = position order). Survivor `i` moves from slot `kept[i]` to slot `i`
/// (K row, V row and, when given, its position), exactly as `PagedLayer::compact`; slots from
/// `n_kept` on keep their old bytes (the CPU path leaves them too). The table then needs
/// `ceil(n_kept_max / block_size)` blocks (per-layer: the largest kept count of the layer's heads;
/// per-head: the head's own), and the blocks after those are free (`PagedCompactPlan::freed`,
/// in table order: what `PagedLayer::shrink_to_fit` returns to the pool, in its order).
///
/// ## Why the in-place move is safe without a staging copy
/// `kept` is strictly ascending, so `kept[i] >= i`: every survivor moves to an earlier or equal
/// slot. The kernel walks a head's survivors in tiles of `R` consecutive survivors, in order,
/// with one CTA: a tile's units are all read (into registers), then `__syncthreads()`, then all
/// written. Tile `t` covers survivors `[i0, i0 + R)`: it writes slots `< i0 + R` and reads slots
/// `kept[j] >= j >= i0`. A later tile reads slots `kept[j] >= j >= i0 + R`, never one that tile
/// `t` (or any earlier tile) writes, so no later read waits for an earlier write, and only the
/// reads and writes of the same tile must be ordered (the barrier). A survivor with
/// `kept[i] == i` is not moved. Rows of different heads never overlap (different blocks, or
/// different head offsets of one block), so heads run concurrently, one CTA each.
/// Contract: `kept` strictly ascending in `[0, n)`; no two heads of one launch share a row: a
/// block is in one table only (per-head tables), and a per-layer table serves each of its KV
/// heads once. `plan_paged_compact` checks the kept lists and the tables of one layer; the kernel
/// checks each head's kept list and table entries again before it writes anything of that head.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "depthkv/config.hpp"
#include "depthkv/error.hpp"
#include "depthkv/paged_cache.hpp"

namespace depthkv {
namespace cuda {

/// Bits OR-ed into `PagedCompactParams::status` by the kernel (the host plan throws instead).
struct PagedCompactStatus {
  static constexpr std::uint32_t kOk = 0u;
  /// Some head was skipped, none of its bytes or positions written: n < 0, n_kept outside
  /// [0, n], n above its table's capacity, head_in_block outside the block's heads, a table entry
  /// outside [0, num_blocks), or kept slots not strictly ascending in [0, n). The same bit as
  /// `EvictStatus::kBadRow` (a row of the batch is bad and skipped).
  static constexpr std::uint32_t kBadHead = 4u;
};

/// One head of a batched paged compaction: the tokens of one (sequence, layer, KV head).
/// All pointers are device memory.
struct PagedCompactHead {
  const std::int32_t* table = nullptr;  ///< [table_len] block ids of the head's table, slot order
  const std::int32_t* kept = nullptr;   ///< [n_kept] kept slots, strictly ascending in [0, n)
  std::int32_t* positions = nullptr;    ///< [n] positions by slot, compacted in place (null: none)
  std::int32_t n = 0;                   ///< tokens the head holds before the compaction
  std::int32_t n_kept = 0;              ///< survivors (0..n)
  std::int32_t table_len = 0;           ///< blocks in `table` (n <= table_len * block_size)
  std::int32_t head_in_block = 0;       ///< head inside a block: the KV head (per-layer tables) or 0 (per-head)
};

namespace detail {

/// Threads of the compaction CTA and 16-byte (or narrower) units each thread holds per tile.
constexpr int kPagedCompactThreads = 256;
constexpr int kPagedCompactUnroll = 4;

/// The element offsets of a pool's blocks (`BlockPool`'s definitions, paged_cache.hpp):
/// row (block b, head h, in-block slot s) starts at `b * block_elements + h * head_stride +
/// s * token_stride` elements from the pool's base; NHD: token_stride = n_kv_heads * head_dim,
/// head_stride = head_dim; HND: token_stride = head_dim, head_stride = block_size * head_dim.
struct PagedGeometry {
  int block_size = 0;
  int n_kv_heads = 0;  ///< heads per block (per-head tables: 1)
  int head_dim = 0;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t block_elements = 0;
};

/// The geometry of blocks of `block_size` tokens x `n_kv_heads` heads x `head_dim` elements.
DEPTHKV_HOST_DEVICE PagedGeometry make_paged_geometry(int block_size, int n_kv_heads, int head_dim, bool hnd) {
  PagedGeometry g;
  g.block_size = block_size;
  g.n_kv_heads = n_kv_heads;
  g.head_dim = head_dim;
  g.token_stride = hnd ? static_cast<std::int64_t>(head_dim) : static_cast<std::int64_t>(n_kv_heads) * head_dim;
  g.head_stride = hnd ? static_cast<std::int64_t>(block_size) * head_dim : static_cast<std::int64_t>(head_dim);
  g.block_elements = static_cast<std::int64_t>(block_size) * n_kv_heads * head_dim;
  return g;
}

/// Element offset of slot `slot` of a head (head `head_in_block` of its blocks, table `table`).
DEPTHKV_HOST_DEVICE std::int64_t paged_slot_offset(const PagedGeometry& g, const std::int32_t* table, int head_in_block,
                                                   int slot) {
  const std::int32_t b = table[slot / g.block_size];
  return static_cast<std::int64_t>(b) * g.block_elements + static_cast<std::int64_t>(head_in_block) * g.head_stride +
         static_cast<std::int64_t>(slot % g.block_size) * g.token_stride;
}

/// Blocks that hold `n` tokens: ceil(n / block_size) (0 for n <= 0).
DEPTHKV_HOST_DEVICE int paged_blocks_for(int n, int block_size) {
  return n <= 0 ? 0 : static_cast<int>((static_cast<std::int64_t>(n) + block_size - 1) / block_size);
}

/// Survivors per tile for rows of `row_units` copy units: as many whole rows as the CTA's
/// `nt * unroll` unit registers hold, at least 1 (a longer row is copied in several steps of one
/// tile) and at most `nt` (one thread per survivor moves its position).
DEPTHKV_HOST_DEVICE int paged_tile_rows(int row_units, int nt, int unroll) {
  const int r = row_units <= 0 ? nt : (nt * unroll) / row_units;
  return r < 1 ? 1 : (r > nt ? nt : r);
}

/// One copy unit of a tile: unit `col` of survivor `i`'s row goes from element offset `src` to
/// `dst` (both from the pool's base, in elements; the unit is `col * unit_bytes` bytes into the row).
struct PagedUnitMove {
  bool move;  ///< false: outside the tile, or the survivor stays (kept[i] == i)
  int i;      ///< survivor index
  int col;    ///< unit inside the row
  std::int64_t src;
  std::int64_t dst;
};

/// The unit with flat index `q` of the tile of survivors `[i0, i0 + rows)` (units row-major:
/// q = (i - i0) * row_units + col). The kernel's thread t handles q = step + u * nt + t.
DEPTHKV_HOST_DEVICE PagedUnitMove paged_unit_move(const PagedGeometry& g, const PagedCompactHead& h, int i0, int rows,
                                                  int row_units, std::int64_t q) {
  PagedUnitMove m{false, 0, 0, 0, 0};
  if (q < 0 || q >= static_cast<std::int64_t>(rows) * row_units) return m;
  m.i = i0 + static_cast<int>(q / row_units);
  m.col = static_cast<int>(q % row_units);
  const int s = h.kept[m.i];
  if (s == m.i) return m;
  m.move = true;
  m.src = paged_slot_offset(g, h.table, h.head_in_block, s);
  m.dst = paged_slot_offset(g, h.table, h.head_in_block, m.i);
  return m;
}

/// Whether a head can be compacted as described (the kernel's per-head check, before it writes
/// anything; the kept list is checked separately by `paged_kept_ok`).
DEPTHKV_HOST_DEVICE bool paged_head_ok(const PagedGeometry& g, const PagedCompactHead& h) {
  if (h.n < 0 || h.n_kept < 0 || h.n_kept > h.n || h.table_len < 0) return false;
  if (h.head_in_block < 0 || h.head_in_block >= g.n_kv_heads) return false;
  if (static_cast<std::int64_t>(h.n) > static_cast<std::int64_t>(h.table_len) * g.block_size) return false;
  if (h.n > 0 && h.table == nullptr) return false;
  if (h.n_kept > 0 && h.kept == nullptr) return false;
  return true;
}

/// Whether entry `i` of a kept list is valid: in [0, n) and above entry i - 1.
DEPTHKV_HOST_DEVICE bool paged_kept_ok(const std::int32_t* kept, int i, int n) {
  const std::int32_t s = kept[i];
  return s >= 0 && s < n && (i == 0 || kept[i - 1] < s);
}

/// Whether table entry `b` names a block of a pool of `num_blocks`.
DEPTHKV_HOST_DEVICE bool paged_block_ok(std::int32_t b, int num_blocks) { return b >= 0 && b < num_blocks; }

/// Why a paged compaction's parameters are rejected (the CUDA `PagedCompact` then returns
/// cudaErrorInvalidValue; `PagedCompactParamsError` gives this text), or null when accepted.
/// @param layout_value the `PagedLayout` as int (0 NHD, 1 HND)
inline const char* paged_compact_params_problem(int n_heads, bool heads_null, bool k_null, bool v_null, int num_blocks,
                                                int block_size, int n_kv_heads, int head_dim, int layout_value,
                                                std::size_t elem_bytes) {
  if (n_heads < 0) return "n_heads < 0";
  if (num_blocks < 0) return "num_blocks < 0";
  if (n_heads > 0 && heads_null) return "null head table";
  if (n_heads > 0 && (k_null || v_null)) return "null key or value blocks";
  if (layout_value != 0 && layout_value != 1) return "layout is neither kNHD nor kHND";
  if (block_size < 1 || n_kv_heads < 1 || head_dim < 1) return "block_size, n_kv_heads or head_dim < 1";
  if (elem_bytes == 0 || static_cast<std::size_t>(head_dim) > std::size_t{0x7fffffff} / elem_bytes)
    return "head_dim * sizeof(T) above 2^31 - 1 bytes";
  return nullptr;
}

/// Copy unit (16, 8, 4, 2 or 1 bytes) dividing every quantity OR-ed into `or_bits`: row bytes,
/// the strides in bytes, the pool bases (the same rule as the eviction's `copy_unit_bytes`).
DEPTHKV_HOST_DEVICE int paged_copy_unit_bytes(std::uint64_t or_bits) {
  if (or_bits == 0) return 16;
  const std::uint64_t low = or_bits & (~or_bits + 1u);
  return low >= 16u ? 16 : static_cast<int>(low);
}

}  // namespace detail

/// What one layer's compaction changes besides the moved rows (host side): per head its kept
/// count, per table its length afterwards, and the blocks that become free.
struct PagedCompactPlan {
  std::vector<int> n_kept;                ///< [n_kv_heads] survivors per head
  std::vector<int> table_len;             ///< [tables] blocks each table keeps (its first ones)
  std::vector<std::int32_t> freed;        ///< blocks after those, table by table, in table order
  std::vector<std::int32_t> freed_begin;  ///< [tables + 1]: table t's freed blocks are freed[freed_begin[t] .. freed_begin[t+1])
};

namespace detail {

/// Checks the layer's `n_tables` block tables: every entry inside [0, num_blocks) and no block
/// listed twice across them.
/// @throws Error naming the table, the entry and the block
inline void check_paged_tables(const std::vector<std::int32_t>* block_tables, int n_tables, int num_blocks) {
  std::vector<char> seen(static_cast<std::size_t>(num_blocks > 0 ? num_blocks : 0), 0);
  for (int t = 0; t < n_tables; ++t) {
    for (std::size_t j = 0; j < block_tables[t].size(); ++j) {
      const std::int32_t b = block_tables[t][j];
      DEPTHKV_CHECK_AS(
          "plan_paged_compact", paged_block_ok(b, num_blocks),
          "table " << t << " entry " << j << ": block " << b << " outside [0, " << num_blocks << ")");
      DEPTHKV_CHECK_AS(
          "plan_paged_compact", !seen[static_cast<std::size_t>(b)],
          "table " << t << " entry " << j << ": block " << b << " listed twice in the layer's tables");
      seen[static_cast<std::size_t>(b)] = 1;
    }
  }
}

/// Checks head `h`: its size within [0, cap] (its table's capacity in tokens), its kept count
/// within [0, size], and its kept slots non-null, inside [0, size) and strictly ascending.
/// @throws Error naming the head
inline void check_paged_head(int h, std::size_t cap, int size, const std::int32_t* kept, int n_kept) {
  DEPTHKV_CHECK_AS("plan_paged_compact", size >= 0 && static_cast<std::size_t>(size) <= cap,
                   "head " << h << ": size " << size << " outside [0, " << cap << "] (its table's capacity)");
  DEPTHKV_CHECK_AS("plan_paged_compact", n_kept >= 0 && n_kept <= size,
                   "head " << h << ": kept count " << n_kept << " outside [0, " << size << "]");
  DEPTHKV_CHECK_AS("plan_paged_compact", n_kept == 0 || kept != nullptr, "head " << h << ": null kept slots");
  for (int i = 0; i < n_kept; ++i)
    DEPTHKV_CHECK_AS(
        "plan_paged_compact", paged_kept_ok(kept, i, size),
        "head " << h << ": kept slot " << kept[i] << " at " << i
                << (kept[i] < 0 || kept[i] >= size ? " outside [0, size)" : " not above the previous one"));
}

/// The plan of validated inputs: each table keeps the blocks its survivors need (per-layer: the
/// largest kept count; per-head: the head's), the rest are freed in table order.
inline PagedCompactPlan make_paged_compact_plan(bool per_layer, int n_tables, int block_size, int n_kv_heads,
                                                const std::vector<std::int32_t>* block_tables, const int* n_kept) {
  PagedCompactPlan p;
  p.n_kept.assign(n_kept, n_kept + n_kv_heads);
  p.freed_begin.push_back(0);
  int max_kept = 0;
  for (int h = 0; h < n_kv_heads; ++h) max_kept = n_kept[h] > max_kept ? n_kept[h] : max_kept;
  for (int t = 0; t < n_tables; ++t) {
    const int need = paged_blocks_for(per_layer ? max_kept : n_kept[t], block_size);
    const std::vector<std::int32_t>& tab = block_tables[t];
    const int len = static_cast<int>(tab.size()) < need ? static_cast<int>(tab.size()) : need;
    p.table_len.push_back(len);
    p.freed.insert(p.freed.end(), tab.begin() + len, tab.end());
    p.freed_begin.push_back(static_cast<std::int32_t>(p.freed.size()));
  }
  return p;
}

}  // namespace detail

/// Plans the compaction of one paged layer, validating everything first (nothing is modified;
/// the kernel moves the rows, the caller then returns `freed` to the pool, truncates the tables
/// to `table_len` and takes the survivors' positions).
///
/// @param tables `PagedTables::kPerLayer` (one table, heads in the blocks) or `kPerHead`
/// @param sizes [n_kv_heads] tokens each head holds; @param block_tables [1 or n_kv_heads] tables
/// @param kept [n_kv_heads] kept slot lists, @param n_kept [n_kv_heads] their lengths
/// @param num_blocks the pool's block count (table entries are checked against it)
/// @throws Error naming the head (or table) on: sizes outside [0, table capacity], kept counts
///   outside [0, size], kept slots out of range or not strictly ascending, a null list, a block
///   outside the pool or listed twice in the layer's tables
inline PagedCompactPlan plan_paged_compact(PagedTables tables, int block_size, int n_kv_heads, const int* sizes,
                                           const std::vector<std::int32_t>* block_tables,
                                           const std::int32_t* const* kept, const int* n_kept, int num_blocks) {
  DEPTHKV_CHECK(block_size >= 1, "block_size must be >= 1, got " << block_size);
  DEPTHKV_CHECK(n_kv_heads >= 0, "n_kv_heads must be >= 0, got " << n_kv_heads);
  DEPTHKV_CHECK(n_kv_heads == 0 || (sizes != nullptr && block_tables != nullptr && kept != nullptr && n_kept != nullptr),
                "null sizes, tables or kept lists");
  const bool per_layer = tables == PagedTables::kPerLayer;
  const int n_tables = per_layer ? (n_kv_heads > 0 ? 1 : 0) : n_kv_heads;
  detail::check_paged_tables(block_tables, n_tables, num_blocks);
  for (int h = 0; h < n_kv_heads; ++h) {
    const std::size_t cap = block_tables[per_layer ? 0 : h].size() * static_cast<std::size_t>(block_size);
    detail::check_paged_head(h, cap, sizes[h], kept[h], n_kept[h]);
  }
  return detail::make_paged_compact_plan(per_layer, n_tables, block_size, n_kv_heads, block_tables, n_kept);
}

/// `plan_paged_compact` for a `PagedLayer` (its sizes, tables and pool), with one kept list per head.
/// @throws Error as the raw overload, or when the layer has no pool or `kept` is not one list per head
template <typename T>
PagedCompactPlan plan_paged_compact(const PagedLayer<T>& layer, const std::vector<std::vector<std::int32_t>>& kept) {
  DEPTHKV_CHECK(layer.block_size() >= 1, "the layer has no block pool (default-constructed or moved from)");
  const int nh = layer.n_kv_heads();
  DEPTHKV_CHECK(static_cast<int>(kept.size()) == nh, kept.size() << " kept lists for " << nh << " KV heads");
  const int n_tables = layer.tables() == PagedTables::kPerLayer ? 1 : nh;
  std::vector<int> sizes(static_cast<std::size_t>(nh)), counts(static_cast<std::size_t>(nh));
  std::vector<const std::int32_t*> lists(static_cast<std::size_t>(nh));
  std::vector<std::vector<std::int32_t>> tabs;
  for (int t = 0; t < n_tables; ++t) tabs.push_back(layer.block_table(t));
  for (int h = 0; h < nh; ++h) {
    sizes[static_cast<std::size_t>(h)] = layer.size(h);
    counts[static_cast<std::size_t>(h)] = static_cast<int>(kept[static_cast<std::size_t>(h)].size());
    lists[static_cast<std::size_t>(h)] = kept[static_cast<std::size_t>(h)].data();
  }
  return plan_paged_compact(layer.tables(), layer.block_size(), nh, sizes.data(), tabs.data(), lists.data(),
                            counts.data(), layer.pool().num_blocks());
}

/// Appends one `PagedCompactHead` per KV head of a planned layer.
/// @param plan from `plan_paged_compact` (kept counts, and the table lengths before are `table_len_before`)
/// @param d_tables [1 (per-layer) or n_kv_heads] device copies of the layer's tables
/// @param table_len_before [same] their lengths (blocks) before the compaction
/// @param sizes [n_kv_heads] tokens each head holds before the compaction
/// @param d_kept [n_kv_heads] device kept lists (the plan's)
/// @param d_positions [n_kv_heads] device positions by slot (null, or null entries: not moved)
inline void append_paged_compact_heads(std::vector<PagedCompactHead>& heads, const PagedCompactPlan& plan,
                                       PagedTables tables, const std::int32_t* const* d_tables,
                                       const int* table_len_before, const int* sizes,
                                       const std::int32_t* const* d_kept, std::int32_t* const* d_positions) {
  const int nh = static_cast<int>(plan.n_kept.size());
  DEPTHKV_CHECK(nh == 0 || (d_tables != nullptr && table_len_before != nullptr && sizes != nullptr && d_kept != nullptr),
                "null tables, table lengths, sizes or kept lists");
  for (int h = 0; h < nh; ++h) {
    const int t = tables == PagedTables::kPerLayer ? 0 : h;
    PagedCompactHead d;
    d.table = d_tables[t];
    d.table_len = table_len_before[t];
    d.kept = d_kept[h];
    d.positions = d_positions == nullptr ? nullptr : d_positions[h];
    d.n = sizes[h];
    d.n_kept = plan.n_kept[static_cast<std::size_t>(h)];
    d.head_in_block = tables == PagedTables::kPerLayer ? h : 0;
    heads.push_back(d);
  }
}

}  // namespace cuda
}  // namespace depthkv
