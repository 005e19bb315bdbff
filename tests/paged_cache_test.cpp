// Tests of paged_cache.hpp: PagedLayer against the owning HostLayer under the same appends and
// evictions (NHD and HND blocks, per-layer and per-head tables, random block sizes and per-head
// budgets), block-pool accounting over random append / evict / free sequences of many sequences
// sharing one pool, exhaustion, atomicity of errors, and the FlashInfer-style export.
#include "depthkv/paged_cache.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "depthkv/evictor.hpp"
#include "depthkv/kv_cache.hpp"

using depthkv::BlockPool;
using depthkv::PagedLayer;
using depthkv::PagedLayout;
using depthkv::PagedTables;
using I32 = std::int32_t;

namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }

/// The fewest blocks that hold the layer's tokens.
template <typename T>
int fewest_blocks(const PagedLayer<T>& L) {
  if (L.tables() == PagedTables::kPerLayer) return ceil_div(L.max_size(), L.block_size());
  int n = 0;
  for (int h = 0; h < L.n_kv_heads(); ++h) n += ceil_div(L.size(h), L.block_size());
  return n;
}

/// Same tokens, positions, rows and bytes.
template <typename T>
bool same_layer(const PagedLayer<T>& p, const depthkv::HostLayer<T>& q) {
  if (p.n_kv_heads() != q.n_kv_heads() || p.bytes() != q.bytes() || p.max_size() != q.max_size()) return false;
  const std::size_t row = static_cast<std::size_t>(p.head_dim()) * sizeof(T);
  for (int h = 0; h < p.n_kv_heads(); ++h) {
    if (p.size(h) != q.size(h)) return false;
    for (int i = 0; i < p.size(h); ++i)
      if (p.positions(h)[i] != q.positions(h)[i] || std::memcmp(p.key(h, i), q.key(h, i), row) != 0 ||
          std::memcmp(p.value(h, i), q.value(h, i), row) != 0)
        return false;
  }
  return true;
}

/// Block ids held by a set of layers: each at most once, and exactly the pool's used blocks.
template <typename T>
bool accounting_ok(const BlockPool<T>& pool, const std::vector<const PagedLayer<T>*>& layers) {
  if (!pool.check()) return false;
  std::set<I32> held;
  std::size_t n = 0;
  for (const PagedLayer<T>* L : layers) {
    const int tables = L->tables() == PagedTables::kPerLayer ? 1 : L->n_kv_heads();
    for (int t = 0; t < tables; ++t)
      for (I32 b : L->block_table(t)) {
        held.insert(b);
        ++n;
        if (!pool.in_use(b)) return false;
      }
  }
  return held.size() == n && static_cast<int>(n) == pool.num_used();
}

/// A snapshot of what an error must leave unchanged.
template <typename T>
struct Snapshot {
  std::vector<std::vector<I32>> tables, positions;
  int free = 0;
  explicit Snapshot(const PagedLayer<T>& L) {
    const int nt = L.tables() == PagedTables::kPerLayer ? 1 : L.n_kv_heads();
    for (int t = 0; t < nt; ++t) tables.push_back(L.block_table(t));
    for (int h = 0; h < L.n_kv_heads(); ++h) positions.emplace_back(L.positions(h), L.positions(h) + L.size(h));
    free = L.pool().num_free();
  }
  bool operator==(const Snapshot& o) const { return tables == o.tables && positions == o.positions && free == o.free; }
};

std::vector<float> random_row(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> r(static_cast<std::size_t>(n));
  for (auto& x : r) x = u(rng);
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("PagedLayer matches HostLayer under the same appends and evictions", "[paged][evict]", float,
                   Eigen::half) {
  std::mt19937 rng(31);
  int cases = 0;
  for (PagedLayout layout : {PagedLayout::kNHD, PagedLayout::kHND})
    for (PagedTables tables : {PagedTables::kPerLayer, PagedTables::kPerHead})
      for (int rep = 0; rep < 6; ++rep) {
        const int nh = 1 + static_cast<int>(rng() % 4), hd = 1 + static_cast<int>(rng() % 9);
        const int bs = 1 + static_cast<int>(rng() % 7);
        const int threads = rep % 2 == 0 ? 1 : 3;
        INFO("layout " << (layout == PagedLayout::kNHD ? "NHD" : "HND") << " tables "
                       << (tables == PagedTables::kPerLayer ? "per-layer" : "per-head") << " nh " << nh << " hd "
                       << hd << " bs " << bs << " threads " << threads);
        BlockPool<TestType> pool(4096, bs, tables == PagedTables::kPerLayer ? nh : 1, hd, layout);
        PagedLayer<TestType> paged(pool, nh, hd, tables);
        depthkv::HostLayer<TestType> host(nh, hd);
        I32 pos = 0;
        for (int round = 0; round < 5; ++round) {
          const int appends = static_cast<int>(rng() % 40);
          for (int t = 0; t < appends; ++t, ++pos) {
            const std::vector<float> k = random_row(nh * hd, rng), v = random_row(nh * hd, rng);
            paged.append(k.data(), v.data(), pos);
            host.append(k.data(), v.data(), pos);
          }
          for (int h = 0; h < nh; ++h)
            for (int t = static_cast<int>(rng() % 5); t > 0; --t, ++pos) {
              const std::vector<float> k = random_row(hd, rng), v = random_row(hd, rng);
              paged.append_head(h, k.data(), v.data(), pos);
              host.append_head(h, k.data(), v.data(), pos);
            }
          REQUIRE(same_layer(paged, host));
          depthkv::LayerScores scores(static_cast<std::size_t>(nh));
          std::vector<int> keep(static_cast<std::size_t>(nh));
          for (int h = 0; h < nh; ++h) {
            const int n = host.size(h);
            for (int i = 0; i < n; ++i) scores[static_cast<std::size_t>(h)].push_back(static_cast<float>(rng() % 6));
            const int kind = static_cast<int>(rng() % 4);
            keep[static_cast<std::size_t>(h)] = kind == 0 ? 0 : kind == 1 ? n : static_cast<int>(rng() % (n + 1));
          }
          depthkv::EvictOptions opt;
          opt.n_threads = threads;
          const depthkv::Protection prot{0, 0};
          const auto ep = depthkv::evict_layer(paged, scores, keep, prot, opt);
          const auto eh = depthkv::evict_layer(host, scores, keep, prot, opt);
          REQUIRE(ep.kept_slots == eh.kept_slots);
          REQUIRE(ep.kept_positions == eh.kept_positions);
          REQUIRE(same_layer(paged, host));
          REQUIRE(paged.num_blocks_held() == fewest_blocks(paged));
          REQUIRE(pool.num_used() == paged.num_blocks_held());
          REQUIRE(paged.bytes_allocated() == static_cast<std::size_t>(paged.num_blocks_held()) * pool.block_bytes());
          REQUIRE(accounting_ok(pool, {&paged}));
        }
        ++cases;
      }
  REQUIRE(cases == 24);
}

TEST_CASE("PagedLayer rows: NHD and HND block addresses, evict with shrink off keeps the blocks", "[paged]") {
  const int nh = 3, hd = 4, bs = 5;
  for (PagedLayout layout : {PagedLayout::kNHD, PagedLayout::kHND}) {
    BlockPool<float> pool(10, bs, nh, hd, layout);
    PagedLayer<float> L(pool, nh, hd);
    std::vector<float> k(nh * hd), v(nh * hd);
    for (int t = 0; t < 12; ++t) {
      for (int i = 0; i < nh * hd; ++i) k[static_cast<std::size_t>(i)] = v[static_cast<std::size_t>(i)] = 100.f * t + i;
      L.append(k.data(), v.data(), t);
    }
    REQUIRE(L.num_blocks_held() == 3);
    REQUIRE(L.block_table() == std::vector<I32>{0, 1, 2});
    for (int h = 0; h < nh; ++h)
      for (int s = 0; s < 12; ++s) {
        const I32 b = L.block_table()[static_cast<std::size_t>(s / bs)];
        const std::ptrdiff_t off = layout == PagedLayout::kNHD ? (s % bs) * nh * hd + h * hd : h * bs * hd + (s % bs) * hd;
        REQUIRE(L.key(h, s) == pool.keys_data() + b * bs * nh * hd + off);
        REQUIRE(L.key(h, s)[1] == 100.f * s + h * hd + 1);
      }
    depthkv::EvictOptions opt;
    opt.shrink = false;
    depthkv::LayerScores scores(nh, std::vector<float>(12, 1.f));
    depthkv::evict_layer(L, scores, {2, 3, 4}, {0, 0}, opt);
    REQUIRE(L.num_blocks_held() == 3);  // shrink off: the blocks stay with the layer
    L.shrink_to_fit();
    REQUIRE(L.num_blocks_held() == 1);
    REQUIRE(pool.num_free() == 9);
    REQUIRE(L.key(2, 3)[0] == 300.f + 2 * hd);  // equal scores: the earliest 4 stay
  }
}

TEST_CASE("BlockPool accounting over random append, evict and free of many sequences", "[paged]") {
  std::mt19937 rng(77);
  for (PagedTables tables : {PagedTables::kPerLayer, PagedTables::kPerHead}) {
    const int nh = 2, hd = 3, n_layers = 3;
    const int bs = 1 + static_cast<int>(rng() % 6);
    BlockPool<float> pool(60, bs, tables == PagedTables::kPerLayer ? nh : 1, hd);
    using Seq = depthkv::KVCache<PagedLayer<float>>;
    std::vector<std::unique_ptr<Seq>> seqs;
    std::vector<I32> next_pos;
    int exhausted = 0, evictions = 0, frees = 0;
    auto all_layers = [&]() {
      std::vector<const PagedLayer<float>*> v;
      for (const auto& s : seqs)
        for (int l = 0; l < s->n_layers(); ++l) v.push_back(&s->layer(l));
      return v;
    };
    for (int step = 0; step < 1500; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op == 0 || seqs.empty()) {  // a new sequence
        seqs.push_back(std::make_unique<Seq>());
        for (int l = 0; l < n_layers; ++l) seqs.back()->add_layer(PagedLayer<float>(pool, nh, hd, tables));
        next_pos.push_back(0);
      } else if (op <= 6) {  // appends to a random sequence (all layers, or one head)
        const std::size_t s = rng() % seqs.size();
        Seq& q = *seqs[s];
        const int l = static_cast<int>(rng() % n_layers);
        PagedLayer<float>& L = q.layer(l);
        const std::vector<float> k = random_row(nh * hd, rng);
        const int h = rng() % 3 == 0 ? static_cast<int>(rng() % nh) : -1;
        const bool room = L.blocks_to_append(h) <= pool.num_free();
        const Snapshot<float> before(L);
        try {
          if (h < 0)
            L.append(k.data(), k.data(), next_pos[s]);
          else
            L.append_head(h, k.data(), k.data(), next_pos[s]);
          REQUIRE(room);
        } catch (const depthkv::Error& e) {
          REQUIRE(!room);
          REQUIRE(std::string(e.what()).find("pool exhausted") != std::string::npos);
          REQUIRE(Snapshot<float>(L) == before);  // nothing taken, nothing written
          ++exhausted;
        }
        ++next_pos[s];
      } else if (op <= 8) {  // evict a random sequence to random per-head budgets
        const std::size_t s = rng() % seqs.size();
        Seq& q = *seqs[s];
        std::vector<depthkv::LayerScores> scores(static_cast<std::size_t>(n_layers));
        std::vector<std::vector<int>> keep(static_cast<std::size_t>(n_layers), std::vector<int>(nh));
        for (int l = 0; l < n_layers; ++l) {
          scores[static_cast<std::size_t>(l)].resize(nh);
          for (int h = 0; h < nh; ++h) {
            const int n = q.layer(l).size(h);
            for (int i = 0; i < n; ++i) scores[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)].push_back(
                static_cast<float>(rng() % 100));
            keep[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)] = static_cast<int>(rng() % (n + 1));
          }
        }
        depthkv::EvictOptions opt;
        opt.n_threads = 2;
        depthkv::evict(q, scores, keep, {0, 0}, opt);
        for (int l = 0; l < n_layers; ++l) REQUIRE(q.layer(l).num_blocks_held() == fewest_blocks(q.layer(l)));
        ++evictions;
      } else {  // a sequence ends: its blocks go back
        const std::size_t s = rng() % seqs.size();
        if (rng() % 2 == 0) {
          for (int l = 0; l < n_layers; ++l) seqs[s]->layer(l).clear();
          REQUIRE(seqs[s]->layer(0).max_size() == 0);
        } else {
          seqs.erase(seqs.begin() + static_cast<std::ptrdiff_t>(s));
          next_pos.erase(next_pos.begin() + static_cast<std::ptrdiff_t>(s));
        }
        ++frees;
      }
      REQUIRE(accounting_ok(pool, all_layers()));
    }
    REQUIRE(exhausted > 0);
    REQUIRE(evictions > 0);
    REQUIRE(frees > 0);
    seqs.clear();
    REQUIRE(pool.num_free() == pool.num_blocks());  // no leak
    REQUIRE(pool.check());
  }
}

TEST_CASE("BlockPool exhaustion: a clear error, never an overwrite, blocks_to_append signals it first", "[paged]") {
  BlockPool<float> pool(2, 2, 1, 2);
  PagedLayer<float> a(pool, 1, 2), b(pool, 1, 2);
  const float r1[2] = {1, 2}, r2[2] = {3, 4};
  for (int t = 0; t < 4; ++t) a.append(r1, r1, t);  // both blocks
  REQUIRE(pool.num_free() == 0);
  REQUIRE(b.blocks_to_append() == 1);
  REQUIRE(a.blocks_to_append() == 1);
  std::string msg;
  try {
    b.append(r2, r2, 0);
  } catch (const depthkv::Error& e) {
    msg = e.what();
  }
  REQUIRE(msg.find("pool exhausted: 1 blocks needed, 0 of 2 free") != std::string::npos);
  REQUIRE(b.size(0) == 0);
  REQUIRE(b.num_blocks_held() == 0);
  REQUIRE_THROWS_AS(a.append(r2, r2, 4), depthkv::Error);
  REQUIRE(a.size(0) == 4);
  for (int s = 0; s < 4; ++s) REQUIRE(a.key(0, s)[1] == 2.f);  // nothing overwritten
  // evicting a frees a block that b then takes
  depthkv::evict_layer(a, depthkv::LayerScores{{1, 1, 1, 1}}, {2}, {0, 0});
  REQUIRE(pool.num_free() == 1);
  b.append(r2, r2, 0);
  REQUIRE(b.key(0, 0)[0] == 3.f);
  REQUIRE(a.key(0, 1)[0] == 1.f);
  // per-head tables: an append needing two blocks with one free takes none
  BlockPool<float> p1(3, 2, 1, 2);
  PagedLayer<float> ph(p1, 2, 2, PagedTables::kPerHead);
  const float kv[4] = {1, 2, 3, 4};
  ph.append(kv, kv, 0);  // two blocks
  ph.append(kv, kv, 1);
  REQUIRE(ph.blocks_to_append() == 2);
  REQUIRE(p1.num_free() == 1);
  REQUIRE_THROWS_AS(ph.append(kv, kv, 2), depthkv::Error);
  REQUIRE(p1.num_free() == 1);
  REQUIRE(ph.size(0) == 2);
  REQUIRE(ph.size(1) == 2);
  ph.append_head(1, kv, kv, 2);  // one block: fits
  REQUIRE(p1.num_free() == 0);
  REQUIRE(ph.block_table(1).size() == 2u);
}

TEST_CASE("PagedLayer and BlockPool errors leave tables and pool unchanged", "[paged]") {
  BlockPool<float> pool(8, 3, 2, 2);
  PagedLayer<float> L(pool, 2, 2);
  const float kv[4] = {1, 2, 3, 4};
  for (int t = 0; t < 7; ++t) L.append(kv, kv, 2 * t);
  const Snapshot<float> before(L);
  REQUIRE_THROWS_AS(L.append(kv, kv, 12), depthkv::Error);  // position does not increase
  REQUIRE_THROWS_AS(L.append_head(2, kv, kv, 20), depthkv::Error);
  const I32 unsorted[] = {3, 1};
  REQUIRE_THROWS_AS(L.compact(0, unsorted, 2), depthkv::Error);
  const I32 outside[] = {7};
  REQUIRE_THROWS_AS(L.compact(0, outside, 1), depthkv::Error);
  depthkv::LayerScores nan_scores(2, std::vector<float>(7, 1.f));
  nan_scores[1][3] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE_THROWS_AS(depthkv::evict_layer(L, nan_scores, {1, 1}, {0, 0}), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::evict_layer(L, depthkv::LayerScores(2, std::vector<float>(7, 1.f)), {1, 1}, {2, 0}),
                    depthkv::Error);  // keep below the protected count
  REQUIRE(Snapshot<float>(L) == before);
  // the pool's own errors
  const I32 not_used[] = {7};
  REQUIRE_THROWS_AS(pool.release(not_used, 1), depthkv::Error);
  const I32 twice[] = {0, 0};
  REQUIRE_THROWS_AS(pool.release(twice, 2), depthkv::Error);
  const I32 out_of_range[] = {0, 8};
  REQUIRE_THROWS_AS(pool.release(out_of_range, 2), depthkv::Error);
  std::vector<I32> got;
  REQUIRE_THROWS_AS(pool.allocate(6, got), depthkv::Error);  // 5 free
  REQUIRE(got.empty());
  REQUIRE(Snapshot<float>(L) == before);
  REQUIRE(accounting_ok(pool, {&L}));
  // construction errors
  REQUIRE_THROWS_AS(PagedLayer<float>(pool, 3, 2), depthkv::Error);                         // heads differ
  REQUIRE_THROWS_AS(PagedLayer<float>(pool, 2, 4), depthkv::Error);                         // head_dim differs
  REQUIRE_THROWS_AS(PagedLayer<float>(pool, 2, 2, PagedTables::kPerHead), depthkv::Error);  // needs 1-head blocks
  REQUIRE_THROWS_AS(BlockPool<float>(4, 0, 1, 2), depthkv::Error);
  std::vector<float> mem(64);
  REQUIRE_THROWS_AS(BlockPool<float>(mem.data(), mem.data() + 8, 2, 2, 2, 2), depthkv::Error);  // K/V overlap
  REQUIRE_NOTHROW(BlockPool<float>(mem.data(), mem.data() + 16, 2, 2, 2, 2));
  // moving a layer moves its blocks; the moved-from layer holds none
  PagedLayer<float> M(std::move(L));
  REQUIRE(M.num_blocks_held() == 3);
  REQUIRE(L.num_blocks_held() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  REQUIRE(accounting_ok(pool, {&M}));
}

TEST_CASE("append_page_table exports FlashInfer-style indices, indptr and last-page lengths", "[paged]") {
  BlockPool<float> pool(32, 4, 2, 2), single(32, 4, 1, 2);
  PagedLayer<float> a(pool, 2, 2), empty(pool, 2, 2), ph(single, 2, 2, PagedTables::kPerHead);
  const float kv[4] = {1, 2, 3, 4};
  PagedLayer<float> b(pool, 2, 2);
  for (int t = 0; t < 9; ++t) a.append(kv, kv, t);
  for (int t = 0; t < 9; ++t) b.append(kv, kv, t);
  for (int t = 0; t < 4; ++t) ph.append_head(0, kv, kv, t);
  for (int t = 0; t < 6; ++t) ph.append_head(1, kv, kv, t);
  depthkv::PageTable pt;
  depthkv::append_page_table(pt, a);
  depthkv::append_page_table(pt, empty);
  depthkv::append_page_table(pt, ph);
  REQUIRE(pt.size() == 4);
  REQUIRE(pt.indptr == std::vector<I32>{0, 3, 3, 4, 6});
  REQUIRE(pt.indices == std::vector<I32>{a.block_table()[0], a.block_table()[1], a.block_table()[2],
                                         ph.block_table(0)[0], ph.block_table(1)[0], ph.block_table(1)[1]});
  REQUIRE(pt.last_page_len == std::vector<I32>{1, 0, 4, 2});
  // after eviction with shrink off only the pages holding tokens are listed
  depthkv::EvictOptions opt;
  opt.shrink = false;
  depthkv::evict_layer(a, depthkv::LayerScores(2, std::vector<float>(9, 0.f)), {5, 5}, {0, 0}, opt);
  depthkv::PageTable q;
  depthkv::append_page_table(q, a);
  REQUIRE(q.indptr == std::vector<I32>{0, 2});
  REQUIRE(q.last_page_len == std::vector<I32>{1});
  REQUIRE(a.num_blocks_held() == 3);
  // heads of different sizes cannot share one per-layer length: refused, q unchanged
  depthkv::evict_layer(b, depthkv::LayerScores(2, std::vector<float>(9, 0.f)), {5, 2}, {0, 0}, opt);
  const depthkv::PageTable before = q;
  REQUIRE_THROWS_WITH(depthkv::append_page_table(q, b), Catch::Contains("KV head 1 holds 2 tokens"));
  REQUIRE(q.indptr == before.indptr);
  REQUIRE(q.indices == before.indices);
  REQUIRE_THROWS_AS(depthkv::append_page_table(q, PagedLayer<float>()), depthkv::Error);  // no pool
  q.indptr.push_back(7);
  REQUIRE_THROWS_AS(depthkv::append_page_table(q, a), depthkv::Error);  // indptr inconsistent
}
