#pragma once
/// @file detail/select_common.hpp
/// @brief Selection logic shared by the CPU evictor and the CUDA kernels (host/device).
///
/// The one ranking rule of depthkv: token a ranks before token b when its score is higher, or
/// when the scores are equal and a's position is earlier ("equal scores: the earlier position
/// stays"). -0.0 and +0.0 are equal scores. NaN scores are rejected before selection.

#include <cstdint>
#include <cstring>

#include "depthkv/config.hpp"

namespace depthkv {
namespace detail {

/// Bit pattern of a float (memcpy, so it is well defined on host and device).
DEPTHKV_HOST_DEVICE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/// Order-preserving key: a > b (as floats, not NaN) iff key(a) > key(b) (as unsigned).
/// -0.0 maps to the key of +0.0 so equal scores get equal keys.
DEPTHKV_HOST_DEVICE std::uint32_t ordered_key(float f) {
  std::uint32_t u = float_bits(f);
  if (u == 0x80000000u) u = 0u;  // -0.0 -> +0.0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/// Order-preserving key of a 16-bit float bit pattern (IEEE half or bfloat16: both are
/// sign-magnitude), -0 mapped to +0.
DEPTHKV_HOST_DEVICE std::uint16_t ordered_key16(std::uint16_t u) {
  if (u == 0x8000u) u = 0u;
  return (u & 0x8000u) ? static_cast<std::uint16_t>(~u) : static_cast<std::uint16_t>(u | 0x8000u);
}

/// Bit patterns of +infinity of the 16-bit float formats (both sign-magnitude: `u & 0x7FFF` is the
/// magnitude, NaNs are the magnitudes above infinity).
constexpr std::uint16_t kHalfInfBits = 0x7C00u;      ///< IEEE half (`Eigen::half`, `__half`)
constexpr std::uint16_t kBFloat16InfBits = 0x7F80u;  ///< bfloat16 (`Eigen::bfloat16`, `__nv_bfloat16`)

/// True when the 16-bit float pattern `u` is a NaN in the format whose +infinity pattern is
/// `inf_bits` (kHalfInfBits or kBFloat16InfBits). A bit test: safe under -ffast-math.
DEPTHKV_HOST_DEVICE bool is_nan16(std::uint16_t u, std::uint16_t inf_bits) {
  return (static_cast<std::uint32_t>(u) & 0x7FFFu) > inf_bits;
}

/// True when the token (score_a, pos_a) ranks before (score_b, pos_b): a higher score, or an
/// equal score and an earlier position.
DEPTHKV_HOST_DEVICE bool ranks_before(float score_a, std::int32_t pos_a, float score_b,
                                      std::int32_t pos_b) {
  const std::uint32_t ka = ordered_key(score_a), kb = ordered_key(score_b);
  return ka > kb || (ka == kb && pos_a < pos_b);
}

/// Number of protected slots in a row of `n` tokens: the first `n_sink` and the last
/// `n_recent` slots (overlaps counted once).
DEPTHKV_HOST_DEVICE int protected_count(int n, int n_sink, int n_recent) {
  const int s = n_sink < n ? n_sink : n;
  const int r = n_recent < n ? n_recent : n;
  return (s + r < n) ? s + r : n;
}

/// True when slot `slot` of a row of `n` tokens is protected (a sink or in the recent window).
DEPTHKV_HOST_DEVICE bool is_protected(int slot, int n, int n_sink, int n_recent) {
  return slot < n_sink || slot >= n - n_recent;
}

}  // namespace detail
}  // namespace depthkv
