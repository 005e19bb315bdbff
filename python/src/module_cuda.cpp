// depthkv._cuda: the library's CUDA kernels on CUDA arrays (see bind_cuda*.cpp); depthkv::Error
// is raised as depthkv._core's depthkv.Error, so one exception type serves both modules.

#include "cuda_bind_common.hpp"
#include "error_translator.hpp"

NB_MODULE(_cuda, m) {
  m.doc() = "depthkv's CUDA kernels bound with nanobind; use depthkv.cuda";
  nanobind::object error = nanobind::module_::import_("depthkv._core").attr("Error");
  m.attr("Error") = error;
  depthkv_py::raise_errors_as(error.release().ptr());  // one reference kept for the translator
  depthkv_py::bind_cuda_scores(m);
  depthkv_py::bind_cuda_evict(m);
  depthkv_py::bind_cuda_paged(m);
}
