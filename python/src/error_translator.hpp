#pragma once
/// @file error_translator.hpp
/// @brief depthkv::Error raised in Python as one exception type: `raise_errors_as(error)`
/// registers a nanobind exception translator that sets `error` (depthkv.Error, made by
/// depthkv._core and shared by depthkv._cuda) with `depthkv::Error::message()` as its text.

#include <exception>

#include <nanobind/nanobind.h>

#include "depthkv/error.hpp"

namespace depthkv_py {

/// Registers the translator of depthkv::Error into `error` (a borrowed reference the module keeps
/// alive as its attribute "Error").
inline void raise_errors_as(PyObject* error) {
  nanobind::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const depthkv::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(payload), e.message().c_str());
        }
      },
      error);
}

}  // namespace depthkv_py
