#pragma once
/// @file llama/quant/q4_k.hpp
/// @brief Q4_K (256 values, 144 bytes): half d, dmin; 12 bytes of 8 packed 6-bit (scale, min)
/// pairs; 128 bytes of nibbles, each 64 values from 32 bytes (low nibbles first).
/// x = (d * sc) * q - (dmin * m). The kernels here serve Q5_K too (q5_k.hpp: a 5th bit plane).
///
/// @code
/// depthkv::llama::BlockQ4_K b{};   // read from a tensor
/// float y[256];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q4_K: 256 values in 8 groups of 32 with 6-bit scales and mins.
struct BlockQ4_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144, "ggml Q4_K block size");

/// Scale and minimum of group j (0..7) of the packed 12-byte Q4_K / Q5_K scales.
/// @param j the group
/// @param q the 12 packed bytes
/// @param sc its scale (written)
/// @param m its minimum (written)
inline void q4k_scale_min(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// Scale d * sc and minimum dmin * m of group j (0..7) of a Q4_K / Q5_K block (q4k_scale_min).
/// @param j the group
/// @param q the 12 packed bytes
/// @param d the block's d
/// @param dmin the block's dmin
/// @param dl the group's scale (written)
/// @param ml the group's minimum (written)
inline void q4k_group(int j, const std::uint8_t* q, float d, float dmin, float& dl, float& ml) {
  std::uint8_t sc, m;
  q4k_scale_min(j, q, sc, m);
  dl = d * static_cast<float>(sc);
  ml = dmin * static_cast<float>(m);
}

/// Dequantizes one Q4_K block into its 256 floats.
/// @param b the block
/// @param y destination of 256 floats
inline void dequantize_block(const BlockQ4_K& b, float* y) {
  const float d = fp16_to_float(b.d), dmin = fp16_to_float(b.dmin);
  const std::uint8_t* q = b.qs;
  for (int j = 0; j < 4; ++j, q += 32) {
    float d1, m1, d2, m2;
    q4k_group(2 * j, b.scales, d, dmin, d1, m1);
    q4k_group(2 * j + 1, b.scales, d, dmin, d2, m2);
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    y += 64;
  }
}

namespace detail {

#if defined(DEPTHKV_AVX2_DISPATCH)
/// The 32 unsigned codes of chunk c (0..7) of a Q4_K (0..15) or, with kHigh, Q5_K (0..31)
/// block: the low (h = 0) or high (h = 1) nibbles of the 32 bytes q of its pair of chunks, and
/// for Q5_K bit c of each byte of qh (hbits) as the fifth bit.
template <bool kHigh>
DEPTHKV_QUANT_AVX2 inline __m256i q45k_codes_avx2(__m256i q, __m256i hbits, int h, int c) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i u = h == 0 ? _mm256_and_si256(q, m4) : _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
  if constexpr (kHigh) {
    u = _mm256_or_si256(u, bit_plane_avx2(hbits, c, 16));
  } else {
    (void)hbits;
    (void)c;
  }
  return u;
}

/// The 32 bytes qh of a Q5_K block (kHigh; Q4_K: zero).
template <class Block, bool kHigh>
DEPTHKV_QUANT_AVX2 inline __m256i q45k_hbits_avx2(const std::uint8_t* blk) {
  if constexpr (kHigh) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(Block, qh)));
  } else {
    (void)blk;
    return _mm256_setzero_si256();
  }
}

// Forces q45k_for_each_chunk_avx2 inline under clang, whose inliner otherwise leaves it out of
// line in some kernels. GCC inlines it unforced; forced, it would stop GCC -O2 from inlining the
// Q4_K / Q5_K one-token kernels into their row loops.
#if defined(__clang__)
#define DEPTHKV_Q45K_CHUNKS_INLINE __attribute__((always_inline))
#else
#define DEPTHKV_Q45K_CHUNKS_INLINE
#endif

/// Calls fn(c, u) for the 8 chunks c = 0..7 of the Q4_K (kHigh false) or Q5_K (kHigh true) block
/// at blk in order, u the chunk's 32 unsigned codes (q45k_codes_avx2). fn takes a vector inside
/// AVX2 code, so a lambda passed here is marked DEPTHKV_QUANT_AVX2 as well.
template <class Block, bool kHigh, class Fn>
DEPTHKV_QUANT_AVX2 DEPTHKV_Q45K_CHUNKS_INLINE inline void q45k_for_each_chunk_avx2(const std::uint8_t* blk,
                                                                                   Fn&& fn) {
  const __m256i hbits = q45k_hbits_avx2<Block, kHigh>(blk);
  for (int j = 0; j < 4; ++j) {
    const __m256i q =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(Block, qs) + 32 * j));
    for (int h = 0; h < 2; ++h) fn(2 * j + h, q45k_codes_avx2<kHigh>(q, hbits, h, 2 * j + h));
  }
}

/// Block kernel of kQ8Activations for Q4_K (kHigh false) and Q5_K (kHigh true): see QuantTraits.
template <class Block, bool kHigh, int NT>
DEPTHKV_QUANT_AVX2 inline void q45k_dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a,
                                                std::int64_t c0, __m256* acc, float* acc_s) {
  const float d = half_avx2(load_u16(blk + offsetof(Block, d))),
              dmin = half_avx2(load_u16(blk + offsetof(Block, dmin)));
  q45k_for_each_chunk_avx2<Block, kHigh>(blk, [&](int c, __m256i u) DEPTHKV_QUANT_AVX2 {
    float dl, ml;
    q4k_group(c, blk + offsetof(Block, scales), d, dmin, dl, ml);
    acc_unsigned_avx2<NT>(u, a, c0 + c, dl, acc);
    sub_group_sums_avx2<NT>(a, c0 + c, ml, 1, 1, acc_s);
  });
}

/// Scales (int16 lanes 0-7) and minimums (lanes 8-15) of the 8 groups of a Q4_K / Q5_K block,
/// from its 12 packed bytes (the values of `q4k_scale_min`).
DEPTHKV_QUANT_AVX2 inline __m256i q4k_scales_mins_avx2(const std::uint8_t* packed) {
  constexpr std::uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  std::uint32_t u[4] = {0, 0, 0, 0};
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // minimums 4-7
  const std::uint32_t m03 = u[1] & kLow6;                       // minimums 0-3
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);         // scales 4-7
  u[2] = m03;
  u[0] &= kLow6;  // scales 0-3
  return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]),
                                            static_cast<int>(u[1]), static_cast<int>(u[0])));
}

/// Block kernel of kQ8KActivations for Q4_K / Q5_K (see QuantTraits and products.hpp): the
/// scaled integer products of the 8 groups summed in int32, the minimums by one madd of bsums.
template <class Block, bool kHigh, int NT>
DEPTHKV_QUANT_AVX2 inline void q45k_dot_q8k_avx2(const std::uint8_t* blk, const ActQ8K* const* a,
                                                 std::int64_t i, __m256* acc) {
  const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
  __m256i sumi[NT];
  for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
  const __m256i sm = q4k_scales_mins_avx2(blk + offsetof(Block, scales));
  const __m256i sc8 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
  const __m128i mn = _mm256_extracti128_si256(sm, 1);
  const __m256i mins16 =
      _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));  // per bsum
  q45k_for_each_chunk_avx2<Block, kHigh>(blk, [&](int c, __m256i u) DEPTHKV_QUANT_AVX2 {
    const __m256i sc =
        _mm256_shuffle_epi8(sc8, _mm256_set1_epi16(static_cast<short>(((2 * c + 1) << 8) | (2 * c))));
    q8k_chunk_avx2<NT>(u, sc, a, i, c, sumi);
  });
  const float dmin = half_avx2(load_u16(blk + offsetof(Block, dmin)));
  for (int t = 0; t < NT; ++t) {
    const ActQ8K& x = a[t][i];
    const __m256i mins =
        _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(x.bsums)), mins16);
    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * x.d), _mm256_cvtepi32_ps(mins), acc[t]);
  }
}
#endif

/// Q4_K traits (see QuantTraits): 4-bit codes, a 6-bit scale and minimum per 32 values.
template <>
struct QuantTraits<GgmlType::kQ4_K> : BlockTraits<BlockQ4_K, 256, true> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    q45k_dot_q8_avx2<Block, false, NT>(blk, a, c0, acc, acc_s);
  }
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8k_avx2(const std::uint8_t* blk, const ActQ8K* const* a, std::int64_t i,
                                              __m256* acc) {
    q45k_dot_q8k_avx2<Block, false, NT>(blk, a, i, acc);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
