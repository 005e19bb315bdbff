#pragma once
/// @file llama/quant/type_list.hpp
/// @brief The quantized block types depthkv converts and multiplies (one header each, with the
/// block's layout, its conversion to float and its product kernels as `detail::QuantTraits`),
/// listed once in `detail::BlockTypes`; the float types F32, F16, BF16 in `detail::FloatTypes`.
///
/// Adding a block type X whose ggml number and size are in ggml_type.hpp's table:
/// 1. Write `quant/x.hpp` (copy the closest existing type): `struct BlockX`, the stored layout
///    with a static_assert on its size; `dequantize_block(const BlockX&, float*)`, bit-exact with
///    llama.cpp's `dequantize_row_x`; and `detail::QuantTraits<GgmlType::kX>`, derived from
///    `detail::BlockTraits<BlockX, values per block>` (`Block`, `kValues`, `kQ8K`, `dequantize`),
///    with the AVX2 block kernel `dot_q8_avx2<NT>` (and `dot_q8k_avx2<NT>` when `kQ8K`), built
///    from the shared pieces of block_kernels.hpp.
/// 2. Include it below and add `GgmlType::kX` to `BlockTypes`.
/// Everything else follows from the list: `dequantize_row`, `ggml_type_dequantizable` and its
/// list of names, the scalar and AVX2 products of every kernel (quant/products.hpp) and kAuto's
/// choice. Add the type to the reference vectors of tests/llama/quant (make_quant_vectors.py).
///
/// @code
/// bool known = false;
/// depthkv::llama::detail::visit_ggml_type(depthkv::llama::detail::BlockTypes{}, type, [&](auto tag) {
///   known = depthkv::llama::detail::QuantTraits<decltype(tag)::value>::kValues > 0;
/// });
/// @endcode

#include <string>
#include <type_traits>

#include "depthkv/llama/quant/ggml_type.hpp"
#include "depthkv/llama/quant/iq4_nl.hpp"
#include "depthkv/llama/quant/iq4_xs.hpp"
#include "depthkv/llama/quant/q2_k.hpp"
#include "depthkv/llama/quant/q3_k.hpp"
#include "depthkv/llama/quant/q4_0.hpp"
#include "depthkv/llama/quant/q4_1.hpp"
#include "depthkv/llama/quant/q4_k.hpp"
#include "depthkv/llama/quant/q5_0.hpp"
#include "depthkv/llama/quant/q5_1.hpp"
#include "depthkv/llama/quant/q5_k.hpp"
#include "depthkv/llama/quant/q6_k.hpp"
#include "depthkv/llama/quant/q8_0.hpp"

namespace depthkv {
namespace llama {
namespace detail {

/// A compile-time list of ggml types.
template <GgmlType... Ts>
struct GgmlTypeList {};

/// The quantized block types (each with a QuantTraits), in the order error messages list them.
using BlockTypes = GgmlTypeList<GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                                GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS>;

/// The float types (one value per element, converted in registers; no QuantTraits).
using FloatTypes = GgmlTypeList<GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16>;

/// The type T as a value `fn` can read at compile time (`decltype(tag)::value`).
template <GgmlType T>
using GgmlTypeTag = std::integral_constant<GgmlType, T>;

/// Calls `fn(GgmlTypeTag<T>{})` for the T of the list equal to `type`.
/// @param type a ggml type
/// @param fn a generic callable
/// @return true when `type` is in the list (fn was called)
template <class Fn, GgmlType... Ts>
inline bool visit_ggml_type(GgmlTypeList<Ts...>, GgmlType type, Fn&& fn) {
  return ((type == Ts ? (fn(GgmlTypeTag<Ts>{}), true) : false) || ...);
}

/// @param type a ggml type
/// @return whether `type` is in the list
template <GgmlType... Ts>
inline constexpr bool ggml_type_in(GgmlTypeList<Ts...>, GgmlType type) {
  return ((type == Ts) || ...);
}

/// @param type a ggml type
/// @return whether `type` is a block type of the list whose traits have the per-256 kernel
template <GgmlType... Ts>
inline constexpr bool ggml_type_q8k(GgmlTypeList<Ts...>, GgmlType type) {
  return ((type == Ts && QuantTraits<Ts>::kQ8K) || ...);
}

/// @return the names of the list's types, separated by ", "
template <GgmlType... Ts>
inline std::string ggml_type_names(GgmlTypeList<Ts...>) {
  std::string s;
  ((s += (s.empty() ? "" : ", ") + ggml_type_name(Ts)), ...);
  return s;
}

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
