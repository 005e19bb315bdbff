#pragma once
/// @file cuda/paged_compact.cuh
/// @brief Paged compaction on the GPU: after an eviction, the survivors of every (layer, KV head)
/// move to the first slots of their block table, in position order, inside device pool memory
/// laid out as `BlockPool` defines it (NHD `[block_size][n_kv_heads][head_dim]` or HND
/// `[n_kv_heads][block_size][head_dim]` blocks; keys `[num_blocks][block]`, values likewise) —
/// the same bytes `PagedLayer::compact` writes on the CPU. One launch over all heads of a batch.
///
/// Per head (`PagedCompactHead`): survivor `i` moves from slot `kept[i]` to slot `i` (its K row,
/// V row and, when `positions` is given, its position); slot `s` lives in block
/// `table[s / block_size]`, in-block slot `s % block_size`. Slots from `n_kept` on and every
/// other byte of the pool are left as they were. The move is in place, with no staging copy: the
/// kernel walks each head's survivors in order in tiles, reading a tile before writing it, which
/// is safe because `kept[i] >= i` (cuda/detail/paged_plan.hpp says why). One CTA of
/// `detail::kPagedCompactThreads` threads per head; every moved row is read and written once
/// (identity survivors, `kept[i] == i`, are not touched).
///
/// Freed blocks are a host-side result: `plan_paged_compact` (detail/paged_plan.hpp) validates a
/// layer and returns, per table, the length it keeps (`ceil(n_kept / block_size)`; per-layer
/// tables: of the layer's largest kept count) and the blocks after it, which the caller returns
/// to its pool (`BlockPool::release`) once the kernel has run; the tables' kept prefixes are not
/// rewritten (survivors stay in the blocks they fill, in table order).
///
/// Errors, as `Evict`: bad parameters return cudaErrorInvalidValue (`PagedCompactParamsError`
/// says why); a bad head (`PagedCompactStatus::kBadHead`: bad counts, a table entry outside the
/// pool, kept slots not strictly ascending in [0, n)) is found by the kernel before it writes
/// anything of that head and is skipped, reported through the optional `status` word.
/// The workspace is the house interface; this kernel needs none (`PagedCompactWorkspaceBytes` = 0).
///
/// @code
/// using namespace depthkv::cuda;
/// // host: the CPU evictor's kept slots per head, the layer's tables and sizes
/// PagedCompactPlan plan = plan_paged_compact(layer, kept);            // throws on bad input
/// // upload tables, kept lists (and positions) to the device, then:
/// std::vector<PagedCompactHead> heads;
/// append_paged_compact_heads(heads, plan, layer.tables(), d_tables, lens, sizes, d_kept, d_pos);
/// cudaMemcpyAsync(d_heads, heads.data(), heads.size() * sizeof(PagedCompactHead), cudaMemcpyHostToDevice, s);
/// PagedCompactParams p;
/// p.heads = d_heads; p.n_heads = int(heads.size()); p.k_blocks = d_k; p.v_blocks = d_v;
/// p.num_blocks = nb; p.block_size = bs; p.n_kv_heads = n_kv; p.head_dim = hd; p.layout = depthkv::PagedLayout::kNHD;
/// cudaError_t e = PagedCompact<__half>(p, nullptr, PagedCompactWorkspaceBytes(p), s);
/// // after the stream reaches it: pool.release(plan.freed.data(), int(plan.freed.size()))
/// @endcode

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "depthkv/cuda/detail/paged_plan.hpp"

namespace depthkv {
namespace cuda {

/// Parameters of one batched paged compaction.
struct PagedCompactParams {
  const PagedCompactHead* heads = nullptr;  ///< device array of `n_heads` heads
  int n_heads = 0;                          ///< heads (sequences x layers x KV heads)
  void* k_blocks = nullptr;                 ///< device key blocks `[num_blocks][block]`
  void* v_blocks = nullptr;                 ///< device value blocks `[num_blocks][block]`
  int num_blocks = 0;                       ///< blocks in the pool (table entries are checked against it)
  int block_size = 0;                       ///< tokens per block
  int n_kv_heads = 0;                       ///< heads per block (per-head tables: 1)
  int head_dim = 0;                         ///< elements per key/value row
  PagedLayout layout = PagedLayout::kNHD;   ///< element order of a block
  std::uint32_t* status = nullptr;          ///< optional device word: zeroed, then OR of PagedCompactStatus bits
};

namespace detail {

/// What the compaction kernel receives (by value).
struct PagedCompactKernelParams {
  const PagedCompactHead* heads;
  unsigned char* k;
  unsigned char* v;
  PagedGeometry g;  ///< offsets in elements
  int num_blocks;
  int elem_bytes;
  int row_units;  ///< units of U per row
  std::uint32_t* status;
};

}  // namespace detail

/// One CTA per head: checks the head (counts, table entries, kept list), then moves its
/// survivors in order, `paged_tile_rows` survivors per tile: every unit of the tile is loaded
/// (K and V), `__syncthreads()`, then stored; the positions of the tile likewise.
template <typename U, int NT, int UNROLL>
__global__ void __launch_bounds__(NT) PagedCompactKernel(const detail::PagedCompactKernelParams p) {
  using namespace detail;
  const PagedCompactHead h = p.heads[blockIdx.x];
  bool bad = !paged_head_ok(p.g, h);
  if (!bad) {
    const int blocks = paged_blocks_for(h.n, p.g.block_size);
    for (int j = static_cast<int>(threadIdx.x); j < blocks; j += NT) bad = bad || !paged_block_ok(h.table[j], p.num_blocks);
    for (int i = static_cast<int>(threadIdx.x); i < h.n_kept; i += NT) bad = bad || !paged_kept_ok(h.kept, i, h.n);
  }
  if (__syncthreads_or(bad ? 1 : 0) != 0) {
    if (threadIdx.x == 0 && p.status != nullptr) atomicOr(p.status, PagedCompactStatus::kBadHead);
    return;
  }
  const int L = p.row_units;
  const int R = paged_tile_rows(L, NT, UNROLL);
  const std::int64_t eb = p.elem_bytes;
  for (int i0 = 0; i0 < h.n_kept; i0 += R) {
    const int rows = h.n_kept - i0 < R ? h.n_kept - i0 : R;
    const std::int64_t total = static_cast<std::int64_t>(rows) * L;
    for (std::int64_t step = 0; step < total; step += static_cast<std::int64_t>(NT) * UNROLL) {
      U kb[UNROLL], vb[UNROLL];
      PagedUnitMove m[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        m[u] = paged_unit_move(p.g, h, i0, rows, L, step + static_cast<std::int64_t>(u) * NT + threadIdx.x);
        if (m[u].move) {
          const std::int64_t off = m[u].src * eb + static_cast<std::int64_t>(m[u].col) * static_cast<std::int64_t>(sizeof(U));
          kb[u] = *reinterpret_cast<const U*>(p.k + off);
          vb[u] = *reinterpret_cast<const U*>(p.v + off);
        }
      }
      std::int32_t pos = 0;
      const bool pos_move = step == 0 && h.positions != nullptr && static_cast<int>(threadIdx.x) < rows &&
                            h.kept[i0 + static_cast<int>(threadIdx.x)] != i0 + static_cast<int>(threadIdx.x);
      if (pos_move) pos = h.positions[h.kept[i0 + static_cast<int>(threadIdx.x)]];
      __syncthreads();  // every read of this tile before any write of it
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (m[u].move) {
          const std::int64_t off = m[u].dst * eb + static_cast<std::int64_t>(m[u].col) * static_cast<std::int64_t>(sizeof(U));
          *reinterpret_cast<U*>(p.k + off) = kb[u];
          *reinterpret_cast<U*>(p.v + off) = vb[u];
        }
      }
      if (pos_move) h.positions[i0 + static_cast<int>(threadIdx.x)] = pos;
      // no barrier here: the next tile reads only slots >= i0 + R, which no write of this tile touches
    }
  }
}

/// Workspace bytes `PagedCompact` needs: 0 (the kernel moves rows in place, no staging).
inline std::size_t PagedCompactWorkspaceBytes(const PagedCompactParams& /*params*/) { return 0; }

/// Why `PagedCompact<T>` would reject `params` (it then returns cudaErrorInvalidValue), or null
/// when they are accepted: negative counts, a null head table, null key or value blocks, a layout
/// that is neither kNHD nor kHND, block_size / n_kv_heads / head_dim < 1, rows above 2^31 - 1 bytes.
template <typename T>
inline const char* PagedCompactParamsError(const PagedCompactParams& params, const void* /*d_workspace*/,
                                           std::size_t /*workspace_bytes*/) {
  return detail::paged_compact_params_problem(params.n_heads, params.heads == nullptr, params.k_blocks == nullptr,
                                              params.v_blocks == nullptr, params.num_blocks, params.block_size,
                                              params.n_kv_heads, params.head_dim, static_cast<int>(params.layout),
                                              sizeof(T));
}

/// Compacts every head of `params` (see PagedCompactHead and the file comment) on `stream`.
///
/// @tparam T K/V element type (`float`, `__half`, `__nv_bfloat16`, ...): only its size matters
/// @param d_workspace, workspace_bytes the house interface (`PagedCompactWorkspaceBytes`: none needed; may be null)
/// @return cudaErrorInvalidValue on bad parameters (`PagedCompactParamsError`), else the launch
///   error. Bad heads are skipped and reported through `params.status` (PagedCompactStatus bits).
template <typename T>
[[nodiscard]] cudaError_t PagedCompact(const PagedCompactParams& params, void* d_workspace, std::size_t workspace_bytes,
                                       cudaStream_t stream = nullptr) {
  using namespace detail;
  if (PagedCompactParamsError<T>(params, d_workspace, workspace_bytes) != nullptr) return cudaErrorInvalidValue;
  cudaError_t e = cudaSuccess;
  if (params.status != nullptr) {
    e = cudaMemsetAsync(params.status, 0, sizeof(std::uint32_t), stream);
    if (e != cudaSuccess) return e;
  }
  if (params.n_heads == 0) return cudaSuccess;
  PagedCompactKernelParams kp;
  kp.heads = params.heads;
  kp.k = static_cast<unsigned char*>(params.k_blocks);
  kp.v = static_cast<unsigned char*>(params.v_blocks);
  kp.g = make_paged_geometry(params.block_size, params.n_kv_heads, params.head_dim, params.layout == PagedLayout::kHND);
  kp.num_blocks = params.num_blocks;
  kp.elem_bytes = static_cast<int>(sizeof(T));
  kp.status = params.status;
  const std::uint64_t eb = sizeof(T);
  const std::uint64_t row_bytes = static_cast<std::uint64_t>(params.head_dim) * eb;
  const int unit = paged_copy_unit_bytes(row_bytes | static_cast<std::uint64_t>(kp.g.token_stride) * eb |
                                         static_cast<std::uint64_t>(kp.g.head_stride) * eb |
                                         static_cast<std::uint64_t>(kp.g.block_elements) * eb |
                                         static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(kp.k)) |
                                         static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(kp.v)));
  kp.row_units = static_cast<int>(row_bytes / static_cast<std::uint64_t>(unit));
  constexpr int NT = kPagedCompactThreads;
  constexpr int UN = kPagedCompactUnroll;
  const unsigned grid = static_cast<unsigned>(params.n_heads);
  switch (unit) {
    case 16: PagedCompactKernel<uint4, NT, UN><<<grid, NT, 0, stream>>>(kp); break;
    case 8: PagedCompactKernel<uint2, NT, UN><<<grid, NT, 0, stream>>>(kp); break;
    case 4: PagedCompactKernel<unsigned int, NT, UN><<<grid, NT, 0, stream>>>(kp); break;
    case 2: PagedCompactKernel<unsigned short, NT, UN><<<grid, NT, 0, stream>>>(kp); break;
    default: PagedCompactKernel<unsigned char, NT, UN><<<grid, NT, 0, stream>>>(kp); break;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace depthkv
