#pragma once
/// @file llama/quant/ggml_type.hpp
/// @brief ggml tensor type numbers (as stored in GGUF tensor infos), their block layouts and
/// names, and exact half / bfloat16 to float conversion.
///
/// A tensor of a block type stores each row as `ne[0] / block_size` consecutive blocks of
/// `type_size` bytes; plain types (F32, F16, BF16, ...) have block_size 1.
///
/// @code
/// depthkv::llama::GgmlTypeInfo info{};
/// if (depthkv::llama::ggml_type_info(12, info)) { /* info.name "Q4_K", 256 values in 144 bytes */ }
/// @endcode

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace depthkv {
namespace llama {

/// ggml tensor type numbers (ggml.h's `enum ggml_type`; the numbers are part of the GGUF format).
/// Which of them depthkv converts to float: see `ggml_type_dequantizable` (quant/dequantize.hpp).
enum class GgmlType : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

/// Block layout of a ggml tensor type.
struct GgmlTypeInfo {
  const char* name;          ///< e.g. "Q4_K"
  std::uint32_t block_size;  ///< elements per block (1 for plain types)
  std::uint32_t type_size;   ///< bytes per block
};

/// @param type a ggml type number as stored in GGUF tensor infos
/// @param out its layout when known
/// @return true when the type is known (its size can be computed)
inline bool ggml_type_info(std::uint32_t type, GgmlTypeInfo& out) {
  struct Entry {
    std::uint32_t id;
    GgmlTypeInfo info;
  };
  static const Entry table[] = {
      {0, {"F32", 1, 4}},         {1, {"F16", 1, 2}},        {2, {"Q4_0", 32, 18}},     {3, {"Q4_1", 32, 20}},
      {6, {"Q5_0", 32, 22}},      {7, {"Q5_1", 32, 24}},     {8, {"Q8_0", 32, 34}},     {9, {"Q8_1", 32, 36}},
      {10, {"Q2_K", 256, 84}},    {11, {"Q3_K", 256, 110}},  {12, {"Q4_K", 256, 144}},  {13, {"Q5_K", 256, 176}},
      {14, {"Q6_K", 256, 210}},   {15, {"Q8_K", 256, 292}},  {16, {"IQ2_XXS", 256, 66}}, {17, {"IQ2_XS", 256, 74}},
      {18, {"IQ3_XXS", 256, 98}}, {19, {"IQ1_S", 256, 50}},  {20, {"IQ4_NL", 32, 18}},  {21, {"IQ3_S", 256, 110}},
      {22, {"IQ2_S", 256, 82}},   {23, {"IQ4_XS", 256, 136}}, {24, {"I8", 1, 1}},        {25, {"I16", 1, 2}},
      {26, {"I32", 1, 4}},        {27, {"I64", 1, 8}},       {28, {"F64", 1, 8}},       {29, {"IQ1_M", 256, 56}},
      {30, {"BF16", 1, 2}},       {34, {"TQ1_0", 256, 54}},  {35, {"TQ2_0", 256, 66}},  {39, {"MXFP4", 32, 17}},
  };
  for (const Entry& e : table) {
    if (e.id == type) {
      out = e.info;
      return true;
    }
  }
  return false;
}

/// @param type a ggml type
/// @param out its layout when known
/// @return true when the type is known
inline bool ggml_type_info(GgmlType type, GgmlTypeInfo& out) { return ggml_type_info(static_cast<std::uint32_t>(type), out); }

/// @param type a ggml type number
/// @return its name ("Q4_K"), or "type N" when unknown
inline std::string ggml_type_name(std::uint32_t type) {
  GgmlTypeInfo info{};
  return ggml_type_info(type, info) ? std::string(info.name) : "type " + std::to_string(type);
}

/// @param type a ggml type
/// @return its name ("Q4_K"), or "type N" when unknown
inline std::string ggml_type_name(GgmlType type) { return ggml_type_name(static_cast<std::uint32_t>(type)); }

/// IEEE half (binary16) bits to float, exact (subnormals, infinities and NaNs included).
/// @param h the half's bits
/// @return its value
inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal, exact
    return sign ? -v : v;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// bfloat16 bits to float (exact).
/// @param b the bfloat16's bits
/// @return its value
inline float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace llama
}  // namespace depthkv
