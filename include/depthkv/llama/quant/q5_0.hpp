#pragma once
/// @file llama/quant/q5_0.hpp
/// @brief Q5_0 (32 values, 22 bytes): half d; uint32 qh (bit j: 5th bit of value j); 16 bytes of
/// nibbles. x = ((q | h << 4) - 16) * d.
///
/// @code
/// depthkv::llama::BlockQ5_0 b{};   // read from a tensor
/// float y[32];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q5_0: 32 values, scale d, 5th bits in qh, 5-bit values offset by 16.
struct BlockQ5_0 {
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22, "ggml Q5_0 block size");

/// Dequantizes one Q5_0 block into its 32 floats.
/// @param b the block
/// @param y destination of 32 floats
inline void dequantize_block(const BlockQ5_0& b, float* y) {
  const float d = fp16_to_float(b.d);
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>(((b.qs[j] & 0xF) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((b.qs[j] >> 4) | h1) - 16) * d;
  }
}

namespace detail {

/// Q5_0 traits (see QuantTraits): unsigned 5-bit codes, the offset 16 through the activation sums.
template <>
struct QuantTraits<GgmlType::kQ5_0> : BlockTraits<BlockQ5_0, 32> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    const __m256i u = nibbles5_avx2(blk + offsetof(Block, qs), blk + offsetof(Block, qh));
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    acc_unsigned_avx2<NT>(u, a, c0, d, acc);
    for (int t = 0; t < NT; ++t) {  // minus the offset 16 of the codes: d * 16 * (d_x * sum of q_x)
      const ActQ8& x = a[t][c0];
      const float s = static_cast<float>(static_cast<int>(x.s[0]) + x.s[1]) * x.d;
      acc_s[t] -= d * 16.0f * s;
    }
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
