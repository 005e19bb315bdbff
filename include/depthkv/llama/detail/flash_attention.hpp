#pragma once
/// @file llama/detail/flash_attention.hpp
/// @brief `flash_attention`: causal grouped-query attention of T new queries against the keys and
/// values each KV head of one layer holds, tiled with an online softmax (FlashAttention's
/// recurrence, on the CPU). It never forms the `T x n` score matrix: it holds one
/// `[query vectors x key tile]` tile of scores at a time.
///
/// ## Formula
/// Query head `qh` reads KV head `h = qh / G` (`G = n_heads / n_kv_heads`). Query row `i`
/// (position `pos0 + i`) sees the slots `b_i <= j < vis_i = min(n_h, n_old_h + i + 1)` of its KV
/// head, `b_i = vis_begin_h[i]` for a sliding-window layer (the first slot inside the row's window),
/// else 0:
///
///     s_ij = scale (q_i . k_j),   out_i = sum_j e^(s_ij - m_i) v_j / sum_j e^(s_ij - m_i)
///
/// with `scale = FlashShape::scale` (0: `1 / sqrt(head_dim)`)
///
/// with `m_i` a running maximum. Keys are visited in tiles of `kFlashKeyTile` slots; per tile
/// every row updates its maximum `m`, its sum `l` and its accumulator `a` (`head_dim` floats):
///
///     m' = max(m, max_j s_ij),  l' = l e^(m - m') + sum_j e^(s_ij - m'),  a' = a e^(m - m') + sum_j e^(s_ij - m') v_j
///
/// and `out_i = a / l` at the end. When a KV head's keys are split into parts (long contexts with
/// few query rows, e.g. decode), each part gives its own `(m_p, l_p, a_p)`, merged in part order:
/// `M = max_p m_p`, `out_i = sum_p a_p e^(m_p - M) / sum_p l_p e^(m_p - M)`.
///
/// ## Shapes and contract
/// - `q`: `T` rows of `n_heads * head_dim` floats with leading dimension `q_ld` (row `i` holds
///   the rotated query vectors of position `pos0 + i`, head `qh` at columns
///   `[qh * head_dim, (qh + 1) * head_dim)`); `out` the same layout with leading dimension `out_ld`.
/// - `heads[h]` (one per KV head): `n` key rows and `n` value rows of `head_dim` elements of
///   `Scalar` (`float`, `Eigen::half`, `Eigen::bfloat16`: converted to float one tile at a time),
///   row `j` at `k + j * ld` and `v + j * ld`, and `n_old`, the slots held before the call's
///   tokens; every query row must see at least one slot (`n_old + 1 <= n`, or `n >= 1`, and
///   `vis_begin[i] < vis_i`); `vis_begin` (optional, `T` entries, non-decreasing) is the first
///   slot each query row sees.
/// - Work is split into tasks (KV head, block of query rows, part of the keys); the split depends
///   only on the shapes (`flash_plan`), never on the thread count, and each task reads its KV
///   head's key and value tiles once for all `G` query heads of the group. Every thread count
///   gives the same bytes; the result equals the softmax attention up to float rounding (the
///   order of the sums differs from a row-at-a-time softmax).
/// - Products: Eigen's, on tiles converted to float (F16 with F16C from SIMD level 2). From level 2
///   over F16 rows, a call of more than `kFlashDecodeVectors` query vectors (T x group; prefill;
///   head size a multiple of 16) converts each KV head once and runs `BlockTile` (register
///   blocks), a smaller one (decode; head size a multiple of 8) `DecodeTile` (no converted copy, no
///   packing), both with the softmax of `TileSoftmax` (AVX2 exponentials); their sums and weights
///   differ from level 1's by float rounding. Float rows always take Eigen's products and softmax
///   (the evaluation protocol's caches: the same bytes at every level).
/// - Tasks run on `threads` OpenMP threads (1: the calling thread, Eigen's products serial).
///
/// @code
/// std::vector<detail::FlashHead<float>> heads = ...;   // one per KV head
/// detail::flash_attention(heads.data(), {T, n_heads, n_kv_heads, head_dim}, q.data(), q.cols(),
///                         att.data(), att.cols(), /*threads=*/2);
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "depthkv/detail/parallel_for.hpp"
#include "depthkv/detail/simd.hpp"
#include "depthkv/thread_pool.hpp"

namespace depthkv {
namespace llama {
namespace detail {

/// The key and value rows of one KV head (see the file comment).
template <class Scalar>
struct FlashHead {
  const Scalar* k = nullptr;  ///< key row 0; row j at k + j * ld
  const Scalar* v = nullptr;  ///< value row 0; row j at v + j * ld
  std::ptrdiff_t ld = 0;      ///< elements from one row to the next (>= head_dim)
  int n = 0;                  ///< rows held (after the call's tokens were appended)
  int n_old = 0;              ///< rows held before the call's tokens
  const int* vis_begin = nullptr;  ///< first slot query row i sees (T entries, non-decreasing); nullptr: 0
};

/// The sizes of one attention call.
struct FlashShape {
  int T = 0;           ///< query rows (tokens of the call)
  int n_heads = 0;     ///< query heads
  int n_kv_heads = 0;  ///< KV heads (divides n_heads)
  int head_dim = 0;
  float scale = 0;     ///< score scale; 0: 1 / sqrt(head_dim)
  /// @return the score scale
  float score_scale() const { return scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

/// Query vectors (query rows x group heads) per task block.
inline constexpr int kFlashQueryVectors = 64;
/// Key slots per tile.
inline constexpr int kFlashKeyTile = 128;
/// Fewer (KV head, query block) tasks than this split the keys into parts...
inline constexpr int kFlashMinTasks = 16;
/// ... of at least this many slots.
inline constexpr int kFlashMinPart = 512;

/// How one call is split into tasks: a function of the shapes only.
struct FlashPlan {
  int group = 1;           ///< query heads per KV head
  int rows_per_block = 1;  ///< query rows per task
  int n_blocks = 1;        ///< query blocks
  int n_parts = 1;         ///< parts of each KV head's keys
  int part_len = 0;        ///< slots per part (a multiple of kFlashKeyTile)
  int n_tasks(int n_kv_heads) const { return n_kv_heads * n_blocks * n_parts; }
};

/// @param max_n the most slots any KV head holds
inline FlashPlan flash_plan(const FlashShape& s, int max_n) {
  FlashPlan p;
  p.group = s.n_heads / s.n_kv_heads;
  p.rows_per_block = std::max(1, kFlashQueryVectors / p.group);
  p.n_blocks = (s.T + p.rows_per_block - 1) / p.rows_per_block;
  const int base = s.n_kv_heads * p.n_blocks;
  const int want = base >= kFlashMinTasks ? 1 : (kFlashMinTasks + base - 1) / base;
  p.n_parts = std::max(1, std::min(want, max_n / kFlashMinPart));
  p.part_len = (max_n + p.n_parts - 1) / p.n_parts;
  p.part_len = std::max(1, (p.part_len + kFlashKeyTile - 1) / kFlashKeyTile) * kFlashKeyTile;
  return p;
}

/// Running softmax state of one task: per query vector (row `(i - r0) * group + g`) the maximum,
/// the sum and the accumulator.
struct FlashState {
  using Rows = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Rows acc;             ///< [vectors x head_dim]
  Eigen::VectorXf m;    ///< running maxima (-inf: nothing seen)
  Eigen::VectorXf l;    ///< running sums
  void reset(int vectors, int head_dim) {
    acc.setZero(vectors, head_dim);
    m.setConstant(vectors, -std::numeric_limits<float>::infinity());
    l.setZero(vectors);
  }
};

/// A KV head's F16 rows converted once per call for `BlockTile`: the keys transposed
/// (`kt[d * ldk + j]`, `ldk` the rows rounded up to 16, plus 16 at a multiple of 1024; zeros past
/// the rows) and the values as float rows (`v[j * head_dim + d]`).
struct BlockHead {
  std::vector<float> kt, v;
  int ldk = 0;
};

#if defined(DEPTHKV_AVX2_DISPATCH)
/// F16 rows to float with F16C (exact, as the scalar conversion): `rows` rows of `hd` at `src`
/// (stride `ld`) to `dst` (stride `hd`).
__attribute__((target("avx2,f16c"))) inline void half_rows_f16c(const Eigen::half* src, std::ptrdiff_t ld, int rows,
                                                                 int hd, float* dst) {
  for (int r = 0; r < rows; ++r, src += ld, dst += hd) {
    int k = 0;
    for (; k + 8 <= hd; k += 8)
      _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k))));
    for (; k < hd; ++k) dst[k] = static_cast<float>(src[k]);
  }
}
/// BF16 rows to float with AVX2 (exact: the 16 bits become the high half of the float).
__attribute__((target("avx2"))) inline void bf16_rows_avx2(const Eigen::bfloat16* src, std::ptrdiff_t ld, int rows,
                                                           int hd, float* dst) {
  for (int r = 0; r < rows; ++r, src += ld, dst += hd) {
    int k = 0;
    for (; k + 8 <= hd; k += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
      _mm256_storeu_ps(dst + k, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; k < hd; ++k) dst[k] = static_cast<float>(src[k]);
  }
}
/// Query vectors per task up to which a tile's products run on `DecodeTile` (AVX2) from SIMD level 2.
inline constexpr int kFlashDecodeVectors = 8;

/// The two products of one key tile for at most `kFlashDecodeVectors` query vectors (decode:
/// one query row of a group), reading the F16 rows in registers (no converted copy, no packing):
/// `S = Q K^T` and `acc += S V`. `head_dim` a multiple of 8. The sums run in another order than
/// Eigen's products (the result differs from level 1 by float rounding only).
struct DecodeTile {
  __attribute__((target("avx2,fma,f16c"))) static __m256 load8(const Eigen::half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx2,fma"))) static float hsum(__m256 a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  /// S[v * bk + j] = q_v . k_j for the `bk` key rows at `k` (stride `ld`), `nv` vectors at `q`.
  __attribute__((target("avx2,fma,f16c"))) static void scores(const float* q, int nv, int hd, const Eigen::half* k,
                                                              std::ptrdiff_t ld, int bk, float* S) {
    for (int j = 0; j < bk; ++j, k += ld) {
      __m256 a[kFlashDecodeVectors];
      for (int v = 0; v < nv; ++v) a[v] = _mm256_setzero_ps();
      for (int d = 0; d < hd; d += 8) {
        const __m256 x = load8(k + d);
        for (int v = 0; v < nv; ++v) a[v] = _mm256_fmadd_ps(_mm256_loadu_ps(q + v * hd + d), x, a[v]);
      }
      for (int v = 0; v < nv; ++v) S[v * bk + j] = hsum(a[v]);
    }
  }
  /// acc[v] += sum_j S[v * bk + j] v_j for the `bk` value rows at `vr` (stride `ld`).
  __attribute__((target("avx2,fma,f16c"))) static void values(const float* S, int nv, int bk, const Eigen::half* vr,
                                                              std::ptrdiff_t ld, int hd, float* acc) {
    for (int d = 0; d < hd; d += 8) {
      __m256 a[kFlashDecodeVectors];
      for (int v = 0; v < nv; ++v) a[v] = _mm256_loadu_ps(acc + v * hd + d);
      for (int j = 0; j < bk; ++j) {
        const __m256 x = load8(vr + j * ld + d);
        for (int v = 0; v < nv; ++v) a[v] = _mm256_fmadd_ps(_mm256_set1_ps(S[v * bk + j]), x, a[v]);
      }
      for (int v = 0; v < nv; ++v) _mm256_storeu_ps(acc + v * hd + d, a[v]);
    }
  }
};

/// The two products of one key tile for more query vectors than `kFlashDecodeVectors` (prefill)
/// over F16 rows converted to float once per call and KV head (`BlockHead`): `S = Q K^T` from the
/// keys transposed in blocks of 4 query vectors x 16 keys, and `acc += S V` from the float values
/// in blocks of 4 vectors x 16 dimensions, all in AVX2/FMA registers (no packing). `head_dim` a
/// multiple of 16. The sums run in another order than Eigen's products (the result differs from
/// level 1 by float rounding).
struct BlockTile {
  /// `out` from the F16 rows of `h`: the keys transposed and the values as floats.
  __attribute__((target("avx2,fma,f16c"))) static void convert(const FlashHead<Eigen::half>& h, int hd,
                                                               BlockHead& out) {
    out.ldk = (h.n + 15) / 16 * 16;
    if (out.ldk % 1024 == 0) out.ldk += 16;  // a row stride of 4 KiB multiples maps every d to one cache set
    out.kt.resize(static_cast<std::size_t>(hd) * static_cast<std::size_t>(out.ldk));
    out.v.resize(static_cast<std::size_t>(h.n) * static_cast<std::size_t>(hd));
    keys_t(h.k, h.ld, h.n, hd, out.kt.data(), out.ldk);
    half_rows_f16c(h.v, h.ld, h.n, hd, out.v.data());
  }
  /// kt[d * ldk + j] = k_j[d] for the `bk` F16 key rows at `k` (stride `ld`); 0 for j in [bk, ldk).
  __attribute__((target("avx2,fma,f16c"))) static void keys_t(const Eigen::half* k, std::ptrdiff_t ld, int bk, int hd,
                                                              float* kt, int ldk) {
    alignas(32) float row[8];
    for (int j = 0; j < bk; ++j)
      for (int d = 0; d < hd; d += 8) {
        _mm256_store_ps(row, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + j * ld + d))));
        for (int i = 0; i < 8; ++i) kt[(d + i) * ldk + j] = row[i];
      }
    for (int d = 0; d < hd; ++d)
      for (int j = bk; j < ldk; ++j) kt[d * ldk + j] = 0.0f;
  }
  /// S[v * bk + j] = q_v . k_j for `R` vectors from `v0` and the 16 keys from `j0`.
  template <int R>
  __attribute__((target("avx2,fma"))) static void score_block(const float* q, int hd, const float* kt, int ldk,
                                                              int v0, int j0, int bk, float* S) {
    __m256 a[R][2];
    for (int i = 0; i < R; ++i) a[i][0] = a[i][1] = _mm256_setzero_ps();
    for (int d = 0; d < hd; ++d) {
      const __m256 b0 = _mm256_loadu_ps(kt + d * ldk + j0), b1 = _mm256_loadu_ps(kt + d * ldk + j0 + 8);
      for (int i = 0; i < R; ++i) {
        const __m256 x = _mm256_broadcast_ss(q + (v0 + i) * hd + d);
        a[i][0] = _mm256_fmadd_ps(x, b0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(x, b1, a[i][1]);
      }
    }
    alignas(32) float out[16];
    const int n = std::min(16, bk - j0);
    for (int i = 0; i < R; ++i) {
      _mm256_store_ps(out, a[i][0]);
      _mm256_store_ps(out + 8, a[i][1]);
      for (int j = 0; j < n; ++j) S[(v0 + i) * bk + j0 + j] = out[j];
    }
  }
  __attribute__((target("avx2,fma"))) static void scores(const float* q, int nv, int hd, const float* kt, int ldk,
                                                         int bk, float* S) {
    for (int j0 = 0; j0 < bk; j0 += 16) {
      int v0 = 0;
      for (; v0 + 4 <= nv; v0 += 4) score_block<4>(q, hd, kt, ldk, v0, j0, bk, S);
      for (; v0 < nv; ++v0) score_block<1>(q, hd, kt, ldk, v0, j0, bk, S);
    }
  }
  /// acc[v * hd + d] += sum_j S[v * bk + j] v_j[d] for `R` vectors from `v0`, dimensions [d0, d0 + 16).
  template <int R>
  __attribute__((target("avx2,fma"))) static void value_block(const float* S, int bk, const float* v, int hd, int v0,
                                                              int d0, float* acc) {
    __m256 a[R][2];
    for (int i = 0; i < R; ++i) {
      a[i][0] = _mm256_loadu_ps(acc + (v0 + i) * hd + d0);
      a[i][1] = _mm256_loadu_ps(acc + (v0 + i) * hd + d0 + 8);
    }
    for (int j = 0; j < bk; ++j) {
      const __m256 x0 = _mm256_loadu_ps(v + j * hd + d0), x1 = _mm256_loadu_ps(v + j * hd + d0 + 8);
      for (int i = 0; i < R; ++i) {
        const __m256 w = _mm256_broadcast_ss(S + (v0 + i) * bk + j);
        a[i][0] = _mm256_fmadd_ps(w, x0, a[i][0]);
        a[i][1] = _mm256_fmadd_ps(w, x1, a[i][1]);
      }
    }
    for (int i = 0; i < R; ++i) {
      _mm256_storeu_ps(acc + (v0 + i) * hd + d0, a[i][0]);
      _mm256_storeu_ps(acc + (v0 + i) * hd + d0 + 8, a[i][1]);
    }
  }
  __attribute__((target("avx2,fma"))) static void values(const float* S, int nv, int bk, const float* v, int hd,
                                                         float* acc) {
    for (int d0 = 0; d0 < hd; d0 += 16) {
      int v0 = 0;
      for (; v0 + 4 <= nv; v0 += 4) value_block<4>(S, bk, v, hd, v0, d0, acc);
      for (; v0 < nv; ++v0) value_block<1>(S, bk, v, hd, v0, d0, acc);
    }
  }
};
#endif

/// `rows` rows of `head_dim` elements at `src` (stride `ld`) as float rows: in place for float,
/// else converted into `buf` (exactly, at every `simd` level: F16C / AVX2 from level 2).
template <class Scalar>
inline Eigen::Map<const FlashState::Rows, 0, Eigen::OuterStride<>> flash_tile(const Scalar* src, std::ptrdiff_t ld,
                                                                             int rows, int head_dim, FlashState::Rows& buf,
                                                                             int simd) {
  using Map = Eigen::Map<const FlashState::Rows, 0, Eigen::OuterStride<>>;
  if constexpr (std::is_same<Scalar, float>::value) {
    (void)buf;
    (void)simd;
    return Map(src, rows, head_dim, Eigen::OuterStride<>(ld));
  } else {
#if defined(DEPTHKV_AVX2_DISPATCH)
    if (simd >= 2) {
      buf.resize(rows, head_dim);
      if constexpr (std::is_same<Scalar, Eigen::half>::value) {
        half_rows_f16c(src, ld, rows, head_dim, buf.data());
        return Map(buf.data(), rows, head_dim, Eigen::OuterStride<>(head_dim));
      } else if constexpr (std::is_same<Scalar, Eigen::bfloat16>::value) {
        bf16_rows_avx2(src, ld, rows, head_dim, buf.data());
        return Map(buf.data(), rows, head_dim, Eigen::OuterStride<>(head_dim));
      }
    }
#else
    (void)simd;
#endif
    using Stored = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    buf = Eigen::Map<const Stored, 0, Eigen::OuterStride<>>(src, rows, head_dim, Eigen::OuterStride<>(ld))
              .template cast<float>();
    return Map(buf.data(), rows, head_dim, Eigen::OuterStride<>(head_dim));
  }
}

/// Turns the scores `S` of one key tile (first slot `j0`) into weights in place and updates the
/// rows' maxima, sums and accumulator scales: entries a row may not see become 0.
/// @param vis(r, b, e) sets [b, e), the slots query vector r sees
template <class Vis>
inline void flash_tile_softmax(FlashState::Rows& S, int j0, float scale, Vis&& vis, FlashState& st) {
  const int bk = static_cast<int>(S.cols());
  for (Eigen::Index r = 0; r < S.rows(); ++r) {
    int b = 0, e = 0;
    vis(static_cast<int>(r), b, e);
    const int lo = std::max(0, b - j0), hi = std::min(bk, e - j0), w = hi - lo;
    auto row = S.row(r).array();
    if (w <= 0) {
      row.setZero();
      continue;
    }
    // the visible slots: a head of the row (no window start in this tile: the same Eigen
    // expression, so the same bits, as without windows), else a segment
    const auto weigh = [&](auto seg) {
      seg *= scale;
      const float m_new = std::max(st.m(r), seg.maxCoeff());
      const float corr = std::exp(st.m(r) - m_new);  // 0 when nothing was seen (m = -inf)
      seg = (seg - m_new).exp();
      st.l(r) = st.l(r) * corr + seg.sum();
      if (corr != 1.0f) st.acc.row(r) *= corr;
      st.m(r) = m_new;
    };
    if (lo == 0) {
      weigh(row.head(w));
    } else {
      weigh(row.segment(lo, w));
      row.head(lo).setZero();
    }
    if (hi < bk) row.tail(bk - hi).setZero();
  }
}

#if defined(DEPTHKV_AVX2_DISPATCH)
/// The weights of the F16 tiles (`flash_tiles_f16`): `flash_tile_softmax`'s rule with the scaling,
/// maximum, exponential and sum of each row's visible segment in AVX2 registers. `exp8` is
/// Cephes' expf: x clamped to [-87.33, 88.38] (exp(-87.33) is FLT_MIN, so a weight never becomes
/// a denormal), e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts),
/// e^r by its degree-7 polynomial; relative error below 2e-7 against std::exp. The sums run in
/// another order than Eigen's (the weights differ from level 1 by float rounding only).
struct TileSoftmax {
  __attribute__((target("avx2,fma"))) static __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365448f)), _mm256_set1_ps(88.3762626f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  /// Scales x[0, w) by `scale` in place and returns their maximum.
  __attribute__((target("avx2,fma"))) static float scale_max(float* x, int w, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int j = 0;
    for (; j + 8 <= w; j += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), sc);
      _mm256_storeu_ps(x + j, v);
      mx = _mm256_max_ps(mx, v);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    for (; j < w; ++j) m = std::max(m, x[j] *= scale);
    return m;
  }
  /// x[j] <- e^(x[j] - m) for j in [0, w); returns their sum.
  __attribute__((target("avx2,fma"))) static float exp_sum(float* x, int w, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= w; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv));
      _mm256_storeu_ps(x + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    if (j < w) {  // the tail through a padded block
      alignas(32) float t[8];
      for (int i = 0; i < 8; ++i) t[i] = j + i < w ? x[j + i] : m - 1000.0f;
      const __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(t), mv));
      _mm256_store_ps(t, e);
      for (int i = 0; j + i < w; ++i) x[j + i] = t[i];
      sum = _mm256_add_ps(sum, _mm256_blendv_ps(e, _mm256_setzero_ps(), tail_mask(w - j)));
    }
    return DecodeTile::hsum(sum);
  }
  /// Lanes [k, 8) set (k in [1, 8)).
  __attribute__((target("avx2"))) static __m256 tail_mask(int k) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(k - 1)));
  }

  /// `flash_tile_softmax` of one tile (same arguments and rule).
  template <class Vis>
  static void apply(FlashState::Rows& S, int j0, float scale, Vis&& vis, FlashState& st) {
    const int bk = static_cast<int>(S.cols());
    for (Eigen::Index r = 0; r < S.rows(); ++r) {
      int b = 0, e = 0;
      vis(static_cast<int>(r), b, e);
      const int lo = std::max(0, b - j0), hi = std::min(bk, e - j0), w = hi - lo;
      float* row = S.data() + r * bk;
      if (w <= 0) {
        std::fill(row, row + bk, 0.0f);
        continue;
      }
      const float m_new = std::max(st.m(r), scale_max(row + lo, w, scale));
      const float corr = std::exp(st.m(r) - m_new);  // 0 when nothing was seen (m = -inf)
      st.l(r) = st.l(r) * corr + exp_sum(row + lo, w, m_new);
      if (corr != 1.0f) st.acc.row(r) *= corr;
      st.m(r) = m_new;
      std::fill(row, row + lo, 0.0f);
      std::fill(row + hi, row + bk, 0.0f);
    }
  }
};

/// `flash_task`'s key tiles [lo, hi) over F16 rows: `BlockTile` on the head's converted rows
/// `bh`, else `DecodeTile` for at most `kFlashDecodeVectors` query vectors and a head size that
/// is a multiple of 8; false (nothing done) otherwise.
template <class Vis>
bool flash_tiles_f16(const FlashHead<Eigen::half>& head, int hd, int lo, int hi, float scale,
                     const FlashState::Rows& Qb, Vis&& vis, FlashState::Rows& S, FlashState& st, const BlockHead* bh) {
  const int vectors = static_cast<int>(Qb.rows());
  if (!bh && (vectors > kFlashDecodeVectors || hd % 8 != 0)) return false;
  for (int jt = lo; jt < hi; jt += kFlashKeyTile) {
    const int bk = std::min(kFlashKeyTile, hi - jt);
    S.resize(vectors, bk);
    if (bh) {
      BlockTile::scores(Qb.data(), vectors, hd, bh->kt.data() + jt, bh->ldk, bk, S.data());
      TileSoftmax::apply(S, jt, scale, vis, st);
      BlockTile::values(S.data(), vectors, bk, bh->v.data() + static_cast<std::ptrdiff_t>(jt) * hd, hd,
                        st.acc.data());
    } else {
      DecodeTile::scores(Qb.data(), vectors, hd, head.k + static_cast<std::ptrdiff_t>(jt) * head.ld, head.ld, bk,
                         S.data());
      TileSoftmax::apply(S, jt, scale, vis, st);
      DecodeTile::values(S.data(), vectors, bk, head.v + static_cast<std::ptrdiff_t>(jt) * head.ld, head.ld, hd,
                         st.acc.data());
    }
  }
  return true;
}
#endif

/// One task: query rows [r0, r1) of every head of KV head `head`'s group against its slots
/// [j0, j1), into `st`.
template <class Scalar>
void flash_task(const FlashHead<Scalar>& head, int kv_head, const FlashShape& s, const FlashPlan& p, const float* q,
                std::ptrdiff_t q_ld, int r0, int r1, int j0, int j1, FlashState& st, int simd,
                const BlockHead* bh = nullptr) {
  const int G = p.group, hd = s.head_dim;
  const int vectors = (r1 - r0) * G;
  FlashState::Rows Qb(vectors, hd), S, kbuf, vbuf;
  for (int i = r0; i < r1; ++i)
    for (int g = 0; g < G; ++g)
      Qb.row((i - r0) * G + g) = Eigen::Map<const Eigen::RowVectorXf>(
          q + static_cast<std::ptrdiff_t>(i) * q_ld + static_cast<std::ptrdiff_t>(kv_head * G + g) * hd, hd);
  st.reset(vectors, hd);
  const float scale = s.score_scale();
  const auto vis = [&](int r, int& b, int& e) {
    const int i = r0 + r / G;
    b = head.vis_begin ? head.vis_begin[i] : 0;
    e = std::min(head.n, head.n_old + i + 1);
  };
  const int hi = std::min(j1, std::min(head.n, head.n_old + r1));  // the last row sees the most
  const int lo = std::max(j0, head.vis_begin ? head.vis_begin[r0] : 0);  // the first row starts first
#if defined(DEPTHKV_AVX2_DISPATCH)
  if constexpr (std::is_same<Scalar, Eigen::half>::value)  // F16 rows only: a float cache keeps Eigen's sums
    if (simd >= 2 && flash_tiles_f16(head, hd, lo, hi, scale, Qb, vis, S, st, bh)) return;
#endif
  (void)bh;
  for (int jt = lo; jt < hi; jt += kFlashKeyTile) {
    const int bk = std::min(kFlashKeyTile, hi - jt);
    const auto K = flash_tile(head.k + static_cast<std::ptrdiff_t>(jt) * head.ld, head.ld, bk, hd, kbuf, simd);
    S.noalias() = Qb * K.transpose();
    flash_tile_softmax(S, jt, scale, vis, st);
    const auto V = flash_tile(head.v + static_cast<std::ptrdiff_t>(jt) * head.ld, head.ld, bk, hd, vbuf, simd);
    st.acc.noalias() += S * V;
  }
}

/// Writes the merged parts `parts[0..n)` of query rows [r0, r1) of KV head `kv_head`'s group to `out`.
inline void flash_write(const FlashState* parts, int n, int kv_head, int G, int hd, int r0, int r1, float* out,
                        std::ptrdiff_t out_ld) {
  for (int r = 0; r < (r1 - r0) * G; ++r) {
    float M = -std::numeric_limits<float>::infinity();
    for (int p = 0; p < n; ++p) M = std::max(M, parts[p].m(r));
    float L = 0;
    Eigen::RowVectorXf o = Eigen::RowVectorXf::Zero(hd);
    for (int p = 0; p < n; ++p) {
      if (parts[p].l(r) == 0) continue;  // the part held no slot this row sees
      const float w = n == 1 ? 1.0f : std::exp(parts[p].m(r) - M);
      L += parts[p].l(r) * w;
      o += w * parts[p].acc.row(r);
    }
    const int i = r0 + r / G, qh = kv_head * G + r % G;
    Eigen::Map<Eigen::RowVectorXf>(out + static_cast<std::ptrdiff_t>(i) * out_ld + static_cast<std::ptrdiff_t>(qh) * hd,
                                   hd) = o / L;
  }
}

/// Runs fn(t) for t in [0, n) on `threads` threads: on `pool` when set (thread_pool.hpp), else an
/// OpenMP team (1, or inside an active region: the calling thread with Eigen serial); rethrows
/// the lowest task's exception.
template <class Fn>
void flash_run(int n, int threads, Fn&& fn, ThreadPool* pool = nullptr) {
#ifdef _OPENMP
  const bool top_level = omp_get_active_level() == 0;
#else
  const bool top_level = true;
#endif
  if (pool != nullptr && threads > 1 && n > 1 && top_level) {
    pool->run(n, threads, fn);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  const auto guarded = [&](int t) {
    try {
      fn(t);
    } catch (...) {
      errors[static_cast<std::size_t>(t)] = std::current_exception();
    }
  };
#ifdef _OPENMP
  if (threads > 1 && n > 1 && omp_get_active_level() == 0) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min(threads, n))
    for (int t = 0; t < n; ++t) guarded(t);
  } else
#endif
  {
    (void)threads;
    depthkv::detail::run_eigen_serial([&] {
      for (int t = 0; t < n; ++t) guarded(t);
    });
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Causal grouped-query attention of `s.T` query rows (see the file comment).
/// @param heads `s.n_kv_heads` KV heads' rows
/// @param q, q_ld the queries and their leading dimension (floats)
/// @param out, out_ld the output (same layout as q)
/// @param threads threads (>= 1)
/// @param simd the instruction-set level of the F16 / BF16 conversion (`detail::simd_level`; the
///   same bytes at every level)
/// @param pool workers for the tasks (nullptr: an OpenMP team)
template <class Scalar>
void flash_attention(const FlashHead<Scalar>* heads, const FlashShape& s, const float* q, std::ptrdiff_t q_ld,
                     float* out, std::ptrdiff_t out_ld, int threads, int simd = cpu_simd_level(),
                     ThreadPool* pool = nullptr) {
  int max_n = 0;
  for (int h = 0; h < s.n_kv_heads; ++h) max_n = std::max(max_n, heads[h].n);
  const FlashPlan p = flash_plan(s, max_n);
  const int tasks = p.n_tasks(s.n_kv_heads);
  std::vector<BlockHead> blocks;  // F16 prefill from level 2: each KV head converted once
#if defined(DEPTHKV_AVX2_DISPATCH)
  if constexpr (std::is_same<Scalar, Eigen::half>::value)
    if (simd >= 2 && s.T * p.group > kFlashDecodeVectors && s.head_dim % 16 == 0) {
      blocks.resize(static_cast<std::size_t>(s.n_kv_heads));
      flash_run(
          s.n_kv_heads, threads,
          [&](int h) { BlockTile::convert(heads[h], s.head_dim, blocks[static_cast<std::size_t>(h)]); }, pool);
    }
#endif
  const auto block_of = [&](int h) { return blocks.empty() ? nullptr : &blocks[static_cast<std::size_t>(h)]; };
  std::vector<FlashState> states(p.n_parts > 1 ? static_cast<std::size_t>(tasks) : 0);
  // task t: part t % n_parts of (KV head, block); the blocks that see the most slots come first
  const auto unpack = [&](int t, int& h, int& r0, int& r1) {
    const int rest = t / p.n_parts;
    h = rest % s.n_kv_heads;
    const int b = p.n_blocks - 1 - rest / s.n_kv_heads;
    r0 = b * p.rows_per_block;
    r1 = std::min(s.T, r0 + p.rows_per_block);
  };
  flash_run(tasks, threads, [&](int t) {
    int h = 0, r0 = 0, r1 = 0;
    unpack(t, h, r0, r1);
    const int part = t % p.n_parts;
    if (p.n_parts == 1) {
      FlashState st;
      flash_task(heads[h], h, s, p, q, q_ld, r0, r1, 0, heads[h].n, st, simd, block_of(h));
      flash_write(&st, 1, h, p.group, s.head_dim, r0, r1, out, out_ld);
      return;
    }
    flash_task(heads[h], h, s, p, q, q_ld, r0, r1, part * p.part_len, (part + 1) * p.part_len,
               states[static_cast<std::size_t>(t)], simd, block_of(h));
  }, pool);
  if (p.n_parts == 1) return;
  for (int t = 0; t < tasks; t += p.n_parts) {
    int h = 0, r0 = 0, r1 = 0;
    unpack(t, h, r0, r1);
    flash_write(&states[static_cast<std::size_t>(t)], p.n_parts, h, p.group, s.head_dim, r0, r1, out, out_ld);
  }
}

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
