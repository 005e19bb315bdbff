// The reference engine over paged caches (paged_cache.hpp): prefill, eviction with per-head
// budgets and decode on KVCache<PagedLayer<float>> give the logits of the owning HostLayer cache,
// for NHD and HND blocks, per-layer and per-head tables and several block sizes, with every
// sequence's blocks from one shared pool.
#include <Eigen/Core>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "depthkv/evictor.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/paged_cache.hpp"
#include "support/random_model.hpp"

using depthkv::BlockPool;
using depthkv::KVCache;
using depthkv::PagedLayer;
using depthkv::PagedLayout;
using depthkv::PagedTables;
using depthkv::llama::ForwardOptions;
using depthkv::llama::LlamaEngine;
using depthkv::llama::RowMatrix;

TEST_CASE("engine: paged caches give the logits of the owning cache through prefill, eviction and decode",
          "[engine][paged]") {
  depthkv_test::RandomSpec spec;
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(spec);
  const LlamaEngine engine(model);
  const int hd = spec.dim / spec.heads, n_prompt = 23;
  const std::vector<int> tokens = depthkv_test::random_tokens(n_prompt + 6, spec.vocab, 5);
  const std::vector<int> prompt(tokens.begin(), tokens.begin() + n_prompt);
  std::mt19937 rng(9);
  for (PagedLayout layout : {PagedLayout::kNHD, PagedLayout::kHND})
    for (PagedTables tables : {PagedTables::kPerLayer, PagedTables::kPerHead})
      for (int bs : {1, 3, 8}) {
        INFO("layout " << static_cast<int>(layout) << " tables " << static_cast<int>(tables) << " block_size " << bs);
        BlockPool<float> pool(512, bs, tables == PagedTables::kPerLayer ? spec.kv_heads : 1, hd, layout);
        {
          KVCache<PagedLayer<float>> paged;
          for (int l = 0; l < spec.layers; ++l) paged.add_layer(PagedLayer<float>(pool, spec.kv_heads, hd, tables));
          auto host = engine.make_cache();
          ForwardOptions opt;
          opt.chunk_size = 7;  // chunked prefill: appends between attention calls
          const RowMatrix a = engine.prefill(prompt, 0, host, opt), b = engine.prefill(prompt, 0, paged, opt);
          REQUIRE((a - b).cwiseAbs().maxCoeff() < 1e-6f);
          // per-head budgets, the same scores for both
          std::vector<depthkv::LayerScores> scores(static_cast<std::size_t>(spec.layers));
          std::vector<std::vector<int>> keep(static_cast<std::size_t>(spec.layers));
          for (int l = 0; l < spec.layers; ++l)
            for (int h = 0; h < spec.kv_heads; ++h) {
              std::vector<float> s(static_cast<std::size_t>(n_prompt));
              for (float& x : s) x = static_cast<float>(rng() % 1000);
              scores[static_cast<std::size_t>(l)].push_back(s);
              keep[static_cast<std::size_t>(l)].push_back(4 + static_cast<int>(rng() % 12));
            }
          const auto eh = depthkv::evict(host, scores, keep, {1, 2});
          const auto ep = depthkv::evict(paged, scores, keep, {1, 2});
          int held = 0;
          for (int l = 0; l < spec.layers; ++l) {
            REQUIRE(eh[static_cast<std::size_t>(l)].kept_positions == ep[static_cast<std::size_t>(l)].kept_positions);
            held += paged.layer(l).num_blocks_held();
          }
          REQUIRE(host.bytes() == paged.bytes());
          REQUIRE(pool.num_used() == held);
          for (int p = n_prompt; p < static_cast<int>(tokens.size()); ++p) {
            const Eigen::VectorXf x = engine.decode(tokens[static_cast<std::size_t>(p)], p, host);
            const Eigen::VectorXf y = engine.decode(tokens[static_cast<std::size_t>(p)], p, paged);
            REQUIRE((x - y).cwiseAbs().maxCoeff() < 1e-6f);
          }
          REQUIRE(host.lengths() == paged.lengths());
        }
        REQUIRE(pool.num_free() == pool.num_blocks());  // the sequence's blocks went back
      }
}

TEST_CASE("engine: a forward that finds the pool short throws before any layer is touched", "[engine][paged]") {
  depthkv_test::RandomSpec spec;
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(spec);
  const LlamaEngine engine(model);
  const int hd = spec.dim / spec.heads, bs = 4, n_prompt = 6;
  const std::vector<int> tokens = depthkv_test::random_tokens(n_prompt + 8, spec.vocab, 11);
  const std::vector<int> prompt(tokens.begin(), tokens.begin() + n_prompt);
  for (PagedTables tables : {PagedTables::kPerLayer, PagedTables::kPerHead}) {
    INFO("tables " << static_cast<int>(tables));
    const int tabs = tables == PagedTables::kPerLayer ? 1 : spec.kv_heads;  // tables per layer
    // the prompt's blocks (2 per table) and one more: the first layer could take it, the others not
    BlockPool<float> pool(spec.layers * tabs * 2 + 1, bs, tables == PagedTables::kPerLayer ? spec.kv_heads : 1, hd);
    KVCache<PagedLayer<float>> paged;
    for (int l = 0; l < spec.layers; ++l) paged.add_layer(PagedLayer<float>(pool, spec.kv_heads, hd, tables));
    auto host = engine.make_cache();
    engine.prefill(prompt, 0, host);
    engine.prefill(prompt, 0, paged);
    REQUIRE(paged.layer(0).blocks_for_tokens(0) == 0);
    REQUIRE(paged.layer(0).blocks_for_tokens(2) == 0);      // slots 6, 7 of block 1
    REQUIRE(paged.layer(0).blocks_for_tokens(3) == tabs);   // slot 8 opens block 2 of every table
    REQUIRE(paged.layer(0).blocks_for_tokens(7) == 2 * tabs);
    REQUIRE_THROWS_AS(paged.layer(0).blocks_for_tokens(-1), depthkv::Error);
    const std::vector<int> lengths = paged.lengths();
    const int used = pool.num_used();
    try {
      engine.forward(tokens.data() + n_prompt, 8, n_prompt, paged);
      FAIL("the pool was short, the forward pass did not throw");
    } catch (const depthkv::Error& e) {
      REQUIRE(std::string(e.what()).find("pool exhausted") != std::string::npos);
    }
    REQUIRE(paged.lengths() == lengths);  // no layer appended anything
    REQUIRE(pool.num_used() == used);
    REQUIRE(pool.check());
    for (int p = n_prompt; p < n_prompt + 2; ++p) {  // the sequence goes on where it was
      const Eigen::VectorXf x = engine.decode(tokens[static_cast<std::size_t>(p)], p, host);
      const Eigen::VectorXf y = engine.decode(tokens[static_cast<std::size_t>(p)], p, paged);
      REQUIRE((x - y).cwiseAbs().maxCoeff() < 1e-6f);
    }
  }
}

TEST_CASE("engine: sliding-window layers on paged and fixed-capacity caches hold only their window's blocks and slots",
          "[engine][paged][window]") {
  depthkv_test::RandomSpec spec;
  spec.gemma3 = true;
  spec.window = 5;
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(spec);
  const LlamaEngine engine(model);
  const int hd = spec.dim / spec.heads, n_prompt = 40, chunk = 4, bs = 2;
  const std::vector<int> tokens = depthkv_test::random_tokens(n_prompt + 8, spec.vocab, 6);
  const std::vector<int> prompt(tokens.begin(), tokens.begin() + n_prompt);
  // the global layer needs 24 blocks for 48 tokens; each local layer at most (5 - 1 + 4) / 2 = 4 during
  // a call: 32 blocks suffice with the window, 72 would be needed without it
  BlockPool<float> pool(32, bs, spec.kv_heads, hd, PagedLayout::kNHD);
  KVCache<PagedLayer<float>> paged;
  for (int l = 0; l < spec.layers; ++l) paged.add_layer(PagedLayer<float>(pool, spec.kv_heads, hd, PagedTables::kPerLayer));
  auto host = engine.make_cache();
  ForwardOptions opt;
  opt.chunk_size = chunk;
  int most_local_blocks = 0;
  opt.after_chunk = [&](int, std::int32_t) {
    most_local_blocks = std::max(most_local_blocks, paged.layer(0).num_blocks_held());
  };
  const RowMatrix a = engine.prefill(prompt, 0, host), b = engine.prefill(prompt, 0, paged, opt);
  REQUIRE((a - b).cwiseAbs().maxCoeff() < 1e-5f);
  REQUIRE(most_local_blocks <= (spec.window - 1 + chunk + bs - 1) / bs);
  REQUIRE(paged.layer(0).num_blocks_held() == (spec.window - 1 + bs - 1) / bs);
  for (int p = n_prompt; p < static_cast<int>(tokens.size()); ++p) {
    const Eigen::VectorXf x = engine.decode(tokens[static_cast<std::size_t>(p)], p, host);
    const Eigen::VectorXf y = engine.decode(tokens[static_cast<std::size_t>(p)], p, paged);
    REQUIRE((x - y).cwiseAbs().maxCoeff() < 1e-5f);
    REQUIRE(paged.layer(1).size(0) == spec.window - 1);
  }
  REQUIRE(host.lengths() == paged.lengths());
  REQUIRE(pool.num_used() == paged.layer(0).num_blocks_held() * 2 + paged.layer(2).num_blocks_held());

  // a fixed-capacity layer (engine-owned memory) of window - 1 + chunk slots is enough for a local layer
  const int cap_local = spec.window - 1 + chunk, cap_global = n_prompt;
  std::vector<std::vector<float>> kmem, vmem;
  KVCache<depthkv::LayerView<float>> views;
  for (int l = 0; l < spec.layers; ++l) {
    const int cap = model.config.is_local(l) ? cap_local : cap_global;
    kmem.emplace_back(static_cast<std::size_t>(spec.kv_heads * cap * hd));
    vmem.emplace_back(static_cast<std::size_t>(spec.kv_heads * cap * hd));
    views.add_layer(depthkv::LayerView<float>(kmem.back().data(), vmem.back().data(), spec.kv_heads, hd, cap));
  }
  const RowMatrix c = engine.prefill(prompt, 0, views, opt);
  REQUIRE((a - c).cwiseAbs().maxCoeff() < 1e-5f);
}
