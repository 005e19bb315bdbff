#pragma once
/// @file cuda_launch.hpp
/// @brief The CUDA launches behind depthkv._cuda, declared without CUDA headers: cuda_launch.cu
/// (compiled by nvcc) defines them over depthkv/cuda/*.cuh; bind_cuda.cpp (compiled by the C++
/// compiler with nanobind) checks the arrays and calls them. Every launch goes to the given
/// stream (`cudaStream_t` as an integer; 0 = the legacy default stream) and returns the CUDA
/// error's text, empty on success; none of them synchronises.

#include <cstddef>
#include <cstdint>
#include <string>

#include "depthkv/cuda/detail/evict_plan.hpp"
#include "depthkv/cuda/detail/paged_plan.hpp"

namespace depthkv_py {
namespace cuda {

/// Element types of probabilities, scores and K/V rows.
enum class Elem { kF32, kF16, kBF16 };

/// Attention probabilities `[n_heads][n_queries][n]` (strides in elements) and float scores
/// `[n_kv_heads][score_stride]` (`depthkv::cuda::H2OScoreParams` / `SnapKVScoreParams`).
struct ProbArgs {
  const void* probs = nullptr;
  Elem type = Elem::kF32;
  std::int64_t head_stride = 0, query_stride = 0;
  int n_heads = 0, n_kv_heads = 0, n_queries = 0, n = 0;
  float* scores = nullptr;
  std::int64_t score_stride = 0;
  std::uint32_t* status = nullptr;  ///< device word: ScoreStatus bits
};

/// CUDA devices visible to this process (0 when there is none or no driver).
int device_count();
/// `depthkv::cuda::AccumulateH2O` (scores accumulated in place).
std::string h2o(const ProbArgs& a, std::uintptr_t stream);
/// Workspace bytes of `snapkv`.
std::size_t snapkv_workspace_bytes(const ProbArgs& a, int kernel, int pooling);
/// `depthkv::cuda::SnapKVScores`; pooling 0 none, 1 max, 2 average (`depthkv::Pooling`).
std::string snapkv(const ProbArgs& a, int kernel, int pooling, void* workspace, std::size_t workspace_bytes,
                   std::uintptr_t stream);
/// Workspace bytes of `evict` for `n_rows` rows of at most `max_n` tokens.
std::size_t evict_workspace_bytes(int n_rows, int max_n);
/// `depthkv::cuda::Evict` over `n_rows` rows already in device memory (`d_rows`), K/V elements
/// of `elem_bytes` (2 or 4) bytes, scores of `score_type`; `status`: EvictStatus bits.
std::string evict(const depthkv::cuda::EvictRow* d_rows, int n_rows, int max_n, int head_dim, int elem_bytes,
                  Elem score_type, int n_sink, int n_recent, std::uint32_t* status, void* workspace,
                  std::size_t workspace_bytes, std::uintptr_t stream);
/// `depthkv::cuda::PagedCompact` over `n_heads` heads already in device memory (`d_heads`);
/// `hnd`: the pool's blocks are `[n_kv_heads][block_size][head_dim]` (else NHD); `status`:
/// PagedCompactStatus bits.
std::string paged_compact(const depthkv::cuda::PagedCompactHead* d_heads, int n_heads, void* k_blocks, void* v_blocks,
                          int num_blocks, int block_size, int n_kv_heads, int head_dim, int elem_bytes, bool hnd,
                          std::uint32_t* status, std::uintptr_t stream);
/// Copies `bytes` from host to device on `stream` (the host buffer may be freed on return).
std::string upload(void* dst, const void* src, std::size_t bytes, std::uintptr_t stream);
/// Copies `bytes` from device to host, waiting for `stream` first.
std::string download(void* dst, const void* src, std::size_t bytes, std::uintptr_t stream);

}  // namespace cuda
}  // namespace depthkv_py
