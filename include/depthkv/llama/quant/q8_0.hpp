#pragma once
/// @file llama/quant/q8_0.hpp
/// @brief Q8_0 (32 values, 34 bytes): half d; 32 int8. x = q * d.
///
/// @code
/// depthkv::llama::BlockQ8_0 b{};   // read from a tensor
/// float y[32];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// Q8_0: 32 values, scale d, int8 values.
struct BlockQ8_0 {
  std::uint16_t d;
  std::int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml Q8_0 block size");

/// Dequantizes one Q8_0 block into its 32 floats.
/// @param b the block
/// @param y destination of 32 floats
inline void dequantize_block(const BlockQ8_0& b, float* y) {
  const float d = fp16_to_float(b.d);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

namespace detail {

/// Q8_0 traits (see QuantTraits): signed int8 codes, one scale per block.
template <>
struct QuantTraits<GgmlType::kQ8_0> : BlockTraits<BlockQ8_0, 32> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* /*acc_s*/) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    acc_signed_avx2<NT>(v, a, c0, half_avx2(load_u16(blk)), acc);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
