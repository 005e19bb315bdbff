#pragma once
/// @file llama/quant/q6_k.hpp
/// @brief Q6_K (256 values, 210 bytes): 128 bytes low nibbles; 64 bytes of high 2-bit pairs; 16
/// int8 scales; half d. x = (d * sc) * (q - 32).
///
/// @code
/// depthkv::llama::BlockQ6_K b{};   // read from a tensor
/// float y[256];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q6_K: 256 values in 16 groups of 16 with int8 scales, 6-bit values offset by 32.
struct BlockQ6_K {
  std::uint8_t ql[128];
  std::uint8_t qh[64];
  std::int8_t scales[16];
  std::uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210, "ggml Q6_K block size");

/// Dequantizes one Q6_K block into its 256 floats.
/// @param b the block
/// @param y destination of 256 floats
inline void dequantize_block(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_float(b.d);
  const std::uint8_t* ql = b.ql;
  const std::uint8_t* qh = b.qh;
  const std::int8_t* sc = b.scales;
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

namespace detail {

#if defined(DEPTHKV_AVX2_DISPATCH)
/// One 128-value half n (0, 1) of a Q6_K block: its 64 low-nibble bytes (ql0, ql1) and 32
/// high-bit bytes (qh).
struct Q6kHalf {
  __m256i ql0, ql1, qh;
};
/// Loads half n of the Q6_K block at blk.
DEPTHKV_QUANT_AVX2 inline Q6kHalf q6k_half_avx2(const std::uint8_t* blk, int n) {
  const std::uint8_t* ql = blk + offsetof(BlockQ6_K, ql) + 64 * n;
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ6_K, qh) + 32 * n))};
}
/// The 32 unsigned 6-bit codes (0..63) of chunk k (0..3) of one 128-value half h of a Q6_K block.
DEPTHKV_QUANT_AVX2 inline __m256i q6k_codes_avx2(const Q6kHalf& h, int k) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i lo = k == 0   ? _mm256_and_si256(h.ql0, m4)
                     : k == 1 ? _mm256_and_si256(h.ql1, m4)
                     : k == 2 ? _mm256_and_si256(_mm256_srli_epi16(h.ql0, 4), m4)
                              : _mm256_and_si256(_mm256_srli_epi16(h.ql1, 4), m4);
  return _mm256_or_si256(lo, _mm256_slli_epi16(crumbs_avx2(h.qh, k), 4));
}
#endif

/// Q6_K traits (see QuantTraits): unsigned 6-bit codes u = q + 32 with an int8 scale per 16
/// values, the offset 32 through the activation sums.
template <>
struct QuantTraits<GgmlType::kQ6_K> : BlockTraits<BlockQ6_K, 256, true> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    const std::uint8_t* scales = blk + offsetof(Block, scales);
    for (int n = 0; n < 2; ++n) {
      const Q6kHalf h = q6k_half_avx2(blk, n);
      for (int k = 0; k < 4; ++k) {
        const int c = 4 * n + k;
        const int sc0 = static_cast<std::int8_t>(scales[8 * n + 2 * k]);
        const int sc1 = static_cast<std::int8_t>(scales[8 * n + 2 * k + 1]);
        // the offset 32 of u as the minimums 32 sc0, 32 sc1
        acc_groups16_avx2<NT>(q6k_codes_avx2(h, k), sc0, sc1, d, 32 * sc0, 32 * sc1, d, a, c0 + c, acc,
                              acc_s);
      }
    }
  }
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8k_avx2(const std::uint8_t* blk, const ActQ8K* const* a, std::int64_t i,
                                              __m256* acc) {
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    const auto* scales = reinterpret_cast<const std::int8_t*>(blk + offsetof(Block, scales));
    __m256i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
    for (int n = 0; n < 2; ++n) {
      const Q6kHalf h = q6k_half_avx2(blk, n);
      for (int k = 0; k < 4; ++k) {
        const int c = 4 * n + k;
        const __m256i u = q6k_codes_avx2(h, k);
        // int16 lanes 0-7: scales[2c], 8-15: scales[2c + 1] (one byte shuffle, sign-extended)
        const __m256i sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            sc8, _mm_set_epi64x(0x0101010101010101LL * (2 * c + 1), 0x0101010101010101LL * (2 * c))));
        q8k_chunk_avx2<NT>(u, sc, a, i, c, sumi);
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
    for (int t = 0; t < NT; ++t) {
      const ActQ8K& x = a[t][i];
      const __m256i offs =
          _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(x.bsums)), sc16);
      const __m256i s = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(offs, 5));  // u - 32
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(s), acc[t]);
    }
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
