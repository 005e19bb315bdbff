#pragma once
/// @file llama/quant/iq4_nl.hpp
/// @brief IQ4_NL (32 values, 18 bytes): half d; nibbles indexing the non-linear table
/// `kIq4nlValues`. x = d * v.
///
/// @code
/// depthkv::llama::BlockIQ4_NL b{};   // read from a tensor
/// float y[32];
/// depthkv::llama::dequantize_block(b, y);
/// @endcode

#include <cstdint>

#include "depthkv/llama/quant/block_kernels.hpp"

namespace depthkv {
namespace llama {

/// IQ4_NL: 32 values, scale d, 4-bit indices into `kIq4nlValues`.
struct BlockIQ4_NL {
  std::uint16_t d;
  std::uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18, "ggml IQ4_NL block size");

/// The 16 values of IQ4_NL / IQ4_XS indices.
inline constexpr std::int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};

/// Dequantizes one IQ4_NL block into its 32 floats.
/// @param b the block
/// @param y destination of 32 floats
inline void dequantize_block(const BlockIQ4_NL& b, float* y) {
  const float d = fp16_to_float(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[b.qs[j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4nlValues[b.qs[j] >> 4]);
  }
}

namespace detail {

#if defined(DEPTHKV_AVX2_DISPATCH)
/// The 32 signed values of 16 bytes of IQ4_NL nibbles (ggml order).
DEPTHKV_QUANT_AVX2 inline __m256i iq4nl_values_avx2(const std::uint8_t* nibbles) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
  return _mm256_shuffle_epi8(table, nibbles_avx2(nibbles));
}
#endif

/// IQ4_NL traits (see QuantTraits): signed table values, one scale per block.
template <>
struct QuantTraits<GgmlType::kIQ4_NL> : BlockTraits<BlockIQ4_NL, 32> {
#if defined(DEPTHKV_AVX2_DISPATCH)
  template <int NT>
  DEPTHKV_QUANT_AVX2 static void dot_q8_avx2(const std::uint8_t* blk, const ActQ8* const* a, std::int64_t c0,
                                             __m256* acc, float* /*acc_s*/) {
    acc_signed_avx2<NT>(iq4nl_values_avx2(blk + 2), a, c0, half_avx2(load_u16(blk)), acc);
  }
#endif
};

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
