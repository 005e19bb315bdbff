#pragma once
/// @file llama/quant/q5_1.hpp
/// @brief Q5_1 (32 values, 24 bytes): half d, m; uint32 qh (bit j: 5th bit of value j); 16 bytes
/// of nibbles. x = (q | h << 4) * d + m.
///
/// @code
/// depthkv::llama::BlockQ5_1 b{};   // read from a tensor
/// float y[32];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q5_1: 32 values, scale d, minimum m, 5th bits in qh.
struct BlockQ5_1 {
  std::uint16_t d, m;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24, "ggml Q5_1 block size");

/// Dequantizes one Q5_1 block into its 32 floats.
/// @param b the block
/// @param y destination of 32 floats
inline void dequantize_block(const BlockQ5_1& b, float* y) {
  const float d = fp16_to_float(b.d), m = fp16_to_float(b.m);
  std::uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
    const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>((b.qs[j] & 0xF) | h0) * d + m;
    y[j + 16] = static_cast<float>((b.qs[j] >> 4) | h1) * d + m;
  }
}

namespace detail {

/// Q5_1 traits (see QuantTraits): unsigned 5-bit codes, the minimum through the activation sums.
template <>
struct QuantTraits<GgmlType::kQ5_1> : BlockTraits<BlockQ5_1, 32> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    const __m256i u = nibbles5_avx2(blk + offsetof(Block, qs), blk + offsetof(Block, qh));
    acc_unsigned_avx2<NT>(u, a, c0, half_avx2(load_u16(blk + offsetof(Block, d))), acc);
    acc_sum_avx2<NT>(a, c0, half_avx2(load_u16(blk + offsetof(Block, m))), acc_s);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
