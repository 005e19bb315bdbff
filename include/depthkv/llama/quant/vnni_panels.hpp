#pragma once
/// @file llama/quant/vnni_panels.hpp
/// @brief The AVX-512 VNNI matmuls with int8 activations, for many tokens at once: the K-quants
/// (Q4_K, Q5_K, Q6_K) with activations per 256 values (`kQ8KActivations`, products.hpp), and
/// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 with activations per 32 (`kQ8Activations`; the section below).
///
/// A panel of 16 weight rows is unpacked once into unsigned 8-bit codes, interleaved so that
/// one 32-byte vector holds 4 consecutive codes of 8 rows, with the block's integer scales and
/// minimums per group; then every token multiplies the whole panel with `vpdpbusd` (unsigned
/// codes x signed activations, 4 products summed into each int32 lane), 2 x 8 rows by 4 tokens
/// of accumulators in registers. Each K-quant block of 256 weights is
///   w_k = d * s_g(k) * u_k - dmin * m_h(k)
/// with unsigned codes u < 64, integer scales s per group g of 256 / G values (Q4_K, Q5_K: G = 8,
/// Q6_K: G = 16) and integer minimums m per 16 values h (Q6_K: the offset 32 as m = 32 s,
/// dmin = d). With x_k ~= d_x * q_k (ActQ8K), per token, row and block:
///   sum_k w_k x_k ~= d_x * (d * sum_g s_g * (sum_{k in g} u_k q_k) - dmin * sum_h m_h * S_h)
/// (S_h = bsums[h]); both sums are exact in int32 (at most 256 * 63 * 128 * 127 < 2^31), and
/// the float steps are the two products and the sum over blocks, as in the AVX2 kernel: the
/// results equal it up to float rounding.
///
/// Instruction set: AVX-512 F, BW, VL and VNNI on 256-bit vectors (`simd_level` 3), chosen at run
/// time like the AVX2 kernels (simd_level.hpp); never called without them.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "depthkv/llama/quant/block_kernels.hpp"
#include "depthkv/llama/quant/type_list.hpp"

#if defined(DEPTHKV_AVX2_DISPATCH)
#define DEPTHKV_QUANT_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

namespace depthkv {
namespace llama {
namespace detail {

/// Rows of W per VNNI panel (two vectors of 8 int32 lanes).
inline constexpr int kVnniPanelRows = 16;
/// Tokens per register tile of the VNNI kernel.
inline constexpr int kVnniTokens = 4;

/// One unpacked panel of kVnniPanelRows rows x nb blocks (see the file comment). Per block b:
/// codes[b][q][r] (4 bytes: values 4q..4q+3 of row r, q < 64), scales[b][g][r] (int32),
/// minimum pairs[b][p][r] (int16 m_{2p} low, m_{2p+1} high), d[b][r], dmin[b][r]. Rows past the
/// matrix's end are zero. The per-32 panels (unpack_panel32_vnni) use codes (q < 8), d and dmin.
struct VnniPanel {
  std::vector<std::uint8_t> codes;
  std::vector<std::int32_t> scales, min_pairs;
  std::vector<float> d, dmin;
  /// Sizes the panel for nb K-quant blocks of `groups` scale groups and zeroes rows [nr,
  /// kVnniPanelRows); rows below nr keep their old values until the unpack overwrites them.
  void resize(std::int64_t nb, int groups, int nr) {
    const auto n = static_cast<std::size_t>(nb);
    resize_rows(codes, n * 64, 4, nr);
    resize_rows(scales, n * static_cast<std::size_t>(groups), 1, nr);
    resize_rows(min_pairs, n * 8, 1, nr);
    resize_rows(d, n, 1, nr);
    resize_rows(dmin, n, 1, nr);
  }
  /// As resize for nb per-32 blocks: codes, d and dmin (scales and min_pairs are left as they are).
  void resize32(std::int64_t nb, int nr) {
    const auto n = static_cast<std::size_t>(nb);
    resize_rows(codes, n * 8, 4, nr);
    resize_rows(d, n, 1, nr);
    resize_rows(dmin, n, 1, nr);
  }

 private:
  /// Sizes v to `steps` runs of kVnniPanelRows rows of `per_row` elements and zeroes rows
  /// [nr, kVnniPanelRows) of each run.
  template <class V>
  static void resize_rows(std::vector<V>& v, std::size_t steps, int per_row, int nr) {
    const auto run = static_cast<std::size_t>(kVnniPanelRows * per_row);
    const auto used = static_cast<std::size_t>(nr * per_row);
    v.resize(steps * run);
    if (used < run)
      for (std::size_t i = 0; i < v.size(); i += run)
        std::fill(v.begin() + i + used, v.begin() + i + run, V{});
  }
};

/// Scale groups per block of the VNNI kernel for type T (8 or 16).
template <GgmlType T>
inline constexpr int vnni_groups() {
  return T == GgmlType::kQ6_K ? 16 : 8;
}

#if defined(DEPTHKV_AVX2_DISPATCH)

/// The unpacked form of one block: 256 codes in value order, G scales, 16 minimums, d, dmin.
struct UnpackedBlock {
  alignas(32) std::uint8_t u[256];
  std::int32_t s[16];
  std::int16_t m[16];
  float d, dmin;
};

/// Unpacks one Q4_K / Q5_K / Q6_K block (see the file comment).
template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline void unpack_block_vnni(const std::uint8_t* blk, UnpackedBlock& out) {
  using Block = typename QuantTraits<T>::Block;
  if constexpr (T == GgmlType::kQ6_K) {
    out.d = out.dmin = half_avx2(load_u16(blk + offsetof(Block, d)));
    const auto* sc = reinterpret_cast<const std::int8_t*>(blk + offsetof(Block, scales));
    for (int n = 0; n < 2; ++n) {
      const Q6kHalf h = q6k_half_avx2(blk, n);
      for (int k = 0; k < 4; ++k)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out.u + 32 * (4 * n + k)), q6k_codes_avx2(h, k));
    }
    for (int g = 0; g < 16; ++g) {
      out.s[g] = sc[g];
      out.m[g] = static_cast<std::int16_t>(32 * sc[g]);
    }
  } else {
    constexpr bool kHigh = T == GgmlType::kQ5_K;
    out.d = half_avx2(load_u16(blk + offsetof(Block, d)));
    out.dmin = half_avx2(load_u16(blk + offsetof(Block, dmin)));
    q45k_for_each_chunk_avx2<Block, kHigh>(blk, [&](int c, __m256i u) DEPTHKV_QUANT_AVX2 {
      _mm256_store_si256(reinterpret_cast<__m256i*>(out.u + 32 * c), u);
      std::uint8_t sc, m;
      q4k_scale_min(c, blk + offsetof(Block, scales), sc, m);
      out.s[c] = sc;
      out.m[2 * c] = out.m[2 * c + 1] = m;
    });
  }
}

/// Unpacks rows [r0, r0 + nr) (nr <= kVnniPanelRows) of a `cols`-wide matrix into p.
template <GgmlType T>
DEPTHKV_QUANT_AVX2 inline void unpack_panel_vnni(const std::uint8_t* base, std::size_t row_bytes,
                                                 std::int64_t r0, int nr, std::int64_t cols, VnniPanel& p) {
  constexpr int G = vnni_groups<T>();
  const std::int64_t nb = cols / 256;
  p.resize(nb, G, nr);
  UnpackedBlock ub;
  for (int r = 0; r < nr; ++r) {
    const std::uint8_t* row = base + static_cast<std::size_t>(r0 + r) * row_bytes;
    for (std::int64_t b = 0; b < nb; ++b) {
      unpack_block_vnni<T>(row + b * static_cast<std::int64_t>(sizeof(typename QuantTraits<T>::Block)), ub);
      std::uint8_t* codes = p.codes.data() + b * 256 * kVnniPanelRows + 4 * r;
      for (int q = 0; q < 64; ++q) std::memcpy(codes + q * 4 * kVnniPanelRows, ub.u + 4 * q, 4);
      for (int g = 0; g < G; ++g)
        p.scales[static_cast<std::size_t>((b * G + g) * kVnniPanelRows + r)] = ub.s[g];
      for (int pp = 0; pp < 8; ++pp) {
        const auto lo = static_cast<std::uint16_t>(ub.m[2 * pp]),
                   hi = static_cast<std::uint16_t>(ub.m[2 * pp + 1]);
        p.min_pairs[static_cast<std::size_t>((b * 8 + pp) * kVnniPanelRows + r)] = static_cast<std::int32_t>(
            static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16));
      }
      p.d[static_cast<std::size_t>(b * kVnniPanelRows + r)] = ub.d;
      p.dmin[static_cast<std::size_t>(b * kVnniPanelRows + r)] = ub.dmin;
    }
  }
}

DEPTHKV_QUANT_VNNI inline __m256i load_i32_bcast_vnni(const void* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/// One 4-value step q of a register tile: sub[r][t] += codes of step q (rows 8r..8r+7) . the 4
/// activation codes of token t at step q (`vpdpbusd`).
template <int NT, class Act>
DEPTHKV_QUANT_VNNI inline void dpbusd_step_vnni(const std::uint8_t* codes, int q, const Act* const* a,
                                                std::int64_t b, __m256i (*sub)[NT]) {
  const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + q * 4 * kVnniPanelRows));
  const __m256i w1 =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + q * 4 * kVnniPanelRows + 32));
  for (int t = 0; t < NT; ++t) {
    const __m256i x = load_i32_bcast_vnni(a[t][b].qs + 4 * q);
    sub[0][t] = _mm256_dpbusd_epi32(sub[0][t], w0, x);
    sub[1][t] = _mm256_dpbusd_epi32(sub[1][t], w1, x);
  }
}

/// The end of K-quant block b for one token x: acc_r += d_x * (d * blk[r][t] - dmin * the
/// minimums times x's bsums), rows 8r..8r+7.
template <int NT>
DEPTHKV_QUANT_VNNI inline void finish_block_vnni(const VnniPanel& p, std::int64_t b, const ActQ8K& x,
                                                 const __m256i (*blk)[NT], int t, __m256& acc0,
                                                 __m256& acc1) {
  const std::int32_t* mp = p.min_pairs.data() + b * 8 * kVnniPanelRows;
  const float* d = p.d.data() + b * kVnniPanelRows;
  const float* dmin = p.dmin.data() + b * kVnniPanelRows;
  __m256i mins[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int pp = 0; pp < 8; ++pp) {
    const __m256i bs = load_i32_bcast_vnni(x.bsums + 2 * pp);
    for (int r = 0; r < 2; ++r)
      mins[r] = _mm256_dpwssd_epi32(
          mins[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + pp * kVnniPanelRows + 8 * r)),
          bs);
  }
  const __m256 dx = _mm256_set1_ps(x.d);
  __m256* acc[2] = {&acc0, &acc1};
  for (int r = 0; r < 2; ++r) {
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(blk[r][t]), _mm256_loadu_ps(d + 8 * r));
    f = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[r]), _mm256_loadu_ps(dmin + 8 * r), f);
    *acc[r] = _mm256_fmadd_ps(f, dx, *acc[r]);
  }
}

/// out[t][r] = the panel's row r times token t's activations (NT tokens, a[t] = its nb blocks):
/// the register tile of the file comment, blocks in order.
template <int G, int NT>
DEPTHKV_QUANT_VNNI inline void panel_tokens_vnni(const VnniPanel& p, std::int64_t nb, const ActQ8K* const* a,
                                                 float (*out)[kVnniPanelRows]) {
  constexpr int kSteps = 64 / G;  // 4-value steps per scale group
  __m256 acc[2][NT];
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* codes = p.codes.data() + b * 256 * kVnniPanelRows;
    const std::int32_t* sc = p.scales.data() + b * G * kVnniPanelRows;
    __m256i blk[2][NT];
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < NT; ++t) blk[r][t] = _mm256_setzero_si256();
    for (int g = 0; g < G; ++g) {
      __m256i sub[2][NT];
      for (int r = 0; r < 2; ++r)
        for (int t = 0; t < NT; ++t) sub[r][t] = _mm256_setzero_si256();
      for (int s = 0; s < kSteps; ++s) dpbusd_step_vnni<NT>(codes, g * kSteps + s, a, b, sub);
      const __m256i s0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + g * kVnniPanelRows));
      const __m256i s1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + g * kVnniPanelRows + 8));
      for (int t = 0; t < NT; ++t) {
        blk[0][t] = _mm256_add_epi32(blk[0][t], _mm256_mullo_epi32(sub[0][t], s0));
        blk[1][t] = _mm256_add_epi32(blk[1][t], _mm256_mullo_epi32(sub[1][t], s1));
      }
    }
    for (int t = 0; t < NT; ++t) finish_block_vnni(p, b, a[t][b], blk, t, acc[0][t], acc[1][t]);
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < 2; ++r) _mm256_storeu_ps(out[t] + 8 * r, acc[r][t]);
}

/// Y[t][r] for every token t < n and the panel's nr rows starting at r0 (Y is n x ldy): the
/// register tile `Tile::run<NT>` (NT <= kVnniTokens tokens; x[t] = token t's nb activation
/// blocks) over every token, kVnniTokens at a time.
template <class Tile, class Act>
DEPTHKV_QUANT_VNNI inline void panel_all_tokens_vnni(const VnniPanel& p, std::int64_t nb, const Act* x,
                                                     std::int64_t n, float* y, std::int64_t ldy,
                                                     std::int64_t r0, int nr) {
  alignas(32) float out[kVnniTokens][kVnniPanelRows];
  for (std::int64_t t0 = 0; t0 < n; t0 += kVnniTokens) {
    const int nt = static_cast<int>(std::min<std::int64_t>(kVnniTokens, n - t0));
    const Act* xs[kVnniTokens];
    for (int t = 0; t < nt; ++t) xs[t] = x + (t0 + t) * nb;
    switch (nt) {
      case 4:
        Tile::template run<4>(p, nb, xs, out);
        break;
      case 3:
        Tile::template run<3>(p, nb, xs, out);
        break;
      case 2:
        Tile::template run<2>(p, nb, xs, out);
        break;
      default:
        Tile::template run<1>(p, nb, xs, out);
        break;
    }
    for (int t = 0; t < nt; ++t)
      std::memcpy(y + (t0 + t) * ldy + r0, out[t], sizeof(float) * static_cast<std::size_t>(nr));
  }
}

/// The K-quant register tile of type T (panel_tokens_vnni with its group count).
template <GgmlType T>
struct Q8KTileVnni {
  template <int NT>
  DEPTHKV_QUANT_VNNI static void run(const VnniPanel& p, std::int64_t nb, const ActQ8K* const* a,
                                     float (*out)[kVnniPanelRows]) {
    panel_tokens_vnni<vnni_groups<T>(), NT>(p, nb, a, out);
  }
};

/// The K-quant panel times every token (panel_all_tokens_vnni).
template <GgmlType T>
DEPTHKV_QUANT_VNNI inline void panel_matmul_vnni(const VnniPanel& p, std::int64_t nb, const ActQ8K* xk,
                                                 std::int64_t n, float* y, std::int64_t ldy, std::int64_t r0,
                                                 int nr) {
  panel_all_tokens_vnni<Q8KTileVnni<T>>(p, nb, xk, n, y, ldy, r0, nr);
}

// ---- per-32 types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) with int8 activations per 32 values -----------
//
// A block of 32 weights is w_k = d * (u_k - o) + m with unsigned codes u (Q8_0: q + 128, o = 128;
// Q4_0: o = 8; Q5_0: o = 16; Q4_1, Q5_1: o = 0 and the block's minimum m). With x_k ~= d_x * q_k
// (ActQ8) and S = the sum of the 32 q_k:
//   sum_k w_k x_k ~= d_x * (d * (sum_k u_k q_k - o * S) + m * S)
// the bracket's integer part exact in int32 (at most 32 * 255 * 127 + 128 * 32 * 127).

/// The integer offset o of the file comment's per-32 form for type T.
template <GgmlType T>
inline constexpr int vnni_offset32() {
  return T == GgmlType::kQ8_0 ? 128 : T == GgmlType::kQ4_0 ? 8 : T == GgmlType::kQ5_0 ? 16 : 0;
}
/// True for the per-32 types with a minimum m (Q4_1, Q5_1).
template <GgmlType T>
inline constexpr bool vnni_min32() {
  return T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
}
/// True for the types of the per-32 VNNI kernel.
template <GgmlType T>
inline constexpr bool vnni_type32() {
  return T == GgmlType::kQ8_0 || T == GgmlType::kQ4_0 || T == GgmlType::kQ4_1 || T == GgmlType::kQ5_0 ||
         T == GgmlType::kQ5_1;
}

/// The 32 codes u, d and m of one per-32 block (see the section comment).
template <GgmlType T>
inline void unpack_block32(const std::uint8_t* blk, std::uint8_t* u, float& d, float& m) {
  using Block = typename QuantTraits<T>::Block;
  Block b;
  std::memcpy(&b, blk, sizeof(Block));
  d = fp16_to_float(b.d);
  m = 0.0f;
  if constexpr (T == GgmlType::kQ8_0) {
    for (int j = 0; j < 32; ++j) u[j] = static_cast<std::uint8_t>(b.qs[j] + 128);
  } else {
    std::uint32_t qh = 0;
    if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) std::memcpy(&qh, b.qh, 4);
    if constexpr (vnni_min32<T>()) m = fp16_to_float(b.m);
    for (int j = 0; j < 16; ++j) {
      u[j] = static_cast<std::uint8_t>((b.qs[j] & 0xF) | (((qh >> j) & 1u) << 4));
      u[j + 16] = static_cast<std::uint8_t>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    }
  }
}

/// Unpacks rows [r0, r0 + nr) of a `cols`-wide per-32 matrix into p: codes[b][q][r] as the
/// K-quant panels (8 four-value steps per block of 32), d[b][r] and dmin[b][r] = m.
template <GgmlType T>
inline void unpack_panel32_vnni(const std::uint8_t* base, std::size_t row_bytes, std::int64_t r0, int nr,
                                std::int64_t cols, VnniPanel& p) {
  const std::int64_t nb = cols / 32;
  p.resize32(nb, nr);
  std::uint8_t u[32];
  for (int r = 0; r < nr; ++r) {
    const std::uint8_t* row = base + static_cast<std::size_t>(r0 + r) * row_bytes;
    for (std::int64_t b = 0; b < nb; ++b) {
      const auto i = static_cast<std::size_t>(b * kVnniPanelRows + r);
      unpack_block32<T>(row + b * static_cast<std::int64_t>(sizeof(typename QuantTraits<T>::Block)), u,
                        p.d[i], p.dmin[i]);
      std::uint8_t* codes = p.codes.data() + b * 32 * kVnniPanelRows + 4 * r;
      for (int q = 0; q < 8; ++q) std::memcpy(codes + q * 4 * kVnniPanelRows, u + 4 * q, 4);
    }
  }
}

/// The per-32 register tile: out[t][r] for NT tokens (a[t] = its nb ActQ8 blocks).
template <int kOffset, bool kMin, int NT>
DEPTHKV_QUANT_VNNI inline void panel32_tokens_vnni(const VnniPanel& p, std::int64_t nb, const ActQ8* const* a,
                                                   float (*out)[kVnniPanelRows]) {
  __m256 acc[2][NT];
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* codes = p.codes.data() + b * 32 * kVnniPanelRows;
    __m256i sub[2][NT];
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < NT; ++t) sub[r][t] = _mm256_setzero_si256();
    for (int q = 0; q < 8; ++q) dpbusd_step_vnni<NT>(codes, q, a, b, sub);
    const float* d = p.d.data() + b * kVnniPanelRows;
    const float* m = p.dmin.data() + b * kVnniPanelRows;
    for (int t = 0; t < NT; ++t) {
      const int S = a[t][b].s[0] + a[t][b].s[1];
      const __m256i off = _mm256_set1_epi32(kOffset * S);
      const __m256 dx = _mm256_set1_ps(a[t][b].d);
      for (int r = 0; r < 2; ++r) {
        __m256 f =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sub[r][t], off)), _mm256_loadu_ps(d + 8 * r));
        if constexpr (kMin)
          f = _mm256_fmadd_ps(_mm256_loadu_ps(m + 8 * r), _mm256_set1_ps(static_cast<float>(S)), f);
        acc[r][t] = _mm256_fmadd_ps(f, dx, acc[r][t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < 2; ++r) _mm256_storeu_ps(out[t] + 8 * r, acc[r][t]);
}

/// The per-32 register tile of type T (panel32_tokens_vnni with its offset and minimum).
template <GgmlType T>
struct Q8TileVnni {
  template <int NT>
  DEPTHKV_QUANT_VNNI static void run(const VnniPanel& p, std::int64_t nb, const ActQ8* const* a,
                                     float (*out)[kVnniPanelRows]) {
    panel32_tokens_vnni<vnni_offset32<T>(), vnni_min32<T>(), NT>(p, nb, a, out);
  }
};

/// The per-32 panel times every token (panel_all_tokens_vnni).
template <GgmlType T>
DEPTHKV_QUANT_VNNI inline void panel32_matmul_vnni(const VnniPanel& p, std::int64_t nb, const ActQ8* xq,
                                                   std::int64_t n, float* y, std::int64_t ldy,
                                                   std::int64_t r0, int nr) {
  panel_all_tokens_vnni<Q8TileVnni<T>>(p, nb, xq, n, y, ldy, r0, nr);
}

#endif  // DEPTHKV_AVX2_DISPATCH

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
