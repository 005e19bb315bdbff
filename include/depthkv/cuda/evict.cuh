#pragma once
/// @file cuda/evict.cuh
/// @brief Batched top-k eviction on the GPU: one call over all (sequence, layer, KV head) rows,
/// each with its own k, identical to the CPU path (`depthkv::select_keep` + compaction).
///
/// Per row: protected sinks `[0, n_sink)` and recent window `[n - n_recent, n)` are always kept
/// and counted inside k; the other tokens are ranked by (score desc, position asc) with a radix
/// select over order-preserving keys (`detail::ordered_key` for float scores,
/// `detail::ordered_key16` for half/bfloat16 scores); kept tokens are emitted in ascending slot
/// (= position) order and their K and V rows gathered into the destination (out-of-place, so no
/// write-before-read hazard; ping-pong two layers). `k >= n` keeps every token.
///
/// Two launch paths, chosen per call (`EvictPath::kAuto`) from the rows' count and maximal length:
/// - one CTA per row (`EvictOneBlockPerRowKernel`): the row's middle keys in shared memory,
///   radix passes, block-scan compaction and the gather in a single launch (short rows, or many
///   rows up to 16384 tokens);
/// - several CTAs per row (`EvictHistogramKernel` per radix pass, `EvictCountKernel`,
///   `EvictEmitKernel`): `kEvictChunk` = 8192 slots per CTA; per-row global histograms, the
///   select state after each pass and per-chunk counts live in the workspace (few long rows);
///   4 (float scores) or 2 (16-bit scores) histogram launches, then one count and one emit launch.
///
/// Limits: a row (and `max_n`) holds at most `detail::kEvictMaxN` = 65535 x 8192 = 536,862,720
/// tokens, since the multi-block grid is (rows, chunks) and gridDim.y <= 65535; `Evict` rejects a
/// larger `max_n` and `append_evict_rows` a longer row. The workspace must be aligned to
/// `detail::kEvictWorkspaceAlignment` (256) bytes, as cudaMalloc returns it. `EvictParamsError`
/// says why parameters are rejected. The one-block kernel's dynamic shared memory limit is raised
/// once per device and process, to the device's opt-in maximum (the attribute is process-wide and
/// not stream-ordered, so it is never changed per call).
/// Both produce identical results. The scores are read once by the one-block path and
/// passes + 2 times by the multi-block path; every kept K/V row is read and written once.
///
/// @code
/// using namespace depthkv::cuda;
/// std::vector<EvictRow> rows;                               // one per (sequence, layer, KV head)
/// for (int l = 0; l < L; ++l) append_evict_rows(rows, src[l], dst[l], d_scores[l], cap, keep[l].data(), 4, 64);
/// cudaMemcpyAsync(d_rows, rows.data(), rows.size() * sizeof(EvictRow), cudaMemcpyHostToDevice, stream);
/// EvictParams p;
/// p.rows = d_rows; p.n_rows = int(rows.size()); p.max_n = max_len; p.head_dim = hd; p.n_sink = 4; p.n_recent = 64;
/// std::size_t ws = EvictWorkspaceBytes(p);                 // allocate once, reuse
/// cudaError_t e = Evict<__nv_bfloat16>(p, d_ws, ws, stream);
/// @endcode

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "depthkv/cuda/detail/block.cuh"
#include "depthkv/cuda/detail/evict_plan.hpp"
#include "depthkv/detail/select_common.hpp"

namespace depthkv {
namespace cuda {

/// Launch path of `Evict`.
enum class EvictPath {
  kAuto,            ///< by the rule `detail::auto_one_block_per_row`
  kOneBlockPerRow,  ///< one CTA per row (needs max_n keys in shared memory)
  kMultiBlock,      ///< several CTAs per row
};

/// Parameters of one batched eviction.
struct EvictParams {
  const EvictRow* rows = nullptr;  ///< device array of `n_rows` rows (see EvictRow for the layouts)
  int n_rows = 0;                  ///< rows (sequences x layers x KV heads)
  int max_n = 0;                   ///< upper bound on every row's n (sizes workspace, grid, shared memory); <= detail::kEvictMaxN
  int head_dim = 0;                ///< elements per key/value token row (all rows; >= 1 when n_rows > 0)
  int n_sink = 0;                  ///< protected first slots of every row
  int n_recent = 0;                ///< protected last slots of every row
  std::uint32_t* status = nullptr; ///< optional device word: zeroed, then OR of EvictStatus bits
  EvictPath path = EvictPath::kAuto;
};

namespace detail {

/// Score storage types: raw bits, key and NaN test.
template <typename ScoreT>
struct ScoreOps;
template <>
struct ScoreOps<float> {
  static constexpr int kKeyBits = 32;
  __device__ __forceinline__ static std::uint32_t key(const float* s, std::int64_t i, bool& nan) {
    const float v = s[i];
    nan = nan || (v != v);
    return depthkv::detail::ordered_key(v);
  }
};
template <>
struct ScoreOps<__half> {
  static constexpr int kKeyBits = 16;
  __device__ __forceinline__ static std::uint32_t key(const __half* s, std::int64_t i, bool& nan) {
    const std::uint16_t u = reinterpret_cast<const std::uint16_t*>(s)[i];
    nan = nan || depthkv::detail::is_nan16(u, depthkv::detail::kHalfInfBits);
    return depthkv::detail::ordered_key16(u);
  }
};
template <>
struct ScoreOps<__nv_bfloat16> {
  static constexpr int kKeyBits = 16;
  __device__ __forceinline__ static std::uint32_t key(const __nv_bfloat16* s, std::int64_t i, bool& nan) {
    const std::uint16_t u = reinterpret_cast<const std::uint16_t*>(s)[i];
    nan = nan || depthkv::detail::is_nan16(u, depthkv::detail::kBFloat16InfBits);
    return depthkv::detail::ordered_key16(u);
  }
};

/// What every eviction kernel receives (by value).
struct EvictKernelParams {
  const EvictRow* rows;
  int n_rows;
  int max_n;
  int row_bytes;        ///< head_dim * sizeof(T)
  int n_sink;
  int n_recent;
  std::uint32_t* status;
  std::uint32_t* hist;    ///< multi-block: [n_rows][kMaxRadixPasses][256]
  std::uint32_t* state;   ///< multi-block: [n_rows][kMaxRadixPasses + 1][2]
  std::uint32_t* counts;  ///< multi-block: [n_rows][n_chunks][2]
  int n_chunks;
};

constexpr int kOneBlockThreads = 512;
constexpr int kHistThreads = 256;
constexpr int kEmitThreads = 512;
constexpr int kCopyUnroll = 4;

__device__ __forceinline__ CopyJob make_copy_job(const EvictRow& r, int row_bytes, int elem_bytes) {
  CopyJob j;
  j.src_k = static_cast<const unsigned char*>(r.src_k);
  j.src_v = static_cast<const unsigned char*>(r.src_v);
  j.dst_k = static_cast<unsigned char*>(r.dst_k);
  j.dst_v = static_cast<unsigned char*>(r.dst_v);
  j.src_stride = r.src_token_stride * elem_bytes;
  j.dst_stride = r.dst_token_stride * elem_bytes;
  j.row_bytes = row_bytes;
  return j;
}

/// Loads the keys of slots [a, b) into keys[0 .. b-a) (NaN noted in `nan`).
template <typename ScoreT, int NT>
__device__ __forceinline__ void load_keys(const ScoreT* scores, int a, int b, std::uint32_t* keys, bool& nan) {
  const int len = b - a;
  for (int i0 = 0; i0 < len; i0 += 4 * NT) {
    std::uint32_t k4[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
      k4[u] = i < len ? ScoreOps<ScoreT>::key(scores, static_cast<std::int64_t>(a) + i, nan) : 0u;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
      if (i < len) keys[i] = k4[u];
    }
  }
}

/// Notes NaN scores among slots [a, b) (no keys kept).
template <typename ScoreT, int NT>
__device__ __forceinline__ void scan_nan(const ScoreT* scores, std::int64_t a, std::int64_t b, bool& nan) {
  for (std::int64_t i = a + threadIdx.x; i < b; i += NT) (void)ScoreOps<ScoreT>::key(scores, i, nan);
}

}  // namespace detail

/// One CTA per row: loads the middle keys into shared memory (dynamic, `one_block_smem_bytes(max_n)`),
/// runs the radix passes there, compacts the kept middle slots in place (block scan), then gathers
/// the kept K/V rows, positions and slots. Grid: `n_rows` CTAs of `kOneBlockThreads` threads.
template <typename ScoreT, int NT>
__global__ void __launch_bounds__(NT) EvictOneBlockPerRowKernel(const detail::EvictKernelParams p, const int elem_bytes) {
  using namespace detail;
  extern __shared__ uint4 s_dyn[];
  std::uint32_t* s_keys = reinterpret_cast<std::uint32_t*>(s_dyn);
  __shared__ std::uint32_t s_hist[kRadixBins];
  __shared__ DigitChoice s_choice;
  __shared__ BlockScanStorage<NT> s_scan;

  const EvictRow row = p.rows[blockIdx.x];
  const RowPlan plan = plan_row(row.n, row.k, p.n_sink, p.n_recent, p.max_n, row.scores != nullptr);
  if (plan.status != 0u && p.status != nullptr && threadIdx.x == 0) atomicOr(p.status, plan.status);
  if (plan.n == 0) return;  // empty or bad row (block-uniform)
  const ScoreT* scores = static_cast<const ScoreT*>(row.scores);
  bool nan = false;
  int m_kept = 0;
  if (plan.select) {
    const int m = plan.hi - plan.lo;
    load_keys<ScoreT, NT>(scores, plan.lo, plan.hi, s_keys, nan);
    __syncthreads();
    const Threshold t = block_radix_select<NT>(s_keys, m, static_cast<std::uint32_t>(plan.keep_mid),
                                               ScoreOps<ScoreT>::kKeyBits, s_hist, &s_choice);
    if (select_failed(t) && p.status != nullptr && threadIdx.x == 0) atomicOr(p.status, EvictStatus::kSelectFailed);
    m_kept = compact_mid<NT>(s_keys, m, plan.lo, t, 0u, 0u, s_scan);
  }
  if (p.status != nullptr) {
    if (scores != nullptr) {
      if (plan.select) {
        scan_nan<ScoreT, NT>(scores, 0, plan.lo, nan);
        scan_nan<ScoreT, NT>(scores, plan.hi, plan.n, nan);
      } else {
        scan_nan<ScoreT, NT>(scores, 0, plan.n, nan);
      }
    }
    if (__syncthreads_or(nan ? 1 : 0) != 0 && threadIdx.x == 0) atomicOr(p.status, EvictStatus::kNaNScore);
  }
  KeptMap map;
  map.s_begin = 0;
  map.s_cnt = plan.lo;
  map.list = s_keys;
  map.m_cnt = m_kept;
  map.r_begin = plan.hi;
  map.r_cnt = plan.n - plan.hi;
  const int count = map.count();
  copy_rows<NT, kCopyUnroll>(make_copy_job(row, p.row_bytes, elem_bytes), map, count, 0);
  write_kept_meta<NT>(map, count, 0, row.positions, row.dst_positions, row.kept_slots);
}

/// Multi-block pass `pass`: each CTA (row = blockIdx.x, chunk = blockIdx.y) derives the digits
/// chosen so far (one step from the stored state and the previous pass's global histogram; the
/// row's first middle chunk stores the new state), histograms the digit of pass `pass` of its
/// chunk's middle keys that match them, and adds it to the row's global histogram.
template <typename ScoreT, int NT>
__global__ void __launch_bounds__(NT) EvictHistogramKernel(const detail::EvictKernelParams p, const int pass) {
  using namespace detail;
  __shared__ std::uint32_t s_hist[kRadixBins];
  __shared__ DigitChoice s_choice;
  const int row_id = static_cast<int>(blockIdx.x);
  const EvictRow row = p.rows[row_id];
  const RowPlan plan = plan_row(row.n, row.k, p.n_sink, p.n_recent, p.max_n, row.scores != nullptr);
  if (!plan.select) return;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.y) * kEvictChunk;
  const int a = static_cast<int>(lmax(c0, plan.lo));
  const int b = static_cast<int>(lmin(c0 + kEvictChunk, plan.hi));
  if (a >= b) return;
  constexpr int kBits = ScoreOps<ScoreT>::kKeyBits;
  std::uint32_t* g_hist = p.hist + hist_index(row_id, 0);
  const bool writer = static_cast<int>(blockIdx.y) == state_writer_chunk(plan, kEvictChunk);
  const Threshold t = multi_block_state<NT>(g_hist, p.state + state_index(row_id, 0), pass,
                                            static_cast<std::uint32_t>(plan.keep_mid), kBits, writer, s_hist, &s_choice);
  for (int i = static_cast<int>(threadIdx.x); i < static_cast<int>(kRadixBins); i += NT) s_hist[i] = 0;
  __syncthreads();
  const ScoreT* scores = static_cast<const ScoreT*>(row.scores);
  const std::uint32_t mask = radix_decided_mask(pass, kBits);
  const int shift = radix_shift(pass, kBits);
  bool nan = false;
  const int len = b - a;
  for (int i0 = 0; i0 < len; i0 += 4 * NT) {
    std::uint32_t k4[4];
    bool v4[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * NT + static_cast<int>(threadIdx.x);
      v4[u] = i < len;
      k4[u] = v4[u] ? ScoreOps<ScoreT>::key(scores, static_cast<std::int64_t>(a) + i, nan) : 0u;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      warp_hist_add(s_hist, v4[u] && (k4[u] & mask) == t.key, (k4[u] >> shift) & (kRadixBins - 1u));
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < static_cast<int>(kRadixBins); i += NT) {
    const std::uint32_t v = s_hist[i];
    if (v != 0u) atomicAdd(&g_hist[static_cast<std::size_t>(pass) * kRadixBins + static_cast<std::size_t>(i)], v);
  }
}

/// Multi-block count: each CTA checks its chunk for NaN scores (when a status word is given) and,
/// for rows that select, counts its middle keys greater than and equal to the row's threshold
/// (written for every chunk of the row, empty ones as zeros).
template <typename ScoreT, int NT>
__global__ void __launch_bounds__(NT) EvictCountKernel(const detail::EvictKernelParams p) {
  using namespace detail;
  __shared__ std::uint32_t s_hist[kRadixBins];
  __shared__ DigitChoice s_choice;
  __shared__ BlockScanStorage<NT> s_scan;
  const int row_id = static_cast<int>(blockIdx.x);
  const int chunk = static_cast<int>(blockIdx.y);
  const EvictRow row = p.rows[row_id];
  const RowPlan plan = plan_row(row.n, row.k, p.n_sink, p.n_recent, p.max_n, row.scores != nullptr);
  const std::int64_t c0 = static_cast<std::int64_t>(chunk) * kEvictChunk;
  if (c0 >= plan.n) return;
  const std::int64_t c1 = lmin(c0 + kEvictChunk, plan.n);
  constexpr int kBits = ScoreOps<ScoreT>::kKeyBits;
  Threshold t{0xffffffffu, 0u};
  if (plan.select) {  // the final threshold, stored for the emit kernel by the row's writer CTA
    const bool writer = chunk == state_writer_chunk(plan, kEvictChunk);
    t = multi_block_state<NT>(p.hist + hist_index(row_id, 0), p.state + state_index(row_id, 0), radix_passes(kBits),
                              static_cast<std::uint32_t>(plan.keep_mid), kBits, writer, s_hist, &s_choice);
    if (writer && select_failed(t) && p.status != nullptr && threadIdx.x == 0)
      atomicOr(p.status, EvictStatus::kSelectFailed);
  }
  const ScoreT* scores = static_cast<const ScoreT*>(row.scores);
  const bool check_nan = p.status != nullptr && scores != nullptr;
  const std::int64_t a = plan.select ? lmax(c0, plan.lo) : c0;
  const std::int64_t b = plan.select ? lmin(c1, plan.hi) : c0;
  std::uint32_t gt = 0, eq = 0;
  bool nan = false;
  const std::int64_t lb = check_nan ? c0 : a;
  const std::int64_t ub = check_nan ? c1 : b;
  for (std::int64_t i = lb + threadIdx.x; i < ub; i += NT) {
    const std::uint32_t key = ScoreOps<ScoreT>::key(scores, i, nan);
    if (i >= a && i < b) {
      gt += key > t.key ? 1u : 0u;
      eq += key == t.key ? 1u : 0u;
    }
  }
  if (check_nan) {
    if (__syncthreads_or(nan ? 1 : 0) != 0 && threadIdx.x == 0) atomicOr(p.status, EvictStatus::kNaNScore);
  }
  if (plan.select) {
    unsigned long long excl = 0, total = 0;
    block_exclusive_sum<NT>((static_cast<unsigned long long>(gt) << 32) | eq, excl, total, s_scan);
    if (threadIdx.x == 0) {
      std::uint32_t* c = p.counts + counts_index(row_id, chunk, p.n_chunks);
      c[0] = static_cast<std::uint32_t>(total >> 32);
      c[1] = static_cast<std::uint32_t>(total & 0xffffffffull);
    }
  }
}

/// Multi-block emit: each CTA (row, chunk) reads the row's threshold (stored by the count kernel),
/// derives its first output index from the counts of the earlier chunks, compacts its kept middle
/// slots (keys in shared memory, block scan), and gathers its kept tokens (protected ones
/// included) into the destination.
template <typename ScoreT, int NT>
__global__ void __launch_bounds__(NT, 2) EvictEmitKernel(const detail::EvictKernelParams p, const int elem_bytes) {
  using namespace detail;
  __shared__ std::uint32_t s_list[kEvictChunk];
  __shared__ BlockScanStorage<NT> s_scan;
  __shared__ std::uint32_t s_before[2];
  const int row_id = static_cast<int>(blockIdx.x);
  const int chunk = static_cast<int>(blockIdx.y);
  const EvictRow row = p.rows[row_id];
  const RowPlan plan = plan_row(row.n, row.k, p.n_sink, p.n_recent, p.max_n, row.scores != nullptr);
  if (chunk == 0 && plan.status != 0u && p.status != nullptr && threadIdx.x == 0) atomicOr(p.status, plan.status);
  const std::int64_t c0l = static_cast<std::int64_t>(chunk) * kEvictChunk;
  if (c0l >= plan.n) return;
  const int c0 = static_cast<int>(c0l);
  const int c1 = static_cast<int>(lmin(c0l + kEvictChunk, plan.n));
  std::uint32_t mid_before = 0;
  int m_kept = 0;
  if (plan.select) {
    constexpr int kBits = ScoreOps<ScoreT>::kKeyBits;
    const std::uint32_t* st = p.state + state_index(row_id, radix_passes(kBits));  // written by EvictCountKernel
    const Threshold t{st[0], st[1]};
    if (threadIdx.x < 32) {
      std::uint32_t gt = 0, eq = 0;
      for (int c = static_cast<int>(threadIdx.x); c < chunk; c += 32) {
        const std::uint32_t* cc = p.counts + counts_index(row_id, c, p.n_chunks);
        gt += cc[0];
        eq += cc[1];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        gt += __shfl_xor_sync(kFullMask, gt, o);
        eq += __shfl_xor_sync(kFullMask, eq, o);
      }
      if (threadIdx.x == 0) {
        s_before[0] = gt;
        s_before[1] = eq;
      }
    }
    __syncthreads();
    const std::uint32_t gt_b = s_before[0];
    const std::uint32_t eq_b = s_before[1];
    mid_before = mid_rank(gt_b, eq_b, t.need);
    const int a = imax(c0, plan.lo);
    const int b = imin(c1, plan.hi);
    if (a < b) {
      bool nan = false;
      load_keys<ScoreT, NT>(static_cast<const ScoreT*>(row.scores), a, b, s_list, nan);
      __syncthreads();
      m_kept = compact_mid<NT>(s_list, b - a, a, t, gt_b, eq_b, s_scan);
    }
  }
  KeptMap map;
  map.s_begin = c0;
  map.s_cnt = imax(0, imin(c1, plan.lo) - c0);
  map.list = s_list;
  map.m_cnt = m_kept;
  map.r_begin = imax(c0, plan.hi);
  map.r_cnt = imax(0, c1 - map.r_begin);
  const int count = map.count();
  const std::int64_t dst_base = kept_before(plan, c0, mid_before);
  copy_rows<NT, kCopyUnroll>(make_copy_job(row, p.row_bytes, elem_bytes), map, count, dst_base);
  write_kept_meta<NT>(map, count, dst_base, row.positions, row.dst_positions, row.kept_slots);
}

/// Workspace bytes `Evict` needs for `params` (any T and ScoreT; 0 when there is nothing to do).
/// Depends only on `n_rows` and `max_n`. The workspace must be aligned to
/// `detail::kEvictWorkspaceAlignment` (256) bytes.
inline std::size_t EvictWorkspaceBytes(const EvictParams& params) {
  return detail::evict_workspace_layout(params.n_rows, params.max_n).total_bytes;
}

/// Why `Evict<T>` would reject `params` with this workspace (it then returns
/// cudaErrorInvalidValue), or null when they are accepted: negative sizes or protection, a null
/// row table, head_dim < 1, max_n above `detail::kEvictMaxN`, a too small, null or misaligned
/// workspace. (A forced one-block path whose rows do not fit in shared memory is checked by
/// `Evict` against the device.)
template <typename T>
inline const char* EvictParamsError(const EvictParams& params, const void* d_workspace, std::size_t workspace_bytes) {
  return detail::evict_params_problem(params.n_rows, params.rows == nullptr, params.max_n, params.head_dim, sizeof(T),
                                      params.n_sink, params.n_recent, d_workspace, workspace_bytes);
}

namespace detail {

/// Raises the dynamic shared memory limit of the one-block kernel for `ScoreT` on `device` to the
/// opt-in maximum less its static shared memory, once per device and process (devices 0..63;
/// others on every call). The attribute is process-wide and not stream-ordered, so it is set to
/// one value that serves every max_n and never lowered: concurrent first callers write the same value.
template <typename ScoreT>
cudaError_t enable_one_block_smem(int device, int smem_optin) {
  static std::atomic<std::uint64_t> s_done{0};
  const std::uint64_t bit = device >= 0 && device < 64 ? (std::uint64_t{1} << device) : 0u;
  if (bit != 0u && (s_done.load(std::memory_order_acquire) & bit) != 0u) return cudaSuccess;
  const auto kernel = EvictOneBlockPerRowKernel<ScoreT, kOneBlockThreads>;
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e != cudaSuccess) return e;
  const int max_dynamic = smem_optin - static_cast<int>(attr.sharedSizeBytes);
  if (max_dynamic <= 0) return cudaErrorInvalidValue;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dynamic);
  if (e != cudaSuccess) return e;
  s_done.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

}  // namespace detail

/// Evicts every row of `params` (see EvictRow and the file comment) on `stream`.
///
/// @tparam T K/V element type (`float`, `__half`, `__nv_bfloat16`): only its size matters
/// @tparam ScoreT score type (`float`, `__half`, `__nv_bfloat16`)
/// @param d_workspace caller-owned device memory of at least `EvictWorkspaceBytes(params)` bytes
/// @return cudaErrorInvalidValue on bad parameters (see `EvictParamsError`: negative sizes or
///   protection, null rows, max_n above `detail::kEvictMaxN`, a too small, null or misaligned
///   workspace; or a forced one-block path whose rows do not fit in shared memory), else the
///   launch error. Per-row problems are reported through `params.status` (EvictStatus bits).
template <typename T, typename ScoreT = float>
[[nodiscard]] cudaError_t Evict(const EvictParams& params, void* d_workspace, std::size_t workspace_bytes,
                                cudaStream_t stream = nullptr) {
  using namespace detail;
  if (EvictParamsError<T>(params, d_workspace, workspace_bytes) != nullptr) return cudaErrorInvalidValue;
  const EvictWorkspaceLayout layout = evict_workspace_layout(params.n_rows, params.max_n);
  cudaError_t e = cudaSuccess;
  if (params.status != nullptr) {
    e = cudaMemsetAsync(params.status, 0, sizeof(std::uint32_t), stream);
    if (e != cudaSuccess) return e;
  }
  if (params.n_rows == 0) return cudaSuccess;

  int device = 0;
  e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  int n_sms = 0, smem_optin = 0;
  e = cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return e;

  const bool fits = one_block_smem_bytes(params.max_n) + kOneBlockStaticSmem <= static_cast<std::size_t>(smem_optin);
  bool one_block = false;
  switch (params.path) {
    case EvictPath::kOneBlockPerRow:
      if (!fits) return cudaErrorInvalidValue;
      one_block = true;
      break;
    case EvictPath::kMultiBlock: one_block = false; break;
    default: one_block = auto_one_block_per_row(params.n_rows, params.max_n, n_sms, static_cast<std::size_t>(smem_optin));
  }
  if (!one_block && layout.n_chunks == 0) one_block = true;  // max_n == 0: nothing to select, the one-block kernel flags bad rows
  // layout.n_chunks <= kEvictMaxChunksPerRow (the grid's y limit) since max_n <= kEvictMaxN

  EvictKernelParams kp;
  kp.rows = params.rows;
  kp.n_rows = params.n_rows;
  kp.max_n = params.max_n;
  kp.row_bytes = params.head_dim * static_cast<int>(sizeof(T));
  kp.n_sink = params.n_sink;
  kp.n_recent = params.n_recent;
  kp.status = params.status;
  kp.hist = nullptr;
  kp.state = nullptr;
  kp.counts = nullptr;
  kp.n_chunks = layout.n_chunks;
  const int elem_bytes = static_cast<int>(sizeof(T));

  if (one_block) {
    const std::size_t smem = one_block_smem_bytes(params.max_n);
    const auto kernel = EvictOneBlockPerRowKernel<ScoreT, kOneBlockThreads>;
    if (smem + kOneBlockStaticSmem > 48u * 1024u) {  // static + dynamic above the default 48 KiB
      e = enable_one_block_smem<ScoreT>(device, smem_optin);
      if (e != cudaSuccess) return e;
    }
    kernel<<<static_cast<unsigned>(params.n_rows), kOneBlockThreads, smem, stream>>>(kp, elem_bytes);
    return cudaGetLastError();
  }

  unsigned char* ws = static_cast<unsigned char*>(d_workspace);
  kp.hist = reinterpret_cast<std::uint32_t*>(ws + layout.hist_offset);
  kp.state = reinterpret_cast<std::uint32_t*>(ws + layout.state_offset);
  kp.counts = reinterpret_cast<std::uint32_t*>(ws + layout.counts_offset);
  e = cudaMemsetAsync(kp.hist, 0, layout.hist_bytes, stream);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(params.n_rows), static_cast<unsigned>(layout.n_chunks));
  const int passes = radix_passes(ScoreOps<ScoreT>::kKeyBits);
  for (int pass = 0; pass < passes; ++pass) {
    EvictHistogramKernel<ScoreT, kHistThreads><<<grid, kHistThreads, 0, stream>>>(kp, pass);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  EvictCountKernel<ScoreT, kHistThreads><<<grid, kHistThreads, 0, stream>>>(kp);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  EvictEmitKernel<ScoreT, kEmitThreads><<<grid, kEmitThreads, 0, stream>>>(kp, elem_bytes);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace depthkv
