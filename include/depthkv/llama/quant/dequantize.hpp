#pragma once
/// @file llama/quant/dequantize.hpp
/// @brief The ggml block formats F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
/// Q5_K, Q6_K, IQ4_NL and IQ4_XS, and their conversion to float, bit-exact with llama.cpp's
/// `dequantize_row_*` (ggml-quants.c) and the gguf Python package's `gguf.quants.dequantize`.
///
/// Layouts (little-endian; `half` is IEEE binary16; x = the 32 or 256 values of a block):
/// - Q4_0 (32 values, 18 bytes): half d; 16 bytes of nibbles. x[j] = (lo(qs[j]) - 8) * d,
///   x[j + 16] = (hi(qs[j]) - 8) * d.
/// - Q4_1 (32, 20): half d, m; 16 bytes of nibbles. x = q * d + m.
/// - Q5_0 (32, 22): half d; uint32 qh (bit j: 5th bit of value j); 16 bytes of nibbles.
///   x = (q | h << 4) - 16) * d.
/// - Q5_1 (32, 24): half d, m; uint32 qh; nibbles. x = (q | h << 4) * d + m.
/// - Q8_0 (32, 34): half d; 32 int8. x = q * d.
/// - Q2_K (256, 84): 16 bytes scales (low nibble scale, high nibble min of each 16 values);
///   64 bytes of 2-bit values; half d, dmin. Each 128 values use 32 bytes: 4 shifts (0, 2, 4, 6)
///   x 32 bytes, each 16-byte half with its own scale. x = (d * sc) * q - (dmin * m).
/// - Q3_K (256, 110): 32 bytes hmask (the 3rd bit, one bit plane per 32 values); 64 bytes of
///   2-bit values (laid out as Q2_K); 12 bytes of 16 packed 6-bit scales (low nibbles in bytes
///   0-7, high 2 bits in bytes 8-11); half d. x = (d * (sc - 32)) * (q - (hbit ? 0 : 4)).
/// - Q4_K (256, 144): half d, dmin; 12 bytes of 8 packed 6-bit (scale, min) pairs; 128 bytes of
///   nibbles, each 64 values from 32 bytes (low nibbles first). x = (d * sc) * q - (dmin * m).
/// - Q5_K (256, 176): as Q4_K plus 32 bytes qh (bit 2i / 2i+1 of qh[l]: 5th bit of value l of
///   the low / high nibbles of 64-value group i), before the nibbles.
/// - Q6_K (256, 210): 128 bytes low nibbles; 64 bytes of high 2-bit pairs; 16 int8 scales; half
///   d. x = (d * sc) * (q - 32).
/// - IQ4_NL (32, 18): half d; nibbles indexing the non-linear table `kIq4nlValues`. x = d * v.
/// - IQ4_XS (256, 136): half d; uint16 scales_h; 4 bytes scales_l (8 6-bit scales, one per 32
///   values); 128 bytes of IQ4_NL nibbles. x = (d * (sc - 32)) * v.
///
/// Bit-exactness holds when the compiler does not contract `a * b - c` into a fused
/// multiply-add (the default without `-mfma`/`-march=...`; or `-ffp-contract=off`).
///
/// @code
/// std::vector<float> row(4096);
/// depthkv::llama::dequantize_row(depthkv::llama::GgmlType::kQ4_K, bytes, row.data(), 4096);
/// @endcode

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "depthkv/error.hpp"
#include "depthkv/llama/quant/ggml_type.hpp"

namespace depthkv {
namespace llama {

/// Q4_0: 32 values, scale d (half), 4-bit values offset by 8.
struct BlockQ4_0 {
  std::uint16_t d;
  std::uint8_t qs[16];
};
/// Q4_1: 32 values, scale d and minimum m (halves), 4-bit values.
struct BlockQ4_1 {
  std::uint16_t d, m;
  std::uint8_t qs[16];
};
/// Q5_0: 32 values, scale d, 5th bits in qh, 5-bit values offset by 16.
struct BlockQ5_0 {
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
/// Q5_1: 32 values, scale d, minimum m, 5th bits in qh.
struct BlockQ5_1 {
  std::uint16_t d, m;
  std::uint8_t qh[4];
  std::uint8_t qs[16];
};
/// Q8_0: 32 values, scale d, int8 values.
struct BlockQ8_0 {
  std::uint16_t d;
  std::int8_t qs[32];
};
/// Q2_K: 256 values in 16 groups of 16 with 4-bit scales and mins.
struct BlockQ2_K {
  std::uint8_t scales[16];
  std::uint8_t qs[64];
  std::uint16_t d, dmin;
};
/// Q3_K: 256 values in 16 groups of 16 with 6-bit scales, 3rd bit in hmask.
struct BlockQ3_K {
  std::uint8_t hmask[32];
  std::uint8_t qs[64];
  std::uint8_t scales[12];
  std::uint16_t d;
};
/// Q4_K: 256 values in 8 groups of 32 with 6-bit scales and mins.
struct BlockQ4_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qs[128];
};
/// Q5_K: Q4_K plus a 5th bit per value in qh.
struct BlockQ5_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[32];
  std::uint8_t qs[128];
};
/// Q6_K: 256 values in 16 groups of 16 with int8 scales, 6-bit values offset by 32.
struct BlockQ6_K {
  std::uint8_t ql[128];
  std::uint8_t qh[64];
  std::int8_t scales[16];
  std::uint16_t d;
};
/// IQ4_NL: 32 values, scale d, 4-bit indices into `kIq4nlValues`.
struct BlockIQ4_NL {
  std::uint16_t d;
  std::uint8_t qs[16];
};
/// IQ4_XS: 256 values in 8 groups of 32 with 6-bit scales, IQ4_NL indices.
struct BlockIQ4_XS {
  std::uint16_t d;
  std::uint16_t scales_h;
  std::uint8_t scales_l[4];
  std::uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 &&
                  sizeof(BlockQ8_0) == 34 && sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 &&
                  sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
                  sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136,
              "ggml block sizes");

/// The 16 values of IQ4_NL / IQ4_XS indices.
inline constexpr std::int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,   38,  53,  69,  89,  113};

/// Scale and minimum of group j (0..7) of the packed 12-byte Q4_K / Q5_K scales.
inline void q4k_scale_min(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// The 16 signed 6-bit scales (already minus 32) of a Q3_K block.
inline void q3k_scales(const std::uint8_t* packed, int* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (lo | (hi << 4)) - 32;
  }
}

/// @name Dequantization of one block into its 32 or 256 floats
/// @{
inline void dequantize_block(const BlockQ4_0& b, float* y) {
  const float d = fp16_to_float(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
  }
}
inline void dequantize_block(const BlockQ4_1& b, float* y) {
  const float d = fp16_to_float(b.d), m = fp16_to_float(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}
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
inline void dequantize_block(const BlockQ8_0& b, float* y) {
  const float d = fp16_to_float(b.d);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}
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
inline void dequantize_block(const BlockQ4_K& b, float* y) {
  const float d = fp16_to_float(b.d), dmin = fp16_to_float(b.dmin);
  const std::uint8_t* q = b.qs;
  for (int j = 0; j < 4; ++j, q += 32) {
    std::uint8_t sc, m;
    q4k_scale_min(2 * j, b.scales, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    q4k_scale_min(2 * j + 1, b.scales, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    y += 64;
  }
}
inline void dequantize_block(const BlockQ5_K& b, float* y) {
  const float d = fp16_to_float(b.d), dmin = fp16_to_float(b.dmin);
  const std::uint8_t* ql = b.qs;
  for (int j = 0; j < 4; ++j, ql += 32) {
    std::uint8_t sc, m;
    q4k_scale_min(2 * j, b.scales, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    q4k_scale_min(2 * j + 1, b.scales, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
    y += 64;
  }
}
inline void dequantize_block(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_float(b.d);
  const std::uint8_t* ql = b.ql;
  const std::uint8_t* qh = b.qh;
  const std::int8_t* sc = b.scales;
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}
inline void dequantize_block(const BlockIQ4_NL& b, float* y) {
  const float d = fp16_to_float(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[b.qs[j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4nlValues[b.qs[j] >> 4]);
  }
}
inline void dequantize_block(const BlockIQ4_XS& b, float* y) {
  const float d = fp16_to_float(b.d);
  const std::uint8_t* qs = b.qs;
  for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
    const int ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b.scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}
/// @}

namespace detail {

/// Block type of each block format, and its number of values.
template <GgmlType T> struct QuantBlock;
template <> struct QuantBlock<GgmlType::kQ4_0> { using type = BlockQ4_0; static constexpr int kValues = 32; };
template <> struct QuantBlock<GgmlType::kQ4_1> { using type = BlockQ4_1; static constexpr int kValues = 32; };
template <> struct QuantBlock<GgmlType::kQ5_0> { using type = BlockQ5_0; static constexpr int kValues = 32; };
template <> struct QuantBlock<GgmlType::kQ5_1> { using type = BlockQ5_1; static constexpr int kValues = 32; };
template <> struct QuantBlock<GgmlType::kQ8_0> { using type = BlockQ8_0; static constexpr int kValues = 32; };
template <> struct QuantBlock<GgmlType::kQ2_K> { using type = BlockQ2_K; static constexpr int kValues = 256; };
template <> struct QuantBlock<GgmlType::kQ3_K> { using type = BlockQ3_K; static constexpr int kValues = 256; };
template <> struct QuantBlock<GgmlType::kQ4_K> { using type = BlockQ4_K; static constexpr int kValues = 256; };
template <> struct QuantBlock<GgmlType::kQ5_K> { using type = BlockQ5_K; static constexpr int kValues = 256; };
template <> struct QuantBlock<GgmlType::kQ6_K> { using type = BlockQ6_K; static constexpr int kValues = 256; };
template <> struct QuantBlock<GgmlType::kIQ4_NL> { using type = BlockIQ4_NL; static constexpr int kValues = 32; };
template <> struct QuantBlock<GgmlType::kIQ4_XS> { using type = BlockIQ4_XS; static constexpr int kValues = 256; };

/// Dequantizes `n_blocks` consecutive blocks of type T at `src` (any alignment) into `y`.
template <GgmlType T>
inline void dequantize_blocks(const std::uint8_t* src, std::int64_t n_blocks, float* y) {
  using Block = typename QuantBlock<T>::type;
  for (std::int64_t i = 0; i < n_blocks; ++i) {
    Block b;
    std::memcpy(&b, src + i * static_cast<std::int64_t>(sizeof(Block)), sizeof(Block));
    dequantize_block(b, y + i * QuantBlock<T>::kValues);
  }
}

}  // namespace detail

/// @param type a ggml type number
/// @return true for the types `dequantize_row` converts: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
///   Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS
inline bool ggml_type_dequantizable(std::uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16:
    case GgmlType::kQ4_0: case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1: case GgmlType::kQ8_0:
    case GgmlType::kQ2_K: case GgmlType::kQ3_K: case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K:
    case GgmlType::kIQ4_NL: case GgmlType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

/// The names of the types `dequantize_row` converts, for error messages.
inline const char* ggml_dequantizable_names() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";
}

/// @param type a ggml type
/// @param n a number of values
/// @return the bytes `n` values of `type` take
/// @throws Error when the type is unknown or n is not a multiple of its block size
inline std::size_t ggml_row_bytes(GgmlType type, std::int64_t n) {
  GgmlTypeInfo info{};
  DEPTHKV_CHECK(ggml_type_info(type, info), "unknown ggml type " << static_cast<std::uint32_t>(type));
  DEPTHKV_CHECK(n >= 0 && n % info.block_size == 0,
                info.name << " rows hold whole blocks of " << info.block_size << " values, got " << n << " values");
  return static_cast<std::size_t>(n / info.block_size) * info.type_size;
}

/// Converts `n` consecutive values stored as `type` to float, as llama.cpp does.
/// @param type the stored type (see `ggml_type_dequantizable`)
/// @param src the stored bytes (any alignment; `ggml_row_bytes(type, n)` of them)
/// @param dst destination of `n` floats
/// @param n number of values, a multiple of the type's block size
/// @throws Error when the type is not converted or n is not a whole number of blocks
inline void dequantize_row(GgmlType type, const void* src, float* dst, std::int64_t n) {
  DEPTHKV_CHECK(ggml_type_dequantizable(static_cast<std::uint32_t>(type)),
                "ggml type " << ggml_type_name(type) << " is not supported (supported: " << ggml_dequantizable_names()
                             << ")");
  const std::size_t bytes = ggml_row_bytes(type, n);
  (void)bytes;
  const auto* p = static_cast<const std::uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, p, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = fp16_to_float(h);
      }
      return;
    case GgmlType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_float(h);
      }
      return;
    case GgmlType::kQ4_0: return detail::dequantize_blocks<GgmlType::kQ4_0>(p, n / 32, dst);
    case GgmlType::kQ4_1: return detail::dequantize_blocks<GgmlType::kQ4_1>(p, n / 32, dst);
    case GgmlType::kQ5_0: return detail::dequantize_blocks<GgmlType::kQ5_0>(p, n / 32, dst);
    case GgmlType::kQ5_1: return detail::dequantize_blocks<GgmlType::kQ5_1>(p, n / 32, dst);
    case GgmlType::kQ8_0: return detail::dequantize_blocks<GgmlType::kQ8_0>(p, n / 32, dst);
    case GgmlType::kQ2_K: return detail::dequantize_blocks<GgmlType::kQ2_K>(p, n / 256, dst);
    case GgmlType::kQ3_K: return detail::dequantize_blocks<GgmlType::kQ3_K>(p, n / 256, dst);
    case GgmlType::kQ4_K: return detail::dequantize_blocks<GgmlType::kQ4_K>(p, n / 256, dst);
    case GgmlType::kQ5_K: return detail::dequantize_blocks<GgmlType::kQ5_K>(p, n / 256, dst);
    case GgmlType::kQ6_K: return detail::dequantize_blocks<GgmlType::kQ6_K>(p, n / 256, dst);
    case GgmlType::kIQ4_NL: return detail::dequantize_blocks<GgmlType::kIQ4_NL>(p, n / 32, dst);
    case GgmlType::kIQ4_XS: return detail::dequantize_blocks<GgmlType::kIQ4_XS>(p, n / 256, dst);
    default:
      break;
  }
}

}  // namespace llama
}  // namespace depthkv
