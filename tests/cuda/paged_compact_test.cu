// CUDA paged compaction vs the CPU path, byte for byte: the whole device key and value pool after
// `PagedCompact` must equal the host pool after `evict_layer` (PagedLayer::compact +
// shrink_to_fit) with the same kept slots (the CPU evictor's `select_keep`), the device positions
// the layer's, and the plan's freed blocks / table lengths what shrink_to_fit released / kept.
//
// Random cases: NHD and HND blocks, per-layer and per-head tables, 1-3 layers over one pool with
// interleaved appends (tables are not runs of consecutive blocks), 1-8 KV heads, random block
// sizes 1-32, per-head budgets from the protected count to all, head_dim 1..256 plus long rows
// (one survivor per tile), K/V of 4 and 2 bytes, pool bases offset by one element (narrow copy
// units); plus a long case (8 heads x 32768 tokens, many tiles), parameter errors
// (cudaErrorInvalidValue), bad heads (status bit, nothing of them written) and an empty launch.
// Exit codes: 0 pass, 1 mismatch or any CUDA error, 77 no CUDA device (support/cuda_device_probe.hpp).
//
// Usage: cuda_paged_compact_test [--seed S] [--cases N] [--seconds T]

// The CPU evictor includes Eigen; compiled as host-only code in this CUDA translation unit.
#ifndef EIGEN_NO_CUDA
#define EIGEN_NO_CUDA 1
#endif

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "depthkv/cuda/paged_compact.cuh"
#include "depthkv/evictor.hpp"
#include "depthkv/paged_cache.hpp"
#include "support/cuda_device_probe.hpp"
#include "support/cuda_test_check.hpp"

namespace dc = depthkv::cuda;
using depthkv::BlockPool;
using depthkv::PagedLayer;
using depthkv::PagedLayout;
using depthkv::PagedTables;
using I32 = std::int32_t;
using Bytes = std::vector<unsigned char>;

namespace {

using depthkv_test::fail;
using depthkv_test::g_failures;

/// Device memory freed at scope end.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t bytes) { CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 1)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename U>
  U* as() const { return static_cast<U*>(p); }
};

template <typename T>
std::size_t pool_bytes(const BlockPool<T>& pool) {
  return static_cast<std::size_t>(pool.num_blocks()) * pool.block_elements() * sizeof(T);
}

std::vector<float> random_row(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> r(static_cast<std::size_t>(n));
  for (auto& x : r) x = u(rng);
  return r;
}

struct CaseSpec {
  PagedLayout layout;
  PagedTables tables;
  int n_layers, nh, hd, bs, tokens, extra, base_offset;  // base_offset: elements the pool bases are shifted by
  std::uint32_t seed;
};

std::string describe(const CaseSpec& c) {
  return std::string(c.layout == PagedLayout::kNHD ? "NHD" : "HND") + " " +
         (c.tables == PagedTables::kPerLayer ? "per-layer" : "per-head") + " layers " + std::to_string(c.n_layers) +
         " heads " + std::to_string(c.nh) + " hd " + std::to_string(c.hd) + " bs " + std::to_string(c.bs) + " tokens " +
         std::to_string(c.tokens) + " offset " + std::to_string(c.base_offset);
}

/// One case: host layers, the CPU evictor's kept slots, the device compaction, the CPU path, compare.
/// `DevT` is the device element type of the same size as the host's `HostT`.
template <typename HostT, typename DevT>
void run_case(const CaseSpec& c, const std::string& label) {
  static_assert(sizeof(HostT) == sizeof(DevT), "host and device element types differ in size");
  std::mt19937 rng(c.seed);
  const int n_tables = c.tables == PagedTables::kPerLayer ? 1 : c.nh;
  const int max_per_head = c.tokens + c.extra;
  BlockPool<HostT> pool(c.n_layers * n_tables * (max_per_head / c.bs + 2), c.bs,
                        c.tables == PagedTables::kPerLayer ? c.nh : 1, c.hd, c.layout);
  std::vector<PagedLayer<HostT>> layers;
  for (int l = 0; l < c.n_layers; ++l) layers.emplace_back(pool, c.nh, c.hd, c.tables);
  for (int t = 0; t < c.tokens; ++t)
    for (auto& L : layers) {
      const std::vector<float> k = random_row(c.nh * c.hd, rng), v = random_row(c.nh * c.hd, rng);
      L.append(k.data(), v.data(), 2 * t);
    }
  for (auto& L : layers)
    for (int h = 0; h < c.nh; ++h) {
      I32 pos = 2 * c.tokens + 1;
      for (int t = static_cast<int>(rng() % static_cast<unsigned>(c.extra + 1)); t > 0; --t, pos += 1 + static_cast<I32>(rng() % 3)) {
        const std::vector<float> k = random_row(c.hd, rng), v = random_row(c.hd, rng);
        L.append_head(h, k.data(), v.data(), pos);
      }
    }
  depthkv::Protection prot;
  prot.n_sink = static_cast<int>(rng() % 4);
  prot.n_recent = static_cast<int>(rng() % 8);
  std::vector<depthkv::LayerScores> scores(layers.size());
  std::vector<std::vector<int>> keep(layers.size());
  std::vector<std::vector<std::vector<I32>>> kept(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l) {
    scores[l].resize(static_cast<std::size_t>(c.nh));
    for (int h = 0; h < c.nh; ++h) {
      const int n = layers[l].size(h);
      for (int i = 0; i < n; ++i) scores[l][static_cast<std::size_t>(h)].push_back(static_cast<float>(rng() % 9));
      const int pc = depthkv::detail::protected_count(n, prot.n_sink, prot.n_recent);
      const int kind = static_cast<int>(rng() % 5);
      const int k = kind == 0 ? pc : kind == 1 ? n : pc + static_cast<int>(rng() % static_cast<unsigned>(n - pc + 1));
      keep[l].push_back(k);
      kept[l].push_back(depthkv::select_keep(scores[l][static_cast<std::size_t>(h)].data(), layers[l].positions(h), n, k, prot));
    }
  }

  // device: pool (bases shifted by base_offset elements), tables, kept lists, positions, heads
  const std::size_t pb = pool_bytes(pool);
  const std::size_t shift = static_cast<std::size_t>(c.base_offset) * sizeof(HostT);
  DevBuf dk(pb + shift), dv(pb + shift);
  unsigned char* d_k = dk.as<unsigned char>() + shift;
  unsigned char* d_v = dv.as<unsigned char>() + shift;
  CUDA_OK(cudaMemcpy(d_k, pool.keys_data(), pb, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_v, pool.values_data(), pb, cudaMemcpyHostToDevice));
  std::vector<I32> flat;  // tables, kept lists and positions of every layer, one device array
  struct Where {
    std::vector<std::size_t> tables, kept, pos;
  };
  std::vector<Where> where(layers.size());
  std::vector<dc::PagedCompactPlan> plans;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    plans.push_back(dc::plan_paged_compact(layers[l], kept[l]));
    for (int t = 0; t < n_tables; ++t) {
      where[l].tables.push_back(flat.size());
      flat.insert(flat.end(), layers[l].block_table(t).begin(), layers[l].block_table(t).end());
    }
    for (int h = 0; h < c.nh; ++h) {
      where[l].kept.push_back(flat.size());
      flat.insert(flat.end(), kept[l][static_cast<std::size_t>(h)].begin(), kept[l][static_cast<std::size_t>(h)].end());
      where[l].pos.push_back(flat.size());
      flat.insert(flat.end(), layers[l].positions(h), layers[l].positions(h) + layers[l].size(h));
    }
  }
  DevBuf dflat(flat.size() * sizeof(I32));
  I32* d_flat = dflat.as<I32>();
  CUDA_OK(cudaMemcpy(d_flat, flat.data(), flat.size() * sizeof(I32), cudaMemcpyHostToDevice));
  std::vector<dc::PagedCompactHead> heads;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    std::vector<const I32*> t_ptr, k_ptr;
    std::vector<I32*> p_ptr;
    std::vector<int> lens, sizes;
    for (int t = 0; t < n_tables; ++t) {
      t_ptr.push_back(d_flat + where[l].tables[static_cast<std::size_t>(t)]);
      lens.push_back(static_cast<int>(layers[l].block_table(t).size()));
    }
    for (int h = 0; h < c.nh; ++h) {
      k_ptr.push_back(d_flat + where[l].kept[static_cast<std::size_t>(h)]);
      p_ptr.push_back(d_flat + where[l].pos[static_cast<std::size_t>(h)]);
      sizes.push_back(layers[l].size(h));
    }
    dc::append_paged_compact_heads(heads, plans[l], c.tables, t_ptr.data(), lens.data(), sizes.data(), k_ptr.data(),
                                   p_ptr.data());
  }
  DevBuf dheads(heads.size() * sizeof(dc::PagedCompactHead));
  CUDA_OK(cudaMemcpy(dheads.p, heads.data(), heads.size() * sizeof(dc::PagedCompactHead), cudaMemcpyHostToDevice));
  DevBuf dstatus(sizeof(std::uint32_t));
  CUDA_OK(cudaMemset(dstatus.p, 0xff, sizeof(std::uint32_t)));  // must be zeroed by the call
  dc::PagedCompactParams p;
  p.heads = dheads.as<dc::PagedCompactHead>();
  p.n_heads = static_cast<int>(heads.size());
  p.k_blocks = d_k;
  p.v_blocks = d_v;
  p.num_blocks = pool.num_blocks();
  p.block_size = c.bs;
  p.n_kv_heads = pool.n_kv_heads();
  p.head_dim = c.hd;
  p.layout = c.layout;
  p.status = dstatus.as<std::uint32_t>();
  if (dc::PagedCompactParamsError<DevT>(p, nullptr, dc::PagedCompactWorkspaceBytes(p)) != nullptr) {
    fail(label + ": parameters rejected: " + dc::PagedCompactParamsError<DevT>(p, nullptr, 0));
    return;
  }
  CUDA_OK(dc::PagedCompact<DevT>(p, nullptr, dc::PagedCompactWorkspaceBytes(p)));
  CUDA_OK(cudaDeviceSynchronize());

  // the CPU path
  std::vector<std::vector<std::vector<I32>>> before(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l)
    for (int t = 0; t < n_tables; ++t) before[l].push_back(layers[l].block_table(t));
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const depthkv::LayerEviction ev = depthkv::evict_layer(layers[l], scores[l], keep[l], prot);
    if (ev.kept_slots != kept[l]) fail(label + ": evict_layer kept other slots than select_keep");
  }

  Bytes gk(pb), gv(pb);
  CUDA_OK(cudaMemcpy(gk.data(), d_k, pb, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(gv.data(), d_v, pb, cudaMemcpyDeviceToHost));
  std::vector<I32> gflat(flat.size());
  CUDA_OK(cudaMemcpy(gflat.data(), d_flat, flat.size() * sizeof(I32), cudaMemcpyDeviceToHost));
  std::uint32_t status = 0;
  CUDA_OK(cudaMemcpy(&status, dstatus.p, sizeof(status), cudaMemcpyDeviceToHost));
  if (status != 0u) fail(label + ": status " + std::to_string(status));
  const auto* ck = reinterpret_cast<const unsigned char*>(pool.keys_data());
  const auto* cv = reinterpret_cast<const unsigned char*>(pool.values_data());
  for (std::size_t b = 0; b < pb; ++b)
    if (gk[b] != ck[b] || gv[b] != cv[b]) {
      const std::size_t per_block = pool.block_elements() * sizeof(HostT);
      fail(label + ": pool byte " + std::to_string(b) + " (block " + std::to_string(b / per_block) + ") differs in " +
           (gk[b] != ck[b] ? "keys" : "values"));
      break;
    }
  for (std::size_t l = 0; l < layers.size(); ++l) {
    for (int h = 0; h < c.nh; ++h) {
      const I32* got = gflat.data() + where[l].pos[static_cast<std::size_t>(h)];
      if (!std::equal(got, got + layers[l].size(h), layers[l].positions(h)))
        fail(label + ": layer " + std::to_string(l) + " head " + std::to_string(h) + ": positions differ");
      const I32* gt = gflat.data() + where[l].tables[static_cast<std::size_t>(c.tables == PagedTables::kPerLayer ? 0 : h)];
      if (!std::equal(gt, gt + before[l][static_cast<std::size_t>(c.tables == PagedTables::kPerLayer ? 0 : h)].size(),
                      before[l][static_cast<std::size_t>(c.tables == PagedTables::kPerLayer ? 0 : h)].begin()))
        fail(label + ": a device table was written");
    }
    for (int t = 0; t < n_tables; ++t) {
      const std::vector<I32>& after = layers[l].block_table(t);
      const dc::PagedCompactPlan& pl = plans[l];
      const std::vector<I32> freed(pl.freed.begin() + pl.freed_begin[static_cast<std::size_t>(t)],
                                   pl.freed.begin() + pl.freed_begin[static_cast<std::size_t>(t) + 1]);
      const std::vector<I32>& bt = before[l][static_cast<std::size_t>(t)];
      if (pl.table_len[static_cast<std::size_t>(t)] != static_cast<int>(after.size()) ||
          freed != std::vector<I32>(bt.begin() + static_cast<std::ptrdiff_t>(after.size()), bt.end()))
        fail(label + ": layer " + std::to_string(l) + " table " + std::to_string(t) + ": plan differs from shrink_to_fit");
    }
  }
}

CaseSpec make_case(std::mt19937_64& rng, int id) {
  CaseSpec c;
  c.layout = (rng() & 1u) ? PagedLayout::kHND : PagedLayout::kNHD;
  c.tables = (rng() & 1u) ? PagedTables::kPerHead : PagedTables::kPerLayer;
  c.n_layers = 1 + static_cast<int>(rng() % 3);
  c.nh = 1 + static_cast<int>(rng() % 8);
  const int hds[] = {1, 3, 8, 16, 64, 96, 128, 256};
  c.hd = id % 11 == 10 ? 4100 : hds[rng() % 8];  // 4100: rows longer than a tile
  c.bs = 1 + static_cast<int>(rng() % 32);
  c.tokens = static_cast<int>(rng() % (c.hd >= 1024 ? 48 : id % 4 == 0 ? 3000 : 300));
  c.extra = static_cast<int>(rng() % 20);
  c.base_offset = static_cast<int>(rng() % 4 == 0 ? 1 : 0);
  c.seed = static_cast<std::uint32_t>(rng());
  return c;
}

void test_errors() {
  DevBuf dk(4096), dv(4096), dheads(sizeof(dc::PagedCompactHead)), dtab(64), dkept(64), dstatus(4);
  dc::PagedCompactParams p;
  p.heads = dheads.as<dc::PagedCompactHead>();
  p.n_heads = 1;
  p.k_blocks = dk.p;
  p.v_blocks = dv.p;
  p.num_blocks = 4;
  p.block_size = 4;
  p.n_kv_heads = 2;
  p.head_dim = 32;
  p.status = dstatus.as<std::uint32_t>();
  auto expect_invalid = [&](dc::PagedCompactParams q, const char* what) {
    if (dc::PagedCompact<float>(q, nullptr, 0) != cudaErrorInvalidValue) fail(std::string("not rejected: ") + what);
    if (dc::PagedCompactParamsError<float>(q, nullptr, 0) == nullptr) fail(std::string("no reason given: ") + what);
  };
  dc::PagedCompactParams q = p;
  q.heads = nullptr;
  expect_invalid(q, "null heads");
  q = p;
  q.k_blocks = nullptr;
  expect_invalid(q, "null keys");
  q = p;
  q.head_dim = 0;
  expect_invalid(q, "head_dim 0");
  q = p;
  q.n_heads = -1;
  expect_invalid(q, "n_heads -1");
  q = p;
  q.layout = static_cast<PagedLayout>(7);
  expect_invalid(q, "bad layout");
  (void)cudaGetLastError();
  // an empty launch succeeds and zeroes the status
  CUDA_OK(cudaMemset(dstatus.p, 0xff, 4));
  q = p;
  q.n_heads = 0;
  q.heads = nullptr;
  CUDA_OK(dc::PagedCompact<float>(q, nullptr, 0));
  std::uint32_t st = 1;
  CUDA_OK(cudaMemcpy(&st, dstatus.p, 4, cudaMemcpyDeviceToHost));
  if (st != 0u) fail("empty launch: status not zeroed");

  // bad heads: status bit, nothing of them written
  std::vector<unsigned char> k0(4096), v0(4096);
  for (std::size_t i = 0; i < k0.size(); ++i) {
    k0[i] = static_cast<unsigned char>(i * 7u);
    v0[i] = static_cast<unsigned char>(i * 13u + 1u);
  }
  const std::vector<I32> table{2, 0, 3, 1};
  CUDA_OK(cudaMemcpy(dtab.p, table.data(), 16, cudaMemcpyHostToDevice));
  for (int what = 0; what < 5; ++what) {
    CUDA_OK(cudaMemcpy(dk.p, k0.data(), 4096, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.p, v0.data(), 4096, cudaMemcpyHostToDevice));
    std::vector<I32> kept{1, 4, 6};
    dc::PagedCompactHead h;
    h.table = dtab.as<I32>();
    h.kept = dkept.as<I32>();
    h.n = 8;
    h.n_kept = 3;
    h.table_len = 4;
    h.head_in_block = 1;
    if (what == 0) kept = {1, 6, 4};  // not ascending
    if (what == 1) kept = {1, 4, 8};  // outside [0, n)
    if (what == 2) h.n = 17;          // above 4 blocks of 4
    if (what == 3) h.head_in_block = 2;
    if (what == 4) h.n_kept = 9;
    CUDA_OK(cudaMemcpy(dkept.p, kept.data(), 12, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dheads.p, &h, sizeof(h), cudaMemcpyHostToDevice));
    CUDA_OK(dc::PagedCompact<float>(p, nullptr, 0));
    std::vector<unsigned char> gk(4096), gv(4096);
    CUDA_OK(cudaMemcpy(gk.data(), dk.p, 4096, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gv.data(), dv.p, 4096, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&st, dstatus.p, 4, cudaMemcpyDeviceToHost));
    if (st != dc::PagedCompactStatus::kBadHead) fail("bad head " + std::to_string(what) + ": status " + std::to_string(st));
    if (gk != k0 || gv != v0) fail("bad head " + std::to_string(what) + ": pool written");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int probe = depthkv_test::cuda_device_probe("cuda_paged_compact_test");
  if (probe != 0) return probe;
  std::uint64_t seed = 20261201;
  int max_cases = 200;
  double seconds = 20.0;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "FAIL: %s needs a value\n", a.c_str());
      return 1;
    }
    if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--cases") max_cases = std::atoi(argv[i + 1]);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "FAIL: unknown argument %s\n", a.c_str());
      return 1;
    }
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("cuda_paged_compact_test: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(seed));
  test_errors();
  {  // long heads: many tiles per CTA
    CaseSpec big{PagedLayout::kNHD, PagedTables::kPerLayer, 1, 8, 128, 16, 32768, 0, 0, 7u};
    run_case<Eigen::half, __half>(big, "long " + describe(big));
    big.layout = PagedLayout::kHND;
    big.tables = PagedTables::kPerHead;
    run_case<Eigen::half, __half>(big, "long " + describe(big));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::mt19937_64 rng(seed);
  int done = 0;
  for (int id = 0; id < max_cases; ++id) {
    const CaseSpec c = make_case(rng, id);
    const std::string label = "case " + std::to_string(id) + " (" + describe(c) + ")";
    if (id % 2 == 0) run_case<float, float>(c, label + " float");
    else run_case<Eigen::half, __half>(c, label + " half");
    ++done;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > seconds && done >= std::min(12, max_cases)) {
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
