#pragma once
/// @file llama/quant/iq4_xs.hpp
/// @brief IQ4_XS (256 values, 136 bytes): half d; uint16 scales_h; 4 bytes scales_l (8 6-bit
/// scales, one per 32 values); 128 bytes of IQ4_NL nibbles. x = (d * (sc - 32)) * v.
///
/// @code
/// depthkv::llama::BlockIQ4_XS b{};   // read from a tensor
/// float y[256];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"
#include "depthkv/llama/quant/iq4_nl.hpp"

namespace depthkv {
namespace llama {

/// IQ4_XS: 256 values in 8 groups of 32 with 6-bit scales, IQ4_NL indices.
struct BlockIQ4_XS {
  std::uint16_t d;
  std::uint16_t scales_h;
  std::uint8_t scales_l[4];
  std::uint8_t qs[128];
};
static_assert(sizeof(BlockIQ4_XS) == 136, "ggml IQ4_XS block size");

/// The 6-bit scale (0..63, offset 32) of group ib (0..7) of an IQ4_XS block.
/// @param scales_l the block's 4 bytes scales_l
/// @param scales_h its scales_h
/// @param ib the group
inline int iq4xs_scale(const std::uint8_t* scales_l, std::uint16_t scales_h, int ib) {
  return ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
}

/// Dequantizes one IQ4_XS block into its 256 floats.
/// @param b the block
/// @param y destination of 256 floats
inline void dequantize_block(const BlockIQ4_XS& b, float* y) {
  const float d = fp16_to_float(b.d);
  const std::uint8_t* qs = b.qs;
  for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
    const float dl = d * static_cast<float>(iq4xs_scale(b.scales_l, b.scales_h, ib) - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

namespace detail {

/// IQ4_XS traits (see QuantTraits): IQ4_NL values with a 6-bit scale per 32 values.
template <>
struct QuantTraits<GgmlType::kIQ4_XS> : BlockTraits<BlockIQ4_XS, 256> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* /*acc_s*/) {
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    const std::uint16_t sh = load_u16(blk + offsetof(Block, scales_h));
    const std::uint8_t* scales_l = blk + offsetof(Block, scales_l);
    for (int c = 0; c < 8; ++c) {
      const __m256i v = iq4nl_values_avx2(blk + offsetof(Block, qs) + 16 * c);
      acc_signed_avx2<NT>(v, a, c0 + c, d * static_cast<float>(iq4xs_scale(scales_l, sh, c) - 32), acc);
    }
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
