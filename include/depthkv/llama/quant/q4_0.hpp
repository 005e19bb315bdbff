#pragma once
/// @file llama/quant/q4_0.hpp
/// @brief Q4_0 (32 values, 18 bytes): half d; 16 bytes of nibbles.
/// x[j] = (lo(qs[j]) - 8) * d, x[j + 16] = (hi(qs[j]) - 8) * d.
///
/// @code
/// depthkv::llama::BlockQ4_0 b{};   // read from a tensor
/// float y[32];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q4_0: 32 values, scale d (half), 4-bit values offset by 8.
struct BlockQ4_0 {
  std::uint16_t d;
  std::uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18, "ggml Q4_0 block size");

/// Dequantizes one Q4_0 block into its 32 floats.
/// @param b the block
/// @param y destination of 32 floats
inline void dequantize_block(const BlockQ4_0& b, float* y) {
  const float d = fp16_to_float(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
  }
}

namespace detail {

/// Q4_0 traits (see QuantTraits): signed codes q - 8, one scale per block.
template <>
struct QuantTraits<GgmlType::kQ4_0> : BlockTraits<BlockQ4_0, 32> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* /*acc_s*/) {
    const __m256i v = _mm256_sub_epi8(nibbles_avx2(blk + 2), _mm256_set1_epi8(8));
    acc_signed_avx2<NT>(v, a, c0, half_avx2(load_u16(blk)), acc);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
