// depthkv._cuda: the library's CUDA kernels (depthkv/cuda/score.cuh, evict.cuh,
// paged_compact.cuh) on arrays in CUDA memory (torch tensors, or anything with DLPack), read and
// written in place. Built only when a CUDA compiler is found (python/CMakeLists.txt); the Python
// side is depthkv.cuda, which allocates the outputs and workspaces and checks the status words.
// Every array is checked here (device, dtype, shape, contiguity) and every row by the library's
// host checks before anything is launched: bad input raises depthkv.Error and changes nothing.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common.hpp"
#include "cuda_bind_common.hpp"

namespace depthkv_py {
namespace {

/// Probabilities [n_heads, n_queries, n] and float32 scores [n_kv_heads, >= n].
cuda::ProbArgs prob_args(const AnyArray& probs, const AnyArray& scores, int n_kv_heads, const char* func) {
  check_cuda_array(probs, func, "probs", -1, 3);
  const int device = probs.device_id();
  check_cuda_array(scores, func, "scores", device, 2);
  check_dtype(scores, nb::dtype<float>(), func, "scores");
  cuda::ProbArgs a;
  a.type = elem_of(probs, func, "probs");
  a.probs = probs.data();
  a.n_heads = to_int(probs.shape(0), func, "heads");
  a.n_queries = to_int(probs.shape(1), func, "queries");
  a.n = to_int(probs.shape(2), func, "keys");
  a.query_stride = a.n;
  a.head_stride = static_cast<std::int64_t>(a.n_queries) * a.n;
  a.n_kv_heads = n_kv_heads;
  DEPTHKV_CHECK_AS(func, n_kv_heads >= 1 && a.n_heads >= 1 && a.n_heads % n_kv_heads == 0,
                   "n_kv_heads = " << n_kv_heads << " must divide the " << a.n_heads << " query heads of probs");
  DEPTHKV_CHECK_AS(func, scores.shape(0) == static_cast<std::size_t>(n_kv_heads) && scores.shape(1) >= probs.shape(2),
                   "scores must be [" << n_kv_heads << ", >= " << a.n << "], got [" << scores.shape(0) << ", "
                                      << scores.shape(1) << "]");
  a.scores = static_cast<float*>(const_cast<void*>(scores.data()));
  a.score_stride = static_cast<std::int64_t>(scores.shape(1));
  return a;
}

void h2o_accumulate(const AnyArray& probs, const AnyArray& scores, int n_kv_heads, const AnyArray& status,
                    std::uintptr_t stream) {
  cuda::ProbArgs a = prob_args(probs, scores, n_kv_heads, "cuda.h2o_accumulate");
  a.status = status_word(status, "cuda.h2o_accumulate", probs.device_id());
  check_launch("cuda.h2o_accumulate", cuda::h2o(a, stream));
}

std::size_t snapkv_workspace(int n_kv_heads, int n, int pooling) {
  cuda::ProbArgs a;
  a.n_kv_heads = n_kv_heads;
  a.n = n;
  return cuda::snapkv_workspace_bytes(a, 7, pooling);
}

void snapkv_scores(const AnyArray& probs, const AnyArray& scores, int n_kv_heads, int kernel, int pooling,
                   const AnyArray& workspace, const AnyArray& status, std::uintptr_t stream) {
  const char* f = "cuda.snapkv_scores";
  cuda::ProbArgs a = prob_args(probs, scores, n_kv_heads, f);
  DEPTHKV_CHECK_AS(f, kernel >= 1 && kernel % 2 == 1, "kernel must be odd and >= 1, got " << kernel);
  DEPTHKV_CHECK_AS(f, pooling >= 0 && pooling <= 2, "pooling must be 0 (none), 1 (max) or 2 (avg), got " << pooling);
  a.status = status_word(status, f, probs.device_id());
  const std::size_t bytes = cuda::snapkv_workspace_bytes(a, kernel, pooling);
  void* ws = bytes == 0 ? nullptr : byte_buffer(workspace, f, "workspace", probs.device_id(), bytes);
  check_launch(f, cuda::snapkv(a, kernel, pooling, ws, bytes, stream));
}

}  // namespace

void bind_cuda_scores(nb::module_& m) {
  m.def("device_count", &cuda::device_count, "CUDA devices visible to this process (0: none, or no driver).");
  m.def("h2o_accumulate", &h2o_accumulate, nb::arg("probs"), nb::arg("scores"), nb::arg("n_kv_heads"),
        nb::arg("status"), nb::arg("stream"),
        "H2O: scores[h, j] += the group's probabilities of slot j (depthkv/cuda/score.cuh AccumulateH2O).");
  m.def("snapkv_workspace_bytes", &snapkv_workspace, nb::arg("n_kv_heads"), nb::arg("n"), nb::arg("pooling"));
  m.def("snapkv_scores", &snapkv_scores, nb::arg("probs"), nb::arg("scores"), nb::arg("n_kv_heads"),
        nb::arg("kernel"), nb::arg("pooling"), nb::arg("workspace"), nb::arg("status"), nb::arg("stream"),
        "SnapKV: window sums of the group's probabilities, pooled (depthkv/cuda/score.cuh SnapKVScores).");
}

}  // namespace depthkv_py
