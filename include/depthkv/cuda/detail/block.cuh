#pragma once
/// @file cuda/detail/block.cuh
/// @brief Block/warp building blocks of the eviction kernels: a block-wide exclusive scan of
/// packed 64-bit counters, warp-aggregated shared-memory histograms, the warp-parallel radix
/// digit search, the radix select over keys in shared memory, the in-place compaction of kept
/// middle slots, and the vectorised K/V row gather.
///
/// Conventions: every function taking `NT` is called by all `NT` threads of the block with
/// block-uniform arguments (they contain `__syncthreads()`); loops over elements step by whole
/// blocks so every warp stays converged for the `*_sync` intrinsics.

#include <cuda_runtime.h>

#include <cstdint>

#include "depthkv/cuda/detail/evict_plan.hpp"

namespace depthkv {
namespace cuda {
namespace detail {

constexpr unsigned kFullMask = 0xffffffffu;

/// Shared storage of `block_exclusive_sum`.
template <int NT>
struct BlockScanStorage {
  unsigned long long warp[NT / 32];
};

/// Block-wide exclusive prefix sum of `x` (thread order). Returns this thread's exclusive sum and
/// the block total. Ends with a barrier, so the storage may be reused right away.
template <int NT>
__device__ __forceinline__ void block_exclusive_sum(unsigned long long x, unsigned long long& excl,
                                                    unsigned long long& total, BlockScanStorage<NT>& s) {
  static_assert(NT % 32 == 0 && NT >= 32 && NT <= 1024, "block size must be a multiple of 32 up to 1024");
  constexpr int kWarps = NT / 32;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  unsigned long long v = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) s.warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = lane < kWarps ? s.warp[lane] : 0ull;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long y = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kWarps) s.warp[lane] = w;  // inclusive prefix of warp totals
  }
  __syncthreads();
  const unsigned long long before = warp > 0 ? s.warp[warp - 1] : 0ull;
  total = s.warp[kWarps - 1];
  excl = before + v - x;
  __syncthreads();
}

/// Adds one to `hist[digit]` for every lane with `match`, one shared atomic per distinct digit
/// of the warp (ties are common: quantised scores). All 32 lanes must call it.
__device__ __forceinline__ void warp_hist_add(std::uint32_t* hist, bool match, std::uint32_t digit) {
  const unsigned active = __ballot_sync(kFullMask, match);
  if (match) {
    const unsigned peers = __match_any_sync(active, digit);
    if ((threadIdx.x & 31u) == static_cast<unsigned>(__ffs(static_cast<int>(peers)) - 1))
      atomicAdd(&hist[digit], static_cast<std::uint32_t>(__popc(peers)));
  }
}

/// Warp-parallel `find_digit`: lane l owns bins 255-8l .. 248-8l (descending); an exclusive scan
/// over lanes gives the count above each lane's bins and the one lane whose range holds `rank`
/// walks its 8 bins. Called by the 32 lanes of one warp; always writes `*out`: when no lane's
/// range holds `rank` (rank 0 or above sum(hist), a broken invariant) lane 0 writes {0, 0}, which
/// `radix_step` turns into the failed threshold (EvictStatus::kSelectFailed), so no thread ever
/// reads an unwritten choice.
__device__ __forceinline__ void warp_find_digit(const std::uint32_t* hist, std::uint32_t rank, DigitChoice* out) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  std::uint32_t c[8];
  std::uint32_t s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    c[j] = hist[255 - 8 * lane - j];
    s += c[j];
  }
  std::uint32_t incl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const std::uint32_t y = __shfl_up_sync(kFullMask, incl, o);
    if (lane >= o) incl += y;
  }
  std::uint32_t above = incl - s;
  const bool mine = above < rank && rank <= incl;
  if (__ballot_sync(kFullMask, mine) == 0u) {
    if (lane == 0) {
      out->digit = 0u;
      out->rank = 0u;
    }
    return;
  }
  if (mine) {
    bool found = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (!found && rank <= above + c[j]) {
        out->digit = static_cast<std::uint32_t>(255 - 8 * lane - j);
        out->rank = rank - above;
        found = true;
      }
      above += c[j];
    }
  }
}

/// Radix select over `len` keys in shared memory: the threshold of the `rank`-th largest key
/// (1 <= rank <= len). 8-bit digits, most significant first; `key_bits_` is 32 or 16. Returns
/// `failed_threshold()` (`select_failed`) when a digit search finds no bin.
template <int NT>
__device__ Threshold block_radix_select(const std::uint32_t* keys, int len, std::uint32_t rank, int key_bits_,
                                        std::uint32_t* s_hist, DigitChoice* s_choice) {
  Threshold t{0u, rank};
  const int passes = radix_passes(key_bits_);
  for (int pass = 0; pass < passes; ++pass) {
    for (int b = static_cast<int>(threadIdx.x); b < static_cast<int>(kRadixBins); b += NT) s_hist[b] = 0;
    __syncthreads();
    const std::uint32_t mask = radix_decided_mask(pass, key_bits_);
    const int shift = radix_shift(pass, key_bits_);
    for (int i0 = 0; i0 < len; i0 += 4 * NT) {
      std::uint32_t k4[4];
      bool v4[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
        v4[u] = i < len;
        k4[u] = v4[u] ? keys[i] : 0u;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
        warp_hist_add(s_hist, v4[u] && (k4[u] & mask) == t.key, (k4[u] >> shift) & (kRadixBins - 1u));
    }
    __syncthreads();
    if (threadIdx.x < 32) warp_find_digit(s_hist, t.need, s_choice);
    __syncthreads();
    t = radix_step(t, *s_choice, pass, key_bits_);
    __syncthreads();  // s_hist and s_choice are rewritten by the next pass
  }
  return t;
}

/// One radix step of the multi-block path: the select state after `pass + 1` digits from the
/// state after `pass` digits (`prev`) and the row's completed global histogram of pass `pass`
/// (`g_hist_pass`, 256 counters); the same deterministic walk in every CTA of the row.
template <int NT>
__device__ Threshold radix_step_from_global(const std::uint32_t* g_hist_pass, Threshold prev, int pass, int key_bits_,
                                            std::uint32_t* s_hist, DigitChoice* s_choice) {
  for (int b = static_cast<int>(threadIdx.x); b < static_cast<int>(kRadixBins); b += NT) s_hist[b] = g_hist_pass[b];
  __syncthreads();
  if (threadIdx.x < 32) warp_find_digit(s_hist, prev.need, s_choice);
  __syncthreads();
  const Threshold t = radix_step(prev, *s_choice, pass, key_bits_);
  __syncthreads();  // s_hist and s_choice may be reused by the caller
  return t;
}

/// The select state of a row after `digits` digits (multi-block path): {0, rank0} for 0 digits,
/// else one step from the stored state after `digits - 1` digits and that pass's histogram. The
/// row's state-writer CTA stores the result.
template <int NT>
__device__ Threshold multi_block_state(const std::uint32_t* g_hist_row, std::uint32_t* g_state_row, int digits,
                                       std::uint32_t rank0, int key_bits_, bool writer, std::uint32_t* s_hist,
                                       DigitChoice* s_choice) {
  if (digits == 0) return Threshold{0u, rank0};
  const Threshold prev = digits == 1 ? Threshold{0u, rank0}
                                     : Threshold{g_state_row[2 * (digits - 1)], g_state_row[2 * (digits - 1) + 1]};
  const Threshold t = radix_step_from_global<NT>(g_hist_row + static_cast<std::size_t>(digits - 1) * kRadixBins, prev,
                                                 digits - 1, key_bits_, s_hist, s_choice);
  if (writer && threadIdx.x == 0) {
    g_state_row[2 * digits] = t.key;
    g_state_row[2 * digits + 1] = t.need;
  }
  return t;
}

/// Compacts the kept middle slots of `len` keys (`keys[i]` is slot `base_slot + i`) in place:
/// afterwards `keys[0 .. returned count)` hold the kept slots, ascending. `gt_base` / `eq_base`
/// count the middle keys > T / == T before `base_slot` (0 for a whole row). Each element's output
/// index is at most its own index, and every thread reads its key before the scan's barriers,
/// so writing into the array being read is safe. Ends with a barrier.
template <int NT>
__device__ int compact_mid(std::uint32_t* keys, int len, int base_slot, Threshold t, std::uint32_t gt_base,
                           std::uint32_t eq_base, BlockScanStorage<NT>& scan) {
  const std::uint32_t start = mid_rank(gt_base, eq_base, t.need);
  std::uint32_t gt = gt_base;
  std::uint32_t eq = eq_base;
  for (int i0 = 0; i0 < len; i0 += NT) {
    const int i = i0 + static_cast<int>(threadIdx.x);
    const bool valid = i < len;
    const std::uint32_t key = valid ? keys[i] : 0u;
    const bool is_gt = valid && key > t.key;
    const bool is_eq = valid && key == t.key;
    const unsigned long long x = (static_cast<unsigned long long>(is_gt) << 32) | static_cast<unsigned long long>(is_eq);
    unsigned long long excl = 0, total = 0;
    block_exclusive_sum<NT>(x, excl, total, scan);
    const std::uint32_t g = gt + static_cast<std::uint32_t>(excl >> 32);
    const std::uint32_t e = eq + static_cast<std::uint32_t>(excl & 0xffffffffull);
    if (is_gt || (is_eq && e < t.need)) keys[mid_rank(g, e, t.need) - start] = static_cast<std::uint32_t>(base_slot + i);
    gt += static_cast<std::uint32_t>(total >> 32);
    eq += static_cast<std::uint32_t>(total & 0xffffffffull);
  }
  __syncthreads();
  return static_cast<int>(mid_rank(gt, eq, t.need) - start);
}

/// Kept tokens of a slot range in output order: `s_cnt` protected slots from `s_begin`, then
/// `m_cnt` middle slots listed in `list`, then `r_cnt` protected slots from `r_begin`.
struct KeptMap {
  int s_begin;
  int s_cnt;
  const std::uint32_t* list;
  int m_cnt;
  int r_begin;
  int r_cnt;
  __device__ __forceinline__ int count() const { return s_cnt + m_cnt + r_cnt; }
  /// Source slot of output `q` (0 <= q < count()).
  __device__ __forceinline__ int operator()(int q) const {
    if (q < s_cnt) return s_begin + q;
    q -= s_cnt;
    if (q < m_cnt) return static_cast<int>(list[q]);
    return r_begin + (q - m_cnt);
  }
};

/// Source and destination of a K/V row gather, in bytes. A null key (value) pointer on either
/// side skips the keys (values).
struct CopyJob {
  const unsigned char* src_k;
  const unsigned char* src_v;
  unsigned char* dst_k;
  unsigned char* dst_v;
  std::int64_t src_stride;  ///< bytes between source tokens
  std::int64_t dst_stride;  ///< bytes between destination tokens
  int row_bytes;            ///< bytes of one token's key (or value)
};

/// Copies token rows in units of `U` (16 bytes when everything is aligned): output `q` of `map`
/// goes to destination token `dst_base + q`. `UNROLL` loads of K and of V are issued before the
/// stores (memory-level parallelism).
template <typename U, int NT, int UNROLL>
__device__ void copy_rows_unit(const CopyJob& job, const KeptMap& map, int count, std::int64_t dst_base) {
  const std::uint32_t L = static_cast<std::uint32_t>(job.row_bytes) / static_cast<std::uint32_t>(sizeof(U));
  if (L == 0u || count <= 0) return;
  const bool do_k = job.src_k != nullptr && job.dst_k != nullptr;
  const bool do_v = job.src_v != nullptr && job.dst_v != nullptr;
  if (!do_k && !do_v) return;
  const bool pow2 = (L & (L - 1u)) == 0u;
  const int lg = pow2 ? __ffs(static_cast<int>(L)) - 1 : 0;
  const std::uint32_t batch = (1u << 30) / L > 0u ? (1u << 30) / L : 1u;  // tokens per batch: batch * L < 2^31
  for (std::int64_t t0 = 0; t0 < count; t0 += batch) {
    const std::uint32_t nb = static_cast<std::uint32_t>(lmin(static_cast<std::int64_t>(batch), count - t0));
    const std::uint32_t total = nb * L;
    for (std::uint32_t w0 = 0; w0 < total; w0 += static_cast<std::uint32_t>(NT * UNROLL)) {
      U kr[UNROLL];
      U vr[UNROLL];
      std::int64_t doff[UNROLL];
      bool ok[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const std::uint32_t w = w0 + static_cast<std::uint32_t>(u * NT) + threadIdx.x;
        ok[u] = w < total;
        kr[u] = U{};
        vr[u] = U{};
        doff[u] = 0;
        if (ok[u]) {
          const std::uint32_t tok = pow2 ? (w >> lg) : (w / L);
          const std::uint32_t part = w - tok * L;
          const int q = static_cast<int>(t0 + static_cast<std::int64_t>(tok));
          const std::int64_t src = map(q);
          const std::int64_t soff = src * job.src_stride + static_cast<std::int64_t>(part) * static_cast<std::int64_t>(sizeof(U));
          doff[u] = (dst_base + q) * job.dst_stride + static_cast<std::int64_t>(part) * static_cast<std::int64_t>(sizeof(U));
          if (do_k) kr[u] = *reinterpret_cast<const U*>(job.src_k + soff);
          if (do_v) vr[u] = *reinterpret_cast<const U*>(job.src_v + soff);
        }
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        if (ok[u]) {
          if (do_k) *reinterpret_cast<U*>(job.dst_k + doff[u]) = kr[u];
          if (do_v) *reinterpret_cast<U*>(job.dst_v + doff[u]) = vr[u];
        }
      }
    }
  }
}

/// Gathers the K/V rows of `count` kept tokens with the widest copy unit the row size, strides
/// and base addresses allow (16 bytes for head_dim 64/128 in any of the three types).
template <int NT, int UNROLL>
__device__ void copy_rows(const CopyJob& job, const KeptMap& map, int count, std::int64_t dst_base) {
  std::uint64_t bits = static_cast<std::uint64_t>(job.row_bytes) | static_cast<std::uint64_t>(job.src_stride) |
                       static_cast<std::uint64_t>(job.dst_stride);
  if (job.src_k != nullptr && job.dst_k != nullptr)
    bits |= reinterpret_cast<std::uintptr_t>(job.src_k) | reinterpret_cast<std::uintptr_t>(job.dst_k);
  if (job.src_v != nullptr && job.dst_v != nullptr)
    bits |= reinterpret_cast<std::uintptr_t>(job.src_v) | reinterpret_cast<std::uintptr_t>(job.dst_v);
  switch (copy_unit_bytes(bits)) {
    case 16: copy_rows_unit<uint4, NT, UNROLL>(job, map, count, dst_base); break;
    case 8: copy_rows_unit<uint2, NT, UNROLL>(job, map, count, dst_base); break;
    case 4: copy_rows_unit<unsigned int, NT, UNROLL>(job, map, count, dst_base); break;
    case 2: copy_rows_unit<unsigned short, NT, UNROLL>(job, map, count, dst_base); break;
    default: copy_rows_unit<unsigned char, NT, UNROLL>(job, map, count, dst_base); break;
  }
}

/// Writes the kept slots and their original positions of `count` kept tokens.
template <int NT>
__device__ void write_kept_meta(const KeptMap& map, int count, std::int64_t dst_base, const std::int32_t* src_positions,
                                std::int32_t* dst_positions, std::int32_t* kept_slots) {
  if (dst_positions == nullptr && kept_slots == nullptr) return;
  for (int q = static_cast<int>(threadIdx.x); q < count; q += NT) {
    const int s = map(q);
    if (kept_slots != nullptr) kept_slots[dst_base + q] = s;
    if (dst_positions != nullptr) dst_positions[dst_base + q] = src_positions != nullptr ? src_positions[s] : s;
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace depthkv
