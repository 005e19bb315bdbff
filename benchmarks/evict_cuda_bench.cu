// CUDA eviction benchmark: select-only and select+compact over all layers and KV heads of a
// Llama-3.1-8B-like cache (32 layers x 8 KV heads x {4K, 32K, 128K} tokens x head_dim 128, bf16),
// keep 10/20/50 %, uniform and layer-varying k, against the measured device-to-device copy
// bandwidth.
//
// Method: the copy bandwidth is measured first (cudaMemcpyAsync D2D, bytes read + written per
// second). Each configuration is timed with CUDA events around one depthkv::cuda::Evict call
// (warm-up runs, then the median of --runs runs); before every run the scores are regenerated on
// the device by a hash kernel with a fresh seed (never all zeros, not timed). Bytes moved =
// score bytes + 2 x kept K/V bytes (each kept key and value row is read once and written once);
// the ideal time is bytes / copy bandwidth. Output lines have the same format as
// benchmarks/torch_topk_baseline.py so both can be compared in one run.
//
// Usage: evict_cuda_bench [--tokens 4096,32768,131072] [--runs 15] [--warmup 3] [--layers 32]
//                         [--heads 8] [--head-dim 128] [--sink 0] [--recent 0]

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "depthkv/cuda/evict.cuh"

namespace dc = depthkv::cuda;

#define CUDA_OK(...)                                                                                   \
  do {                                                                                                  \
    const cudaError_t e_ = (__VA_ARGS__);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "CUDA error '%s' at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #__VA_ARGS__); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

namespace {

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Fresh scores in (0, 1] from a hash of (seed, index): never zero, a new draw per seed.
__global__ void HashScoresKernel(float* s, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    s[i] = static_cast<float>((h >> 40) + 1) * (1.0f / 16777216.0f);
  }
}

/// Random bits for K/V (the copy is bitwise, so any pattern will do).
__global__ void HashFillKernel(std::uint32_t* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::uint32_t>(mix64(seed + i));
}

/// positions[row][i] = i (rows of `stride` entries).
__global__ void IotaKernel(std::int32_t* p, std::size_t n, int stride) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(stride));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::string cur;
  for (const char* c = s;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!cur.empty()) out.push_back(std::atoi(cur.c_str()));
      cur.clear();
      if (*c == '\0') break;
    } else {
      cur += *c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> tokens = {4096, 32768, 131072};
  int runs = 15, warmup = 3, layers = 32, heads = 8, hd = 128, sink = 0, recent = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") tokens = parse_list(argv[i + 1]);
    else if (a == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--warmup") warmup = std::max(0, std::atoi(argv[i + 1]));
    else if (a == "--layers") layers = std::atoi(argv[i + 1]);
    else if (a == "--heads") heads = std::atoi(argv[i + 1]);
    else if (a == "--head-dim") hd = std::atoi(argv[i + 1]);
    else if (a == "--sink") sink = std::atoi(argv[i + 1]);
    else if (a == "--recent") recent = std::atoi(argv[i + 1]);
  }
  // 77 (skipped) only without a CUDA device (no driver installed, cudaErrorNoDevice, 0 devices);
  // any other CUDA error fails, as in tests/support/cuda_device_probe.hpp
  int driver_version = 0, count = 0;
  const cudaError_t ed = cudaDriverGetVersion(&driver_version);
  const cudaError_t ec = cudaGetDeviceCount(&count);
  if ((ed == cudaSuccess && driver_version == 0) || ec == cudaErrorNoDevice || (ec == cudaSuccess && count == 0)) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  CUDA_OK(ed);
  CUDA_OK(ec);
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CUDA_OK(cudaDriverGetVersion(&driver));
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  std::printf("# evict_cuda_bench: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB, driver %d, runtime %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, static_cast<double>(prop.totalGlobalMem) / (1 << 30),
              static_cast<double>(prop.l2CacheSize) / (1 << 20), driver, runtime);
  std::printf("# shape: %d layers x %d KV heads x head_dim %d, bf16 K/V, float scores, sink %d recent %d; "
              "median of %d runs after %d warm-up, fresh scores per run\n",
              layers, heads, hd, sink, recent, runs, warmup);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaEvent_t ev0, ev1;
  CUDA_OK(cudaEventCreate(&ev0));
  CUDA_OK(cudaEventCreate(&ev1));

  // ---- 1. device-to-device copy bandwidth ----
  double copy_bw = 0;  // bytes (read + written) per second
  {
    const std::size_t bytes = std::size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    CUDA_OK(cudaMalloc(&a, bytes));
    CUDA_OK(cudaMalloc(&b, bytes));
    CUDA_OK(cudaMemsetAsync(a, 1, bytes, stream));
    std::vector<double> t;
    for (int r = 0; r < warmup + 20; ++r) {
      CUDA_OK(cudaEventRecord(ev0, stream));
      CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(cudaEventRecord(ev1, stream));
      CUDA_OK(cudaEventSynchronize(ev1));
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, ev0, ev1));
      if (r >= warmup) t.push_back(ms * 1e-3);
    }
    copy_bw = 2.0 * static_cast<double>(bytes) / median(t);
    std::printf("copy: cudaMemcpyAsync D2D %.2f GiB, median %.3f ms, %.1f GB/s (read + write)\n",
                static_cast<double>(bytes) / (1 << 30), median(t) * 1e3, copy_bw * 1e-9);
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
  }

  // ---- 2. buffers sized for the longest row that fits ----
  const int rows = layers * heads;
  const double max_keep_frac = 0.75;  // layer-varying k at 50 % keeps up to 75 % in the last layer
  std::sort(tokens.begin(), tokens.end());
  std::size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  auto need_bytes = [&](int n) {
    const std::size_t cap_dst = static_cast<std::size_t>(static_cast<double>(n) * max_keep_frac) + 1;
    const std::size_t r = static_cast<std::size_t>(rows);
    return r * static_cast<std::size_t>(n) * hd * 2u * 2u          // src K, V
           + r * cap_dst * hd * 2u * 2u                            // dst K, V
           + r * static_cast<std::size_t>(n) * (4u + 4u)           // scores, positions
           + r * cap_dst * (4u + 4u);                              // kept slots, dst positions
  };
  while (!tokens.empty() && need_bytes(tokens.back()) + (std::size_t{1} << 30) > free_b) {
    std::printf("# skipping %d tokens: needs %.1f GiB, %.1f GiB free\n", tokens.back(),
                static_cast<double>(need_bytes(tokens.back())) / (1 << 30), static_cast<double>(free_b) / (1 << 30));
    tokens.pop_back();
  }
  if (tokens.empty()) return 1;
  const int n_max = tokens.back();
  const std::size_t cap_max = static_cast<std::size_t>(static_cast<double>(n_max) * max_keep_frac) + 1;
  const std::size_t src_elems = static_cast<std::size_t>(rows) * static_cast<std::size_t>(n_max) * hd;
  const std::size_t dst_elems = static_cast<std::size_t>(rows) * cap_max * hd;
  __nv_bfloat16 *d_k = nullptr, *d_v = nullptr, *d_dk = nullptr, *d_dv = nullptr;
  float* d_scores = nullptr;
  std::int32_t *d_pos = nullptr, *d_kept = nullptr, *d_dpos = nullptr;
  CUDA_OK(cudaMalloc(&d_k, src_elems * 2));
  CUDA_OK(cudaMalloc(&d_v, src_elems * 2));
  CUDA_OK(cudaMalloc(&d_dk, dst_elems * 2));
  CUDA_OK(cudaMalloc(&d_dv, dst_elems * 2));
  CUDA_OK(cudaMalloc(&d_scores, static_cast<std::size_t>(rows) * n_max * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_pos, static_cast<std::size_t>(rows) * n_max * sizeof(std::int32_t)));
  CUDA_OK(cudaMalloc(&d_kept, static_cast<std::size_t>(rows) * cap_max * sizeof(std::int32_t)));
  CUDA_OK(cudaMalloc(&d_dpos, static_cast<std::size_t>(rows) * cap_max * sizeof(std::int32_t)));
  HashFillKernel<<<4096, 256, 0, stream>>>(reinterpret_cast<std::uint32_t*>(d_k), src_elems / 2, 1);
  HashFillKernel<<<4096, 256, 0, stream>>>(reinterpret_cast<std::uint32_t*>(d_v), src_elems / 2, 2);
  CUDA_OK(cudaGetLastError());
  dc::EvictRow* d_rows = nullptr;
  CUDA_OK(cudaMalloc(&d_rows, static_cast<std::size_t>(rows) * sizeof(dc::EvictRow)));
  std::uint32_t* d_status = nullptr;
  CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));
  dc::EvictParams probe;
  probe.n_rows = rows;
  probe.max_n = n_max;
  const std::size_t ws_bytes = dc::EvictWorkspaceBytes(probe);
  void* d_ws = nullptr;
  if (ws_bytes > 0) CUDA_OK(cudaMalloc(&d_ws, ws_bytes));

  // ---- 3. the sweep ----
  std::uint64_t seed = 1000;
  int bad = 0;
  std::printf("%-8s %-15s %7s %5s %-7s %10s %9s %9s %10s %8s  %s\n", "impl", "mode", "tokens", "keep", "k", "time_ms",
              "bytes_GB", "eff_GBps", "frac_copy", "x_ideal", "path");
  for (int n : tokens) {
    const std::size_t cap_dst = static_cast<std::size_t>(static_cast<double>(n) * max_keep_frac) + 1;
    IotaKernel<<<4096, 256, 0, stream>>>(d_pos, static_cast<std::size_t>(rows) * n, n);
    CUDA_OK(cudaGetLastError());
    for (double keep : {0.10, 0.20, 0.50}) {
      for (int varying = 0; varying < 2; ++varying) {
        for (int compact = 0; compact < 2; ++compact) {
          std::vector<dc::EvictRow> h_rows(static_cast<std::size_t>(rows));
          std::size_t kept_tokens = 0;
          for (int l = 0; l < layers; ++l) {
            // layer-varying: k_l = keep * n * (0.5 + l / (layers - 1)), mean keep * n
            const double f = varying ? keep * (0.5 + (layers > 1 ? static_cast<double>(l) / (layers - 1) : 0.5)) : keep;
            const int k = std::min(n, static_cast<int>(f * n + 0.5));
            for (int h = 0; h < heads; ++h) {
              const std::size_t r = static_cast<std::size_t>(l) * heads + h;
              dc::EvictRow& row = h_rows[r];
              row.scores = d_scores + r * n;
              row.positions = d_pos + r * n;
              row.src_k = d_k + r * n * hd;
              row.src_v = d_v + r * n * hd;
              row.src_token_stride = hd;
              row.dst_token_stride = hd;
              row.n = n;
              row.k = std::max(k, std::min(n, sink + recent));
              if (compact) {
                row.dst_k = d_dk + r * cap_dst * hd;
                row.dst_v = d_dv + r * cap_dst * hd;
                row.dst_positions = d_dpos + r * cap_dst;
              } else {
                row.kept_slots = d_kept + r * cap_dst;
              }
              kept_tokens += static_cast<std::size_t>(std::min(row.k, n));
            }
          }
          CUDA_OK(cudaMemcpyAsync(d_rows, h_rows.data(), h_rows.size() * sizeof(dc::EvictRow), cudaMemcpyHostToDevice, stream));
          dc::EvictParams p;
          p.rows = d_rows;
          p.n_rows = rows;
          p.max_n = n;
          p.head_dim = hd;
          p.n_sink = sink;
          p.n_recent = recent;
          p.status = d_status;
          std::vector<double> t;
          for (int r = 0; r < warmup + runs; ++r) {
            HashScoresKernel<<<4096, 256, 0, stream>>>(d_scores, static_cast<std::size_t>(rows) * n, ++seed);
            CUDA_OK(cudaEventRecord(ev0, stream));
            CUDA_OK((dc::Evict<__nv_bfloat16, float>(p, d_ws, ws_bytes, stream)));
            CUDA_OK(cudaEventRecord(ev1, stream));
            CUDA_OK(cudaEventSynchronize(ev1));
            float ms = 0;
            CUDA_OK(cudaEventElapsedTime(&ms, ev0, ev1));
            if (r >= warmup) t.push_back(ms * 1e-3);
          }
          std::uint32_t st = 0;
          CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
          if (st != 0u) {
            std::printf("# status %u for n %d keep %.2f\n", st, n, keep);
            ++bad;
          }
          const double tm = median(t);
          const double bytes = static_cast<double>(rows) * n * 4.0 +
                               (compact ? 2.0 * static_cast<double>(kept_tokens) * hd * 2.0 * 2.0 : 0.0);
          const double eff = bytes / tm;
          const bool one_block = depthkv::cuda::detail::auto_one_block_per_row(
              rows, n, prop.multiProcessorCount, static_cast<std::size_t>(prop.sharedMemPerBlockOptin));
          std::printf("%-8s %-15s %7d %4.0f%% %-7s %10.4f %9.4f %9.1f %10.3f %8.2f  %s\n", "depthkv",
                      compact ? "select+compact" : "select-only", n, keep * 100, varying ? "layer" : "uniform", tm * 1e3,
                      bytes * 1e-9, eff * 1e-9, eff / copy_bw, tm / (bytes / copy_bw),
                      one_block ? "one-block-per-row" : "multi-block");
          std::fflush(stdout);
        }
      }
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaFree(d_k));
  CUDA_OK(cudaFree(d_v));
  CUDA_OK(cudaFree(d_dk));
  CUDA_OK(cudaFree(d_dv));
  CUDA_OK(cudaFree(d_scores));
  CUDA_OK(cudaFree(d_pos));
  CUDA_OK(cudaFree(d_kept));
  CUDA_OK(cudaFree(d_dpos));
  CUDA_OK(cudaFree(d_rows));
  CUDA_OK(cudaFree(d_status));
  if (d_ws != nullptr) CUDA_OK(cudaFree(d_ws));
  return bad == 0 ? 0 : 1;
}
