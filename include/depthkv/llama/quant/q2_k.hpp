#pragma once
/// @file llama/quant/q2_k.hpp
/// @brief Q2_K (256 values, 84 bytes): 16 bytes scales (low nibble scale, high nibble min of
/// each 16 values); 64 bytes of 2-bit values; half d, dmin. Each 128 values use 32 bytes: 4 shifts
/// (0, 2, 4, 6) x 32 bytes, each 16-byte half with its own scale. x = (d * sc) * q - (dmin * m).
///
/// @code
/// depthkv::llama::BlockQ2_K b{};   // read from a tensor
/// float y[256];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q2_K: 256 values in 16 groups of 16 with 4-bit scales and mins.
struct BlockQ2_K {
  std::uint8_t scales[16];
  std::uint8_t qs[64];
  std::uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84, "ggml Q2_K block size");

/// Dequantizes one Q2_K block into its 256 floats.
/// @param b the block
/// @param y destination of 256 floats
inline void dequantize_block(const BlockQ2_K& b, float* y) {
  const float d = fp16_to_float(b.d), dmin = fp16_to_float(b.dmin);
  const std::uint8_t* q = b.qs;
  int is = 0;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half, ++is) {
        const float dl = d * static_cast<float>(b.scales[is] & 0xF);
        const float ml = dmin * static_cast<float>(b.scales[is] >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[16 * half + l] >> shift) & 3) - ml;
      }
    }
  }
}

namespace detail {

/// Q2_K traits (see QuantTraits): 2-bit codes with a 4-bit scale and minimum per 16 values.
template <>
struct QuantTraits<GgmlType::kQ2_K> : BlockTraits<BlockQ2_K, 256> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    const float dmin = half_avx2(load_u16(blk + offsetof(Block, dmin)));
    const std::uint8_t* sc = blk + offsetof(Block, scales);
    for (int n = 0; n < 2; ++n) {
      const __m256i q =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(Block, qs) + 32 * n));
      for (int s = 0; s < 4; ++s) {
        const int c = 4 * n + s;
        acc_groups16_avx2<NT>(crumbs_avx2(q, s), sc[2 * c] & 0xF, sc[2 * c + 1] & 0xF, d, sc[2 * c] >> 4,
                              sc[2 * c + 1] >> 4, dmin, a, c0 + c, acc, acc_s);
      }
    }
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
