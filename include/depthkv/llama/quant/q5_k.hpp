#pragma once
/// @file llama/quant/q5_k.hpp
/// @brief Q5_K (256 values, 176 bytes): as Q4_K plus 32 bytes qh (bit 2i / 2i+1 of qh[l]: 5th
/// bit of value l of the low / high nibbles of 64-value group i), before the nibbles.
/// x = (d * sc) * (q + 16 h) - (dmin * m).
///
/// @code
/// depthkv::llama::BlockQ5_K b{};   // read from a tensor
/// float y[256];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"
#include "depthkv/llama/quant/q4_k.hpp"

namespace depthkv {
namespace llama {

/// Q5_K: Q4_K plus a 5th bit per value in qh.
struct BlockQ5_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[32];
  std::uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176, "ggml Q5_K block size");

/// Dequantizes one Q5_K block into its 256 floats.
/// @param b the block
/// @param y destination of 256 floats
inline void dequantize_block(const BlockQ5_K& b, float* y) {
  const float d = fp16_to_float(b.d), dmin = fp16_to_float(b.dmin);
  const std::uint8_t* ql = b.qs;
  for (int j = 0; j < 4; ++j, ql += 32) {
    float d1, m1, d2, m2;
    q4k_group(2 * j, b.scales, d, dmin, d1, m1);
    q4k_group(2 * j + 1, b.scales, d, dmin, d2, m2);
    const int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
    for (int l = 0; l < 32; ++l)
      y[l] = d1 * static_cast<float>((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      y[32 + l] = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
    y += 64;
  }
}

namespace detail {

/// Q5_K traits (see QuantTraits): the Q4_K kernels with the fifth bit plane.
template <>
struct QuantTraits<GgmlType::kQ5_K> : BlockTraits<BlockQ5_K, 256, true> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* acc_s) {
    q45k_dot_q8_avx2<Block, true, NT>(blk, a, c0, acc, acc_s);
  }
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8k_avx2(const std::uint8_t* blk, const ActQ8K* const* a, std::int64_t i,
                                              __m256* acc) {
    q45k_dot_q8k_avx2<Block, true, NT>(blk, a, i, acc);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
