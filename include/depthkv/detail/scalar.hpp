#pragma once
/// @file detail/scalar.hpp
/// @brief Conversions between float and a storage scalar (`float`, `Eigen::half`,
/// `Eigen::bfloat16`, ...): `static_cast` both ways, the rounding of the scalar type.

namespace depthkv {
namespace detail {

/// `x` rounded to the storage scalar T.
template <typename T>
inline T to_scalar(float x) {
  return static_cast<T>(x);
}

/// The storage scalar `x` as a float.
template <typename T>
inline float to_float(const T& x) {
  return static_cast<float>(x);
}

}  // namespace detail
}  // namespace depthkv
