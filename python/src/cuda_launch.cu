// The CUDA launches of depthkv._cuda (declared in cuda_launch.hpp): thin calls of the library's
// kernels in depthkv/cuda/*.cuh, compiled by nvcc; the checks of the arrays are in bind_cuda.cpp.

#include "cuda_launch.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "depthkv/cuda/evict.cuh"
#include "depthkv/cuda/paged_compact.cuh"
#include "depthkv/cuda/score.cuh"

namespace depthkv_py {
namespace cuda {
namespace {

std::string text(cudaError_t e) {
  if (e == cudaSuccess) return std::string();
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

cudaStream_t as_stream(std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

depthkv::Pooling pooling_of(int p) {
  return p == 1 ? depthkv::Pooling::kMax : (p == 2 ? depthkv::Pooling::kAvg : depthkv::Pooling::kNone);
}

depthkv::cuda::SnapKVScoreParams snapkv_params(const ProbArgs& a, int kernel, int pooling) {
  depthkv::cuda::SnapKVScoreParams p;
  p.probs = a.probs;
  p.head_stride = a.head_stride;
  p.query_stride = a.query_stride;
  p.n_heads = a.n_heads;
  p.n_kv_heads = a.n_kv_heads;
  p.n_queries = a.n_queries;
  p.n = a.n;
  p.kernel = kernel;
  p.pooling = pooling_of(pooling);
  p.scores = a.scores;
  p.score_stride = a.score_stride;
  p.status = a.status;
  return p;
}

template <typename ScoreT>
cudaError_t evict_as(int elem_bytes, const depthkv::cuda::EvictParams& p, void* ws, std::size_t bytes, cudaStream_t s) {
  return elem_bytes == 2 ? depthkv::cuda::Evict<__half, ScoreT>(p, ws, bytes, s)
                         : depthkv::cuda::Evict<float, ScoreT>(p, ws, bytes, s);
}

}  // namespace

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::string h2o(const ProbArgs& a, std::uintptr_t stream) {
  depthkv::cuda::H2OScoreParams p;
  p.probs = a.probs;
  p.head_stride = a.head_stride;
  p.query_stride = a.query_stride;
  p.n_heads = a.n_heads;
  p.n_kv_heads = a.n_kv_heads;
  p.n_queries = a.n_queries;
  p.n = a.n;
  p.scores = a.scores;
  p.score_stride = a.score_stride;
  p.status = a.status;
  switch (a.type) {
    case Elem::kF16: return text(depthkv::cuda::AccumulateH2O<__half>(p, nullptr, 0, as_stream(stream)));
    case Elem::kBF16: return text(depthkv::cuda::AccumulateH2O<__nv_bfloat16>(p, nullptr, 0, as_stream(stream)));
    default: return text(depthkv::cuda::AccumulateH2O<float>(p, nullptr, 0, as_stream(stream)));
  }
}

std::size_t snapkv_workspace_bytes(const ProbArgs& a, int kernel, int pooling) {
  return depthkv::cuda::SnapKVScoresWorkspaceBytes(snapkv_params(a, kernel, pooling));
}

std::string snapkv(const ProbArgs& a, int kernel, int pooling, void* workspace, std::size_t workspace_bytes,
                   std::uintptr_t stream) {
  const depthkv::cuda::SnapKVScoreParams p = snapkv_params(a, kernel, pooling);
  const cudaStream_t s = as_stream(stream);
  switch (a.type) {
    case Elem::kF16: return text(depthkv::cuda::SnapKVScores<__half>(p, workspace, workspace_bytes, s));
    case Elem::kBF16: return text(depthkv::cuda::SnapKVScores<__nv_bfloat16>(p, workspace, workspace_bytes, s));
    default: return text(depthkv::cuda::SnapKVScores<float>(p, workspace, workspace_bytes, s));
  }
}

std::size_t evict_workspace_bytes(int n_rows, int max_n) {
  depthkv::cuda::EvictParams p;
  p.n_rows = n_rows;
  p.max_n = max_n;
  return depthkv::cuda::EvictWorkspaceBytes(p);
}

std::string evict(const depthkv::cuda::EvictRow* d_rows, int n_rows, int max_n, int head_dim, int elem_bytes,
                  Elem score_type, int n_sink, int n_recent, std::uint32_t* status, void* workspace,
                  std::size_t workspace_bytes, std::uintptr_t stream) {
  depthkv::cuda::EvictParams p;
  p.rows = d_rows;
  p.n_rows = n_rows;
  p.max_n = max_n;
  p.head_dim = head_dim;
  p.n_sink = n_sink;
  p.n_recent = n_recent;
  p.status = status;
  const cudaStream_t s = as_stream(stream);
  switch (score_type) {
    case Elem::kF16: return text(evict_as<__half>(elem_bytes, p, workspace, workspace_bytes, s));
    case Elem::kBF16: return text(evict_as<__nv_bfloat16>(elem_bytes, p, workspace, workspace_bytes, s));
    default: return text(evict_as<float>(elem_bytes, p, workspace, workspace_bytes, s));
  }
}

std::string paged_compact(const depthkv::cuda::PagedCompactHead* d_heads, int n_heads, void* k_blocks, void* v_blocks,
                          int num_blocks, int block_size, int n_kv_heads, int head_dim, int elem_bytes, bool hnd,
                          std::uint32_t* status, std::uintptr_t stream) {
  depthkv::cuda::PagedCompactParams p;
  p.heads = d_heads;
  p.n_heads = n_heads;
  p.k_blocks = k_blocks;
  p.v_blocks = v_blocks;
  p.num_blocks = num_blocks;
  p.block_size = block_size;
  p.n_kv_heads = n_kv_heads;
  p.head_dim = head_dim;
  p.layout = hnd ? depthkv::PagedLayout::kHND : depthkv::PagedLayout::kNHD;
  p.status = status;
  const cudaStream_t s = as_stream(stream);
  return text(elem_bytes == 2 ? depthkv::cuda::PagedCompact<__half>(p, nullptr, 0, s)
                              : depthkv::cuda::PagedCompact<float>(p, nullptr, 0, s));
}

std::string upload(void* dst, const void* src, std::size_t bytes, std::uintptr_t stream) {
  return text(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}

std::string download(void* dst, const void* src, std::size_t bytes, std::uintptr_t stream) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream));
  if (e == cudaSuccess) e = cudaStreamSynchronize(as_stream(stream));
  return text(e);
}

}  // namespace cuda
}  // namespace depthkv_py
