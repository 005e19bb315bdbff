// CUDA eviction vs the CPU path, exactly: kept slots, kept positions and the compacted K/V bytes.
//
// Random shapes (1-32 layers, 1-8 KV heads, lengths 0..131072 per head, k from the protected
// count to n and beyond, head_dim 64/128 plus odd sizes for the narrow-copy paths, K/V in
// float/half/bfloat16, scores in float/half/bfloat16 of every kind of support/adversarial_scores.hpp:
// ties, constant rows, +/-inf, denormals, ...), both launch paths, owning
// layers and strided views over raw device memory, select-only and select+compact; plus status
// bits, parameter errors (alignment, length limit), 16-bit NaN scores, two evictions in flight on
// two streams, and DeviceLayer round trips.
//
// Overruns: every destination (K/V rows up to the layer's capacity including the padding of each
// token's stride, positions up to capacity, kept slots up to the row's stride) is pre-filled with a
// pattern; after the eviction the kept entries must be exact and everything past n_kept (and every
// stride pad) must still hold the pattern. compute-sanitizer's memcheck sees only writes outside
// allocations; these checks see writes into slack inside them.
//
// The reference ranks by definition (support/selection_reference.hpp: a full sort with plain
// comparisons, score desc then position asc), cross-checked with the CPU evictor when present.
// Exit codes: 0 pass, 1 mismatch or any CUDA error, 77 no CUDA device (support/cuda_device_probe.hpp).
//
// Usage: cuda_evict_test [--seed S] [--cases N] [--seconds T] [--budget-mb M (source K/V bytes per case)]
//                        [--case ID (rerun only random case ID of this seed and budget; no directed tests)]
//                        [--random-only (no directed tests: for the slow sanitizer tools)]

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
#include "depthkv/kv_cache.hpp"
#include "support/adversarial_scores.hpp"
#include "support/cuda_device_probe.hpp"
#include "support/cuda_test_check.hpp"
#include "support/selection_reference.hpp"

#if !defined(DEPTHKV_TEST_NO_CPU_EVICTOR) && __has_include("depthkv/evictor.hpp")
#include "depthkv/evictor.hpp"
#define DEPTHKV_TEST_HAVE_EVICTOR 1
#endif

namespace dc = depthkv::cuda;

namespace {

using depthkv_test::fail;
using depthkv_test::g_failures;
std::size_t g_budget_bytes = std::size_t{160} << 20;  // source K+V bytes per random case

constexpr unsigned char kDstPattern = 0xa5;         // pre-fill of destination K/V bytes
constexpr unsigned char kPosPattern = 0x5a;         // pre-fill of destination position bytes
constexpr std::int32_t kPosSentinel = 0x5a5a5a5a;   // ... as int32
constexpr std::int32_t kSlotSentinel = -1;          // pre-fill of kept slots (0xff bytes)

/// Protected slots of a row (the first n_sink and the last n_recent), by definition.
int protected_slots(int n, int n_sink, int n_recent) { return std::min(n, n_sink + n_recent); }

/// Checks one head's destination rows after an eviction: token q < n_written holds the source
/// token ref[q] (`row_bytes` of `src`, tokens `row_bytes` apart), the stride pad of every token and
/// every token from n_written up to `cap` still hold kDstPattern. Returns "" or what differs.
std::string check_dst_rows(const std::vector<unsigned char>& got, const unsigned char* src, const std::vector<std::int32_t>& ref,
                           int n_written, int cap, std::size_t stride_bytes, std::size_t row_bytes) {
  for (int q = 0; q < cap; ++q) {
    const unsigned char* g = got.data() + static_cast<std::size_t>(q) * stride_bytes;
    std::size_t from = 0;
    if (q < n_written) {
      if (std::memcmp(g, src + static_cast<std::size_t>(ref[static_cast<std::size_t>(q)]) * row_bytes, row_bytes) != 0)
        return "kept token " + std::to_string(q) + " differs";
      from = row_bytes;
    }
    for (std::size_t b = from; b < stride_bytes; ++b)
      if (g[b] != kDstPattern)
        return (q < n_written ? "stride pad of kept token " : "overrun: token ") + std::to_string(q) + " byte " +
               std::to_string(b) + " written (n_kept " + std::to_string(n_written) + ", capacity " + std::to_string(cap) + ")";
  }
  return "";
}

// ---- the CPU path --------------------------------------------------------------------------------

/// The CPU path for one row: depthkv::select_keep on the float scores (and on the raw 16-bit
/// scores when the GPU ranked half/bfloat16 keys: `raw16`, `bf16`), cross-checked with the naive
/// reference. Without evictor.hpp, the naive reference alone.
std::vector<std::int32_t> cpu_select(const float* s, const std::int32_t* pos, int n, int k, int sink, int recent,
                                     const std::uint16_t* raw16 = nullptr, bool bf16 = false) {
  std::vector<std::int32_t> ref = depthkv_test::naive_select_keep(s, pos, n, k, sink, recent);
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
        const ScoreT s = from_float<ScoreT>(depthkv_test::adversarial_score(c.score_mode, i, n, rng));
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

  // destinations pre-filled with patterns (checked after the eviction: nothing past n_kept written)
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      T* dk = c.views ? view_dst[static_cast<std::size_t>(l)].key(h, 0) : own_dst[static_cast<std::size_t>(l)].key(h, 0);
      T* dv = c.views ? view_dst[static_cast<std::size_t>(l)].value(h, 0) : own_dst[static_cast<std::size_t>(l)].value(h, 0);
      std::int32_t* dp = c.views ? view_dst[static_cast<std::size_t>(l)].positions(h) : own_dst[static_cast<std::size_t>(l)].positions(h);
      const std::size_t tsd = static_cast<std::size_t>(c.views ? view_dst[static_cast<std::size_t>(l)].token_stride()
                                                               : own_dst[static_cast<std::size_t>(l)].token_stride());
      const std::size_t cl = static_cast<std::size_t>(cap[static_cast<std::size_t>(l)]);
      CUDA_OK(cudaMemset(dk, kDstPattern, cl * tsd * sizeof(T)));
      CUDA_OK(cudaMemset(dv, kDstPattern, cl * tsd * sizeof(T)));
      CUDA_OK(cudaMemset(dp, kPosPattern, cl * sizeof(std::int32_t)));
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
  std::vector<unsigned char> got_k, got_v;
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
      // kept slots: exact in [0, n_kept), the sentinel up to the row's stride
      got_slots.assign(static_cast<std::size_t>(score_stride), 0);
      CUDA_OK(cudaMemcpy(got_slots.data(), d_kept + r * static_cast<std::size_t>(score_stride),
                         static_cast<std::size_t>(score_stride) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
      if (!std::equal(ref.begin(), ref.end(), got_slots.begin())) {
        int first = 0;
        while (first < n_kept && got_slots[static_cast<std::size_t>(first)] == ref[static_cast<std::size_t>(first)]) ++first;
        fail(where + ": kept slots differ at index " + std::to_string(first));
        continue;
      }
      for (int q = n_kept; q < score_stride; ++q)
        if (got_slots[static_cast<std::size_t>(q)] != kSlotSentinel) {
          fail(where + ": overrun: kept slot " + std::to_string(q) + " written past n_kept " + std::to_string(n_kept));
          break;
        }
      // positions: exact in [0, n_kept), the pattern up to the capacity
      const int capd = c.views ? view_dst[static_cast<std::size_t>(l)].capacity() : own_dst[static_cast<std::size_t>(l)].capacity();
      const std::size_t tsd = static_cast<std::size_t>(c.views ? view_dst[static_cast<std::size_t>(l)].token_stride()
                                                               : own_dst[static_cast<std::size_t>(l)].token_stride());
      const std::int32_t* dpos = c.views ? view_dst[static_cast<std::size_t>(l)].positions(h) : own_dst[static_cast<std::size_t>(l)].positions(h);
      got_pos.assign(static_cast<std::size_t>(capd), 0);
      CUDA_OK(cudaMemcpy(got_pos.data(), dpos, static_cast<std::size_t>(capd) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
      for (int q = 0; q < capd; ++q) {
        const bool kept = q < n_kept;
        if (kept ? got_pos[static_cast<std::size_t>(q)] != h_pos[r][static_cast<std::size_t>(ref[static_cast<std::size_t>(q)])]
                 : got_pos[static_cast<std::size_t>(q)] != kPosSentinel) {
          fail(where + (kept ? ": kept position " : ": overrun: position ") + std::to_string(q) +
               (kept ? " differs" : " written past n_kept " + std::to_string(n_kept)));
          break;
        }
      }
      // K/V: the kept rows exact (select-only: none written), every pad and everything past them the pattern
      const int written = c.select_only ? 0 : n_kept;
      const std::size_t stride_bytes = tsd * sizeof(T), row_bytes = static_cast<std::size_t>(hd) * sizeof(T);
      const T* dk = c.views ? view_dst[static_cast<std::size_t>(l)].key(h, 0) : own_dst[static_cast<std::size_t>(l)].key(h, 0);
      const T* dv = c.views ? view_dst[static_cast<std::size_t>(l)].value(h, 0) : own_dst[static_cast<std::size_t>(l)].value(h, 0);
      got_k.resize(static_cast<std::size_t>(capd) * stride_bytes);
      got_v.resize(got_k.size());
      CUDA_OK(cudaMemcpy(got_k.data(), dk, got_k.size(), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got_v.data(), dv, got_v.size(), cudaMemcpyDeviceToHost));
      const std::string ek = check_dst_rows(got_k, reinterpret_cast<const unsigned char*>(h_k[r].data()), ref, written, capd,
                                            stride_bytes, row_bytes);
      if (!ek.empty()) fail(where + ": keys: " + ek);
      const std::string ev = check_dst_rows(got_v, reinterpret_cast<const unsigned char*>(h_v[r].data()), ref, written, capd,
                                            stride_bytes, row_bytes);
      if (!ev.empty()) fail(where + ": values: " + ev);
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
  c.score_mode = static_cast<int>(rng() % depthkv_test::kScoreKinds);
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
      const int pc = protected_slots(n, c.n_sink, c.n_recent);
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
    if (got != depthkv_test::naive_select_keep(s.data() + 3 * n, pos.data(), n, 20, 2, 4)) fail("valid row next to bad rows differs");
    // parameter errors
    dc::EvictParams bad = p;
    bad.n_sink = -1;
    if (dc::Evict<float>(bad, d_ws, ws) != cudaErrorInvalidValue) fail("negative n_sink accepted");
    bad = p;
    if (ws > 0 && dc::Evict<float>(bad, d_ws, ws - 1) != cudaErrorInvalidValue) fail("small workspace accepted");
    bad.head_dim = 0;
    if (dc::Evict<float>(bad, d_ws, ws) != cudaErrorInvalidValue) fail("head_dim 0 accepted");
    // workspace alignment and the length limit (gridDim.y <= 65535 chunks)
    if (dc::EvictParamsError<float>(p, d_ws, ws) != nullptr) fail("valid parameters reported as an error");
    void* misaligned = static_cast<unsigned char*>(d_ws) + 4;
    if (dc::Evict<float>(p, misaligned, ws) != cudaErrorInvalidValue) fail("misaligned workspace accepted");
    const char* why = dc::EvictParamsError<float>(p, misaligned, ws);
    if (why == nullptr || std::strstr(why, "aligned") == nullptr) fail("misaligned workspace: no clear error");
    bad = p;
    bad.max_n = dc::detail::kEvictMaxN + 1;
    if (dc::Evict<float>(bad, d_ws, std::size_t{1} << 40) != cudaErrorInvalidValue) fail("max_n above kEvictMaxN accepted");
    why = dc::EvictParamsError<float>(bad, d_ws, std::size_t{1} << 40);
    if (why == nullptr || std::strstr(why, "kEvictMaxN") == nullptr) fail("max_n above kEvictMaxN: no clear error");
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

/// 16-bit NaN scores on the device path: rows 0 and 2 hold a NaN (a middle slot; a recent-window
/// slot), row 1 is valid with +/-inf. Both launch paths, a one-block-sized and a multi-block-sized
/// length: kNaNScore is set, the valid row is exact; without the NaN rows no bit is set.
template <typename ScoreT>
void test_nan16(std::uint16_t nan_a, std::uint16_t nan_b) {
  for (int n : {300, 20000}) {
    const int k = n / 4, sink = 2, recent = 4, R = 3;
    std::vector<ScoreT> s(static_cast<std::size_t>(R) * static_cast<std::size_t>(n));
    std::vector<float> f(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      const int v = static_cast<int>((i * 37u) % 23u) - 11;
      s[i] = from_float<ScoreT>(v == 11 ? std::numeric_limits<float>::infinity()
                                : v == -11 ? -std::numeric_limits<float>::infinity() : static_cast<float>(v) * 0.25f);
      f[i] = to_float<ScoreT>(s[i]);
    }
    std::memcpy(static_cast<void*>(&s[static_cast<std::size_t>(n / 2)]), &nan_a, 2);                                     // row 0, middle
    std::memcpy(static_cast<void*>(&s[2 * static_cast<std::size_t>(n) + static_cast<std::size_t>(n - 2)]), &nan_b, 2);  // row 2, recent window
    ScoreT* d_s = nullptr;
    std::int32_t* d_kept = nullptr;
    std::uint32_t* d_status = nullptr;
    dc::EvictRow* d_rows = nullptr;
    CUDA_OK(cudaMalloc(&d_s, s.size() * sizeof(ScoreT)));
    CUDA_OK(cudaMemcpy(d_s, s.data(), s.size() * sizeof(ScoreT), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_kept, s.size() * sizeof(std::int32_t)));
    CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));
    std::vector<dc::EvictRow> rows(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      rows[static_cast<std::size_t>(r)].scores = d_s + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      rows[static_cast<std::size_t>(r)].kept_slots = d_kept + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      rows[static_cast<std::size_t>(r)].n = n;
      rows[static_cast<std::size_t>(r)].k = k;
    }
    CUDA_OK(cudaMalloc(&d_rows, rows.size() * sizeof(dc::EvictRow)));
    CUDA_OK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(dc::EvictRow), cudaMemcpyHostToDevice));
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    const std::vector<std::int32_t> ref = depthkv_test::naive_select_keep(f.data() + n, pos.data(), n, k, sink, recent);
    for (dc::EvictPath path : {dc::EvictPath::kOneBlockPerRow, dc::EvictPath::kMultiBlock})
      for (int with_nan = 1; with_nan >= 0; --with_nan) {
        dc::EvictParams p;
        p.rows = with_nan ? d_rows : d_rows + 1;  // without: row 1 alone
        p.n_rows = with_nan ? R : 1;
        p.max_n = n;
        p.head_dim = 1;
        p.n_sink = sink;
        p.n_recent = recent;
        p.status = d_status;
        p.path = path;
        const std::size_t ws = dc::EvictWorkspaceBytes(p);
        void* d_ws = nullptr;
        if (ws > 0) CUDA_OK(cudaMalloc(&d_ws, ws));
        CUDA_OK(cudaMemset(d_kept, 0xff, s.size() * sizeof(std::int32_t)));
        CUDA_OK((dc::Evict<float, ScoreT>(p, d_ws, ws)));
        CUDA_OK(cudaDeviceSynchronize());
        std::uint32_t st = 0;
        CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
        const std::string where = std::string(type_name<ScoreT>()) + " NaN scores, n " + std::to_string(n) + ", path " +
                                  std::to_string(static_cast<int>(path)) + (with_nan ? "" : ", valid row alone");
        const std::uint32_t want = with_nan ? dc::EvictStatus::kNaNScore : 0u;
        if (st != want) fail(where + ": status " + std::to_string(st) + " != " + std::to_string(want));
        std::vector<std::int32_t> got(static_cast<std::size_t>(n));
        CUDA_OK(cudaMemcpy(got.data(), d_kept + n, static_cast<std::size_t>(n) * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
        if (!std::equal(ref.begin(), ref.end(), got.begin())) fail(where + ": valid row differs");
        for (int q = static_cast<int>(ref.size()); q < n; ++q)
          if (got[static_cast<std::size_t>(q)] != kSlotSentinel) {
            fail(where + ": overrun past n_kept");
            break;
          }
        if (d_ws != nullptr) CUDA_OK(cudaFree(d_ws));
      }
    CUDA_OK(cudaFree(d_rows));
    CUDA_OK(cudaFree(d_status));
    CUDA_OK(cudaFree(d_kept));
    CUDA_OK(cudaFree(d_s));
  }
  std::printf("  16-bit NaN scores (%s): %s\n", type_name<ScoreT>(), g_failures ? "FAILURES SO FAR" : "ok");
}

/// One batched eviction of `R` rows of `n` tokens (float scores, float K of head_dim 8), its own buffers.
struct StreamProblem {
  int R = 0, n = 0, k = 0, hd = 8;
  dc::EvictPath path = dc::EvictPath::kAuto;
  std::vector<float> s, key;
  float *d_s = nullptr, *d_src = nullptr, *d_dst = nullptr;
  std::int32_t* d_kept = nullptr;
  std::uint32_t* d_status = nullptr;
  dc::EvictRow* d_rows = nullptr;
  void* d_ws = nullptr;
  std::size_t ws = 0;
  dc::EvictParams p;

  StreamProblem(int R_, int n_, int k_, dc::EvictPath path_, std::uint64_t seed) : R(R_), n(n_), k(k_), path(path_) {
    const std::size_t N = static_cast<std::size_t>(R) * static_cast<std::size_t>(n);
    std::mt19937_64 rng(seed);
    s.resize(N);
    for (float& x : s) x = static_cast<float>(rng() % 1000u) * 0.125f;  // many ties
    key.resize(N * static_cast<std::size_t>(hd));
    fill_random_bytes(key.data(), key.size() * sizeof(float), seed + 1);
    CUDA_OK(cudaMalloc(&d_s, N * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_s, s.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_src, key.size() * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_src, key.data(), key.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_dst, key.size() * sizeof(float)));
    CUDA_OK(cudaMemset(d_dst, kDstPattern, key.size() * sizeof(float)));
    CUDA_OK(cudaMalloc(&d_kept, N * sizeof(std::int32_t)));
    CUDA_OK(cudaMemset(d_kept, 0xff, N * sizeof(std::int32_t)));
    CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));
    std::vector<dc::EvictRow> rows(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      dc::EvictRow& w = rows[static_cast<std::size_t>(r)];
      const std::size_t o = static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      w.scores = d_s + o;
      w.src_k = d_src + o * static_cast<std::size_t>(hd);
      w.dst_k = d_dst + o * static_cast<std::size_t>(hd);
      w.kept_slots = d_kept + o;
      w.src_token_stride = hd;
      w.dst_token_stride = hd;
      w.n = n;
      w.k = k;
    }
    CUDA_OK(cudaMalloc(&d_rows, rows.size() * sizeof(dc::EvictRow)));
    CUDA_OK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(dc::EvictRow), cudaMemcpyHostToDevice));
    p.rows = d_rows;
    p.n_rows = R;
    p.max_n = n;
    p.head_dim = hd;
    p.n_sink = 4;
    p.n_recent = 16;
    p.status = d_status;
    p.path = path;
    ws = dc::EvictWorkspaceBytes(p);
    if (ws > 0) CUDA_OK(cudaMalloc(&d_ws, ws));
  }
  StreamProblem(const StreamProblem&) = delete;
  StreamProblem& operator=(const StreamProblem&) = delete;
  ~StreamProblem() {
    for (void* q : {static_cast<void*>(d_s), static_cast<void*>(d_src), static_cast<void*>(d_dst), static_cast<void*>(d_kept),
                    static_cast<void*>(d_status), static_cast<void*>(d_rows), d_ws})
      if (q != nullptr) (void)cudaFree(q);
  }
  void launch(cudaStream_t stream) { CUDA_OK(dc::Evict<float>(p, d_ws, ws, stream)); }
  /// Compares with the reference (kept slots, K rows, sentinels, status 0).
  void check(const std::string& what) {
    std::uint32_t st = 0;
    CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
    if (st != 0u) fail(what + ": status " + std::to_string(st));
    const std::size_t N = static_cast<std::size_t>(R) * static_cast<std::size_t>(n);
    std::vector<std::int32_t> kept(N);
    std::vector<unsigned char> dst(key.size() * sizeof(float));
    CUDA_OK(cudaMemcpy(kept.data(), d_kept, N * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(dst.data(), d_dst, dst.size(), cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
    std::iota(pos.begin(), pos.end(), 0);
    const std::size_t row_bytes = static_cast<std::size_t>(hd) * sizeof(float);
    for (int r = 0; r < R; ++r) {
      const std::size_t o = static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      const std::vector<std::int32_t> ref = depthkv_test::naive_select_keep(s.data() + o, pos.data(), n, k, 4, 16);
      bool ok = std::equal(ref.begin(), ref.end(), kept.begin() + static_cast<std::ptrdiff_t>(o));
      for (std::size_t q = ref.size(); ok && q < static_cast<std::size_t>(n); ++q) ok = kept[o + q] == kSlotSentinel;
      if (!ok) {
        fail(what + ": row " + std::to_string(r) + " kept slots differ or overrun");
        continue;
      }
      const std::vector<unsigned char> got(dst.begin() + static_cast<std::ptrdiff_t>(o * row_bytes),
                                           dst.begin() + static_cast<std::ptrdiff_t>((o + static_cast<std::size_t>(n)) * row_bytes));
      const std::string e = check_dst_rows(got, reinterpret_cast<const unsigned char*>(key.data() + o * static_cast<std::size_t>(hd)),
                                           ref, static_cast<int>(ref.size()), n, row_bytes, row_bytes);
      if (!e.empty()) fail(what + ": row " + std::to_string(r) + " keys: " + e);
    }
  }
};

/// Two evictions in flight at once on two streams (one per launch path, the one-block one above
/// the default 48 KiB of shared memory, so its first call raises the kernel's limit while the
/// other runs): both exact, with results equal to the reference.
void test_two_streams() {
  StreamProblem a(4, 100000, 30000, dc::EvictPath::kMultiBlock, 501);
  StreamProblem b(96, 14000, 3000, dc::EvictPath::kOneBlockPerRow, 502);
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int rep = 0; rep < 3; ++rep) {
    a.launch(s1);
    b.launch(s2);
  }
  CUDA_OK(cudaStreamSynchronize(s1));
  CUDA_OK(cudaStreamSynchronize(s2));
  a.check("two streams, multi-block");
  b.check("two streams, one block per row");
  CUDA_OK(cudaStreamDestroy(s1));
  CUDA_OK(cudaStreamDestroy(s2));
  std::printf("  two evictions in flight on two streams: %s\n", g_failures ? "FAILURES SO FAR" : "ok");
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
  const int probe = depthkv_test::cuda_device_probe("cuda_evict_test");
  if (probe != 0) return probe;
  std::uint64_t seed = 20241129;
  int max_cases = 150;
  int only_case = -1;
  double seconds = 200.0;
  int budget_mb = 160;
  bool directed = true;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--random-only") {
      directed = false;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "FAIL: %s needs a value\n", a.c_str());
      return 1;
    }
    if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--cases") max_cases = std::atoi(argv[i + 1]);
    else if (a == "--case") only_case = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (a == "--budget-mb") budget_mb = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "FAIL: unknown argument %s\n", a.c_str());
      return 1;
    }
  }
  g_budget_bytes = static_cast<std::size_t>(budget_mb) << 20;
  if (only_case >= 0) max_cases = only_case + 1;
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
  if (only_case < 0 && directed) {
    test_status_and_errors();
    test_nan16<__half>(0x7e00u, 0xfc01u);
    test_nan16<__nv_bfloat16>(0x7fc0u, 0xff81u);
    test_two_streams();
    test_device_layer();
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(seed);
  int done = 0;
  std::vector<int> failed_ids;
  for (int id = 0; id < max_cases; ++id) {
    int elem = 0, score = 0;
    const CaseSpec c = make_case(rng, id, elem, score);  // every earlier case is drawn, so ids replay exactly
    if (only_case >= 0 && id != only_case) continue;
    const int before = g_failures;
    if (elem == 0) run_case_t<float>(c, id, score, prop.sharedMemPerBlockOptin);
    else if (elem == 1) run_case_t<__half>(c, id, score, prop.sharedMemPerBlockOptin);
    else run_case_t<__nv_bfloat16>(c, id, score, prop.sharedMemPerBlockOptin);
    if (g_failures != before) failed_ids.push_back(id);
    ++done;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (only_case < 0 && el > seconds && done >= std::min(15, max_cases)) {
      std::printf("  time budget of %.0f s reached after %d cases\n", seconds, done);
      break;
    }
  }
  for (int id : failed_ids)
    std::printf("  rerun: cuda_evict_test --seed %llu --budget-mb %d --case %d\n", static_cast<unsigned long long>(seed),
                budget_mb, id);
  if (g_failures) {
    std::printf("FAIL: %d mismatches (%d random cases)\n", g_failures, done);
    return 1;
  }
  if (only_case >= 0)
    std::printf("PASS: random case %d of seed %llu identical to the CPU path\n", only_case, static_cast<unsigned long long>(seed));
  else
    std::printf("PASS: %d random cases + directed tests, all identical to the CPU path\n", done);
  return 0;
}
