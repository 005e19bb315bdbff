#pragma once
/// @file llama/quant/q4_1.hpp
/// @brief Q4_1 (32 values, 20 bytes): half d, m; 16 bytes of nibbles. x = q * d + m.
///
/// @code
/// depthkv::llama::BlockQ4_1 b{};   // read from a tensor
/// float y[32];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q4_1: 32 values, scale d and minimum m (halves), 4-bit values.
struct BlockQ4_1 {
  std::uint16_t d, m;
  std::uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20, "ggml Q4_1 block size");

/// Dequantizes one Q4_1 block into its 32 floats.
/// @param b the block
/// @param y destination of 32 floats
inline void dequantize_block(const BlockQ4_1& b, float* y) {
  const float d = fp16_to_float(b.d), m = fp16_to_float(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}

namespace detail {

/// Q4_1 traits (see QuantTraits): unsigned codes, the minimum through the activation sums.
template <>
struct QuantTraits<GgmlType::kQ4_1> : BlockTraits<BlockQ4_1, 32> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    const __m256i u = nibbles_avx2(blk + offsetof(Block, qs));
    const float d = half_avx2(load_u16(blk + offsetof(Block, d)));
    acc_unsigned_avx2<NT>(u, a, c0, d, acc);
    acc_sum_avx2<NT>(a, c0, half_avx2(load_u16(blk + offsetof(Block, m))), acc_s);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
