// TokenScorer's output-norm cache (cached_scores): bit for bit the uncached scores over appends,
// evictions and more appends; the per-slot norms independent of the product's blocks; a layer
// shrunk behind the scorer's back refused with the scorer unchanged.
#include <Eigen/Core>
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "depthkv/kv_cache.hpp"
#include "depthkv/token_scorer.hpp"

using depthkv::LayerScores;
using depthkv::OutputProjection;
using depthkv::ScorerConfig;
using depthkv::ScorerKind;
using depthkv::TokenScorer;

namespace {

// Appends n tokens of normal keys / values to every KV head, positions continuing.
template <class Layer>
void oanorm_append(Layer& L, int n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<std::size_t>(L.n_kv_heads() * L.head_dim())), v(k.size());
  std::int32_t pos = 0;  // after every head's last held position (evictions differ per head)
  for (int h = 0; h < L.n_kv_heads(); ++h)
    if (L.size(h) > 0) pos = std::max(pos, L.positions(h)[L.size(h) - 1] + 1);
  for (int i = 0; i < n; ++i) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    L.append(k.data(), v.data(), pos++);
  }
}

// One attention row per query head at each position [pos0, pos0 + n_new), over the slots held.
template <class Layer>
void oanorm_observe(TokenScorer& sc, const Layer& L, int n_heads, std::int32_t pos0, int n_new, std::mt19937& rng) {
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const int group = n_heads / L.n_kv_heads();
  for (int i = 0; i < n_new; ++i)
    for (int q = 0; q < n_heads; ++q) {
      const int n = L.size(q / group);
      std::vector<float> p(static_cast<std::size_t>(n));
      for (float& x : p) x = u01(rng);
      sc.observe(q, pos0 + i, p.data(), n);
    }
}

// A random strictly ascending subset of [0, n) per KV head, applied to the layer and the scorer.
template <class Layer>
void oanorm_evict(TokenScorer& sc, Layer& L, std::mt19937& rng) {
  for (int h = 0; h < L.n_kv_heads(); ++h) {
    std::vector<std::int32_t> kept;
    const int keep_per_mille = static_cast<int>(rng() % 1000);
    for (int j = 0; j < L.size(h); ++j)
      if (static_cast<int>(rng() % 1000) < keep_per_mille) kept.push_back(j);
    L.compact(h, kept.data(), static_cast<int>(kept.size()));
    sc.compact(h, kept.data(), static_cast<int>(kept.size()));
  }
}

std::vector<float> oanorm_matrix(int rows, int cols, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> W(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  for (float& x : W) x = nd(rng);
  return W;
}

struct OanormShape {
  int n_kv, group, head_dim, dim;
};

// (tiny: Eigen would take its coefficient-wise product for few slots; dim 1: a row-vector product;
// stories260K; Qwen2.5-0.5B's 2 KV heads of 7 query heads)
const OanormShape kOanormShapes[] = {{2, 1, 3, 5}, {1, 3, 4, 6}, {2, 2, 3, 1},
                                     {4, 2, 8, 64}, {2, 1, 16, 48}, {2, 7, 64, 896}};

}  // namespace

TEMPLATE_TEST_CASE("cached output-aware scores equal the uncached ones bit for bit over appends and evictions",
                   "[scorer][output][cache]", float, Eigen::half) {
  std::mt19937 rng(3131);
  for (const OanormShape& s : kOanormShapes)
    for (ScorerKind kind : {ScorerKind::kH2O, ScorerKind::kSnapKV}) {
      const int n_heads = s.n_kv * s.group;
      ScorerConfig cfg;
      cfg.kind = kind;
      cfg.window = 4;
      cfg.output_aware = true;
      TokenScorer sc(cfg, n_heads, s.n_kv);
      depthkv::HostLayer<TestType> L(s.n_kv, s.head_dim);
      const std::vector<float> W = oanorm_matrix(s.dim, n_heads * s.head_dim, rng);
      const OutputProjection wo{W.data(), s.dim, n_heads, s.head_dim};
      std::int32_t pos = 0;
      const int steps = s.dim >= 896 ? 5 : 12;
      for (int step = 0; step < steps; ++step) {
        // 1 slot (a matrix-vector product), a few, or more than a 256-slot block
        const int n_new = step % 4 == 0 ? 1 : static_cast<int>(step % 4 == 3 ? 200 + rng() % 200 : rng() % 40);
        oanorm_append(L, n_new, rng);
        oanorm_observe(sc, L, n_heads, pos, std::min(n_new, 3), rng);
        pos += n_new;
        INFO("group " << s.group << " head_dim " << s.head_dim << " dim " << s.dim << " step " << step << " "
                      << depthkv::to_string(kind));
        const LayerScores cached = sc.cached_scores(L, &wo);
        const LayerScores fresh = sc.scores(L, &wo);  // output_contribution_norms of every slot
        REQUIRE(cached == fresh);
        for (int h = 0; h < s.n_kv; ++h) REQUIRE(sc.cached_norms(h) == L.size(h));
        if (step % 2 == 1) {
          oanorm_evict(sc, L, rng);
          for (int h = 0; h < s.n_kv; ++h) REQUIRE(sc.cached_norms(h) == L.size(h));  // compacted with the layer
        }
      }
      // another projection view (the transposed layout) or another layer object: rebuilt
      std::vector<float> Wt(W.size());
      const int cols = n_heads * s.head_dim;
      for (int r = 0; r < s.dim; ++r)
        for (int c = 0; c < cols; ++c)
          Wt[static_cast<std::size_t>(c) * s.dim + r] = W[static_cast<std::size_t>(r) * cols + c];
      const OutputProjection wt{Wt.data(), s.dim, n_heads, s.head_dim, 1, s.dim};
      REQUIRE(sc.cached_scores(L, &wt) == sc.scores(L, &wt));
      depthkv::HostLayer<TestType> other = L;
      oanorm_append(other, 2, rng);
      REQUIRE(sc.cached_scores(other, &wt) == sc.scores(other, &wt));
    }
}

TEST_CASE("the output norms of a slot do not depend on the slots sharing its product block", "[scorer][output][cache]") {
  std::mt19937 rng(977);
  for (const OanormShape& s : kOanormShapes) {
    const int n_heads = s.n_kv * s.group;
    depthkv::HostLayer<float> L(s.n_kv, s.head_dim);
    oanorm_append(L, 700, rng);
    const std::vector<float> W = oanorm_matrix(s.dim, n_heads * s.head_dim, rng);
    const OutputProjection wo{W.data(), s.dim, n_heads, s.head_dim};
    const LayerScores whole = depthkv::output_contribution_norms(L, wo);
    Eigen::MatrixXf v, y;
    const std::vector<int> counts = s.dim >= 512 ? std::vector<int>{1, 2, 3, 5, 7, 9, 29}
                                                 : std::vector<int>{1, 2, 3, 4, 5, 6, 7, 9, 13, 17, 26, 29, 255, 257, 300};
    for (int h = 0; h < s.n_kv; ++h)
      for (int j0 = 0; j0 < 8; ++j0)  // slots [j0, j0 + m) as one block: shifted column positions
        for (int m : counts) {
          std::vector<float> piece(static_cast<std::size_t>(m));
          depthkv::detail::output_norms_range(L, wo, n_heads * s.head_dim, h, j0, j0 + m, piece.data(), v, y);
          const std::vector<float>& w = whole[static_cast<std::size_t>(h)];
          INFO("group " << s.group << " head_dim " << s.head_dim << " dim " << s.dim << " head " << h << " slots ["
                        << j0 << ", " << j0 + m << ")");
          REQUIRE(piece == std::vector<float>(w.begin() + j0, w.begin() + j0 + m));
        }
  }
}

TEST_CASE("cached scores refuse a layer shrunk without compact and leave the scorer unchanged", "[scorer][output][cache]") {
  std::mt19937 rng(41);
  ScorerConfig cfg;
  cfg.kind = ScorerKind::kSnapKV;
  cfg.output_aware = true;
  TokenScorer sc(cfg, 4, 2);
  depthkv::HostLayer<float> L(2, 8);
  const std::vector<float> W = oanorm_matrix(16, 4 * 8, rng);
  const OutputProjection wo{W.data(), 16, 4, 8};
  oanorm_append(L, 20, rng);
  oanorm_observe(sc, L, 4, 0, 1, rng);  // 20 slots observed
  oanorm_append(L, 20, rng);
  (void)sc.cached_scores(L, &wo);  // 40 slots cached per head
  const TokenScorer before = sc;
  std::vector<std::int32_t> first30(30);
  for (int j = 0; j < 30; ++j) first30[static_cast<std::size_t>(j)] = j;
  L.compact(1, first30.data(), 30);  // evicted behind the scorer's back (the observed 20 survive)
  CHECK_THROWS_WITH(sc.cached_scores(L, &wo), Catch::Contains("KV head 1: layer holds 30 tokens but the output-norm cache 40") &&
                                                  Catch::Contains("compact"));
  CHECK(sc.cached_norms(0) == 40);
  CHECK(sc.cached_norms(1) == 40);
  CHECK(sc.observed_size(1) == 20);
  // the same state as before the call: both give the same scores once told of the eviction
  TokenScorer told = before;
  sc.compact(1, first30.data(), 30);
  told.compact(1, first30.data(), 30);
  CHECK(sc.cached_norms(1) == 30);
  const LayerScores got = sc.cached_scores(L, &wo);
  CHECK(got == told.cached_scores(L, &wo));
  CHECK(got == sc.scores(L, &wo));
  // reset empties the cache
  sc.reset();
  CHECK(sc.cached_norms(0) == 0);
  CHECK(sc.cached_norms(1) == 0);
}
