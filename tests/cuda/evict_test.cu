// CUDA eviction vs the CPU path, exactly: kept slots, kept positions and the compacted K/V bytes.
//
// Random shapes (1-32 layers, 1-8 KV heads, lengths 0..131072 per head, k from the protected
// count to n and beyond, head_dim 64/128 plus odd sizes for the narrow-copy paths, K/V in
// float/half/bfloat16, scores in float/half/bfloat16 with many ties), both launch paths, owning
// layers and strided views over raw device memory, select-only and select+compact; plus status
// bits, parameter errors and DeviceLayer round trips. Exit codes: 0 pass, 1 mismatch, 77 no device.
//
// Usage: cuda_evict_test [--seed S] [--cases N] [--seconds T] [--budget-mb M (source K/V bytes per case)]

// The CPU evictor includes Eigen; its host/device annotations are not needed in this CUDA
// translation unit (and warn under nvcc), so Eigen is compiled as host-only code here.
#ifndef EIGEN_NO_CUDA
#define EIGEN_NO_CUDA 1
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "depthkv/cuda/device_layer.cuh"
#include "depthkv/cuda/evict.cuh"
#include "depthkv/detail/select_common.hpp"
#include "depthkv/kv_cache.hpp"

#if !defined(DEPTHKV_TEST_NO_CPU_EVICTOR) && __has_include("depthkv/evictor.hpp")
#include "depthkv/evictor.hpp"
#define DEPTHKV_TEST_HAVE_EVICTOR 1
#endif

namespace dc = depthkv::cuda;

#define CUDA_OK(...)                                                                                   \
  do {                                                                                                  \
    const cudaError_t e_ = (__VA_ARGS__);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "FAIL: CUDA error '%s' at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #__VA_ARGS__); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

namespace {

int g_failures = 0;
std::size_t g_budget_bytes = std::size_t{160} << 20;  // source K+V bytes per random case

void fail(const std::string& what) {
  if (g_failures < 30) std::fprintf(stderr, "MISMATCH: %s\n", what.c_str());
  ++g_failures;
}

// ---- the CPU path --------------------------------------------------------------------------------

std::vector<std::int32_t> naive_select_keep(const float* s, const std::int32_t* pos, int n, int k, int sink, int recent) {
  std::vector<std::int32_t> out;
  if (k >= n) {
    out.resize(static_cast<std::size_t>(n));
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  std::vector<std::int32_t> cand;
  for (int i = 0; i < n; ++i) {
    if (depthkv::detail::is_protected(i, n, sink, recent))
      out.push_back(i);
    else
      cand.push_back(i);
  }
  const int take = k - static_cast<int>(out.size());
  if (take < 0) return {};
  std::nth_element(cand.begin(), cand.begin() + take, cand.end(), [&](std::int32_t a, std::int32_t b) {
    return depthkv::detail::ranks_before(s[a], pos[a], s[b], pos[b]);
  });
  out.insert(out.end(), cand.begin(), cand.begin() + take);
  std::sort(out.begin(), out.end());
  return out;
}

/// The CPU path for one row: depthkv::select_keep on the float scores (and on the raw 16-bit
/// scores when the GPU ranked half/bfloat16 keys: `raw16`, `bf16`), cross-checked with the naive
/// reference. Without evictor.hpp, the naive reference alone.
std::vector<std::int32_t> cpu_select(const float* s, const std::int32_t* pos, int n, int k, int sink, int recent,
                                     const std::uint16_t* raw16 = nullptr, bool bf16 = false) {
  std::vector<std::int32_t> ref = naive_select_keep(s, pos, n, k, sink, recent);
#ifdef DEPTHKV_TEST_HAVE_EVICTOR
  depthkv::Protection prot;
  prot.n_sink = sink;
  prot.n_recent = recent;
  const std::vector<std::int32_t> cpu = depthkv::select_keep(s, pos, n, k, prot);
  if (cpu != ref) fail("depthkv::select_keep disagrees with the naive reference");
  if (raw16 != nullptr) {
    const std::vector<std::int32_t> cpu16 =
        bf16 ? depthkv::select_keep(reinterpret_cast<const Eigen::bfloat16*>(raw16), pos, n, k, prot)
             : depthkv::select_keep(reinterpret_cast<const Eigen::half*>(raw16), pos, n, k, prot);
    if (cpu16 != cpu) fail("depthkv::select_keep on 16-bit scores disagrees with the float path");
  }
  return cpu;
#else
  (void)raw16;
  (void)bf16;
  return ref;
#endif
}

// ---- types -------------------------------------------------------------------------------------

template <typename S>
S from_float(float f);
template <>
float from_float<float>(float f) { return f; }
template <>
__half from_float<__half>(float f) { return __float2half_rn(f); }
template <>
__nv_bfloat16 from_float<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }

template <typename S>
float to_float(S s);
template <>
float to_float<float>(float s) { return s; }
template <>
float to_float<__half>(__half s) { return __half2float(s); }
template <>
float to_float<__nv_bfloat16>(__nv_bfloat16 s) { return __bfloat162float(s); }

template <typename S>
const char* type_name() {
  return std::is_same<S, float>::value ? "f32" : std::is_same<S, __half>::value ? "f16" : "bf16";
}

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fill_random_bytes(void* p, std::size_t bytes, std::uint64_t seed) {
  unsigned char* c = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t v = splitmix(seed);
    std::memcpy(c + i, &v, 8);
  }
  for (; i < bytes; ++i) c[i] = static_cast<unsigned char>(splitmix(seed));
}

// ---- one random case ---------------------------------------------------------------------------

struct CaseSpec {
  int layers = 1, heads = 1, head_dim = 64;
  int n_sink = 0, n_recent = 0;
  std::vector<std::vector<int>> n, k;  // [layer][head]
  dc::EvictPath path = dc::EvictPath::kAuto;
  bool select_only = false;
  bool views = false;   // DeviceLayerView over raw buffers with a padded token stride
  int token_pad = 0;    // extra elements per token in views
  int score_mode = 0;
  std::uint64_t seed = 0;
};

float random_score(std::mt19937_64& rng, int mode) {
  switch (mode) {
    case 0: return std::uniform_real_distribution<float>(0.f, 1.f)(rng);
    case 1: return static_cast<float>(rng() % 4) * 0.25f;  // 4 values: heavy ties
    case 2: return 0.5f;                                   // all equal
    case 3: return (rng() % 2) ? 0.0f : -0.0f;             // signed zeros
    case 4: return static_cast<float>(rng() % 2);          // 2 values
    default: return std::uniform_real_distribution<float>(-1e4f, 1e4f)(rng);
  }
}

template <typename T, typename ScoreT>
void run_case(const CaseSpec& c, int case_id, std::size_t smem_optin) {
  const int L = c.layers, H = c.heads, hd = c.head_dim;
  std::mt19937_64 rng(c.seed);
  int max_n = 0;
  std::vector<int> cap(static_cast<std::size_t>(L), 1);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      cap[static_cast<std::size_t>(l)] = std::max(cap[static_cast<std::size_t>(l)], c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
      max_n = std::max(max_n, c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
    }
  const int score_stride = std::max(max_n, 1);
  dc::EvictPath path = c.path;
  if (path == dc::EvictPath::kOneBlockPerRow &&
      depthkv::cuda::detail::one_block_smem_bytes(max_n) + depthkv::cuda::detail::kOneBlockStaticSmem > smem_optin)
    path = dc::EvictPath::kAuto;

  // host data: scores (as ScoreT and as the CPU's floats), positions, K/V rows
  const std::size_t rows_n = static_cast<std::size_t>(L) * static_cast<std::size_t>(H);
  std::vector<ScoreT> h_scores(rows_n * static_cast<std::size_t>(score_stride), from_float<ScoreT>(0.f));
  std::vector<float> f_scores(h_scores.size(), 0.f);
  std::vector<std::vector<std::int32_t>> h_pos(rows_n);
  std::vector<std::vector<T>> h_k(rows_n), h_v(rows_n);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const std::size_t r = static_cast<std::size_t>(l) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
      const int n = c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      std::int32_t p = static_cast<std::int32_t>(rng() % 7);
      h_pos[r].resize(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        h_pos[r][static_cast<std::size_t>(i)] = p;
        p += 1 + static_cast<std::int32_t>(rng() % 3);
        const ScoreT s = from_float<ScoreT>(random_score(rng, c.score_mode));
        h_scores[r * static_cast<std::size_t>(score_stride) + static_cast<std::size_t>(i)] = s;
        f_scores[r * static_cast<std::size_t>(score_stride) + static_cast<std::size_t>(i)] = to_float<ScoreT>(s);
      }
      h_k[r].resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(hd));
      h_v[r].resize(h_k[r].size());
      fill_random_bytes(h_k[r].data(), h_k[r].size() * sizeof(T), c.seed * 1315423911ull + r * 2 + 1);
      fill_random_bytes(h_v[r].data(), h_v[r].size() * sizeof(T), c.seed * 1315423911ull + r * 2 + 2);
    }

  ScoreT* d_scores = nullptr;
  CUDA_OK(cudaMalloc(&d_scores, h_scores.size() * sizeof(ScoreT)));
  CUDA_OK(cudaMemcpy(d_scores, h_scores.data(), h_scores.size() * sizeof(ScoreT), cudaMemcpyHostToDevice));
  std::int32_t* d_kept = nullptr;
  CUDA_OK(cudaMalloc(&d_kept, rows_n * static_cast<std::size_t>(score_stride) * sizeof(std::int32_t)));
  CUDA_OK(cudaMemset(d_kept, 0xff, rows_n * static_cast<std::size_t>(score_stride) * sizeof(std::int32_t)));

  // layers: owning DeviceLayers, or views over raw buffers with a padded token stride
  std::vector<dc::DeviceLayer<T>> own_src, own_dst;
  std::vector<dc::DeviceLayerView<T>> view_src, view_dst;
  std::vector<void*> raw;
  const int ts = hd + c.token_pad;
  for (int l = 0; l < L; ++l) {
    const int cl = cap[static_cast<std::size_t>(l)];
    if (!c.views) {
      own_src.emplace_back(H, hd, cl);
      own_dst.emplace_back(H, hd, cl);
      for (int h = 0; h < H; ++h) {
        const std::size_t r = static_cast<std::size_t>(l) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
        CUDA_OK(own_src.back().upload_head(h, h_k[r].data(), h_v[r].data(), h_pos[r].data(),
                                           c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]));
      }
    } else {
      const std::size_t elems = static_cast<std::size_t>(H) * static_cast<std::size_t>(cl) * static_cast<std::size_t>(ts);
      void* b[6];
      for (int i = 0; i < 4; ++i) CUDA_OK(cudaMalloc(&b[i], elems * sizeof(T)));
      for (int i = 4; i < 6; ++i) CUDA_OK(cudaMalloc(&b[i], static_cast<std::size_t>(H) * static_cast<std::size_t>(cl) * sizeof(std::int32_t)));
      for (void* p : b) raw.push_back(p);
      view_src.emplace_back(static_cast<T*>(b[0]), static_cast<T*>(b[1]), static_cast<std::int32_t*>(b[4]), H, hd, cl, 0, -1, ts);
      view_dst.emplace_back(static_cast<T*>(b[2]), static_cast<T*>(b[3]), static_cast<std::int32_t*>(b[5]), H, hd, cl, 0, -1, ts);
      for (int h = 0; h < H; ++h) {
        const std::size_t r = static_cast<std::size_t>(l) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
        const int n = c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
        view_src.back().set_size(h, n);
        if (n == 0) continue;
        const std::size_t pitch = static_cast<std::size_t>(ts) * sizeof(T), width = static_cast<std::size_t>(hd) * sizeof(T);
        CUDA_OK(cudaMemcpy2D(view_src.back().key(h, 0), pitch, h_k[r].data(), width, width, static_cast<std::size_t>(n), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy2D(view_src.back().value(h, 0), pitch, h_v[r].data(), width, width, static_cast<std::size_t>(n), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(view_src.back().positions(h), h_pos[r].data(), static_cast<std::size_t>(n) * sizeof(std::int32_t), cudaMemcpyHostToDevice));
      }
    }
  }

  // rows: built by the host helper (validates like the CPU evictor), then uploaded
  std::vector<dc::EvictRow> rows;
  for (int l = 0; l < L; ++l) {
    const ScoreT* sc = d_scores + static_cast<std::size_t>(l) * static_cast<std::size_t>(H) * static_cast<std::size_t>(score_stride);
    std::int32_t* kp = d_kept + static_cast<std::size_t>(l) * static_cast<std::size_t>(H) * static_cast<std::size_t>(score_stride);
    if (!c.views)
      dc::append_evict_rows(rows, own_src[static_cast<std::size_t>(l)], own_dst[static_cast<std::size_t>(l)], sc, score_stride,
                            c.k[static_cast<std::size_t>(l)].data(), c.n_sink, c.n_recent, kp, score_stride);
    else
      dc::append_evict_rows(rows, view_src[static_cast<std::size_t>(l)], view_dst[static_cast<std::size_t>(l)], sc, score_stride,
                            c.k[static_cast<std::size_t>(l)].data(), c.n_sink, c.n_recent, kp, score_stride);
  }
  if (c.select_only)
    for (auto& r : rows) {
      r.dst_k = nullptr;
      r.dst_v = nullptr;
    }
  dc::EvictRow* d_rows = nullptr;
  CUDA_OK(cudaMalloc(&d_rows, rows.size() * sizeof(dc::EvictRow)));
  CUDA_OK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(dc::EvictRow), cudaMemcpyHostToDevice));
  std::uint32_t* d_status = nullptr;
  CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));

  dc::EvictParams prm;
  prm.rows = d_rows;
  prm.n_rows = static_cast<int>(rows.size());
  prm.max_n = max_n;
  prm.head_dim = hd;
  prm.n_sink = c.n_sink;
  prm.n_recent = c.n_recent;
  prm.status = d_status;
  prm.path = path;
  const std::size_t ws_bytes = dc::EvictWorkspaceBytes(prm);
  void* d_ws = nullptr;
  if (ws_bytes > 0) CUDA_OK(cudaMalloc(&d_ws, ws_bytes));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  CUDA_OK(dc::Evict<T, ScoreT>(prm, d_ws, ws_bytes, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::uint32_t status = 0;
  CUDA_OK(cudaMemcpy(&status, d_status, sizeof status, cudaMemcpyDeviceToHost));

  const std::string tag = "case " + std::to_string(case_id) + " [" + type_name<T>() + "/" + type_name<ScoreT>() +
                          " L" + std::to_string(L) + " H" + std::to_string(H) + " hd" + std::to_string(hd) +
                          " max_n " + std::to_string(max_n) + " path " + std::to_string(static_cast<int>(path)) + "]";
  if (status != 0u) fail(tag + ": status " + std::to_string(status));

  // compare every row with the CPU path
  std::vector<std::int32_t> got_slots, got_pos;
  std::vector<T> got_k, got_v, row_k, row_v;
  std::size_t kept_total = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const std::size_t r = static_cast<std::size_t>(l) * static_cast<std::size_t>(H) + static_cast<std::size_t>(h);
      const int n = c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      const int k = c.k[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      const std::uint16_t* raw16 =
          sizeof(ScoreT) == 2 ? reinterpret_cast<const std::uint16_t*>(h_scores.data() + r * static_cast<std::size_t>(score_stride))
                              : nullptr;
      const std::vector<std::int32_t> ref =
          cpu_select(f_scores.data() + r * static_cast<std::size_t>(score_stride), h_pos[r].data(), n, k, c.n_sink, c.n_recent,
                     raw16, std::is_same<ScoreT, __nv_bfloat16>::value);
      const int n_kept = static_cast<int>(ref.size());
      kept_total += ref.size();
      const std::string where = tag + " layer " + std::to_string(l) + " head " + std::to_string(h) + " n " +
                                std::to_string(n) + " k " + std::to_string(k);
      const int dst_size = c.views ? view_dst[static_cast<std::size_t>(l)].size(h) : own_dst[static_cast<std::size_t>(l)].size(h);
      if (dst_size != n_kept) fail(where + ": destination size " + std::to_string(dst_size) + " != " + std::to_string(n_kept));
      got_slots.assign(static_cast<std::size_t>(n_kept), 0);
      if (n_kept > 0)
        CUDA_OK(cudaMemcpy(got_slots.data(), d_kept + r * static_cast<std::size_t>(score_stride),
                           static_cast<std::size_t>(n_kept) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
      if (got_slots != ref) {
        int first = 0;
        while (first < n_kept && got_slots[static_cast<std::size_t>(first)] == ref[static_cast<std::size_t>(first)]) ++first;
        fail(where + ": kept slots differ at index " + std::to_string(first));
        continue;
      }
      const std::int32_t* dpos = c.views ? view_dst[static_cast<std::size_t>(l)].positions(h) : own_dst[static_cast<std::size_t>(l)].positions(h);
      got_pos.assign(static_cast<std::size_t>(n_kept), 0);
      if (n_kept > 0)
        CUDA_OK(cudaMemcpy(got_pos.data(), dpos, static_cast<std::size_t>(n_kept) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
      for (int q = 0; q < n_kept; ++q)
        if (got_pos[static_cast<std::size_t>(q)] != h_pos[r][static_cast<std::size_t>(ref[static_cast<std::size_t>(q)])]) {
          fail(where + ": kept position " + std::to_string(q) + " differs");
          break;
        }
      if (c.select_only || n_kept == 0) continue;
      const std::size_t row_elems = static_cast<std::size_t>(n_kept) * static_cast<std::size_t>(hd);
      got_k.assign(row_elems, from_float<T>(0.f));
      got_v.assign(row_elems, from_float<T>(0.f));
      const std::size_t width = static_cast<std::size_t>(hd) * sizeof(T);
      const T* dk = c.views ? view_dst[static_cast<std::size_t>(l)].key(h, 0) : own_dst[static_cast<std::size_t>(l)].key(h, 0);
      const T* dv = c.views ? view_dst[static_cast<std::size_t>(l)].value(h, 0) : own_dst[static_cast<std::size_t>(l)].value(h, 0);
      CUDA_OK(cudaMemcpy2D(got_k.data(), width, dk, static_cast<std::size_t>(ts) * sizeof(T), width, static_cast<std::size_t>(n_kept), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy2D(got_v.data(), width, dv, static_cast<std::size_t>(ts) * sizeof(T), width, static_cast<std::size_t>(n_kept), cudaMemcpyDeviceToHost));
      row_k.resize(row_elems);
      row_v.resize(row_elems);
      for (int q = 0; q < n_kept; ++q) {
        const std::size_t s = static_cast<std::size_t>(ref[static_cast<std::size_t>(q)]) * static_cast<std::size_t>(hd);
        std::memcpy(row_k.data() + static_cast<std::size_t>(q) * static_cast<std::size_t>(hd), h_k[r].data() + s, width);
        std::memcpy(row_v.data() + static_cast<std::size_t>(q) * static_cast<std::size_t>(hd), h_v[r].data() + s, width);
      }
      if (std::memcmp(row_k.data(), got_k.data(), row_elems * sizeof(T)) != 0) fail(where + ": compacted keys differ");
      if (std::memcmp(row_v.data(), got_v.data(), row_elems * sizeof(T)) != 0) fail(where + ": compacted values differ");
    }
  std::printf("  %s: %zu rows, %zu kept tokens%s%s -> %s\n", tag.c_str(), rows.size(), kept_total,
              c.select_only ? ", select-only" : "", c.views ? ", strided views" : "", g_failures ? "FAILURES SO FAR" : "ok");

  CUDA_OK(cudaStreamDestroy(stream));
  if (d_ws != nullptr) CUDA_OK(cudaFree(d_ws));
  CUDA_OK(cudaFree(d_status));
  CUDA_OK(cudaFree(d_rows));
  CUDA_OK(cudaFree(d_kept));
  CUDA_OK(cudaFree(d_scores));
  for (void* p : raw) CUDA_OK(cudaFree(p));
}

template <typename T>
void run_case_t(const CaseSpec& c, int id, int score_type, std::size_t smem) {
  if (score_type == 0) run_case<T, float>(c, id, smem);
  else if (score_type == 1) run_case<T, __half>(c, id, smem);
  else run_case<T, __nv_bfloat16>(c, id, smem);
}

/// A random case: regime by id, sizes scaled to ~160 MB of source K/V.
CaseSpec make_case(std::mt19937_64& rng, int id, int& elem_type, int& score_type) {
  CaseSpec c;
  c.seed = rng();
  elem_type = static_cast<int>(rng() % 3);
  score_type = (rng() % 5 < 3) ? 0 : 1 + static_cast<int>(rng() % 2);
  const int hd_pick = static_cast<int>(rng() % 10);
  c.head_dim = hd_pick < 5 ? 128 : hd_pick < 9 ? 64 : (rng() % 2 ? 7 : 100);
  const int regime = id % 5;
  int max_len = 4096;
  switch (regime) {
    case 0: c.layers = 1 + static_cast<int>(rng() % 32); c.heads = 1 + static_cast<int>(rng() % 8); max_len = 4096; break;
    case 1: c.layers = 8 + static_cast<int>(rng() % 25); c.heads = 4 + static_cast<int>(rng() % 5); max_len = 16384; break;
    case 2: c.layers = 1 + static_cast<int>(rng() % 2); c.heads = 1 + static_cast<int>(rng() % 4); max_len = 131072; break;
    case 3: c.layers = 1 + static_cast<int>(rng() % 4); c.heads = 1 + static_cast<int>(rng() % 8); max_len = 4; break;
    default: c.layers = 1 + static_cast<int>(rng() % 32); c.heads = 1 + static_cast<int>(rng() % 8); max_len = 131072; break;
  }
  const std::size_t elem = elem_type == 0 ? 4u : 2u;
  const std::size_t budget = g_budget_bytes;
  const std::size_t per_token = static_cast<std::size_t>(c.head_dim) * elem * 2u;
  const std::size_t rows = static_cast<std::size_t>(c.layers) * static_cast<std::size_t>(c.heads);
  const std::size_t cap_tokens = budget / per_token / rows;
  const bool one_full_row = regime == 2 && rng() % 2 == 0 && per_token * 131072u <= budget;  // one row of 131072 tokens
  if (one_full_row) {
    c.layers = 1;
    c.heads = 1;
    max_len = 131072;
  } else if (static_cast<std::size_t>(max_len) > cap_tokens) {
    max_len = static_cast<int>(std::max<std::size_t>(cap_tokens, 1));
  }
  c.n_sink = std::vector<int>{0, 1, 4, 16, 8200}[rng() % 5];  // 8200: the first middle slot is in chunk 1
  c.n_recent = std::vector<int>{0, 1, 32, 256}[rng() % 4];
  c.score_mode = static_cast<int>(rng() % 6);
  c.path = static_cast<dc::EvictPath>(id % 3);
  c.select_only = rng() % 5 == 0;
  c.views = rng() % 4 == 0;
  c.token_pad = c.views ? std::vector<int>{0, 8, 3}[rng() % 3] : 0;
  const bool per_head_len = rng() % 2 == 0;
  const bool per_head_k = rng() % 3 == 0;
  c.n.assign(static_cast<std::size_t>(c.layers), std::vector<int>(static_cast<std::size_t>(c.heads), 0));
  c.k = c.n;
  for (int l = 0; l < c.layers; ++l) {
    const int base = regime == 3 ? static_cast<int>(rng() % 5)
                     : (one_full_row || rng() % 8 == 0) ? max_len
                                                        : static_cast<int>(rng() % static_cast<std::uint64_t>(max_len + 1));
    const double ratio = std::uniform_real_distribution<double>(0.0, 1.1)(rng);
    const int special = static_cast<int>(rng() % 8);
    for (int h = 0; h < c.heads; ++h) {
      const int n = (per_head_len && !one_full_row) ? (regime == 3 ? static_cast<int>(rng() % 5) : static_cast<int>(rng() % static_cast<std::uint64_t>(base + 1)))
                                 : base;
      c.n[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)] = n;
      const int pc = depthkv::detail::protected_count(n, c.n_sink, c.n_recent);
      int k;
      const double rr = per_head_k ? std::uniform_real_distribution<double>(0.0, 1.1)(rng) : ratio;
      switch (special) {
        case 0: k = pc; break;
        case 1: k = n; break;
        case 2: k = n + 1 + static_cast<int>(rng() % 10); break;
        case 3: k = std::min(n, pc + 1); break;
        default: k = std::max(pc, static_cast<int>(rr * n));
      }
      c.k[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)] = k;
    }
  }
  return c;
}

// ---- directed tests ----------------------------------------------------------------------------

void test_status_and_errors() {
  // rows: 0 has a NaN score, 1 keeps fewer than its protected tokens, 2 is longer than max_n, 3 is fine
  const int n = 64, hd = 8;
  std::vector<float> s(4 * n);
  for (int i = 0; i < 4 * n; ++i) s[static_cast<std::size_t>(i)] = static_cast<float>((i * 37) % 11);
  s[5] = std::numeric_limits<float>::quiet_NaN();
  float* d_s = nullptr;
  float* d_src = nullptr;
  float* d_dst = nullptr;
  std::int32_t* d_kept = nullptr;
  CUDA_OK(cudaMalloc(&d_s, s.size() * sizeof(float)));
  CUDA_OK(cudaMemcpy(d_s, s.data(), s.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&d_src, 4 * n * hd * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_dst, 4 * n * hd * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_kept, 4 * n * sizeof(std::int32_t)));
  std::vector<dc::EvictRow> rows(4);
  for (int r = 0; r < 4; ++r) {
    rows[static_cast<std::size_t>(r)].scores = d_s + r * n;
    rows[static_cast<std::size_t>(r)].src_k = d_src + r * n * hd;
    rows[static_cast<std::size_t>(r)].dst_k = d_dst + r * n * hd;
    rows[static_cast<std::size_t>(r)].src_token_stride = hd;
    rows[static_cast<std::size_t>(r)].dst_token_stride = hd;
    rows[static_cast<std::size_t>(r)].kept_slots = d_kept + r * n;
    rows[static_cast<std::size_t>(r)].n = n;
    rows[static_cast<std::size_t>(r)].k = 20;
  }
  rows[1].k = 3;       // < 2 + 4 protected
  rows[2].n = n + 1;   // > max_n
  dc::EvictRow* d_rows = nullptr;
  CUDA_OK(cudaMalloc(&d_rows, rows.size() * sizeof(dc::EvictRow)));
  CUDA_OK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(dc::EvictRow), cudaMemcpyHostToDevice));
  std::uint32_t* d_status = nullptr;
  CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));
  for (dc::EvictPath path : {dc::EvictPath::kOneBlockPerRow, dc::EvictPath::kMultiBlock}) {
    dc::EvictParams p;
    p.rows = d_rows;
    p.n_rows = 4;
    p.max_n = n;
    p.head_dim = hd;
    p.n_sink = 2;
    p.n_recent = 4;
    p.status = d_status;
    p.path = path;
    const std::size_t ws = dc::EvictWorkspaceBytes(p);
    void* d_ws = nullptr;
    CUDA_OK(cudaMalloc(&d_ws, ws + 1));
    CUDA_OK(dc::Evict<float>(p, d_ws, ws));
    CUDA_OK(cudaDeviceSynchronize());
    std::uint32_t st = 0;
    CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
    const std::uint32_t want = dc::EvictStatus::kNaNScore | dc::EvictStatus::kBadKeep | dc::EvictStatus::kBadRow;
    if (st != want) fail("status bits " + std::to_string(st) + " != " + std::to_string(want) + " (path " + std::to_string(static_cast<int>(path)) + ")");
    // row 3 is still exact
    std::vector<std::int32_t> got(20);
    CUDA_OK(cudaMemcpy(got.data(), d_kept + 3 * n, 20 * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    if (got != naive_select_keep(s.data() + 3 * n, pos.data(), n, 20, 2, 4)) fail("valid row next to bad rows differs");
    // parameter errors
    dc::EvictParams bad = p;
    bad.n_sink = -1;
    if (dc::Evict<float>(bad, d_ws, ws) != cudaErrorInvalidValue) fail("negative n_sink accepted");
    bad = p;
    if (ws > 0 && dc::Evict<float>(bad, d_ws, ws - 1) != cudaErrorInvalidValue) fail("small workspace accepted");
    bad.head_dim = 0;
    if (dc::Evict<float>(bad, d_ws, ws) != cudaErrorInvalidValue) fail("head_dim 0 accepted");
    CUDA_OK(cudaFree(d_ws));
  }
  dc::EvictParams none;
  if (dc::Evict<float>(none, nullptr, 0) != cudaSuccess) fail("empty eviction failed");
  CUDA_OK(cudaFree(d_status));
  CUDA_OK(cudaFree(d_rows));
  CUDA_OK(cudaFree(d_kept));
  CUDA_OK(cudaFree(d_dst));
  CUDA_OK(cudaFree(d_src));
  CUDA_OK(cudaFree(d_s));
  std::printf("  status bits and parameter errors: %s\n", g_failures ? "FAILURES SO FAR" : "ok");
}

void test_device_layer() {
  const int H = 3, hd = 16, cap = 40;
  dc::DeviceLayer<__nv_bfloat16> L(H, hd, cap);
  std::vector<__nv_bfloat16> k(static_cast<std::size_t>(cap * hd)), v(k.size());
  std::vector<std::int32_t> pos(static_cast<std::size_t>(cap));
  fill_random_bytes(k.data(), k.size() * 2, 11);
  fill_random_bytes(v.data(), v.size() * 2, 12);
  std::iota(pos.begin(), pos.end(), 100);
  for (int h = 0; h < H; ++h) CUDA_OK(L.upload_head(h, k.data(), v.data(), pos.data(), 10 + 5 * h));
  if (L.bytes() != static_cast<std::size_t>(10 + 15 + 20) * hd * 2 * 2) fail("DeviceLayer bytes");
  if (L.bytes_allocated() != static_cast<std::size_t>(H) * cap * hd * 2 * 2) fail("DeviceLayer bytes_allocated");
  L.shrink_to_fit();
  if (L.capacity() != 20) fail("DeviceLayer shrink_to_fit capacity");
  L.reserve(64);
  if (L.capacity() != 64) fail("DeviceLayer reserve capacity");
  for (int h = 0; h < H; ++h) {
    const int n = 10 + 5 * h;
    std::vector<__nv_bfloat16> gk(static_cast<std::size_t>(n * hd)), gv(gk.size());
    std::vector<std::int32_t> gp(static_cast<std::size_t>(n));
    CUDA_OK(L.download_head(h, gk.data(), gv.data(), gp.data()));
    CUDA_OK(cudaDeviceSynchronize());
    if (std::memcmp(gk.data(), k.data(), gk.size() * 2) != 0 || std::memcmp(gv.data(), v.data(), gv.size() * 2) != 0 ||
        !std::equal(gp.begin(), gp.end(), pos.begin()))
      fail("DeviceLayer data lost by shrink_to_fit/reserve, head " + std::to_string(h));
  }
  dc::DeviceLayer<__nv_bfloat16> M(std::move(L));
  if (M.size(2) != 20 || L.keys_data() != nullptr) fail("DeviceLayer move");
  const dc::DeviceLayerView<__nv_bfloat16> view = M.view();
  if (view.size(1) != 15 || view.key(1, 2) != M.key(1, 2)) fail("DeviceLayer view");
  // the host side of the Layer concept: a KVCache of device layers
  depthkv::KVCache<dc::DeviceLayer<__nv_bfloat16>> cache;
  cache.add_layer(dc::DeviceLayer<__nv_bfloat16>(2, 8, 16));
  cache.add_layer(std::move(M));
  cache.layer(0).set_size(1, 5);
  if (cache.lengths() != std::vector<int>{5, 20}) fail("KVCache<DeviceLayer> lengths");
  if (cache.bytes() != static_cast<std::size_t>(5) * 8 * 2 * 2 + static_cast<std::size_t>(10 + 15 + 20) * hd * 2 * 2)
    fail("KVCache<DeviceLayer> bytes");
  cache.shrink_to_fit();
  if (cache.layer(0).capacity() != 5 || cache.layer(1).capacity() != 20) fail("KVCache<DeviceLayer> shrink_to_fit");
  std::printf("  DeviceLayer round trips: %s\n", g_failures ? "FAILURES SO FAR" : "ok");
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  std::uint64_t seed = 20241129;
  int max_cases = 150;
  double seconds = 200.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--cases") max_cases = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (a == "--budget-mb") g_budget_bytes = static_cast<std::size_t>(std::max(1, std::atoi(argv[i + 1]))) << 20;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("cuda_evict_test: %s (sm_%d%d, %d SMs), seed %llu%s\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, static_cast<unsigned long long>(seed),
#ifdef DEPTHKV_TEST_HAVE_EVICTOR
              ", CPU path: depthkv::select_keep (+ naive cross-check)"
#else
              ", CPU path: naive reference (evictor.hpp not present)"
#endif
  );
  test_status_and_errors();
  test_device_layer();
  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(seed);
  int done = 0;
  for (int id = 0; id < max_cases; ++id) {
    int elem = 0, score = 0;
    const CaseSpec c = make_case(rng, id, elem, score);
    if (elem == 0) run_case_t<float>(c, id, score, prop.sharedMemPerBlockOptin);
    else if (elem == 1) run_case_t<__half>(c, id, score, prop.sharedMemPerBlockOptin);
    else run_case_t<__nv_bfloat16>(c, id, score, prop.sharedMemPerBlockOptin);
    ++done;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > seconds && done >= std::min(15, max_cases)) {
      std::printf("  time budget of %.0f s reached after %d cases\n", seconds, done);
      break;
    }
  }
  if (g_failures) {
    std::printf("FAIL: %d mismatches (%d random cases)\n", g_failures, done);
    return 1;
  }
  std::printf("PASS: %d random cases + directed tests, all identical to the CPU path\n", done);
  return 0;
}
