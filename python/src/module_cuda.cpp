// depthkv._cuda: the library's CUDA kernels on CUDA arrays (see bind_cuda*.cpp); depthkv::Error
// is raised as depthkv._core's depthkv.Error, so one exception type serves both modules.

#include "cuda_bind_common.hpp"

NB_MODULE(_cuda, m) {
  m.doc() = "depthkv's CUDA kernels bound with nanobind; use depthkv.cuda";
  nanobind::object error = nanobind::module_::import_("depthkv._core").attr("Error");
  m.attr("Error") = error;
  nanobind::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const depthkv::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(payload), e.message().c_str());
        }
      },
      error.release().ptr());
  depthkv_py::bind_cuda_scores(m);
  depthkv_py::bind_cuda_evict(m);
  depthkv_py::bind_cuda_paged(m);
}
