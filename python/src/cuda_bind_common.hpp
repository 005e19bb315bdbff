#pragma once
/// @file cuda_bind_common.hpp
/// @brief What the binding files of depthkv._cuda share: the checks of arrays in CUDA memory
/// (device, dtype, shape, C-contiguity) and of the buffers the Python side allocates; each
/// failure a `depthkv::Error` naming the function and the argument.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common.hpp"
#include "cuda_launch.hpp"

namespace depthkv_py {

/// Throws depthkv::Error with `func`'s name when a launch returned a CUDA error.
inline void check_launch(const char* func, const std::string& error) {
  DEPTHKV_CHECK_AS(func, error.empty(), "CUDA: " << error);
}

/// Checks that `a` is a C-contiguous array in the memory of CUDA device `device` (-1: any) with
/// `ndim` dimensions (0: at least 1).
inline void check_cuda_array(const AnyArray& a, const char* func, const char* what, int device, std::size_t ndim) {
  DEPTHKV_CHECK_AS(func, a.device_type() == nb::device::cuda::value,
                   what << " must be in CUDA memory (a CUDA tensor), got "
                        << (a.device_type() == nb::device::cpu::value ? std::string("host (CPU) memory")
                                                                      : "device type " + std::to_string(a.device_type())));
  DEPTHKV_CHECK_AS(func, device < 0 || a.device_id() == device,
                   what << " is on CUDA device " << a.device_id() << ", the other arrays on device " << device);
  DEPTHKV_CHECK_AS(func, ndim == 0 ? a.ndim() >= 1 : a.ndim() == ndim,
                   what << " must have " << (ndim == 0 ? std::string("at least 1") : std::to_string(ndim))
                        << " dimension(s), got " << a.ndim());
  std::int64_t expect = 1;
  for (std::size_t d = a.ndim(); d-- > 0;) {
    DEPTHKV_CHECK_AS(func, a.shape(d) <= 1 || a.stride(d) == expect,
                     what << " must be C-contiguous (dimension " << d << " has stride " << a.stride(d) << ", expected "
                          << expect << "): pass " << what << ".contiguous()");
    expect *= static_cast<std::int64_t>(a.shape(d));
  }
}

inline cuda::Elem elem_of(const AnyArray& a, const char* func, const char* what) {
  const nb::dlpack::dtype t = a.dtype();
  if (t == nb::dtype<float>()) return cuda::Elem::kF32;
  const bool b16 = t.lanes == 1 && t.bits == 16;
  if (b16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)) return cuda::Elem::kF16;
  if (b16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat)) return cuda::Elem::kBF16;
  DEPTHKV_CHECK_AS(func, false, what << " must be float32, float16 or bfloat16, got " << dtype_name(t));
}

inline void check_dtype(const AnyArray& a, nb::dlpack::dtype t, const char* func, const char* what) {
  DEPTHKV_CHECK_AS(func, a.dtype() == t, what << " must be " << dtype_name(t) << ", got " << dtype_name(a.dtype()));
}

/// The device word of a status argument (int32 or uint32 with at least one element).
inline std::uint32_t* status_word(const AnyArray& s, const char* func, int device) {
  check_cuda_array(s, func, "status", device, 1);
  DEPTHKV_CHECK_AS(func, s.shape(0) >= 1 && s.dtype().bits == 32 && s.dtype().lanes == 1 &&
                             (s.dtype().code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
                              s.dtype().code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt)),
                   "status must be an int32 or uint32 array of at least 1 element");
  return static_cast<std::uint32_t*>(const_cast<void*>(s.data()));
}

/// A uint8 device buffer of at least `bytes` bytes.
inline void* byte_buffer(const AnyArray& b, const char* func, const char* what, int device, std::size_t bytes) {
  check_cuda_array(b, func, what, device, 1);
  DEPTHKV_CHECK_AS(func, b.dtype() == nb::dtype<std::uint8_t>() && b.shape(0) >= bytes,
                   what << " must be a uint8 array of at least " << bytes << " bytes");
  return const_cast<void*>(b.data());
}

inline int to_int(std::size_t v, const char* func, const char* what) {
  DEPTHKV_CHECK_AS(func, v <= 0x7fffffffu, what << " = " << v << " is above 2^31 - 1");
  return static_cast<int>(v);
}

/// Registers device_count, h2o_accumulate, snapkv_workspace_bytes and snapkv_scores.
void bind_cuda_scores(nb::module_& m);
/// Registers evict_workspace_bytes, evict_row_bytes and evict.
void bind_cuda_evict(nb::module_& m);
/// Registers paged_head_bytes and paged_compact.
void bind_cuda_paged(nb::module_& m);

}  // namespace depthkv_py
