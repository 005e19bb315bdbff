#pragma once
/// @file cuda/score.cuh
/// @brief Token-score accumulation on the GPU from attention probabilities, GQA-aware (query
/// head q adds onto KV head q / (n_heads / n_kv_heads)), so a prefill on the GPU never copies
/// probabilities to the host:
/// - `AccumulateH2O`: H2O cumulative attention, s_j += sum over the group's query heads and the
///   block's queries of a_ij (in place, call once per prefill chunk / decode step);
/// - `SnapKVScores`: the SnapKV observation window, s_j = pool(sum over the group's query heads
///   and the window queries of a_ij), pooled along slots (`depthkv::Pooling`: max or average,
///   same-size output, padding kernel / 2, exactly as `TokenScorer`'s kSnapKV).
///
/// Probability layout (both): element (query head q, query i, slot j) of type ProbT (`float`,
/// `__half`, `__nv_bfloat16`) at `probs[q * head_stride + i * query_stride + j]`, each query row
/// covering slots `[0, n)` (masked entries 0). Scores: float `[n_kv_heads][score_stride]`, slot j
/// of KV head h at `scores[h * score_stride + j]`.
///
/// Summation orders (float adds, no FMA, no reassociation), bit-identical to `depthkv::TokenScorer`
/// fed with the same probabilities (as floats) by `observe_block` once per query head, heads
/// ascending:
/// - H2O: per slot, s = s + a for each query head of the group (ascending), for each query
///   (ascending) — TokenScorer's per-KV-head accumulator;
/// - SnapKV: per slot and query (ascending), v = 0 + a over the group's heads (ascending), then
///   s = 0 + v over the queries (ascending) — TokenScorer's ring of per-position group sums.
///
/// @code
/// depthkv::cuda::H2OScoreParams p;
/// p.probs = d_probs; p.head_stride = n_q * ld; p.query_stride = ld;
/// p.n_heads = 32; p.n_kv_heads = 8; p.n_queries = n_q; p.n = n_tokens;
/// p.scores = d_scores; p.score_stride = capacity;
/// cudaError_t e = depthkv::cuda::AccumulateH2O<__nv_bfloat16>(p, nullptr, 0, stream);
/// @endcode

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "depthkv/scorer_config.hpp"

namespace depthkv {
namespace cuda {

/// Bits OR-ed into the score kernels' optional status word.
struct ScoreStatus {
  static constexpr std::uint32_t kOk = 0u;
  /// Some probability is NaN, infinite or negative (the CPU TokenScorer throws).
  static constexpr std::uint32_t kBadProbability = 1u;
};

/// Parameters of H2O accumulation (see the file comment for the layouts).
struct H2OScoreParams {
  const void* probs = nullptr;       ///< ProbT probabilities
  std::int64_t head_stride = 0;      ///< elements between query heads
  std::int64_t query_stride = 0;     ///< elements between queries (>= n)
  int n_heads = 0;                   ///< query heads (a multiple of n_kv_heads)
  int n_kv_heads = 0;                ///< KV heads
  int n_queries = 0;                 ///< queries in this block (>= 0)
  int n = 0;                         ///< slots covered (tokens held)
  float* scores = nullptr;           ///< [n_kv_heads][score_stride], accumulated in place
  std::int64_t score_stride = 0;     ///< >= n
  std::uint32_t* status = nullptr;   ///< optional device word: zeroed, then OR of ScoreStatus bits
};

/// Parameters of SnapKV window scoring: the probabilities of the last `n_queries` (= window)
/// queries; the scores are overwritten.
struct SnapKVScoreParams {
  const void* probs = nullptr;
  std::int64_t head_stride = 0;
  std::int64_t query_stride = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int n_queries = 0;                 ///< window queries
  int n = 0;
  int kernel = 7;                    ///< pooling width (odd, >= 1)
  /// kNone: the window sums; kMax: out[j] = max of in[t], t in [j - kernel/2, j + kernel/2] inside
  /// [0, n); kAvg: (sum of in[t] over that range, t ascending) / kernel (zero padding, PyTorch
  /// avg_pool1d's count_include_pad, as SnapKV uses it)
  Pooling pooling = Pooling::kMax;
  float* scores = nullptr;           ///< [n_kv_heads][score_stride], overwritten
  std::int64_t score_stride = 0;
  std::uint32_t* status = nullptr;
};

namespace detail {

template <typename ProbT>
struct ProbOps;
template <>
struct ProbOps<float> {
  __device__ __forceinline__ static float load(const float* p, std::int64_t i) { return p[i]; }
};
template <>
struct ProbOps<__half> {
  __device__ __forceinline__ static float load(const __half* p, std::int64_t i) { return __half2float(p[i]); }
};
template <>
struct ProbOps<__nv_bfloat16> {
  __device__ __forceinline__ static float load(const __nv_bfloat16* p, std::int64_t i) { return __bfloat162float(p[i]); }
};

/// Kernel arguments of window/cumulative summation.
struct ScoreSumArgs {
  const void* probs;
  std::int64_t head_stride;
  std::int64_t query_stride;
  int group;        ///< query heads per KV head
  int n_queries;
  int n;
  float* out;       ///< [n_kv_heads][out_stride]
  std::int64_t out_stride;
  bool accumulate;  ///< add to out (H2O) or start from 0 (SnapKV)
  bool query_major; ///< SnapKV order (per query: group sum, then add) instead of H2O order
  std::uint32_t* status;
};

constexpr int kScoreThreads = 256;

inline bool score_shape_ok(const void* probs, std::int64_t query_stride, int n_heads, int n_kv_heads, int n_queries,
                           int n, const float* scores, std::int64_t score_stride) {
  if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0 || n_queries < 0 || n < 0) return false;
  if (n == 0) return true;
  if (scores == nullptr || score_stride < n) return false;
  if (n_queries > 0 && (probs == nullptr || query_stride < n)) return false;
  return n_kv_heads <= 65535;
}

}  // namespace detail

/// One thread per (KV head, slot): sums the group's query heads' probabilities of that slot over
/// the queries in the fixed orders of the file comment (H2O or SnapKV). Grid: (ceil(n / NT), n_kv_heads).
template <typename ProbT, int NT>
__global__ void __launch_bounds__(NT) ScoreSumKernel(const detail::ScoreSumArgs a) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * NT + threadIdx.x;
  if (j >= a.n) return;
  const int kv = static_cast<int>(blockIdx.y);
  float* out = a.out + static_cast<std::int64_t>(kv) * a.out_stride + j;
  float acc = a.accumulate ? *out : 0.0f;
  bool bad = false;
  const ProbT* probs = static_cast<const ProbT*>(a.probs);
  const ProbT* head0 = probs + static_cast<std::int64_t>(kv) * a.group * a.head_stride + j;
  if (a.query_major) {
    for (int i = 0; i < a.n_queries; ++i) {
      const ProbT* q = head0 + static_cast<std::int64_t>(i) * a.query_stride;
      float v = 0.0f;
      for (int g = 0; g < a.group; ++g) {
        const float x = detail::ProbOps<ProbT>::load(q, static_cast<std::int64_t>(g) * a.head_stride);
        bad = bad || !(x >= 0.0f && x <= 3.402823466e38f);
        v = __fadd_rn(v, x);
      }
      acc = __fadd_rn(acc, v);
    }
    *out = acc;
    if (bad && a.status != nullptr) atomicOr(a.status, ScoreStatus::kBadProbability);
    return;
  }
  for (int g = 0; g < a.group; ++g) {
    const std::int64_t q = static_cast<std::int64_t>(kv) * a.group + g;
    const ProbT* base = probs + q * a.head_stride + j;
    int i = 0;
    for (; i + 4 <= a.n_queries; i += 4) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = detail::ProbOps<ProbT>::load(base, static_cast<std::int64_t>(i + u) * a.query_stride);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        bad = bad || !(v[u] >= 0.0f && v[u] <= 3.402823466e38f);  // NaN, inf or negative
        acc = __fadd_rn(acc, v[u]);
      }
    }
    for (; i < a.n_queries; ++i) {
      const float v = detail::ProbOps<ProbT>::load(base, static_cast<std::int64_t>(i) * a.query_stride);
      bad = bad || !(v >= 0.0f && v <= 3.402823466e38f);
      acc = __fadd_rn(acc, v);
    }
  }
  *out = acc;
  if (bad && a.status != nullptr) atomicOr(a.status, ScoreStatus::kBadProbability);
}

/// Same-size 1-D pooling along slots of `in` ([n_kv_heads][n], dense) into `out`
/// ([n_kv_heads][out_stride]). Grid: (ceil(n / NT), n_kv_heads).
template <int NT>
__global__ void __launch_bounds__(NT) PoolScoresKernel(const float* in, int n, int kernel, int avg, float* out,
                                                       std::int64_t out_stride) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * NT + threadIdx.x;
  if (j >= n) return;
  const int kv = static_cast<int>(blockIdx.y);
  const float* row = in + static_cast<std::int64_t>(kv) * n;
  const int half = kernel / 2;
  const std::int64_t t0 = j - half < 0 ? 0 : j - half;
  const std::int64_t t1 = j + half >= n ? n - 1 : j + half;
  float r = avg ? 0.0f : row[t0];
  for (std::int64_t t = t0; t <= t1; ++t) {
    const float v = row[t];
    if (avg) {
      r = __fadd_rn(r, v);
    } else {
      r = v > r ? v : r;
    }
  }
  if (avg) r = __fdiv_rn(r, static_cast<float>(kernel));
  out[static_cast<std::int64_t>(kv) * out_stride + j] = r;
}

/// Workspace of `AccumulateH2O` (none).
inline std::size_t AccumulateH2OWorkspaceBytes(const H2OScoreParams&) { return 0; }

/// Adds this block's attention probabilities to the H2O scores (in place).
/// @return cudaErrorInvalidValue on a bad shape (n_heads not a multiple of n_kv_heads, strides
///   below n, null pointers), else the launch error
template <typename ProbT = float>
[[nodiscard]] cudaError_t AccumulateH2O(const H2OScoreParams& p, void* d_workspace, std::size_t workspace_bytes,
                                        cudaStream_t stream = nullptr) {
  (void)d_workspace;
  (void)workspace_bytes;
  if (!detail::score_shape_ok(p.probs, p.query_stride, p.n_heads, p.n_kv_heads, p.n_queries, p.n, p.scores,
                              p.score_stride))
    return cudaErrorInvalidValue;
  if (p.status != nullptr) {
    const cudaError_t e = cudaMemsetAsync(p.status, 0, sizeof(std::uint32_t), stream);
    if (e != cudaSuccess) return e;
  }
  if (p.n == 0 || p.n_queries == 0) return cudaSuccess;
  detail::ScoreSumArgs a;
  a.probs = p.probs;
  a.head_stride = p.head_stride;
  a.query_stride = p.query_stride;
  a.group = p.n_heads / p.n_kv_heads;
  a.n_queries = p.n_queries;
  a.n = p.n;
  a.out = p.scores;
  a.out_stride = p.score_stride;
  a.accumulate = true;
  a.query_major = false;
  a.status = p.status;
  constexpr int NT = detail::kScoreThreads;
  const dim3 grid(static_cast<unsigned>((static_cast<std::int64_t>(p.n) + NT - 1) / NT), static_cast<unsigned>(p.n_kv_heads));
  ScoreSumKernel<ProbT, NT><<<grid, NT, 0, stream>>>(a);
  return cudaGetLastError();
}

/// Workspace of `SnapKVScores`: the window sums before pooling, `n_kv_heads * n` floats (none
/// without pooling).
inline std::size_t SnapKVScoresWorkspaceBytes(const SnapKVScoreParams& p) {
  if (p.pooling == Pooling::kNone || p.n <= 0 || p.n_kv_heads <= 0) return 0;
  return static_cast<std::size_t>(p.n_kv_heads) * static_cast<std::size_t>(p.n) * sizeof(float);
}

/// Computes SnapKV scores (window sums, then pooling) into `p.scores`.
/// @return cudaErrorInvalidValue on a bad shape, an even or non-positive kernel, or a too small
///   workspace, else the launch error
template <typename ProbT = float>
[[nodiscard]] cudaError_t SnapKVScores(const SnapKVScoreParams& p, void* d_workspace, std::size_t workspace_bytes,
                                       cudaStream_t stream = nullptr) {
  if (!detail::score_shape_ok(p.probs, p.query_stride, p.n_heads, p.n_kv_heads, p.n_queries, p.n, p.scores,
                              p.score_stride))
    return cudaErrorInvalidValue;
  if (p.pooling != Pooling::kNone && (p.kernel < 1 || p.kernel % 2 == 0)) return cudaErrorInvalidValue;
  const std::size_t need = SnapKVScoresWorkspaceBytes(p);
  if (workspace_bytes < need || (need > 0 && d_workspace == nullptr)) return cudaErrorInvalidValue;
  if (p.status != nullptr) {
    const cudaError_t e = cudaMemsetAsync(p.status, 0, sizeof(std::uint32_t), stream);
    if (e != cudaSuccess) return e;
  }
  if (p.n == 0) return cudaSuccess;
  const bool pool = p.pooling != Pooling::kNone;
  detail::ScoreSumArgs a;
  a.probs = p.probs;
  a.head_stride = p.head_stride;
  a.query_stride = p.query_stride;
  a.group = p.n_heads / p.n_kv_heads;
  a.n_queries = p.n_queries;
  a.n = p.n;
  a.out = pool ? static_cast<float*>(d_workspace) : p.scores;
  a.out_stride = pool ? p.n : p.score_stride;
  a.accumulate = false;
  a.query_major = true;
  a.status = p.status;
  constexpr int NT = detail::kScoreThreads;
  const dim3 grid(static_cast<unsigned>((static_cast<std::int64_t>(p.n) + NT - 1) / NT), static_cast<unsigned>(p.n_kv_heads));
  ScoreSumKernel<ProbT, NT><<<grid, NT, 0, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !pool) return e;
  PoolScoresKernel<NT><<<grid, NT, 0, stream>>>(static_cast<const float*>(d_workspace), p.n, p.kernel,
                                                p.pooling == Pooling::kAvg ? 1 : 0, p.scores, p.score_stride);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace depthkv
