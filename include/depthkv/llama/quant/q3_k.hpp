#pragma once
/// @file llama/quant/q3_k.hpp
/// @brief Q3_K (256 values, 110 bytes): 32 bytes hmask (the 3rd bit, one bit plane per 32
/// values); 64 bytes of 2-bit values (laid out as Q2_K); 12 bytes of 16 packed 6-bit scales (low
/// nibbles in bytes 0-7, high 2 bits in bytes 8-11); half d. x = (d * (sc - 32)) * (q - (hbit ? 0 : 4)).
///
/// @code
/// depthkv::llama::BlockQ3_K b{};   // read from a tensor
/// float y[256];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q3_K: 256 values in 16 groups of 16 with 6-bit scales, 3rd bit in hmask.
struct BlockQ3_K {
  std::uint8_t hmask[32];
  std::uint8_t qs[64];
  std::uint8_t scales[12];
  std::uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110, "ggml Q3_K block size");

/// The 16 signed 6-bit scales (already minus 32) of a Q3_K block.
/// @param packed the block's 12 scale bytes
/// @param out destination of 16 scales
inline void q3k_scales(const std::uint8_t* packed, int* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (lo | (hi << 4)) - 32;
  }
}

/// Dequantizes one Q3_K block into its 256 floats.
/// @param b the block
/// @param y destination of 256 floats
inline void dequantize_block(const BlockQ3_K& b, float* y) {
  const float d = fp16_to_float(b.d);
  int sc[16];
  q3k_scales(b.scales, sc);
  const std::uint8_t* q = b.qs;
  int is = 0;
  std::uint8_t m = 1;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<std::uint8_t>(m << 1)) {
      for (int half = 0; half < 2; ++half, ++is) {
        const float dl = d * static_cast<float>(sc[is]);
        for (int l = 0; l < 16; ++l) {
          const int i = 16 * half + l;
          const int v = ((q[i] >> shift) & 3) - ((b.hmask[i] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

namespace detail {

/// Q3_K traits (see QuantTraits): 2-bit codes plus the hmask bit (u = q + 4 hbit, offset 4 through
/// the activation sums), a signed 6-bit scale per 16 values.
template <>
struct QuantTraits<GgmlType::kQ3_K> : BlockTraits<BlockQ3_K, 256> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    int sc3[16];
    q3k_scales(blk + offsetof(Block, scales), sc3);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(Block, hmask)));
    for (int n = 0; n < 2; ++n) {
      const __m256i q =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(Block, qs) + 32 * n));
      for (int s = 0; s < 4; ++s) {
        const int c = 4 * n + s;
        const __m256i u = _mm256_or_si256(crumbs_avx2(q, s), bit_plane_avx2(hm, c, 4));
        const int sc0 = sc3[2 * c], sc1 = sc3[2 * c + 1];
        acc_groups16_avx2<NT>(u, sc0, sc1, d, 4 * sc0, 4 * sc1, d, a, c0 + c, acc, acc_s);  // offset 4
      }
    }
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
