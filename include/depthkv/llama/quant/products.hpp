#pragma once
/// @file llama/quant/products.hpp
/// @brief Matrix products on weights stored in a ggml type, without a float copy of the matrix:
/// `quant_matvec` (y = W x), `quant_matmul` (Y = X W^T) and `quant_row_dot`.
///
/// W is `rows x cols`, row-major, each row `ggml_row_bytes(type, cols)` bytes of blocks (as GGUF
/// stores a tensor with ne = [cols, rows]); x has `cols` floats; X is `n x cols` and Y `n x rows`,
/// both row-major floats. Types: every `ggml_type_dequantizable` type.
///
/// Kernels (`QuantKernel`):
/// - `kQ8Activations` (block types; as llama.cpp's `ggml_vec_dot_*_q8_*`): x is quantized per
///   32 values to int8 with a float scale (d = max|x| / 127, round to nearest), and each chunk
///   of 32 weights is multiplied as integers (AVX2 `maddubs`/`madd`) with its sub-block scales,
///   then once in float by d_w * d_x; minimums and offsets go through the activation sums. The
///   rounding of x adds at most sum_k |w_k| * max_k |x_k| / 254 per 32 values to a dot product
///   (the max over each 32 values).
/// - `kQ8KActivations` (Q4_K, Q5_K, Q6_K; as llama.cpp's `ggml_vec_dot_q*_K_q8_K`): x is
///   quantized per 256 values (one K-quant block) to int8 with one float scale
///   (d = max|x| / 127 over the 256 values) and the sums of each 16 codes; the integer products
///   of all the sub-blocks of a block are summed with their 6-bit (Q6_K: 8-bit) scales in
///   int32, the minimums (Q6_K: the offset 32) folded in with one multiply-add of those sums,
///   and converted to float once per block and token. Coarser than kQ8Activations: the rounding
///   of x adds at most sum_k |w_k| * max_k |x_k| / 254 per 256 values, the max over each 256
///   values (up to 8x the per-32 bound where the magnitudes of x vary across a block, the same
///   where they do not).
/// - Both int8 kernels need finite activations: a NaN or infinity in x has no int8 code (the
///   result is then unspecified; the float kernel would propagate it).
/// - `kDequantize`: each block is dequantized into a float buffer (exactly the values of
///   `dequantize_row`) and multiplied in float: matvec with an FMA dot per row; matmul
///   dequantizes a tile of `kQuantMatmulTile` rows and multiplies it with X: from
///   `kFloatPanelMinTokens` tokens on by panels of 16 rows interleaved so that one load holds a
///   column (8 x 8 transposes), each FMA'd with broadcast activations of 6 tokens (2 x 6 AVX2
///   accumulators); below that by 4-token x 2-row dot-product tiles (Eigen's float GEMM at the
///   scalar level: Eigen is compiled for the build's baseline instruction set). Every type.
/// - AVX-512 VNNI (`max_simd_level` 3, where the CPU has AVX-512 F, BW, VL and VNNI): from
///   `kVnniMinTokens` tokens on, both int8 kernels of the matmul unpack panels of 16 rows into
///   unsigned codes once and multiply every token with `vpdpbusd` (vnni_panels.hpp): the same
///   integer sums as the AVX2 kernels, other float rounding. Matvec and fewer tokens use AVX2.
/// - `kAuto` (default): `kQ8KActivations` for Q4_K, Q5_K and Q6_K, `kQ8Activations` for the
///   other block types, `kDequantize` (conversion in registers, F16C for F16) for F32, F16 and
///   BF16. The choice is measured by benchmarks/quant_bench.cpp (figures in
///   benchmarks/RESULTS.md; reasons in quants.hpp): for the three K-quants the per-256 kernel
///   ran at 2.0-2.8x the per-32 one in the 512-token matmul and 1.3-2.6x in matvec (1 thread,
///   every TinyLlama shape; 2 threads: matmul 1.1-2.6x), which pays for the coarser activation
///   rounding (llama.cpp rounds the activations of these types per 256 values too).
///
/// Accuracy of kDequantize: the result is the float product of the dequantized matrix, summed
/// in another order (8-lane FMA partial sums; Eigen's GEMM blocking at the scalar level), so it differs from
/// `dequantize_row` followed by an exact product by rounding only (the tests allow
/// 1e-5 * sum_k |w_k x_k|).
///
/// Instruction set: AVX2 + FMA + F16C paths chosen at run time, a scalar fallback otherwise or
/// when the call's `max_simd_level` (QuantProductOptions is a CpuOptions, cpu_options.hpp) is 0
/// or 1; both quantize the activations with the same code and give the same results up to
/// summation order.
///
/// Threads: `n_threads` as everywhere in depthkv (1 = the calling thread, the default here;
/// 0 = all cores). The work is split into fixed tasks of rows, so every thread count gives the
/// same bytes. The tasks run on the options' `pool` when it is set (thread_pool.hpp), else in an
/// OpenMP parallel region sized by a `num_threads` clause; either way Eigen's GEMM inside each
/// task stays on its thread.
///
/// @code
/// auto raw = file.raw_tensor(*file.find_tensor("blk.0.ffn_up.weight"));   // Q4_K, 5632 x 2048
/// std::vector<float> y(raw.rows);
/// depthkv::llama::quant_matvec(raw.type, raw.data, raw.rows, raw.cols, x.data(), y.data(),
///                               depthkv::llama::QuantProductOptions(depthkv::CpuOptions{2, 2}));  // 2 threads
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "depthkv/cpu_options.hpp"
#include "depthkv/thread_pool.hpp"
#include "depthkv/detail/parallel_for.hpp"
#include "depthkv/detail/simd.hpp"
#include "depthkv/error.hpp"
#include "depthkv/llama/quant/block_kernels.hpp"
#include "depthkv/llama/quant/dequantize.hpp"
#include "depthkv/llama/quant/ggml_type.hpp"
#include "depthkv/llama/quant/type_list.hpp"
#include "depthkv/llama/quant/vnni_panels.hpp"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace depthkv {
namespace llama {

/// How a product multiplies the stored blocks (see the file comment).
enum class QuantKernel {
  kAuto,           ///< the measured faster kernel for the type and product
  kDequantize,     ///< dequantize blocks (tiles) to float, then float FMA / GEMM
  kQ8Activations,  ///< quantize activations to int8 per 32 values, integer block dot products
  kQ8KActivations, ///< Q4_K, Q5_K, Q6_K: int8 activations per 256 values, integer sums per block
};

/// Options of the quantized products: threads and instruction-set cap (`CpuOptions`; here
/// `n_threads` defaults to 1, the calling thread) and the kernel.
struct QuantProductOptions : CpuOptions {
  QuantProductOptions() : CpuOptions{1, 3} {}
  /// @param cpu threads and instruction-set cap
  /// @param k kernel choice
  explicit QuantProductOptions(const CpuOptions& cpu, QuantKernel k = QuantKernel::kAuto) : CpuOptions(cpu), kernel(k) {}
  QuantKernel kernel = QuantKernel::kAuto;  ///< kernel choice
};

/// Rows of W dequantized together by quant_matmul's kDequantize kernel.
inline constexpr std::int64_t kQuantMatmulTile = 64;

/// Fewest tokens for which quant_matmul's kDequantize kernel (AVX2) multiplies interleaved panels
/// of 16 rows with broadcast activations instead of 4-token x 2-row dot-product tiles.
inline constexpr std::int64_t kFloatPanelMinTokens = 16;

namespace detail {

/// Tokens per call of the kQ8KActivations matmul kernel (each decoded weight block serves them;
/// 8 ran 0-10 % faster than 4 in quant_bench's Q4_K matmul; 16-row tasks were level with or faster
/// than 64-row ones).
inline constexpr int kQ8KTokens = 8;

/// Fewest tokens for which quant_matmul's int8 kernels unpack AVX-512 VNNI panels
/// (vnni_panels.hpp) instead of decoding each weight row for a few tokens at a time.
inline constexpr std::int64_t kVnniMinTokens = 32;

/// True for the types of the kQ8KActivations kernel (traits with kQ8K: Q4_K, Q5_K, Q6_K).
inline constexpr bool q8k_type(GgmlType t) { return ggml_type_q8k(BlockTypes{}, t); }

// ---- float rows (F32 / F16 / BF16) and dequantize-then-FMA rows --------------------------------

template <GgmlType T>
inline float row_dot_deq_scalar(const std::uint8_t* row, const float* x, std::int64_t cols) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if constexpr (T == GgmlType::kF32 || T == GgmlType::kF16 || T == GgmlType::kBF16) {
    constexpr int kChunk = 256;
    float buf[kChunk];
    constexpr int es = T == GgmlType::kF32 ? 4 : 2;
    for (std::int64_t c = 0; c < cols; c += kChunk) {
      const std::int64_t m = std::min<std::int64_t>(kChunk, cols - c);
      dequantize_row(T, row + es * c, buf, m);
      for (std::int64_t j = 0; j < m; ++j) acc[j & 7] += buf[j] * x[c + j];
    }
  } else {
    using Block = typename QuantTraits<T>::Block;
    constexpr int K = QuantTraits<T>::kValues;
    float buf[K];
    for (std::int64_t i = 0; i < cols / K; ++i) {
      Block b;
      std::memcpy(&b, row + i * static_cast<std::int64_t>(sizeof(Block)), sizeof(Block));
      QuantTraits<T>::dequantize(b, buf);
      for (int j = 0; j < K; ++j) acc[j & 7] += buf[j] * x[i * K + j];
    }
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

#if defined(DEPTHKV_AVX2_DISPATCH)
/// Converts 8 stored F32 / F16 / BF16 values at p to floats.
template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline __m256 load8_avx2(const std::uint8_t* p) {
  if constexpr (T == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (T == GgmlType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline float row_dot_deq_avx2(const std::uint8_t* row, const float* x, std::int64_t cols) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  if constexpr (T == GgmlType::kF32 || T == GgmlType::kF16 || T == GgmlType::kBF16) {
    constexpr int es = T == GgmlType::kF32 ? 4 : 2;
    std::int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
      acc0 = _mm256_fmadd_ps(load8_avx2<T>(row + es * j), _mm256_loadu_ps(x + j), acc0);
      acc1 = _mm256_fmadd_ps(load8_avx2<T>(row + es * (j + 8)), _mm256_loadu_ps(x + j + 8), acc1);
    }
    float tail = 0;
    if (j < cols) tail = row_dot_deq_scalar<T>(row + es * j, x + j, cols - j);
    return hsum_avx2(_mm256_add_ps(acc0, acc1)) + tail;
  } else {
    using Block = typename QuantTraits<T>::Block;
    constexpr int K = QuantTraits<T>::kValues;
    alignas(32) float buf[K];
    for (std::int64_t i = 0; i < cols / K; ++i, x += K) {
      Block b;
      std::memcpy(&b, row + i * static_cast<std::int64_t>(sizeof(Block)), sizeof(Block));
      QuantTraits<T>::dequantize(b, buf);
      for (int j = 0; j < K; j += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_load_ps(buf + j), _mm256_loadu_ps(x + j), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_load_ps(buf + j + 8), _mm256_loadu_ps(x + j + 8), acc1);
      }
    }
    return hsum_avx2(_mm256_add_ps(acc0, acc1));
  }
}

/// y[t * ldy + r] = dot of float row r of w (NR rows, stride ldw) with float row t of x (NT rows,
/// stride ldx) over `cols` values: NT x NR 8-lane FMA accumulators, each loaded weight vector
/// serving NT tokens and each activation vector NR rows.
template <int NT, int NR>
DEPTHKV_QUANT_AVX2 inline void gemm_tile_avx2(const float* w, std::int64_t ldw, const float* x, std::int64_t ldx,
                                              std::int64_t cols, float* y, std::int64_t ldy) {
  __m256 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    __m256 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm256_loadu_ps(w + r * ldw + j);
    for (int t = 0; t < NT; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + j);
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm256_fmadd_ps(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) {
      float s = hsum_avx2(acc[t][r]);
      for (std::int64_t k = j; k < cols; ++k) s += w[r * ldw + k] * x[t * ldx + k];
      y[t * ldy + r] = s;
    }
}

/// Y[t][r] (row stride ldy) = X[t] . W[r] for the n x cols floats X and the nr x cols floats W
/// (both row-major, contiguous): 4-token x 2-row register tiles, tails by the smaller tiles.
DEPTHKV_QUANT_AVX2 inline void gemm_rows_avx2(const float* w, std::int64_t nr, const float* x, std::int64_t n,
                                              std::int64_t cols, float* y, std::int64_t ldy) {
  std::int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    std::int64_t r = 0;
    for (; r + 2 <= nr; r += 2) gemm_tile_avx2<4, 2>(w + r * cols, cols, x + t * cols, cols, cols, y + t * ldy + r, ldy);
    if (r < nr) gemm_tile_avx2<4, 1>(w + r * cols, cols, x + t * cols, cols, cols, y + t * ldy + r, ldy);
  }
  for (; t < n; ++t) {
    std::int64_t r = 0;
    for (; r + 2 <= nr; r += 2) gemm_tile_avx2<1, 2>(w + r * cols, cols, x + t * cols, cols, cols, y + t * ldy + r, ldy);
    if (r < nr) gemm_tile_avx2<1, 1>(w + r * cols, cols, x + t * cols, cols, cols, y + t * ldy + r, ldy);
  }
}

/// Rows of a float panel of quant_matmul's kDequantize kernel (two 8-lane vectors per k).
inline constexpr int kFloatPanelRows = 16;
/// Tokens per register tile of the float panel (2 x 6 accumulators of the 16 AVX2 registers).
inline constexpr int kFloatPanelTokens = 6;

/// p[k * 16 + i] = w[i * cols + k] for the nr (<= 16) float rows of w, 0 for i >= nr: 8 x 8
/// transposes, so that one 16-float load holds one column of the panel.
DEPTHKV_QUANT_AVX2 inline void interleave_panel_avx2(const float* w, int nr, std::int64_t cols, float* p) {
  std::int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    for (int g = 0; g < 2; ++g) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = 8 * g + i < nr ? _mm256_loadu_ps(w + (8 * g + i) * cols + k) : _mm256_setzero_ps();
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      const __m256 c[8] = {_mm256_permute2f128_ps(s0, s4, 0x20), _mm256_permute2f128_ps(s1, s5, 0x20),
                           _mm256_permute2f128_ps(s2, s6, 0x20), _mm256_permute2f128_ps(s3, s7, 0x20),
                           _mm256_permute2f128_ps(s0, s4, 0x31), _mm256_permute2f128_ps(s1, s5, 0x31),
                           _mm256_permute2f128_ps(s2, s6, 0x31), _mm256_permute2f128_ps(s3, s7, 0x31)};
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(p + (k + j) * kFloatPanelRows + 8 * g, c[j]);
    }
  }
  for (; k < cols; ++k)
    for (int i = 0; i < kFloatPanelRows; ++i) p[k * kFloatPanelRows + i] = i < nr ? w[i * cols + k] : 0.0f;
}

/// out[t][i] = panel row i . x[t] over `cols` values (NT tokens): 2 x NT 8-lane FMA accumulators,
/// each loaded panel column serving NT tokens and each broadcast activation 16 rows.
template <int NT>
DEPTHKV_QUANT_AVX2 inline void panel_tokens_avx2(const float* p, std::int64_t cols, const float* const* x,
                                                 float (*out)[kFloatPanelRows]) {
  __m256 acc[2][NT];
  for (int t = 0; t < NT; ++t) acc[0][t] = acc[1][t] = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < cols; ++k) {
    const __m256 w0 = _mm256_loadu_ps(p + k * kFloatPanelRows), w1 = _mm256_loadu_ps(p + k * kFloatPanelRows + 8);
    for (int t = 0; t < NT; ++t) {
      const __m256 xb = _mm256_broadcast_ss(x[t] + k);
      acc[0][t] = _mm256_fmadd_ps(w0, xb, acc[0][t]);
      acc[1][t] = _mm256_fmadd_ps(w1, xb, acc[1][t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    _mm256_storeu_ps(out[t], acc[0][t]);
    _mm256_storeu_ps(out[t] + 8, acc[1][t]);
  }
}

/// Y[t][r] (row stride ldy) = X[t] . W[r] for the n x cols floats X and the nr x cols floats W
/// (both row-major, contiguous), by panels of 16 rows of W interleaved into `panel` (16 * cols
/// floats), kFloatPanelTokens tokens at a time.
DEPTHKV_QUANT_AVX2 inline void gemm_panels_avx2(const float* w, std::int64_t nr, const float* x, std::int64_t n,
                                                std::int64_t cols, float* y, std::int64_t ldy, float* panel) {
  alignas(32) float out[kFloatPanelTokens][kFloatPanelRows];
  for (std::int64_t r0 = 0; r0 < nr; r0 += kFloatPanelRows) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kFloatPanelRows, nr - r0));
    interleave_panel_avx2(w + r0 * cols, rows, cols, panel);
    for (std::int64_t t0 = 0; t0 < n; t0 += kFloatPanelTokens) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kFloatPanelTokens, n - t0));
      const float* xs[kFloatPanelTokens];
      for (int t = 0; t < nt; ++t) xs[t] = x + (t0 + t) * cols;
      switch (nt) {
        case 6: panel_tokens_avx2<6>(panel, cols, xs, out); break;
        case 5: panel_tokens_avx2<5>(panel, cols, xs, out); break;
        case 4: panel_tokens_avx2<4>(panel, cols, xs, out); break;
        case 3: panel_tokens_avx2<3>(panel, cols, xs, out); break;
        case 2: panel_tokens_avx2<2>(panel, cols, xs, out); break;
        default: panel_tokens_avx2<1>(panel, cols, xs, out); break;
      }
      for (int t = 0; t < nt; ++t)
        std::memcpy(y + (t0 + t) * ldy + r0, out[t], sizeof(float) * static_cast<std::size_t>(rows));
    }
  }
}

/// Dequantizes `n` values of a row (F16 / BF16 with F16C / shifts; blocks as dequantize_row).
template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline void dequantize_row_avx2(const std::uint8_t* row, float* out, std::int64_t n) {
  if constexpr (T == GgmlType::kF16 || T == GgmlType::kBF16) {
    std::int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, load8_avx2<T>(row + 2 * j));
    if (j < n) dequantize_row(T, row + 2 * j, out + j, n - j);
  } else if constexpr (T == GgmlType::kF32) {
    dequantize_row(T, row, out, n);
  } else {
    dequantize_blocks<T>(row, n / QuantTraits<T>::kValues, out);
  }
}
#endif

// ---- int8 activations ------------------------------------------------------------------------------
//
// Every block type is multiplied with activations quantized per 32 values (ActQ8). For each
// chunk of 32 weights the kernels build the 32 integer codes u (unsigned, or signed for Q8_0,
// Q4_0, IQ4_NL, IQ4_XS) and the chunk's integer (sub-)scales, compute sum u * q_x with AVX2
// maddubs / madd, and apply the float factors of the chunk: d_w (* sub-scale) * d_x, with the
// offsets and minimums folded in through the activation sums s (sum of q_x per 16 values).
// The scalar path computes the same products from the dequantized weights in float.

template <GgmlType T>
inline float row_dot_q8_scalar(const std::uint8_t* row, const ActQ8* xq, std::int64_t cols) {
  using Block = typename QuantTraits<T>::Block;
  constexpr int K = QuantTraits<T>::kValues;
  float buf[K];
  float acc = 0;
  for (std::int64_t i = 0; i < cols / K; ++i) {
    Block b;
    std::memcpy(&b, row + i * static_cast<std::int64_t>(sizeof(Block)), sizeof(Block));
    QuantTraits<T>::dequantize(b, buf);
    for (int c = 0; c < K / 32; ++c) {
      const ActQ8& a = xq[i * (K / 32) + c];
      float s = 0;
      for (int j = 0; j < 32; ++j) s += buf[32 * c + j] * static_cast<float>(a.qs[j]);
      acc += s * a.d;
    }
  }
  return acc;
}

/// out[t] = dot of one stored row (Q4_K, Q5_K or Q6_K) with the per-256 quantized activations
/// a[t], t < nt: sum over blocks of d_x * sum_k w_k q_x,k with w_k the dequantized weights
/// (exactly `dequantize_block`), in float. The scalar path of kQ8KActivations.
template <GgmlType T>
inline void rows_dot_q8k_scalar(const std::uint8_t* row, const ActQ8K* const* a, int nt, std::int64_t cols,
                                float* out) {
  using Block = typename QuantTraits<T>::Block;
  float buf[256];
  for (int t = 0; t < nt; ++t) out[t] = 0;
  for (std::int64_t i = 0; i < cols / 256; ++i) {
    Block b;
    std::memcpy(&b, row + i * static_cast<std::int64_t>(sizeof(Block)), sizeof(Block));
    QuantTraits<T>::dequantize(b, buf);
    for (int t = 0; t < nt; ++t) {
      const ActQ8K& x = a[t][i];
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int j = 0; j < 256; ++j) s[j & 7] += buf[j] * static_cast<float>(x.qs[j]);
      out[t] += (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) * x.d;
    }
  }
}

#if defined(DEPTHKV_AVX2_DISPATCH)
/// out[t] = dot of one stored row with the quantized activations a[t] (NT tokens at once, so
/// each chunk of weights is decoded once for NT tokens).
template <GgmlType T, int NT>
DEPTHKV_QUANT_AVX2 inline void rows_dot_q8_avx2(const std::uint8_t* row, const ActQ8* const* a, std::int64_t cols,
                                                float* out) {
  using Traits = QuantTraits<T>;
  constexpr int K = Traits::kValues;
  __m256 acc[NT];
  float acc_s[NT];  // offsets and minimums (scalar)
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    acc_s[t] = 0;
  }
  for (std::int64_t i = 0; i < cols / K; ++i) {
    const std::uint8_t* blk = row + i * static_cast<std::int64_t>(sizeof(typename Traits::Block));
    Traits::template dot_q8_avx2<NT>(blk, a, i * (K / 32), acc, acc_s);  // chunks of the block: i * K / 32 ..
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum_avx2(acc[t]) + acc_s[t];
}

template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline float row_dot_q8_avx2(const std::uint8_t* row, const ActQ8* xq, std::int64_t cols) {
  float out;
  rows_dot_q8_avx2<T, 1>(row, &xq, cols, &out);
  return out;
}
template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline void row_dot4_q8_avx2(const std::uint8_t* row, const ActQ8* const* xq, std::int64_t cols,
                                                float* out) {
  rows_dot_q8_avx2<T, 4>(row, xq, cols, out);
}

// ---- int8 activations per 256 values (Q4_K, Q5_K, Q6_K) ---------------------------------------
//
// A K-quant block of 256 weights is w_k = d * sc_g(k) * u_k - dmin * m_g(k) (Q4_K, Q5_K: 8 groups
// of 32, 6-bit sc and m, u < 32) or w_k = d * sc_g(k) * (u_k - 32) (Q6_K: 16 groups of 16, int8
// sc, u < 64). With x_k ~= d_x * q_k for the block's 256 activations (ActQ8K):
//   sum_k w_k x_k ~= d * d_x * sum_g sc_g * (sum_{k in g} u_k q_k) - dmin * d_x * sum_g m_g * S_g
// (S_g = the sum of q over group g, from bsums; Q6_K: the second term is d * d_x * 32 * sum_g
// sc_g S_g and is subtracted in integer). Per token and block the kernel accumulates the whole
// first sum in int32 (maddubs u * q, each pair at most 2 * 63 * 127 < 2^15 so never saturated,
// then madd with the int16 group scales; the block at most 256 * 63 * 127 * 128 < 2^31 in
// magnitude), the minimums with one madd of bsums and the int16
// minimums, and converts to float once: two FMAs per token per 256 weights instead of one
// per 32 weights with kQ8Activations. The weight codes, scales and minimums of a block are
// decoded once for the NT tokens of a call.

/// out[t] = dot of one stored Q4_K / Q5_K / Q6_K row with the activations a[t] (NT tokens at
/// once; see the section comment). Equals rows_dot_q8k_scalar up to float rounding (the
/// integer sums are exact; the float steps are d * d_x * sum and the sum over blocks).
template <GgmlType T, int NT>
DEPTHKV_QUANT_AVX2 inline void rows_dot_q8k_avx2(const std::uint8_t* row, const ActQ8K* const* a, std::int64_t cols,
                                                 float* out) {
  using Traits = QuantTraits<T>;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < cols / 256; ++i) {
    Traits::template dot_q8k_avx2<NT>(row + i * static_cast<std::int64_t>(sizeof(typename Traits::Block)), a, i, acc);
  }
  for (int t = 0; t < NT; ++t) out[t] = hsum_avx2(acc[t]);
}
#endif

/// Per-type entry points, dispatched once per product.
struct QuantRowOps {
  float (*dot)(const std::uint8_t*, const float*, std::int64_t) = nullptr;           // kDequantize
  void (*dequantize)(const std::uint8_t*, float*, std::int64_t) = nullptr;          // a row to float
  float (*dot_q8)(const std::uint8_t*, const ActQ8*, std::int64_t) = nullptr;       // kQ8Activations (cols)
  void (*dot4_q8)(const std::uint8_t*, const ActQ8* const*, std::int64_t, float*) = nullptr;  // 4 tokens
  void (*dot_q8k)(const std::uint8_t*, const ActQ8K* const*, std::int64_t, float*) = nullptr;  // kQ8KActivations, 1 token
  void (*dotn_q8k)(const std::uint8_t*, const ActQ8K* const*, std::int64_t, float*) = nullptr;  // kQ8KTokens tokens
  void (*quantize_q8)(const float*, std::int64_t, ActQ8*) = &quantize_act_q8;     // activations, per 32
  void (*quantize_q8k)(const float*, std::int64_t, ActQ8K*) = &quantize_act_q8k;  // activations, per 256
  // kQ8KActivations matmul, AVX-512 VNNI panels (vnni_panels.hpp): unpack rows, multiply all tokens
  void (*vnni_unpack)(const std::uint8_t*, std::size_t, std::int64_t, int, std::int64_t, VnniPanel&) = nullptr;
  void (*vnni_matmul)(const VnniPanel&, std::int64_t, const ActQ8K*, std::int64_t, float*, std::int64_t, std::int64_t,
                      int) = nullptr;
  // kQ8Activations matmul, the same for the per-32 types
  void (*vnni_unpack32)(const std::uint8_t*, std::size_t, std::int64_t, int, std::int64_t, VnniPanel&) = nullptr;
  void (*vnni_matmul32)(const VnniPanel&, std::int64_t, const ActQ8*, std::int64_t, float*, std::int64_t, std::int64_t,
                        int) = nullptr;
};

template <GgmlType T>
inline QuantRowOps quant_row_ops_for(bool avx2, bool vnni) {
  QuantRowOps ops;
  ops.dot = &row_dot_deq_scalar<T>;
  ops.dequantize = [](const std::uint8_t* row, float* out, std::int64_t n) { dequantize_row(T, row, out, n); };
  constexpr bool blocks = ggml_type_in(BlockTypes{}, T);
  if constexpr (blocks) {
    ops.dot_q8 = &row_dot_q8_scalar<T>;
    ops.dot4_q8 = [](const std::uint8_t* row, const ActQ8* const* xq, std::int64_t cols, float* out) {
      for (int t = 0; t < 4; ++t) out[t] = row_dot_q8_scalar<T>(row, xq[t], cols);
    };
  }
  if constexpr (q8k_type(T)) {
    ops.dot_q8k = [](const std::uint8_t* row, const ActQ8K* const* xq, std::int64_t cols, float* out) {
      rows_dot_q8k_scalar<T>(row, xq, 1, cols, out);
    };
    ops.dotn_q8k = [](const std::uint8_t* row, const ActQ8K* const* xq, std::int64_t cols, float* out) {
      rows_dot_q8k_scalar<T>(row, xq, kQ8KTokens, cols, out);
    };
  }
#if defined(DEPTHKV_AVX2_DISPATCH)
  if (avx2) {
    ops.quantize_q8 = &quantize_act_q8_avx2;
    ops.quantize_q8k = &quantize_act_q8k_avx2;
    ops.dot = &row_dot_deq_avx2<T>;
    ops.dequantize = &dequantize_row_avx2<T>;
    if constexpr (blocks) {
      ops.dot_q8 = &row_dot_q8_avx2<T>;
      ops.dot4_q8 = &row_dot4_q8_avx2<T>;
    }
    if constexpr (vnni_type32<T>()) {
      if (vnni) {
        ops.vnni_unpack32 = &unpack_panel32_vnni<T>;
        ops.vnni_matmul32 = &panel32_matmul_vnni<T>;
      }
    }
    if constexpr (q8k_type(T)) {
      ops.dot_q8k = &rows_dot_q8k_avx2<T, 1>;
      ops.dotn_q8k = &rows_dot_q8k_avx2<T, kQ8KTokens>;
      if (vnni) {
        ops.vnni_unpack = &unpack_panel_vnni<T>;
        ops.vnni_matmul = &panel_matmul_vnni<T>;
      }
    }
  }
#else
  (void)avx2;
#endif
  (void)vnni;
  return ops;
}

inline QuantRowOps quant_row_ops(GgmlType type, int max_simd_level) {
  DEPTHKV_CHECK(ggml_type_dequantizable(static_cast<std::uint32_t>(type)),
                "quantized product: ggml type " << ggml_type_name(type)
                                                << " is not supported (supported: " << ggml_dequantizable_names() << ")");
  const bool avx2 = quant_simd_level(max_simd_level) >= 2;
  const bool vnni = avx2 && depthkv::detail::simd_level(max_simd_level) >= 3;
  QuantRowOps ops;
  const auto pick = [&](auto tag) { ops = quant_row_ops_for<decltype(tag)::value>(avx2, vnni); };
  if (!visit_ggml_type(FloatTypes{}, type, pick)) visit_ggml_type(BlockTypes{}, type, pick);
  return ops;
}

/// The kernel `kernel` resolves to for `type` (matvec: `is_matvec`).
inline QuantKernel resolve_kernel(QuantKernel kernel, GgmlType type, bool is_matvec) {
  const bool q8_ok = ggml_type_in(BlockTypes{}, type);
  (void)is_matvec;
  if (kernel == QuantKernel::kAuto) {
    if (q8k_type(type)) return QuantKernel::kQ8KActivations;
    return q8_ok ? QuantKernel::kQ8Activations : QuantKernel::kDequantize;
  }
  DEPTHKV_CHECK(kernel != QuantKernel::kQ8Activations || q8_ok,
                "quantized product: the int8-activation kernel is for block types, not " << ggml_type_name(type));
  DEPTHKV_CHECK(kernel != QuantKernel::kQ8KActivations || q8k_type(type),
                "quantized product: the per-256 int8-activation kernel is for Q4_K, Q5_K and Q6_K, not "
                    << ggml_type_name(type));
  return kernel;
}

inline void check_product(GgmlType type, std::int64_t rows, std::int64_t cols) {
  DEPTHKV_CHECK(rows >= 0 && cols >= 0, "quantized product: negative shape " << rows << " x " << cols);
  (void)ggml_row_bytes(type, cols);  // throws on an unknown type or a partial block
}

/// Runs fn(task) for task in [0, n_tasks) on up to `cpu.n_threads` threads: on `cpu.pool` when
/// set (thread_pool.hpp: each participant claims its own contiguous block of tasks first, late
/// ones' blocks are taken by the others), else on an OpenMP team with a static schedule (each
/// thread one contiguous block: it streams its own rows of the matrix, benchmarks/RESULTS.md,
/// "Decode at 2 threads"), so Eigen products inside a task stay on their thread either way.
template <class Fn>
inline void quant_parallel(int n_tasks, const CpuOptions& cpu, Fn&& fn) {
  const int workers = depthkv::detail::resolve_threads(cpu.n_threads, n_tasks);
  if (workers > 1 && cpu.pool) {
    cpu.pool->run(n_tasks, workers, fn);
    return;
  }
#ifdef _OPENMP
  if (workers > 1) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n_tasks));
#pragma omp parallel for schedule(static) num_threads(workers)
    for (int t = 0; t < n_tasks; ++t) {
      try {
        fn(t);
      } catch (...) {
        errors[static_cast<std::size_t>(t)] = std::current_exception();
      }
    }
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    return;
  }
#endif
  depthkv::detail::parallel_for(n_tasks, workers, [&](int, int t) { fn(t); });
}

}  // namespace detail

/// Dot product of one stored row with x (kDequantize kernel).
/// @param type the row's ggml type
/// @param row its bytes (`ggml_row_bytes(type, cols)`, any alignment)
/// @param x `cols` floats
/// @param cols number of values, a multiple of the type's block size
/// @param cpu instruction-set cap (`max_simd_level`; one thread)
/// @return sum_k w_k x_k
/// @throws Error for an unsupported type, a partial block or invalid `cpu`
inline float quant_row_dot(GgmlType type, const void* row, const float* x, std::int64_t cols,
                           const CpuOptions& cpu = CpuOptions()) {
  cpu.validate();
  detail::check_product(type, 1, cols);
  return detail::quant_row_ops(type, cpu.max_simd_level).dot(static_cast<const std::uint8_t*>(row), x, cols);
}

/// y = W x for a `rows x cols` matrix W stored as `type` (see the file comment).
/// @param type the stored type
/// @param w the matrix's bytes, `rows * ggml_row_bytes(type, cols)`
/// @param rows rows of W (= size of y)
/// @param cols columns of W (= size of x), a multiple of the type's block size
/// @param x `cols` floats
/// @param y `rows` floats (written)
/// @param opt threads, instruction-set cap and kernel
/// @throws Error for an unsupported type, a partial block, a kernel the type lacks or invalid
///   threads / cap
inline void quant_matvec(GgmlType type, const void* w, std::int64_t rows, std::int64_t cols, const float* x, float* y,
                         const QuantProductOptions& opt = {});

/// One matrix of quant_matvec_many: W (`rows x cols`, stored as `type`) and its output y.
struct QuantMatvecTarget {
  GgmlType type;      ///< the stored type
  const void* w;      ///< the matrix's bytes, `rows * ggml_row_bytes(type, cols)`
  std::int64_t rows;  ///< rows of W (= size of y)
  float* y;           ///< `rows` floats (written)
};

/// y_i = W_i x for `count` matrices of the same width and the same x: each the bytes of
/// `quant_matvec(W_i, x)`, with x quantized once per kernel and the rows of all the matrices in
/// one parallel region (one fork-join instead of `count`).
/// @param targets the matrices and outputs
/// @param count number of targets
/// @param cols columns of every W (= size of x), a multiple of each type's block size
/// @param x `cols` floats
/// @param opt threads, instruction-set cap and kernel (the kernel applies to every target)
/// @throws Error as quant_matvec, for any target, before any output is written
inline void quant_matvec_many(const QuantMatvecTarget* targets, int count, std::int64_t cols, const float* x,
                              const QuantProductOptions& opt = {}) {
  opt.validate();
  DEPTHKV_CHECK(count >= 0, "quantized product: negative number of matrices " << count);
  constexpr std::int64_t kRowsPerTask = 32;
  struct Part {
    detail::QuantRowOps ops;
    QuantKernel kernel;
    std::size_t rb;
    int first_task;
  };
  std::vector<Part> parts(static_cast<std::size_t>(count));
  bool need_q8 = false, need_q8k = false;
  int n_tasks = 0;
  for (int i = 0; i < count; ++i) {
    const QuantMatvecTarget& m = targets[i];
    detail::check_product(m.type, m.rows, cols);
    Part& p = parts[static_cast<std::size_t>(i)];
    p.ops = detail::quant_row_ops(m.type, opt.max_simd_level);
    p.kernel = detail::resolve_kernel(opt.kernel, m.type, true);
    p.rb = ggml_row_bytes(m.type, cols);
    p.first_task = n_tasks;
    n_tasks += static_cast<int>((m.rows + kRowsPerTask - 1) / kRowsPerTask);
    need_q8 = need_q8 || p.kernel == QuantKernel::kQ8Activations;
    need_q8k = need_q8k || p.kernel == QuantKernel::kQ8KActivations;
  }
  if (n_tasks == 0) return;
  std::vector<detail::ActQ8> xq;
  std::vector<detail::ActQ8K> xk;
  if (need_q8) {  // the quantizers give the same bytes at every level: any target's will do
    xq.resize(static_cast<std::size_t>(cols / 32));
    parts[0].ops.quantize_q8(x, cols, xq.data());
  }
  if (need_q8k) {
    xk.resize(static_cast<std::size_t>(cols / 256));
    parts[0].ops.quantize_q8k(x, cols, xk.data());
  }
  const detail::ActQ8K* const xk0 = xk.data();
  detail::quant_parallel(n_tasks, opt, [&](int task) {
    int i = count - 1;
    while (parts[static_cast<std::size_t>(i)].first_task > task) --i;
    const Part& p = parts[static_cast<std::size_t>(i)];
    const QuantMatvecTarget& m = targets[i];
    const auto* base = static_cast<const std::uint8_t*>(m.w);
    const std::int64_t r0 = std::int64_t{task - p.first_task} * kRowsPerTask, r1 = std::min(m.rows, r0 + kRowsPerTask);
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::uint8_t* row = base + static_cast<std::size_t>(r) * p.rb;
      if (p.kernel == QuantKernel::kQ8KActivations) {
        p.ops.dot_q8k(row, &xk0, cols, m.y + r);
      } else {
        m.y[r] = p.kernel == QuantKernel::kQ8Activations ? p.ops.dot_q8(row, xq.data(), cols) : p.ops.dot(row, x, cols);
      }
    }
  });
}

inline void quant_matvec(GgmlType type, const void* w, std::int64_t rows, std::int64_t cols, const float* x, float* y,
                         const QuantProductOptions& opt) {
  const QuantMatvecTarget target{type, w, rows, y};
  quant_matvec_many(&target, 1, cols, x, opt);
}

namespace detail {

/// The stored rows and shape of one quant_matmul call, and its dispatched row kernels.
struct QuantMatmulArgs {
  const std::uint8_t* base;  ///< W's bytes
  std::size_t rb;            ///< bytes per row of W
  std::int64_t rows, cols;   ///< W's shape
  const float* x;            ///< X, n x cols
  std::int64_t n;            ///< rows of X
  float* y;                  ///< Y, n x rows
  QuantRowOps ops;
  const std::uint8_t* row(std::int64_t r) const { return base + static_cast<std::size_t>(r) * rb; }
};

/// The n rows of X quantized (`quantize`: nb blocks per row), 16 rows per task on the threads.
template <class Act>
inline std::vector<Act> quantize_tokens(const QuantMatmulArgs& m, const CpuOptions& cpu,
                                        void (*quantize)(const float*, std::int64_t, Act*), std::int64_t nb) {
  std::vector<Act> xs(static_cast<std::size_t>(m.n * nb));
  constexpr std::int64_t kTokensPerTask = 16;
  quant_parallel(static_cast<int>((m.n + kTokensPerTask - 1) / kTokensPerTask), cpu, [&](int task) {
    for (std::int64_t t = task * kTokensPerTask; t < std::min(m.n, (task + 1) * kTokensPerTask); ++t)
      quantize(m.x + t * m.cols, m.cols, xs.data() + t * nb);
  });
  return xs;
}

/// The AVX-512 VNNI matmul of both int8 kernels: tasks of kVnniPanelRows rows of W, each
/// unpacked once (`unpack`) into its thread's panel and multiplied with all n tokens (`matmul`;
/// x: the n x nb quantized activation blocks).
template <class Act>
inline void vnni_panels_matmul(const QuantMatmulArgs& m, const CpuOptions& cpu,
                               void (*unpack)(const std::uint8_t*, std::size_t, std::int64_t, int, std::int64_t, VnniPanel&),
                               void (*matmul)(const VnniPanel&, std::int64_t, const Act*, std::int64_t, float*, std::int64_t,
                                              std::int64_t, int),
                               const Act* x, std::int64_t nb) {
  quant_parallel(static_cast<int>((m.rows + kVnniPanelRows - 1) / kVnniPanelRows), cpu, [&](int task) {
    thread_local VnniPanel panel;
    const std::int64_t r0 = std::int64_t{task} * kVnniPanelRows;
    const int nr = static_cast<int>(std::min<std::int64_t>(kVnniPanelRows, m.rows - r0));
    unpack(m.base, m.rb, r0, nr, m.cols, panel);
    matmul(panel, nb, x, m.n, m.y, m.rows, r0, nr);
  });
}

/// quant_matmul's kQ8KActivations kernel: X quantized per 256 values, then tasks of 16 rows of W,
/// each decoded weight row serving kQ8KTokens tokens at a time.
inline void quant_matmul_q8k(const QuantMatmulArgs& m, const CpuOptions& cpu) {
  const std::int64_t n = m.n, rows = m.rows, nb = m.cols / 256;
  const std::vector<ActQ8K> xk = quantize_tokens(m, cpu, m.ops.quantize_q8k, nb);
  if (m.ops.vnni_matmul != nullptr && n >= kVnniMinTokens) {  // AVX-512 VNNI: unpacked panels, all tokens each
    vnni_panels_matmul(m, cpu, m.ops.vnni_unpack, m.ops.vnni_matmul, xk.data(), nb);
    return;
  }
  constexpr int NT = kQ8KTokens;
  constexpr std::int64_t kTile = 16;
  quant_parallel(static_cast<int>((rows + kTile - 1) / kTile), cpu, [&](int task) {
    const std::int64_t r0 = task * kTile, r1 = std::min(rows, r0 + kTile);
    const ActQ8K* xs[NT];
    float out[NT];
    std::int64_t t = 0;
    for (; t + NT <= n; t += NT) {  // NT tokens per decoded weight row
      for (int k = 0; k < NT; ++k) xs[k] = xk.data() + (t + k) * nb;
      for (std::int64_t r = r0; r < r1; ++r) {
        m.ops.dotn_q8k(m.row(r), xs, m.cols, out);
        for (int k = 0; k < NT; ++k) m.y[(t + k) * rows + r] = out[k];
      }
    }
    for (; t < n; ++t) {
      xs[0] = xk.data() + t * nb;
      for (std::int64_t r = r0; r < r1; ++r) m.ops.dot_q8k(m.row(r), xs, m.cols, m.y + t * rows + r);
    }
  });
}

/// quant_matmul's kQ8Activations kernel: X quantized per 32 values, then tasks of 16 rows of W,
/// each decoded weight row serving 4 tokens at a time.
inline void quant_matmul_q8(const QuantMatmulArgs& m, const CpuOptions& cpu) {
  const std::int64_t n = m.n, rows = m.rows, nb = m.cols / 32;
  const std::vector<ActQ8> xq = quantize_tokens(m, cpu, m.ops.quantize_q8, nb);
  if (m.ops.vnni_matmul32 != nullptr && n >= kVnniMinTokens) {  // AVX-512 VNNI: unpacked panels, all tokens each
    vnni_panels_matmul(m, cpu, m.ops.vnni_unpack32, m.ops.vnni_matmul32, xq.data(), nb);
    return;
  }
  constexpr std::int64_t kTile = 16;
  quant_parallel(static_cast<int>((rows + kTile - 1) / kTile), cpu, [&](int task) {
    const std::int64_t r0 = task * kTile, r1 = std::min(rows, r0 + kTile);
    std::int64_t t = 0;
    for (; t + 4 <= n; t += 4) {  // 4 tokens per decoded weight row
      const ActQ8* xs[4] = {xq.data() + t * nb, xq.data() + (t + 1) * nb, xq.data() + (t + 2) * nb,
                            xq.data() + (t + 3) * nb};
      for (std::int64_t r = r0; r < r1; ++r) {
        float out[4];
        m.ops.dot4_q8(m.row(r), xs, m.cols, out);
        for (int k = 0; k < 4; ++k) m.y[(t + k) * rows + r] = out[k];
      }
    }
    for (; t < n; ++t) {
      for (std::int64_t r = r0; r < r1; ++r) m.y[t * rows + r] = m.ops.dot_q8(m.row(r), xq.data() + t * nb, m.cols);
    }
  });
}

/// quant_matmul's kDequantize kernel: tiles of kQuantMatmulTile rows of W dequantized, then
/// multiplied with X (AVX2 FMA register tiles, or Eigen's GEMM on the calling thread).
inline void quant_matmul_deq(const QuantMatmulArgs& m, const CpuOptions& cpu) {
  using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int64_t rows = m.rows, cols = m.cols;
  const int n_tasks = static_cast<int>((rows + kQuantMatmulTile - 1) / kQuantMatmulTile);
  const Eigen::Map<const RowMat> X(m.x, m.n, cols);
  const bool avx2 = quant_simd_level(cpu.max_simd_level) >= 2;
  const auto tile_product = [&](int task) {
    const std::int64_t r0 = task * kQuantMatmulTile, nr = std::min(rows, r0 + kQuantMatmulTile) - r0;
    RowMat tile(nr, cols);
    for (std::int64_t r = 0; r < nr; ++r) m.ops.dequantize(m.row(r0 + r), tile.data() + r * cols, cols);
#if defined(DEPTHKV_AVX2_DISPATCH)
    if (avx2 && m.n >= kFloatPanelMinTokens) {  // interleaved panels, broadcast activations
      thread_local std::vector<float> panel;
      panel.resize(static_cast<std::size_t>(kFloatPanelRows * cols));
      gemm_panels_avx2(tile.data(), nr, m.x, m.n, cols, m.y + r0, rows, panel.data());
      return;
    }
    if (avx2) {  // register-tiled FMA (Eigen is built for the baseline ISA)
      gemm_rows_avx2(tile.data(), nr, m.x, m.n, cols, m.y + r0, rows);
      return;
    }
#endif
    Eigen::Map<RowMat, 0, Eigen::OuterStride<>> Y(m.y + r0, m.n, nr, Eigen::OuterStride<>(rows));
    Y.noalias() = X * tile.transpose();
  };
  if (!avx2 && depthkv::detail::resolve_threads(cpu.n_threads, n_tasks) == 1) {  // Eigen's GEMM single-threaded on one thread too
    depthkv::detail::run_eigen_serial([&] { depthkv::detail::parallel_for(n_tasks, 1, [&](int, int t) { tile_product(t); }); });
  } else {
    quant_parallel(n_tasks, cpu, tile_product);
  }
}

}  // namespace detail

/// Y = X W^T for a `rows x cols` matrix W stored as `type`: Y[t][r] = sum_k X[t][k] W[r][k].
/// @param type the stored type
/// @param w the matrix's bytes, `rows * ggml_row_bytes(type, cols)`
/// @param rows rows of W (= columns of Y)
/// @param cols columns of W (= columns of X), a multiple of the type's block size
/// @param x `n x cols` floats, row-major
/// @param n rows of X and Y
/// @param y `n x rows` floats, row-major (written)
/// @param opt threads, instruction-set cap and kernel
/// @throws Error for an unsupported type, a partial block, a kernel the type lacks or invalid
///   threads / cap
inline void quant_matmul(GgmlType type, const void* w, std::int64_t rows, std::int64_t cols, const float* x, std::int64_t n,
                         float* y, const QuantProductOptions& opt = {}) {
  opt.validate();
  detail::check_product(type, rows, cols);
  DEPTHKV_CHECK(n >= 0, "quantized product: negative number of rows of X " << n);
  if (rows == 0 || n == 0) return;
  const detail::QuantMatmulArgs args{static_cast<const std::uint8_t*>(w), ggml_row_bytes(type, cols), rows, cols, x, n, y,
                                     detail::quant_row_ops(type, opt.max_simd_level)};
  const QuantKernel kernel = detail::resolve_kernel(opt.kernel, type, false);
  if (kernel == QuantKernel::kQ8KActivations) {
    detail::quant_matmul_q8k(args, opt);
  } else if (kernel == QuantKernel::kQ8Activations) {
    detail::quant_matmul_q8(args, opt);
  } else {
    detail::quant_matmul_deq(args, opt);
  }
}

}  // namespace llama
}  // namespace depthkv
