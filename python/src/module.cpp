// depthkv._core: the nanobind module over the depthkv headers (the pure-Python package
// python/depthkv/ wraps it). depthkv::Error is raised as depthkv.Error, a ValueError subclass,
// with depthkv::Error::message() as its text.

#include <Python.h>

#include "common.hpp"
#include "error_translator.hpp"

NB_MODULE(_core, m) {
  m.doc() = "depthkv's C++ library (header-only) bound with nanobind; use the depthkv package";
  PyObject* error = PyErr_NewExceptionWithDoc(
      "depthkv.Error", "Invalid input to depthkv: the message of the C++ library's depthkv::Error.", PyExc_ValueError,
      nullptr);
  if (error == nullptr) throw nanobind::python_error();
  m.attr("Error") = nanobind::steal(error);
  depthkv_py::raise_errors_as(error);
  depthkv_py::bind_profile(m);
  depthkv_py::bind_select(m);
  depthkv_py::bind_scorer(m);
  depthkv_py::bind_profiler(m);
#ifdef DEPTHKV_PY_ENGINE
  depthkv_py::bind_engine(m);
#endif
}
