// CPU tests of the host/device logic of the CUDA paged compaction (cuda/detail/paged_plan.hpp;
// no CUDA needed): the block geometry against BlockPool::row_offset, the tile schedule, the copy
// unit, the parameter and per-head checks, and the host plan (kept counts, table lengths, freed
// blocks). The kernel (cuda/paged_compact.cuh) is emulated step by step with exactly these
// functions -- one CTA per head, tiles of paged_tile_rows survivors, every thread's units by
// paged_unit_move, all reads of a tile before its writes -- on a copy of the pool's bytes, and the
// result is compared byte for byte (the whole pool) with PagedLayer's compaction by the CPU
// evictor (evict_layer: compact + shrink_to_fit), for NHD and HND blocks, per-layer and per-head
// tables, random block sizes, head dims and per-head budgets. A second emulation delays each
// tile's writes until after the next tile's reads (the order the kernel leaves free, since no
// barrier separates them); a third, walking the tiles backwards, must get it wrong (the check
// can fail).

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "depthkv/cuda/detail/paged_plan.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/paged_cache.hpp"

namespace dc = depthkv::cuda;
namespace dd = depthkv::cuda::detail;
using depthkv::BlockPool;
using depthkv::PagedLayer;
using depthkv::PagedLayout;
using depthkv::PagedTables;
using I32 = std::int32_t;
using Bytes = std::vector<unsigned char>;

namespace {

enum class Order { kKernel, kWritesAfterNextReads, kReversedTiles };

/// The bytes of a pool's keys and values.
template <typename T>
void pool_bytes(const BlockPool<T>& pool, Bytes& k, Bytes& v) {
  const std::size_t n = static_cast<std::size_t>(pool.num_blocks()) * pool.block_elements() * sizeof(T);
  const auto* kb = reinterpret_cast<const unsigned char*>(pool.keys_data());
  const auto* vb = reinterpret_cast<const unsigned char*>(pool.values_data());
  k.assign(kb, kb + n);
  v.assign(vb, vb + n);
}

/// The kernel's per-head check (paged_compact.cuh): counts, table entries for the held slots, kept list.
bool head_bad(const dd::PagedGeometry& g, const dc::PagedCompactHead& h, int num_blocks) {
  if (!dd::paged_head_ok(g, h)) return true;
  for (int j = 0; j < dd::paged_blocks_for(h.n, g.block_size); ++j)
    if (!dd::paged_block_ok(h.table[j], num_blocks)) return true;
  for (int i = 0; i < h.n_kept; ++i)
    if (!dd::paged_kept_ok(h.kept, i, h.n)) return true;
  return false;
}

/// PagedCompactKernel on the CPU: `heads` point into host memory (tables, kept lists, positions).
/// Returns the status bits.
std::uint32_t emulate(Bytes& K, Bytes& V, const dd::PagedGeometry& g, int num_blocks, int elem_bytes, int unit,
                      const std::vector<dc::PagedCompactHead>& heads, Order order) {
  constexpr int NT = dd::kPagedCompactThreads;
  constexpr int UN = dd::kPagedCompactUnroll;
  std::uint32_t status = 0;
  const int L = g.head_dim * elem_bytes / unit;
  struct Write {
    std::int64_t off;
    std::array<unsigned char, 16> k, v;  // one copy unit (<= 16 bytes)
  };
  struct PosWrite {
    I32* at;
    I32 value;
  };
  for (const dc::PagedCompactHead& h : heads) {
    if (head_bad(g, h, num_blocks)) {
      status |= dc::PagedCompactStatus::kBadHead;
      continue;
    }
    const int R = dd::paged_tile_rows(L, NT, UN);
    std::vector<int> starts;
    for (int i0 = 0; i0 < h.n_kept; i0 += R) starts.push_back(i0);
    if (order == Order::kReversedTiles) std::reverse(starts.begin(), starts.end());
    std::vector<Write> pending;
    std::vector<PosWrite> pending_pos;
    auto flush = [&]() {
      for (const Write& w : pending) {
        std::memcpy(K.data() + w.off, w.k.data(), static_cast<std::size_t>(unit));
        std::memcpy(V.data() + w.off, w.v.data(), static_cast<std::size_t>(unit));
      }
      for (const PosWrite& w : pending_pos) *w.at = w.value;
      pending.clear();
      pending_pos.clear();
    };
    for (int i0 : starts) {
      const int rows = std::min(R, h.n_kept - i0);
      const std::int64_t total = static_cast<std::int64_t>(rows) * L;
      for (std::int64_t step = 0; step < total; step += static_cast<std::int64_t>(NT) * UN) {
        std::vector<Write> reads;
        std::vector<PosWrite> pos_reads;
        for (int t = 0; t < NT; ++t) {
          for (int u = 0; u < UN; ++u) {
            const dd::PagedUnitMove m = dd::paged_unit_move(g, h, i0, rows, L, step + static_cast<std::int64_t>(u) * NT + t);
            if (!m.move) continue;
            const std::int64_t src = m.src * elem_bytes + static_cast<std::int64_t>(m.col) * unit;
            Write w;
            w.off = m.dst * elem_bytes + static_cast<std::int64_t>(m.col) * unit;
            std::memcpy(w.k.data(), K.data() + src, static_cast<std::size_t>(unit));
            std::memcpy(w.v.data(), V.data() + src, static_cast<std::size_t>(unit));
            reads.push_back(std::move(w));
          }
          if (step == 0 && h.positions != nullptr && t < rows && h.kept[i0 + t] != i0 + t)
            pos_reads.push_back(PosWrite{h.positions + i0 + t, h.positions[h.kept[i0 + t]]});
        }
        // barrier: the previous step's writes (delayed in kWritesAfterNextReads) are done by now
        flush();
        pending = std::move(reads);
        pending_pos = std::move(pos_reads);
        if (order != Order::kWritesAfterNextReads) flush();
      }
    }
    flush();
  }
  return status;
}

/// Host copies of one layer's state that the emulated kernel works on.
struct HostHeads {
  std::vector<std::vector<I32>> tables, kept, positions;
  std::vector<dc::PagedCompactHead> heads;
};

template <typename T>
HostHeads make_heads(const PagedLayer<T>& L, const dc::PagedCompactPlan& plan, const std::vector<std::vector<I32>>& kept) {
  HostHeads hh;
  const int nh = L.n_kv_heads();
  const int nt = L.tables() == PagedTables::kPerLayer ? 1 : nh;
  for (int t = 0; t < nt; ++t) hh.tables.push_back(L.block_table(t));
  hh.kept = kept;
  for (int h = 0; h < nh; ++h) hh.positions.emplace_back(L.positions(h), L.positions(h) + L.size(h));
  std::vector<const I32*> d_tables, d_kept;
  std::vector<I32*> d_pos;
  std::vector<int> lens, sizes;
  for (auto& t : hh.tables) {
    d_tables.push_back(t.data());
    lens.push_back(static_cast<int>(t.size()));
  }
  for (int h = 0; h < nh; ++h) {
    d_kept.push_back(hh.kept[static_cast<std::size_t>(h)].data());
    d_pos.push_back(hh.positions[static_cast<std::size_t>(h)].data());
    sizes.push_back(L.size(h));
  }
  dc::append_paged_compact_heads(hh.heads, plan, L.tables(), d_tables.data(), lens.data(), sizes.data(), d_kept.data(),
                                 d_pos.data());
  return hh;
}

template <typename T>
int unit_for(const BlockPool<T>& pool) {
  const std::uint64_t eb = sizeof(T);
  const dd::PagedGeometry g =
      dd::make_paged_geometry(pool.block_size(), pool.n_kv_heads(), pool.head_dim(), pool.layout() == PagedLayout::kHND);
  return dd::paged_copy_unit_bytes(static_cast<std::uint64_t>(pool.head_dim()) * eb |
                                   static_cast<std::uint64_t>(g.token_stride) * eb |
                                   static_cast<std::uint64_t>(g.head_stride) * eb |
                                   static_cast<std::uint64_t>(g.block_elements) * eb);
}

std::vector<float> random_row(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> r(static_cast<std::size_t>(n));
  for (auto& x : r) x = u(rng);
  return r;
}

const char* name(PagedLayout l) { return l == PagedLayout::kNHD ? "NHD" : "HND"; }
const char* name(PagedTables t) { return t == PagedTables::kPerLayer ? "per-layer" : "per-head"; }

}  // namespace

TEST_CASE("paged geometry gives BlockPool's row offsets", "[paged][cuda]") {
  for (PagedLayout layout : {PagedLayout::kNHD, PagedLayout::kHND})
    for (int bs : {1, 3, 16})
      for (int nh : {1, 2, 5})
        for (int hd : {1, 7, 64}) {
          BlockPool<float> pool(6, bs, nh, hd, layout);
          const dd::PagedGeometry g = dd::make_paged_geometry(bs, nh, hd, layout == PagedLayout::kHND);
          REQUIRE(g.token_stride == pool.token_stride());
          REQUIRE(g.head_stride == pool.head_stride());
          REQUIRE(static_cast<std::size_t>(g.block_elements) == pool.block_elements());
          const std::vector<I32> table{4, 0, 5, 2};
          for (int h = 0; h < nh; ++h)
            for (int s = 0; s < 4 * bs; ++s)
              REQUIRE(dd::paged_slot_offset(g, table.data(), h, s) ==
                      static_cast<std::int64_t>(pool.row_offset(table[static_cast<std::size_t>(s / bs)], h, s % bs)));
        }
}

TEST_CASE("paged tile schedule, copy unit and blocks", "[paged][cuda]") {
  REQUIRE(dd::paged_blocks_for(0, 4) == 0);
  REQUIRE(dd::paged_blocks_for(-3, 4) == 0);
  REQUIRE(dd::paged_blocks_for(1, 4) == 1);
  REQUIRE(dd::paged_blocks_for(4, 4) == 1);
  REQUIRE(dd::paged_blocks_for(5, 4) == 2);
  REQUIRE(dd::paged_blocks_for(2147483647, 16) == 134217728);
  // whole rows per tile, 1..NT
  REQUIRE(dd::paged_tile_rows(16, 256, 4) == 64);
  REQUIRE(dd::paged_tile_rows(1, 256, 4) == 256);      // capped at one survivor per thread
  REQUIRE(dd::paged_tile_rows(1024, 256, 4) == 1);
  REQUIRE(dd::paged_tile_rows(5000, 256, 4) == 1);     // a row longer than a tile: one row, several steps
  REQUIRE(dd::paged_tile_rows(3, 256, 4) == 256);
  REQUIRE(dd::paged_tile_rows(7, 256, 4) == 146);
  REQUIRE(dd::paged_copy_unit_bytes(0) == 16);
  REQUIRE(dd::paged_copy_unit_bytes(256 | 4096) == 16);
  REQUIRE(dd::paged_copy_unit_bytes(256 | 24) == 8);
  REQUIRE(dd::paged_copy_unit_bytes(6) == 2);
  REQUIRE(dd::paged_copy_unit_bytes(7) == 1);
  // every unit of a tile once, row-major, identity survivors not moved
  BlockPool<float> pool(8, 4, 2, 3, PagedLayout::kNHD);
  const dd::PagedGeometry g = dd::make_paged_geometry(4, 2, 3, false);
  const std::vector<I32> table{7, 2, 5};
  const std::vector<I32> kept{0, 1, 3, 6, 7, 10};
  dc::PagedCompactHead h;
  h.table = table.data();
  h.kept = kept.data();
  h.n = 11;
  h.n_kept = 6;
  h.table_len = 3;
  h.head_in_block = 1;
  const int L = 3;  // 3 floats in 4-byte units
  int moved = 0;
  for (std::int64_t q = -1; q <= 4 * L; ++q) {
    const dd::PagedUnitMove m = dd::paged_unit_move(g, h, 2, 4, L, q);
    if (q < 0 || q >= 4 * L) {
      REQUIRE_FALSE(m.move);
      continue;
    }
    REQUIRE(m.i == 2 + static_cast<int>(q / L));
    REQUIRE(m.col == static_cast<int>(q % L));
    REQUIRE(m.move);  // kept[2..5] = 3, 6, 7, 10: all move
    REQUIRE(m.src == static_cast<std::int64_t>(pool.row_offset(table[static_cast<std::size_t>(kept[m.i] / 4)], 1, kept[m.i] % 4)));
    REQUIRE(m.dst == static_cast<std::int64_t>(pool.row_offset(table[static_cast<std::size_t>(m.i / 4)], 1, m.i % 4)));
    ++moved;
  }
  REQUIRE(moved == 4 * L);
  for (std::int64_t q = 0; q < 2 * L; ++q) REQUIRE_FALSE(dd::paged_unit_move(g, h, 0, 2, L, q).move);  // kept[0..1] = 0, 1
}

TEST_CASE("paged compaction parameter and head checks", "[paged][cuda]") {
  auto problem = [](int n_heads, bool heads_null, bool k_null, bool v_null, int num_blocks, int bs, int nh, int hd,
                    int layout, std::size_t eb) {
    const char* p = dd::paged_compact_params_problem(n_heads, heads_null, k_null, v_null, num_blocks, bs, nh, hd, layout, eb);
    return std::string(p == nullptr ? "" : p);
  };
  REQUIRE(problem(4, false, false, false, 10, 16, 2, 64, 0, 2).empty());
  REQUIRE(problem(0, true, true, true, 0, 16, 2, 64, 1, 2).empty());  // nothing to do: null pointers accepted
  REQUIRE(problem(-1, false, false, false, 10, 16, 2, 64, 0, 2) == "n_heads < 0");
  REQUIRE(problem(1, false, false, false, -1, 16, 2, 64, 0, 2) == "num_blocks < 0");
  REQUIRE(problem(1, true, false, false, 10, 16, 2, 64, 0, 2) == "null head table");
  REQUIRE(problem(1, false, true, false, 10, 16, 2, 64, 0, 2) == "null key or value blocks");
  REQUIRE(problem(1, false, false, true, 10, 16, 2, 64, 0, 2) == "null key or value blocks");
  REQUIRE(problem(1, false, false, false, 10, 16, 2, 64, 2, 2) == "layout is neither kNHD nor kHND");
  REQUIRE(problem(1, false, false, false, 10, 0, 2, 64, 0, 2) == "block_size, n_kv_heads or head_dim < 1");
  REQUIRE(problem(1, false, false, false, 10, 16, 0, 64, 0, 2) == "block_size, n_kv_heads or head_dim < 1");
  REQUIRE(problem(1, false, false, false, 10, 16, 2, 0, 0, 2) == "block_size, n_kv_heads or head_dim < 1");
  REQUIRE(problem(1, false, false, false, 10, 16, 2, 1 << 30, 0, 4) == "head_dim * sizeof(T) above 2^31 - 1 bytes");

  const dd::PagedGeometry g = dd::make_paged_geometry(4, 2, 8, false);
  const std::vector<I32> table{3, 1};
  const std::vector<I32> kept{0, 2, 5};
  dc::PagedCompactHead h;
  h.table = table.data();
  h.kept = kept.data();
  h.n = 7;
  h.n_kept = 3;
  h.table_len = 2;
  h.head_in_block = 1;
  REQUIRE(dd::paged_head_ok(g, h));
  REQUIRE_FALSE(head_bad(g, h, 4));
  REQUIRE(head_bad(g, h, 3));  // block 3 outside a pool of 3
  auto with = [&](auto change) {
    dc::PagedCompactHead c = h;
    change(c);
    return dd::paged_head_ok(g, c);
  };
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.n = -1; }));
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.n_kept = -1; }));
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.n_kept = 8; }));
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.n = 9; }));  // above 2 blocks of 4
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.head_in_block = 2; }));
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.head_in_block = -1; }));
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.table = nullptr; }));
  REQUIRE_FALSE(with([](dc::PagedCompactHead& c) { c.kept = nullptr; }));
  REQUIRE(with([](dc::PagedCompactHead& c) { c.n = 0, c.n_kept = 0, c.table = nullptr, c.kept = nullptr; }));
  const std::vector<I32> unsorted{0, 5, 2}, dup{1, 1}, high{0, 7}, neg{-1, 0};
  REQUIRE_FALSE(dd::paged_kept_ok(unsorted.data(), 2, 7));
  REQUIRE(dd::paged_kept_ok(unsorted.data(), 1, 7));
  REQUIRE_FALSE(dd::paged_kept_ok(dup.data(), 1, 7));
  REQUIRE_FALSE(dd::paged_kept_ok(high.data(), 1, 7));
  REQUIRE_FALSE(dd::paged_kept_ok(neg.data(), 0, 7));
}

TEMPLATE_TEST_CASE("emulated paged compaction kernel matches PagedLayer's compaction byte for byte", "[paged][cuda]",
                   float, Eigen::half) {
  std::mt19937 rng(1729);
  int cases = 0, moved_cases = 0, multi_tile = 0, long_rows = 0;
  for (PagedLayout layout : {PagedLayout::kNHD, PagedLayout::kHND})
    for (PagedTables tables : {PagedTables::kPerLayer, PagedTables::kPerHead})
      for (int rep = 0; rep < 10; ++rep) {
        const int nh = 1 + static_cast<int>(rng() % 4);
        const bool long_row = rep == 9;  // 4100 elements: a row longer than a tile (one survivor per tile)
        const int hd_choice[] = {1, 3, 8, 16, 64};
        const int hd = long_row ? 4100 : hd_choice[rng() % 5];
        const int bs = 1 + static_cast<int>(rng() % 17);
        const int n_layers = 1 + static_cast<int>(rng() % 3);
        const int tokens = static_cast<int>(rng() % (long_row ? 40 : rep % 3 == 0 ? 600 : 90));
        INFO("layout " << name(layout) << " tables " << name(tables) << " nh " << nh << " hd " << hd << " bs " << bs
                       << " layers " << n_layers << " tokens " << tokens << " rep " << rep);
        const int n_tables = tables == PagedTables::kPerLayer ? 1 : nh;
        BlockPool<TestType> pool(n_layers * n_tables * ((tokens + 11) / bs + 2), bs,
                                 tables == PagedTables::kPerLayer ? nh : 1, hd, layout);
        std::vector<PagedLayer<TestType>> layers;
        for (int l = 0; l < n_layers; ++l) layers.emplace_back(pool, nh, hd, tables);
        // interleaved appends over the layers, so that tables are not runs of consecutive blocks
        for (int t = 0; t < tokens; ++t)
          for (auto& L : layers) {
            const std::vector<float> k = random_row(nh * hd, rng), v = random_row(nh * hd, rng);
            L.append(k.data(), v.data(), 3 * t);
          }
        for (auto& L : layers)
          for (int h = 0; h < nh; ++h) {
            I32 pos = 3 * tokens + 1;
            for (int t = static_cast<int>(rng() % 12); t > 0; --t, pos += 1 + static_cast<I32>(rng() % 3)) {
              const std::vector<float> k = random_row(hd, rng), v = random_row(hd, rng);
              L.append_head(h, k.data(), v.data(), pos);
            }
          }
        // the CPU evictor's kept slots per (layer, head): random budgets, protection
        depthkv::Protection prot;
        prot.n_sink = static_cast<int>(rng() % 3);
        prot.n_recent = static_cast<int>(rng() % 4);
        std::vector<depthkv::LayerScores> scores(layers.size());
        std::vector<std::vector<int>> keep(layers.size());
        std::vector<std::vector<std::vector<I32>>> kept(layers.size());
        for (std::size_t l = 0; l < layers.size(); ++l) {
          scores[l].resize(static_cast<std::size_t>(nh));
          for (int h = 0; h < nh; ++h) {
            const int n = layers[l].size(h);
            for (int i = 0; i < n; ++i) scores[l][static_cast<std::size_t>(h)].push_back(static_cast<float>(rng() % 7));
            const int pc = depthkv::detail::protected_count(n, prot.n_sink, prot.n_recent);
            const int kind = static_cast<int>(rng() % 5);
            const int k = kind == 0 ? pc : kind == 1 ? n : pc + static_cast<int>(rng() % (n - pc + 1));
            keep[l].push_back(k);
            kept[l].push_back(depthkv::select_keep(scores[l][static_cast<std::size_t>(h)].data(), layers[l].positions(h), n,
                                                   k, prot));
          }
        }
        // plan and emulate on copies, before the CPU path changes anything
        Bytes k0, v0;
        pool_bytes(pool, k0, v0);
        Bytes ke = k0, ve = v0, kd = k0, vd = v0;
        std::vector<dc::PagedCompactPlan> plans;
        std::vector<HostHeads> hh, hd_late;
        std::vector<dc::PagedCompactHead> all, all_late;
        for (std::size_t l = 0; l < layers.size(); ++l) {
          plans.push_back(dc::plan_paged_compact(layers[l], kept[l]));
          hh.push_back(make_heads(layers[l], plans.back(), kept[l]));
          hd_late.push_back(make_heads(layers[l], plans.back(), kept[l]));
        }
        for (std::size_t l = 0; l < layers.size(); ++l) {
          all.insert(all.end(), hh[l].heads.begin(), hh[l].heads.end());
          all_late.insert(all_late.end(), hd_late[l].heads.begin(), hd_late[l].heads.end());
        }
        const dd::PagedGeometry g =
            dd::make_paged_geometry(bs, pool.n_kv_heads(), hd, layout == PagedLayout::kHND);
        const int unit = unit_for(pool);
        const int L_units = hd * static_cast<int>(sizeof(TestType)) / unit;
        const int R = dd::paged_tile_rows(L_units, dd::kPagedCompactThreads, dd::kPagedCompactUnroll);
        REQUIRE(emulate(ke, ve, g, pool.num_blocks(), sizeof(TestType), unit, all, Order::kKernel) == 0u);
        REQUIRE(emulate(kd, vd, g, pool.num_blocks(), sizeof(TestType), unit, all_late, Order::kWritesAfterNextReads) == 0u);

        // the CPU path
        const int free_before = pool.num_free();
        std::vector<std::vector<std::vector<I32>>> tables_before(layers.size());
        for (std::size_t l = 0; l < layers.size(); ++l)
          for (int t = 0; t < (tables == PagedTables::kPerLayer ? 1 : nh); ++t) tables_before[l].push_back(layers[l].block_table(t));
        for (std::size_t l = 0; l < layers.size(); ++l) {
          const depthkv::LayerEviction ev = depthkv::evict_layer(layers[l], scores[l], keep[l], prot);
          REQUIRE(ev.kept_slots == kept[l]);
        }
        Bytes kc, vc;
        pool_bytes(pool, kc, vc);
        REQUIRE(ke == kc);  // the whole pool, stale slots included
        REQUIRE(ve == vc);
        REQUIRE(kd == kc);
        REQUIRE(vd == vc);
        std::size_t freed_total = 0;
        for (std::size_t l = 0; l < layers.size(); ++l) {
          const dc::PagedCompactPlan& p = plans[l];
          for (int h = 0; h < nh; ++h) {
            REQUIRE(p.n_kept[static_cast<std::size_t>(h)] == layers[l].size(h));
            const std::vector<I32> got(hh[l].positions[static_cast<std::size_t>(h)].begin(),
                                       hh[l].positions[static_cast<std::size_t>(h)].begin() + layers[l].size(h));
            REQUIRE(got == std::vector<I32>(layers[l].positions(h), layers[l].positions(h) + layers[l].size(h)));
            REQUIRE(std::equal(got.begin(), got.end(), hd_late[l].positions[static_cast<std::size_t>(h)].begin()));
          }
          REQUIRE(p.freed_begin.size() == tables_before[l].size() + 1);
          for (std::size_t t = 0; t < tables_before[l].size(); ++t) {
            const std::vector<I32>& before = tables_before[l][t];
            const std::vector<I32>& after = layers[l].block_table(static_cast<int>(t));
            REQUIRE(p.table_len[t] == static_cast<int>(after.size()));
            REQUIRE(std::equal(after.begin(), after.end(), before.begin()));  // the kept prefix, unchanged
            const std::vector<I32> freed(p.freed.begin() + p.freed_begin[t], p.freed.begin() + p.freed_begin[t + 1]);
            REQUIRE(freed == std::vector<I32>(before.begin() + static_cast<std::ptrdiff_t>(after.size()), before.end()));
            for (I32 b : freed) REQUIRE_FALSE(pool.in_use(b));
          }
          freed_total += p.freed.size();
        }
        REQUIRE(pool.num_free() == free_before + static_cast<int>(freed_total));
        REQUIRE(pool.check());
        ++cases;
        bool any_move = false, many = false;
        for (const auto& h : all) {
          for (int i = 0; i < h.n_kept; ++i) any_move = any_move || h.kept[i] != i;
          many = many || h.n_kept > R;
        }
        moved_cases += any_move;
        multi_tile += many;
        long_rows += R == 1 && any_move;
      }
  INFO("cases " << cases << " with moves " << moved_cases << " several tiles " << multi_tile << " long rows " << long_rows);
  REQUIRE(moved_cases >= cases / 2);
  REQUIRE(multi_tile >= 5);
  REQUIRE(long_rows >= 1);
}

TEST_CASE("a tile order that breaks the contract is caught", "[paged][cuda]") {
  // Walking the tiles backwards overwrites slots that earlier survivors still have to read: the
  // comparison with the CPU path must see it (so the byte comparison above can fail).
  BlockPool<float> pool(64, 2, 1, 4100, PagedLayout::kNHD);  // 4100 floats: one survivor per tile
  PagedLayer<float> layer(pool, 1, 4100, PagedTables::kPerHead);
  std::mt19937 rng(5);
  for (int t = 0; t < 6; ++t) {
    const std::vector<float> k = random_row(4100, rng), v = random_row(4100, rng);
    layer.append(k.data(), v.data(), t);
  }
  const std::vector<std::vector<I32>> kept{{1, 2, 4}};
  const dc::PagedCompactPlan plan = dc::plan_paged_compact(layer, kept);
  HostHeads good = make_heads(layer, plan, kept), bad = make_heads(layer, plan, kept);
  Bytes k0, v0;
  pool_bytes(pool, k0, v0);
  Bytes kg = k0, vg = v0, kb = k0, vb = v0;
  const dd::PagedGeometry g = dd::make_paged_geometry(2, 1, 4100, false);
  REQUIRE(unit_for(pool) == 16);
  REQUIRE(dd::paged_tile_rows(4100 * 4 / 16, dd::kPagedCompactThreads, dd::kPagedCompactUnroll) == 1);
  REQUIRE(emulate(kg, vg, g, 64, 4, 16, good.heads, Order::kKernel) == 0u);
  REQUIRE(emulate(kb, vb, g, 64, 4, 16, bad.heads, Order::kReversedTiles) == 0u);
  layer.compact(0, kept[0].data(), 3);
  Bytes kc, vc;
  pool_bytes(pool, kc, vc);
  REQUIRE(kg == kc);
  REQUIRE(vg == vc);
  REQUIRE(kb != kc);
  REQUIRE(bad.positions[0] != std::vector<I32>(layer.positions(0), layer.positions(0) + 3));
}

TEST_CASE("emulated kernel skips bad heads without writing them", "[paged][cuda]") {
  BlockPool<float> pool(16, 4, 2, 8, PagedLayout::kHND);
  PagedLayer<float> layer(pool, 2, 8, PagedTables::kPerLayer);
  std::mt19937 rng(9);
  for (int t = 0; t < 10; ++t) {
    const std::vector<float> k = random_row(16, rng), v = random_row(16, rng);
    layer.append(k.data(), v.data(), t);
  }
  const std::vector<std::vector<I32>> kept{{0, 3, 9}, {2, 5}};
  const dc::PagedCompactPlan plan = dc::plan_paged_compact(layer, kept);
  const dd::PagedGeometry g = dd::make_paged_geometry(4, 2, 8, true);
  Bytes k0, v0;
  pool_bytes(pool, k0, v0);
  for (int what = 0; what < 4; ++what) {
    HostHeads hh = make_heads(layer, plan, kept);
    dc::PagedCompactHead& h = hh.heads[1];
    if (what == 0) hh.kept[1][1] = 1;                      // {2, 1}: not ascending
    if (what == 1) hh.kept[1][1] = 10;                     // {2, 10}: outside [0, n)
    if (what == 2) hh.tables[0][1] = 16;                   // a block outside the pool
    if (what == 3) h.head_in_block = 2;                    // no such head in the block
    Bytes k = k0, v = v0;
    const std::vector<I32> pos1 = hh.positions[1];
    REQUIRE(emulate(k, v, g, 16, 4, unit_for(pool), hh.heads, Order::kKernel) == dc::PagedCompactStatus::kBadHead);
    REQUIRE(hh.positions[1] == pos1);  // the bad head's positions untouched
    // the bad head's rows untouched: only head 0's rows (or none, when the bad table is shared) differ
    const std::vector<I32>& tab = layer.block_table(0);
    for (int s = 0; s < 10; ++s) {
      const std::size_t off = pool.row_offset(tab[static_cast<std::size_t>(s / 4)], 1, s % 4) * sizeof(float);
      REQUIRE(std::memcmp(k.data() + off, k0.data() + off, 8 * sizeof(float)) == 0);
      REQUIRE(std::memcmp(v.data() + off, v0.data() + off, 8 * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("plan_paged_compact rejects bad input with a clear message and changes nothing", "[paged][cuda]") {
  using Catch::Contains;
  for (PagedTables tables : {PagedTables::kPerLayer, PagedTables::kPerHead}) {
    INFO(name(tables));
    BlockPool<float> pool(32, 3, tables == PagedTables::kPerLayer ? 2 : 1, 4, PagedLayout::kNHD);
    PagedLayer<float> layer(pool, 2, 4, tables);
    std::mt19937 rng(3);
    for (int t = 0; t < 8; ++t) {
      const std::vector<float> k = random_row(8, rng), v = random_row(8, rng);
      layer.append(k.data(), v.data(), t);
    }
    const std::vector<I32> t0 = layer.block_table(0);
    const int free0 = pool.num_free();
    Bytes k0, v0, k1, v1;
    pool_bytes(pool, k0, v0);
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(layer, {{0, 1}}), Contains("1 kept lists for 2 KV heads"));
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(layer, {{0, 1}, {3, 2}}),
                        Contains("plan_paged_compact: head 1: kept slot 2 at 1 not above the previous one"));
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(layer, {{0, 0}, {1}}), Contains("head 0: kept slot 0 at 1 not above"));
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(layer, {{0, 8}, {1}}), Contains("head 0: kept slot 8 at 1 outside [0, size)"));
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(layer, {{-1}, {1}}), Contains("head 0: kept slot -1 at 0 outside"));
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(layer, {{0, 1, 2, 3, 4, 5, 6, 7, 7}, {1}}),
                        Contains("head 0: kept count 9 outside [0, 8]"));
    // raw overload: sizes beyond a table, a block outside the pool or listed twice
    const int sizes_big[2] = {10, 8};
    const int counts[2] = {0, 0};
    const I32* lists[2] = {nullptr, nullptr};
    std::vector<std::vector<I32>> tabs;
    for (int t = 0; t < (tables == PagedTables::kPerLayer ? 1 : 2); ++t) tabs.push_back(layer.block_table(t));
    REQUIRE_THROWS_WITH(
        dc::plan_paged_compact(tables, 3, 2, sizes_big, tabs.data(), lists, counts, 32),
        Contains("plan_paged_compact: head 0: size 10 outside [0, 9]"));  // the function called
    const int sizes[2] = {8, 8};
    std::vector<std::vector<I32>> bad = tabs;
    bad[0][1] = 32;
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(tables, 3, 2, sizes, bad.data(), lists, counts, 32),
                        Contains("plan_paged_compact: table 0 entry 1: block 32 outside [0, 32)"));
    bad = tabs;
    bad.back()[2] = bad[0][0];
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(tables, 3, 2, sizes, bad.data(), lists, counts, 32),
                        Contains("listed twice in the layer's tables"));
    const int counts1[2] = {1, 0};
    REQUIRE_THROWS_WITH(dc::plan_paged_compact(tables, 3, 2, sizes, tabs.data(), lists, counts1, 32),
                        Contains("head 0: null kept slots"));
    REQUIRE(layer.block_table(0) == t0);
    REQUIRE(pool.num_free() == free0);
    REQUIRE(layer.size(0) == 8);
    REQUIRE(layer.size(1) == 8);
    pool_bytes(pool, k1, v1);
    REQUIRE(k1 == k0);
    REQUIRE(v1 == v0);
    // empty layer, keep-none and keep-all plans
    const dc::PagedCompactPlan none = dc::plan_paged_compact(layer, {{}, {}});
    REQUIRE(none.n_kept == std::vector<int>{0, 0});
    for (int l : none.table_len) REQUIRE(l == 0);
    REQUIRE(static_cast<int>(none.freed.size()) == layer.num_blocks_held());
    const dc::PagedCompactPlan all = dc::plan_paged_compact(layer, {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}});
    REQUIRE(all.freed.empty());
    const dc::PagedCompactPlan part = dc::plan_paged_compact(layer, {{0, 7}, {1, 2, 3, 4}});
    if (tables == PagedTables::kPerLayer) {
      REQUIRE(part.table_len == std::vector<int>{2});  // the largest head's 4 survivors: 2 blocks of 3
    } else {
      REQUIRE(part.table_len == std::vector<int>{1, 2});
    }
  }
  PagedLayer<float> empty;
  REQUIRE_THROWS_WITH(dc::plan_paged_compact(empty, {}), Contains("no block pool"));
}
