// CUDA score accumulation vs the CPU path, bit-exactly: depthkv::TokenScorer (fed the same
// probabilities as floats, observe_block per query head, heads ascending) and a naive loop in the
// documented order. H2O cumulative (accumulated over several blocks of queries) and SnapKV windows
// (no pooling, max, average), GQA groups 1..8, probabilities in float/half/bfloat16, plus the
// bad-probability status bit and parameter errors. Exit codes: 0 pass, 1 mismatch or any CUDA
// error, 77 no CUDA device (support/cuda_device_probe.hpp).

// The CPU scorer includes Eigen; compiled as host-only code in this CUDA translation unit.
#ifndef EIGEN_NO_CUDA
#define EIGEN_NO_CUDA 1
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <string>
#include <type_traits>
#include <vector>

#include "depthkv/cuda/score.cuh"
#include "depthkv/kv_cache.hpp"
#include "depthkv/token_scorer.hpp"
#include "support/cuda_device_probe.hpp"
#include "support/cuda_test_check.hpp"

namespace dc = depthkv::cuda;

namespace {

using depthkv_test::fail;
using depthkv_test::g_failures;
template <typename P>
P from_float(float f);
template <>
float from_float<float>(float f) { return f; }
template <>
__half from_float<__half>(float f) { return __float2half_rn(f); }
template <>
__nv_bfloat16 from_float<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
template <typename P>
float to_float(P p);
template <>
float to_float<float>(float p) { return p; }
template <>
float to_float<__half>(__half p) { return __half2float(p); }
template <>
float to_float<__nv_bfloat16>(__nv_bfloat16 p) { return __bfloat162float(p); }

template <typename P>
const char* type_name() {
  return std::is_same<P, float>::value ? "f32" : std::is_same<P, __half>::value ? "f16" : "bf16";
}

/// Random attention probabilities [n_heads][n_queries][ld] (causal-style zeros for some entries).
template <typename P>
std::vector<P> random_probs(std::mt19937_64& rng, int n_heads, int n_queries, int ld, int n, std::vector<float>& as_float) {
  std::vector<P> p(static_cast<std::size_t>(n_heads) * static_cast<std::size_t>(n_queries) * static_cast<std::size_t>(ld),
                   from_float<P>(0.f));
  as_float.assign(p.size(), 0.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (std::size_t q = 0; q < static_cast<std::size_t>(n_heads) * static_cast<std::size_t>(n_queries); ++q)
    for (int j = 0; j < n; ++j) {
      const float r = u(rng);
      const float v = r < 0.2f ? 0.0f : r * r / static_cast<float>(n);
      const std::size_t i = q * static_cast<std::size_t>(ld) + static_cast<std::size_t>(j);
      p[i] = from_float<P>(v);
      as_float[i] = to_float<P>(p[i]);
    }
  return p;
}

/// H2O order: per slot, query heads of the group ascending, queries ascending, float adds.
void cpu_sum(const std::vector<float>& probs, int n_heads, int n_kv, int n_queries, int ld, int n, std::vector<float>& s,
             int s_stride, bool accumulate) {
  const int group = n_heads / n_kv;
  for (int kv = 0; kv < n_kv; ++kv)
    for (int j = 0; j < n; ++j) {
      float acc = accumulate ? s[static_cast<std::size_t>(kv) * static_cast<std::size_t>(s_stride) + static_cast<std::size_t>(j)] : 0.0f;
      for (int g = 0; g < group; ++g) {
        const std::size_t q = static_cast<std::size_t>(kv * group + g);
        for (int i = 0; i < n_queries; ++i)
          acc = acc + probs[(q * static_cast<std::size_t>(n_queries) + static_cast<std::size_t>(i)) * static_cast<std::size_t>(ld) +
                            static_cast<std::size_t>(j)];
      }
      s[static_cast<std::size_t>(kv) * static_cast<std::size_t>(s_stride) + static_cast<std::size_t>(j)] = acc;
    }
}

/// SnapKV order: per slot and query (ascending), v = 0 + the group's heads (ascending), s = 0 + v.
void cpu_window_sum(const std::vector<float>& probs, int n_heads, int n_kv, int n_queries, int ld, int n,
                    std::vector<float>& s, int s_stride) {
  const int group = n_heads / n_kv;
  for (int kv = 0; kv < n_kv; ++kv)
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < n_queries; ++i) {
        float v = 0.0f;
        for (int g = 0; g < group; ++g) {
          const std::size_t q = static_cast<std::size_t>(kv * group + g);
          v = v + probs[(q * static_cast<std::size_t>(n_queries) + static_cast<std::size_t>(i)) * static_cast<std::size_t>(ld) +
                        static_cast<std::size_t>(j)];
        }
        acc = acc + v;
      }
      s[static_cast<std::size_t>(kv) * static_cast<std::size_t>(s_stride) + static_cast<std::size_t>(j)] = acc;
    }
}

/// depthkv::TokenScorer's scores for the observed blocks: blocks[b] = {n_queries, probs
/// [n_heads][n_queries][ld]}, each fed with observe_block per query head (ascending).
std::vector<float> token_scorer_scores(const depthkv::ScorerConfig& cfg, int n_heads, int n_kv, int ld, int n,
                                       const std::vector<std::pair<int, std::vector<float>>>& blocks, int s_stride) {
  depthkv::TokenScorer scorer(cfg, n_heads, n_kv);
  std::int32_t pos0 = 0;
  for (const auto& b : blocks) {
    for (int q = 0; q < n_heads; ++q)
      scorer.observe_block(q, pos0, b.first,
                           b.second.data() + static_cast<std::size_t>(q) * static_cast<std::size_t>(b.first) * static_cast<std::size_t>(ld),
                           ld, n);
    pos0 += b.first;
  }
  depthkv::HostLayer<float> layer(n_kv, 1, n);
  const std::vector<float> kv_row(static_cast<std::size_t>(n_kv), 1.0f);
  for (int j = 0; j < n; ++j) layer.append(kv_row.data(), kv_row.data(), j);
  const depthkv::LayerScores ls = scorer.scores(layer);
  std::vector<float> out(static_cast<std::size_t>(n_kv) * static_cast<std::size_t>(s_stride), 0.f);
  for (int kv = 0; kv < n_kv; ++kv)
    std::copy(ls[static_cast<std::size_t>(kv)].begin(), ls[static_cast<std::size_t>(kv)].end(),
              out.begin() + static_cast<std::ptrdiff_t>(kv) * s_stride);
  return out;
}

void cpu_pool(std::vector<float>& s, int n_kv, int n, int s_stride, int kernel, depthkv::Pooling pooling) {
  if (pooling == depthkv::Pooling::kNone) return;
  std::vector<float> in(s);
  const int half = kernel / 2;
  for (int kv = 0; kv < n_kv; ++kv)
    for (int j = 0; j < n; ++j) {
      const int t0 = j - half < 0 ? 0 : j - half, t1 = j + half >= n ? n - 1 : j + half;
      const float* row = in.data() + static_cast<std::size_t>(kv) * static_cast<std::size_t>(s_stride);
      float r = pooling == depthkv::Pooling::kAvg ? 0.0f : row[t0];
      for (int t = t0; t <= t1; ++t) r = pooling == depthkv::Pooling::kAvg ? r + row[t] : (row[t] > r ? row[t] : r);
      if (pooling == depthkv::Pooling::kAvg) r = r / static_cast<float>(kernel);
      s[static_cast<std::size_t>(kv) * static_cast<std::size_t>(s_stride) + static_cast<std::size_t>(j)] = r;
    }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, int n_kv, int n, int stride, std::string& where) {
  for (int kv = 0; kv < n_kv; ++kv)
    for (int j = 0; j < n; ++j) {
      const std::size_t i = static_cast<std::size_t>(kv) * static_cast<std::size_t>(stride) + static_cast<std::size_t>(j);
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
        where = "kv " + std::to_string(kv) + " slot " + std::to_string(j) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
        return false;
      }
    }
  return true;
}

template <typename P>
void run_h2o(std::mt19937_64& rng, int id) {
  const int n_kv = 1 + static_cast<int>(rng() % 8);
  const int group = 1 << (rng() % 4);
  const int n_heads = n_kv * group;
  const int n = 1 + static_cast<int>(rng() % 20000);
  const int ld = n + static_cast<int>(rng() % 5);
  const int stride = n + static_cast<int>(rng() % 3);
  std::vector<float> cpu(static_cast<std::size_t>(n_kv) * static_cast<std::size_t>(stride), 0.f);
  float* d_s = nullptr;
  CUDA_OK(cudaMalloc(&d_s, cpu.size() * sizeof(float)));
  CUDA_OK(cudaMemset(d_s, 0, cpu.size() * sizeof(float)));
  std::uint32_t* d_status = nullptr;
  CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));
  const int blocks = 1 + static_cast<int>(rng() % 3);
  std::vector<std::pair<int, std::vector<float>>> seen;
  for (int b = 0; b < blocks; ++b) {
    const int nq = static_cast<int>(rng() % 40);  // 0 queries is a valid no-op block
    std::vector<float> pf;
    const std::vector<P> probs = random_probs<P>(rng, n_heads, nq, ld, n, pf);
    P* d_p = nullptr;
    CUDA_OK(cudaMalloc(&d_p, (probs.size() + 1) * sizeof(P)));
    CUDA_OK(cudaMemcpy(d_p, probs.data(), probs.size() * sizeof(P), cudaMemcpyHostToDevice));
    dc::H2OScoreParams prm;
    prm.probs = d_p;
    prm.head_stride = static_cast<std::int64_t>(nq) * ld;
    prm.query_stride = ld;
    prm.n_heads = n_heads;
    prm.n_kv_heads = n_kv;
    prm.n_queries = nq;
    prm.n = n;
    prm.scores = d_s;
    prm.score_stride = stride;
    prm.status = d_status;
    CUDA_OK(dc::AccumulateH2O<P>(prm, nullptr, dc::AccumulateH2OWorkspaceBytes(prm)));
    cpu_sum(pf, n_heads, n_kv, nq, ld, n, cpu, stride, true);
    seen.emplace_back(nq, pf);
    CUDA_OK(cudaDeviceSynchronize());
    std::uint32_t st = 0;
    CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
    if (st != 0u) fail("H2O status " + std::to_string(st));
    CUDA_OK(cudaFree(d_p));
  }
  std::vector<float> gpu(cpu.size());
  CUDA_OK(cudaMemcpy(gpu.data(), d_s, gpu.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::string where;
  depthkv::ScorerConfig cfg;
  cfg.kind = depthkv::ScorerKind::kH2O;
  const std::vector<float> ts = token_scorer_scores(cfg, n_heads, n_kv, ld, n, seen, stride);
  if (!same_bits(ts, gpu, n_kv, n, stride, where))
    fail("H2O case " + std::to_string(id) + " vs TokenScorer: " + where);
  if (!same_bits(cpu, gpu, n_kv, n, stride, where))
    fail("H2O case " + std::to_string(id) + " [" + type_name<P>() + " kv " + std::to_string(n_kv) + " group " +
         std::to_string(group) + " n " + std::to_string(n) + "] " + where);
  CUDA_OK(cudaFree(d_status));
  CUDA_OK(cudaFree(d_s));
}

template <typename P>
void run_snapkv(std::mt19937_64& rng, int id) {
  const int n_kv = 1 + static_cast<int>(rng() % 8);
  const int group = 1 << (rng() % 4);
  const int n_heads = n_kv * group;
  const int n = 1 + static_cast<int>(rng() % 20000);
  const int ld = n;
  const int stride = n + static_cast<int>(rng() % 3);
  const int window = 1 + static_cast<int>(rng() % 64);
  const int kernel = 1 + 2 * static_cast<int>(rng() % 4);
  const depthkv::Pooling pooling = static_cast<depthkv::Pooling>(rng() % 3);
  std::vector<float> pf;
  const std::vector<P> probs = random_probs<P>(rng, n_heads, window, ld, n, pf);
  P* d_p = nullptr;
  float* d_s = nullptr;
  CUDA_OK(cudaMalloc(&d_p, probs.size() * sizeof(P)));
  CUDA_OK(cudaMemcpy(d_p, probs.data(), probs.size() * sizeof(P), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMalloc(&d_s, static_cast<std::size_t>(n_kv) * static_cast<std::size_t>(stride) * sizeof(float)));
  CUDA_OK(cudaMemset(d_s, 0x7f, static_cast<std::size_t>(n_kv) * static_cast<std::size_t>(stride) * sizeof(float)));  // overwritten
  dc::SnapKVScoreParams prm;
  prm.probs = d_p;
  prm.head_stride = static_cast<std::int64_t>(window) * ld;
  prm.query_stride = ld;
  prm.n_heads = n_heads;
  prm.n_kv_heads = n_kv;
  prm.n_queries = window;
  prm.n = n;
  prm.kernel = kernel;
  prm.pooling = pooling;
  prm.scores = d_s;
  prm.score_stride = stride;
  const std::size_t ws = dc::SnapKVScoresWorkspaceBytes(prm);
  void* d_ws = nullptr;
  if (ws > 0) CUDA_OK(cudaMalloc(&d_ws, ws));
  if (ws > 0 && dc::SnapKVScores<P>(prm, d_ws, ws - 4) != cudaErrorInvalidValue) fail("SnapKV: small workspace accepted");
  CUDA_OK(dc::SnapKVScores<P>(prm, d_ws, ws));
  std::vector<float> cpu(static_cast<std::size_t>(n_kv) * static_cast<std::size_t>(stride), 0.f);
  cpu_window_sum(pf, n_heads, n_kv, window, ld, n, cpu, stride);
  cpu_pool(cpu, n_kv, n, stride, kernel, pooling);
  std::vector<float> gpu(cpu.size());
  CUDA_OK(cudaMemcpy(gpu.data(), d_s, gpu.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::string where;
  depthkv::ScorerConfig cfg;
  cfg.kind = depthkv::ScorerKind::kSnapKV;
  cfg.window = window;
  cfg.kernel = kernel;
  cfg.pooling = pooling;
  const std::vector<float> ts = token_scorer_scores(cfg, n_heads, n_kv, ld, n, {{window, pf}}, stride);
  if (!same_bits(ts, gpu, n_kv, n, stride, where))
    fail("SnapKV case " + std::to_string(id) + " vs TokenScorer (pooling " + std::to_string(static_cast<int>(pooling)) +
         ", kernel " + std::to_string(kernel) + "): " + where);
  if (!same_bits(cpu, gpu, n_kv, n, stride, where))
    fail("SnapKV case " + std::to_string(id) + " [" + type_name<P>() + " kv " + std::to_string(n_kv) + " group " +
         std::to_string(group) + " n " + std::to_string(n) + " window " + std::to_string(window) + " kernel " +
         std::to_string(kernel) + " pooling " + std::to_string(static_cast<int>(pooling)) + "] " + where);
  if (d_ws != nullptr) CUDA_OK(cudaFree(d_ws));
  CUDA_OK(cudaFree(d_s));
  CUDA_OK(cudaFree(d_p));
}

void test_errors_and_status() {
  float* d_p = nullptr;
  float* d_s = nullptr;
  std::uint32_t* d_status = nullptr;
  CUDA_OK(cudaMalloc(&d_p, 4 * 16 * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_s, 2 * 16 * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_status, sizeof(std::uint32_t)));
  std::vector<float> p(64, 0.01f);
  p[17] = -0.5f;
  CUDA_OK(cudaMemcpy(d_p, p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice));
  dc::H2OScoreParams prm;
  prm.probs = d_p;
  prm.head_stride = 16;
  prm.query_stride = 16;
  prm.n_heads = 4;
  prm.n_kv_heads = 2;
  prm.n_queries = 1;
  prm.n = 16;
  prm.scores = d_s;
  prm.score_stride = 16;
  prm.status = d_status;
  CUDA_OK(dc::AccumulateH2O<float>(prm, nullptr, 0));
  CUDA_OK(cudaDeviceSynchronize());
  std::uint32_t st = 0;
  CUDA_OK(cudaMemcpy(&st, d_status, sizeof st, cudaMemcpyDeviceToHost));
  if (st != dc::ScoreStatus::kBadProbability) fail("negative probability not flagged");
  dc::H2OScoreParams bad = prm;
  bad.n_heads = 3;
  if (dc::AccumulateH2O<float>(bad, nullptr, 0) != cudaErrorInvalidValue) fail("n_heads % n_kv_heads != 0 accepted");
  bad = prm;
  bad.score_stride = 8;
  if (dc::AccumulateH2O<float>(bad, nullptr, 0) != cudaErrorInvalidValue) fail("score_stride < n accepted");
  dc::SnapKVScoreParams sp;
  sp.probs = d_p;
  sp.head_stride = 16;
  sp.query_stride = 16;
  sp.n_heads = 2;
  sp.n_kv_heads = 2;
  sp.n_queries = 1;
  sp.n = 16;
  sp.kernel = 4;
  sp.scores = d_s;
  sp.score_stride = 16;
  if (dc::SnapKVScores<float>(sp, d_p, 1 << 20) != cudaErrorInvalidValue) fail("even pooling kernel accepted");
  CUDA_OK(cudaFree(d_status));
  CUDA_OK(cudaFree(d_s));
  CUDA_OK(cudaFree(d_p));
}

}  // namespace

int main(int argc, char** argv) {
  const int probe = depthkv_test::cuda_device_probe("cuda_score_test");
  if (probe != 0) return probe;
  std::uint64_t seed = 77;
  int cases = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--cases") cases = std::atoi(argv[i + 1]);
  }
  std::mt19937_64 rng(seed);
  test_errors_and_status();
  for (int id = 0; id < cases; ++id) {
    switch (id % 6) {
      case 0: run_h2o<float>(rng, id); break;
      case 1: run_h2o<__half>(rng, id); break;
      case 2: run_h2o<__nv_bfloat16>(rng, id); break;
      case 3: run_snapkv<float>(rng, id); break;
      case 4: run_snapkv<__half>(rng, id); break;
      default: run_snapkv<__nv_bfloat16>(rng, id); break;
    }
  }
  if (g_failures) {
    std::printf("FAIL: %d mismatches\n", g_failures);
    return 1;
  }
  std::printf("PASS: %d score cases bit-identical to the CPU order\n", cases);
  return 0;
}
