#pragma once
/// @file llama/quant/block_kernels.hpp
/// @brief The pieces every quantized type's product kernels share: the traits members that
/// follow from the block type (`BlockTraits`), the int8 activation blocks (`ActQ8` per 32 values,
/// `ActQ8K` per 256) and their quantizers, the run-time choice of the AVX2 + FMA + F16C kernels,
/// and the AVX2 building blocks of a block dot product (nibble and bit unpacking, `maddubs` /
/// `madd` accumulation into per-token float accumulators, the minimum and offset terms through
/// the activation sums, the chunk of a 16-groups-of-16 block).
///
/// A type's block kernel (its traits' `dot_q8_avx2`, see type_list.hpp) adds the products of one
/// weight block with NT tokens' activation chunks to `acc[t]` (8 float lanes, summed at the end)
/// and `acc_s[t]` (scalar terms: offsets and minimums through the activation sums).
///
/// @code
/// std::vector<depthkv::llama::detail::ActQ8> xq(cols / 32);
/// depthkv::llama::detail::quantize_act_q8(x, cols, xq.data());
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "depthkv/detail/simd.hpp"
#include "depthkv/llama/quant/ggml_type.hpp"

#if defined(DEPTHKV_AVX2_DISPATCH)
#include <cpuid.h>
#endif

namespace depthkv {
namespace llama {
namespace detail {

/// The traits of one quantized block type T (one header per type, e.g. quant/q4_0.hpp; the
/// list of types: type_list.hpp). Members:
/// - `using Block`: the block's struct (its layout as stored, `sizeof(Block)` bytes);
/// - `kValues`: values per block (32 or 256);
/// - `kQ8K`: whether the type has the per-256 int8-activation kernel (`dot_q8k_avx2`);
/// - `static void dequantize(const Block&, float* y)`: the block's kValues floats, bit-exact
///   with llama.cpp (the scalar products multiply these floats);
/// - with AVX2 dispatch, `template <int NT> static void dot_q8_avx2(const std::uint8_t* blk,
///   const ActQ8* const* a, std::int64_t c0, __m256* acc, float* acc_s)`: adds the products of the
///   block at blk (read in place) with chunks c0.. of the NT tokens' activations a[t];
/// - when kQ8K, `template <int NT> static void dot_q8k_avx2(const std::uint8_t* blk,
///   const ActQ8K* const* a, std::int64_t i, __m256* acc)`: the same with activation block i.
/// A type's traits derive the first four from `BlockTraits` and add the kernels.
template <GgmlType T>
struct QuantTraits;

/// The members of QuantTraits that follow from the block type: `Block` = B, `kValues` = N,
/// `kQ8K` = Q8K and `dequantize`, the block type's `dequantize_block(const B&, float*)` overload
/// (found by argument-dependent lookup in namespace llama, beside B).
template <class B, int N, bool Q8K = false>
struct BlockTraits {
  using Block = B;
  static constexpr int kValues = N;
  static constexpr bool kQ8K = Q8K;
  static void dequantize(const Block& b, float* y) { dequantize_block(b, y); }
};

#if defined(DEPTHKV_AVX2_DISPATCH)
#define DEPTHKV_QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

/// @param max_simd_level the call's `CpuOptions::max_simd_level`
/// @return 2 when the AVX2 + FMA + F16C kernels may run under that cap on this CPU, else 0 (scalar)
inline int quant_simd_level(int max_simd_level = 2) {
#if defined(DEPTHKV_AVX2_DISPATCH)
  static const bool ok = [] {  // CPUID leaf 1, ECX: FMA bit 12, F16C bit 29 (AVX2 and OS support: simd_level)
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 12)) != 0 && (c & (1u << 29)) != 0;
  }();
  return ok && depthkv::detail::simd_level(max_simd_level) >= 2 ? 2 : 0;
#else
  (void)max_simd_level;
  return 0;
#endif
}

/// One block of 32 activations quantized to int8 (x ~= d * qs), with the sums of qs[0..15]
/// and qs[16..31].
struct ActQ8 {
  float d;
  std::int16_t s[2];
  std::int8_t qs[32];
};

/// The int8 scale of n values v: d = max|v| / 127, and id = 1 / d (0 when d is 0).
inline void act_scale(const float* v, int n, float& d, float& id) {
  float amax = 0;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(v[j]));
  d = amax / 127.0f;
  id = d != 0 ? 1.0f / d : 0.0f;
}

/// Quantizes n (a multiple of 32) floats into n / 32 ActQ8 blocks (round to nearest);
/// quantize_act_q8_avx2 gives the same bytes.
inline void quantize_act_q8(const float* x, std::int64_t n, ActQ8* out) {
  for (std::int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    float id;
    act_scale(v, 32, out[b].d, id);
    int s0 = 0, s1 = 0;
    for (int j = 0; j < 32; ++j) {
      out[b].qs[j] = static_cast<std::int8_t>(std::lrintf(v[j] * id));
      (j < 16 ? s0 : s1) += out[b].qs[j];
    }
    out[b].s[0] = static_cast<std::int16_t>(s0);
    out[b].s[1] = static_cast<std::int16_t>(s1);
  }
}

/// One block of 256 activations quantized to int8 (x ~= d * qs), with the sums of qs over each
/// 16 values (`bsums[g]` = sum of qs[16 g .. 16 g + 15], |bsums| <= 2032); the layout of
/// llama.cpp's block_q8_K, 32-byte aligned so that the kernels' loads of qs stay in one line.
struct alignas(32) ActQ8K {
  std::int8_t qs[256];
  std::int16_t bsums[16];
  float d;
};

/// Quantizes n (a multiple of 256) floats into n / 256 ActQ8K blocks: d = max|x| / 127 over
/// the 256 values, qs = round to nearest of x / d (|qs| <= 127). Each value is off by at most
/// d / 2 = max|x| / 254 of its block. quantize_act_q8k_avx2 gives the same bytes, so the
/// kernels see the same codes at every SIMD level.
inline void quantize_act_q8k(const float* x, std::int64_t n, ActQ8K* out) {
  for (std::int64_t b = 0; b < n / 256; ++b) {
    const float* v = x + 256 * b;
    float id;
    act_scale(v, 256, out[b].d, id);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 16 * g; j < 16 * g + 16; ++j) {
        out[b].qs[j] = static_cast<std::int8_t>(std::lrintf(v[j] * id));
        s += out[b].qs[j];
      }
      out[b].bsums[g] = static_cast<std::int16_t>(s);
    }
  }
}

#if defined(DEPTHKV_AVX2_DISPATCH)
/// max_j |v[j]| over n (a multiple of 8) floats; the value act_scale finds (max is exact).
DEPTHKV_QUANT_AVX2 inline float amax_avx2(const float* v, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + j), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
/// round(v[j] * id) for 16 floats, as int16 lanes in order: the same product and the same
/// rounding (to nearest even, the default mode, as lrintf) as the scalar quantizers.
DEPTHKV_QUANT_AVX2 inline __m256i round16_avx2(const float* v, __m256 id) {
  const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v), id));
  const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8), id));
  return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
}
/// The sum of 16 int16 lanes.
DEPTHKV_QUANT_AVX2 inline int sum16_avx2(__m256i p) {
  const __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}
/// Stores 2 x 16 int16 lanes (|v| <= 127) as 32 int8 in order.
DEPTHKV_QUANT_AVX2 inline void store32_i8_avx2(std::int8_t* dst, __m256i p0, __m256i p1) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permute4x64_epi64(_mm256_packs_epi16(p0, p1), 0xD8));
}
/// quantize_act_q8 with AVX2: the same codes, scales and sums.
DEPTHKV_QUANT_AVX2 inline void quantize_act_q8_avx2(const float* x, std::int64_t n, ActQ8* out) {
  for (std::int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    out[b].d = amax_avx2(v, 32) / 127.0f;
    const float id = out[b].d != 0 ? 1.0f / out[b].d : 0.0f;
    const __m256i p0 = round16_avx2(v, _mm256_set1_ps(id)), p1 = round16_avx2(v + 16, _mm256_set1_ps(id));
    store32_i8_avx2(out[b].qs, p0, p1);
    out[b].s[0] = static_cast<std::int16_t>(sum16_avx2(p0));
    out[b].s[1] = static_cast<std::int16_t>(sum16_avx2(p1));
  }
}
/// quantize_act_q8k with AVX2: the same codes, scales and sums.
DEPTHKV_QUANT_AVX2 inline void quantize_act_q8k_avx2(const float* x, std::int64_t n, ActQ8K* out) {
  for (std::int64_t b = 0; b < n / 256; ++b) {
    const float* v = x + 256 * b;
    out[b].d = amax_avx2(v, 256) / 127.0f;
    const __m256 id = _mm256_set1_ps(out[b].d != 0 ? 1.0f / out[b].d : 0.0f);
    for (int g = 0; g < 16; g += 2) {
      const __m256i p0 = round16_avx2(v + 16 * g, id), p1 = round16_avx2(v + 16 * g + 16, id);
      store32_i8_avx2(out[b].qs + 16 * g, p0, p1);
      out[b].bsums[g] = static_cast<std::int16_t>(sum16_avx2(p0));
      out[b].bsums[g + 1] = static_cast<std::int16_t>(sum16_avx2(p1));
    }
  }
}
#endif

/// Loads the 16-bit little-endian value at p (any alignment).
inline std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

#if defined(DEPTHKV_AVX2_DISPATCH)
/// Sum of the 8 lanes of v.
DEPTHKV_QUANT_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
/// 32 bytes: 0xFF where bit i of the 32 bits at p is set.
DEPTHKV_QUANT_AVX2 inline __m256i bits_to_bytes_avx2(const std::uint8_t* p) {
  std::uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
}
/// The 32 nibbles of 16 bytes in ggml order: low nibbles (values 0-15), then high (16-31).
DEPTHKV_QUANT_AVX2 inline __m256i nibbles_avx2(const std::uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}
/// The 32 five-bit codes of Q5_0 / Q5_1: the nibbles of the 16 bytes at qs (nibbles_avx2) with
/// bit j of the 32 bits at qh as 16 of value j.
DEPTHKV_QUANT_AVX2 inline __m256i nibbles5_avx2(const std::uint8_t* qs, const std::uint8_t* qh) {
  const __m256i high = _mm256_and_si256(bits_to_bytes_avx2(qh), _mm256_set1_epi8(16));
  return _mm256_or_si256(nibbles_avx2(qs), high);
}
/// 32 bytes: bits 2 s and 2 s + 1 (s = 0..3) of each byte of q, as 0..3.
DEPTHKV_QUANT_AVX2 inline __m256i crumbs_avx2(__m256i q, int s) {
  return _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi8(3));
}
/// 16 x int16 sums of pairs u * q (u unsigned, 0..127) of one chunk.
DEPTHKV_QUANT_AVX2 inline __m256i pairs_u_avx2(__m256i u, const ActQ8& a) {
  return _mm256_maddubs_epi16(u, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)));
}
/// 8 x int32: pairs summed with int16 weights sc0 (values 0-15) and sc1 (values 16-31).
DEPTHKV_QUANT_AVX2 inline __m256i scale_pairs_avx2(__m256i p16, int sc0, int sc1) {
  return _mm256_madd_epi16(p16, _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(sc1)),
                                                 _mm_set1_epi16(static_cast<short>(sc0))));
}
/// IEEE half to float with F16C.
DEPTHKV_QUANT_AVX2 inline float half_avx2(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/// acc[t] += f * d_x(t, c) * (sum of v * q_x over chunk c of token t), v signed int8.
template <int NT>
DEPTHKV_QUANT_AVX2 inline void acc_signed_avx2(__m256i v, const ActQ8* const* a, std::int64_t c, float f,
                                               __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i av = _mm256_sign_epi8(v, v);
  for (int t = 0; t < NT; ++t) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t][c].qs));
    const __m256 p =
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(q, v)), ones));
    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(f * a[t][c].d), p, acc[t]);
  }
}
/// As acc_signed_avx2 for unsigned codes u (0..127).
template <int NT>
DEPTHKV_QUANT_AVX2 inline void acc_unsigned_avx2(__m256i u, const ActQ8* const* a, std::int64_t c, float f,
                                                 __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int t = 0; t < NT; ++t) {
    const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs_u_avx2(u, a[t][c]), ones));
    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(f * a[t][c].d), p, acc[t]);
  }
}
/// As acc_unsigned_avx2 with integer scales sc0 (values 0-15) and sc1 (values 16-31).
template <int NT>
DEPTHKV_QUANT_AVX2 inline void acc_unsigned16_avx2(__m256i u, int sc0, int sc1, const ActQ8* const* a,
                                                   std::int64_t c, float f, __m256* acc) {
  for (int t = 0; t < NT; ++t) {
    const __m256 p = _mm256_cvtepi32_ps(scale_pairs_avx2(pairs_u_avx2(u, a[t][c]), sc0, sc1));
    acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(f * a[t][c].d), p, acc[t]);
  }
}

/// acc_s[t] += f * (d_x(t, c) * (sum of q_x over chunk c of token t)): a block's minimum f
/// (one per 32 values) times the activation sum.
template <int NT>
DEPTHKV_QUANT_AVX2 inline void acc_sum_avx2(const ActQ8* const* a, std::int64_t c, float f, float* acc_s) {
  for (int t = 0; t < NT; ++t) {
    const ActQ8& x = a[t][c];
    const float s = static_cast<float>(static_cast<int>(x.s[0]) + x.s[1]) * x.d;
    acc_s[t] += f * s;
  }
}
/// acc_s[t] -= f * d_x(t, c) * (m0 * s0 + m1 * s1), s0 and s1 the sums of q_x over values 0-15
/// and 16-31 of chunk c of token t: the minimums or offsets m0, m1 (integers, per 16 values)
/// of a chunk, scaled by f.
template <int NT>
DEPTHKV_QUANT_AVX2 inline void sub_group_sums_avx2(const ActQ8* const* a, std::int64_t c, float f, int m0,
                                                   int m1, float* acc_s) {
  for (int t = 0; t < NT; ++t) {
    const ActQ8& x = a[t][c];
    acc_s[t] -= f * x.d * static_cast<float>(m0 * x.s[0] + m1 * x.s[1]);
  }
}
/// Chunk c of a block of 16 groups of 16 values (Q2_K, Q3_K, Q6_K), w = d * sc * u - f * m per
/// group: acc_unsigned16_avx2 with the scales sc0, sc1 and sub_group_sums_avx2 with the
/// minimums m0, m1 of the chunk's two groups.
template <int NT>
DEPTHKV_QUANT_AVX2 inline void acc_groups16_avx2(__m256i u, int sc0, int sc1, float d, int m0, int m1,
                                                 float f, const ActQ8* const* a, std::int64_t c, __m256* acc,
                                                 float* acc_s) {
  acc_unsigned16_avx2<NT>(u, sc0, sc1, a, c, d, acc);
  sub_group_sums_avx2<NT>(a, c, f, m0, m1, acc_s);
}

/// sumi[t] += madd(maddubs(u, q), sc) for chunk c (32 values) of block i of every token: u the
/// chunk's unsigned weight codes (< 64), sc its int16 group scales per pair of values.
template <int NT>
DEPTHKV_QUANT_AVX2 inline void q8k_chunk_avx2(__m256i u, __m256i sc, const ActQ8K* const* a, std::int64_t i,
                                              int c, __m256i* sumi) {
  for (int t = 0; t < NT; ++t) {
    const __m256i q = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[t][i].qs + 32 * c));
    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), sc));
  }
}
/// 32 bytes: `value` where bit `bit` of byte i of `bytes` is set, else 0.
DEPTHKV_QUANT_AVX2 inline __m256i bit_plane_avx2(__m256i bytes, int bit, char value) {
  const __m256i b = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, b), b), _mm256_set1_epi8(value));
}
#endif

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
