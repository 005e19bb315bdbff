#pragma once
/// @file llama/quant/dequantize.hpp
/// @brief Conversion of stored ggml values to float: `dequantize_row` for F32, F16, BF16 and the
/// block types of type_list.hpp (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
/// IQ4_NL, IQ4_XS), bit-exact with llama.cpp's `dequantize_row_*` (ggml-quants.c) and the gguf
/// Python package's `gguf.quants.dequantize`. Each block type's layout and formula are in its own
/// header (quant/q4_0.hpp, ...; little-endian, `half` is IEEE binary16).
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
#include <string>

#include "depthkv/error.hpp"
#include "depthkv/llama/quant/ggml_type.hpp"
#include "depthkv/llama/quant/type_list.hpp"

namespace depthkv {
namespace llama {

namespace detail {

/// Dequantizes `n_blocks` consecutive blocks of type T at `src` (any alignment) into `y`.
template <GgmlType T>
inline void dequantize_blocks(const std::uint8_t* src, std::int64_t n_blocks, float* y) {
  using Traits = QuantTraits<T>;
  using Block = typename Traits::Block;
  for (std::int64_t i = 0; i < n_blocks; ++i) {
    Block b;
    std::memcpy(&b, src + i * static_cast<std::int64_t>(sizeof(Block)), sizeof(Block));
    Traits::dequantize(b, y + i * Traits::kValues);
  }
}

/// Converts n stored 16-bit floats at p (any alignment) with Conv (half or bfloat16).
template <float (*Conv)(std::uint16_t)>
inline void convert_u16_row(const std::uint8_t* p, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = Conv(h);
  }
}

}  // namespace detail

/// @param type a ggml type number
/// @return true for the types `dequantize_row` converts: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
///   Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS
inline bool ggml_type_dequantizable(std::uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return detail::ggml_type_in(detail::FloatTypes{}, t) || detail::ggml_type_in(detail::BlockTypes{}, t);
}

/// The names of the types `dequantize_row` converts, for error messages.
inline const char* ggml_dequantizable_names() {
  static const std::string names =
      detail::ggml_type_names(detail::FloatTypes{}) + ", " + detail::ggml_type_names(detail::BlockTypes{});
  return names.c_str();
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
  if (type == GgmlType::kF32) {
    if (n > 0) std::memcpy(dst, p, static_cast<std::size_t>(n) * sizeof(float));
  } else if (type == GgmlType::kF16) {
    detail::convert_u16_row<fp16_to_float>(p, dst, n);
  } else if (type == GgmlType::kBF16) {
    detail::convert_u16_row<bf16_to_float>(p, dst, n);
  } else {
    detail::visit_ggml_type(detail::BlockTypes{}, type, [&](auto tag) {
      constexpr GgmlType kType = decltype(tag)::value;
      detail::dequantize_blocks<kType>(p, n / detail::QuantTraits<kType>::kValues, dst);
    });
  }
}

}  // namespace llama
}  // namespace depthkv
