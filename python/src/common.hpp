#pragma once
/// @file common.hpp
/// @brief What the binding files of depthkv._core share: the accepted array type, its checks
/// (device, dtype, dimensions, contiguity; each failure a `depthkv::Error`, which the module
/// raises as `depthkv.Error`), and numpy arrays that own a moved-in `std::vector` (no copy).

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "depthkv/error.hpp"

namespace depthkv_py {

namespace nb = nanobind;

/// An array as it arrives from Python (numpy, or anything with DLPack such as a torch tensor):
/// any dtype, device and strides, read-only; the callee checks what it needs.
using AnyArray = nb::ndarray<nb::ro>;

/// "float32", "int64", "bfloat16", ...: a dtype for messages.
inline std::string dtype_name(nb::dlpack::dtype t) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: kind = "dtype" + std::to_string(t.code) + "_"; break;
  }
  std::string out = kind + std::to_string(t.bits);
  if (t.lanes != 1) out += "x" + std::to_string(t.lanes);
  return out;
}

/// Checks that `a` lies in host memory, has 1 or `max_ndim` dimensions, and that its last
/// dimension is contiguous (stride 1; rows may be strided).
/// @param func the public function named in the message (e.g. "select_keep")
/// @param what the argument (e.g. "scores")
/// @throws depthkv::Error naming `func`, `what` and what is wrong
inline void check_host_rows(const AnyArray& a, const char* func, const char* what, std::size_t max_ndim) {
  DEPTHKV_CHECK_AS(func, a.device_type() == nb::device::cpu::value,
                   what << " must be in host (CPU) memory, got device type " << a.device_type()
                        << " (copy it to the CPU first)");
  DEPTHKV_CHECK_AS(func, a.ndim() >= 1 && a.ndim() <= max_ndim,
                   what << " must have 1" << (max_ndim > 1 ? " or 2" : "") << " dimension(s), got " << a.ndim());
  const std::size_t last = a.ndim() - 1;
  DEPTHKV_CHECK_AS(func, a.size() == 0 || a.shape(last) <= 1 || a.stride(last) == 1,  // an empty array: nothing read
                   what << " must be contiguous in its last dimension (stride " << a.stride(last)
                        << " elements): pass numpy.ascontiguousarray(" << what << ")");
}

/// A numpy array that owns `v` (moved onto the heap, freed with the array): no copy.
/// @param shape the array's shape (its product must equal v.size())
template <class T>
nb::object owning_array(std::vector<T>&& v, std::initializer_list<std::size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(heap->data(), shape, owner));
}

/// Registers the profile functions (load_profile, save_profile, Profile, allocate, preset).
void bind_profile(nb::module_& m);
/// Registers select_keep.
void bind_select(nb::module_& m);
/// Registers TokenScorer and keep_tokens.
void bind_scorer(nb::module_& m);
/// Registers profile_from_samples.
void bind_profiler(nb::module_& m);
/// Registers Engine (the model file, its tokenizer and generation on the library's driver);
/// built only when the engine's tokenizers are (the CMake target depthkv::llama, PCRE2).
void bind_engine(nb::module_& m);

}  // namespace depthkv_py
