// The tiled online-softmax attention (llama/detail/flash_attention.hpp) against a naive softmax
// attention in double precision: max abs difference < 1e-5 on the outputs over random shapes, GQA
// ratios, per-head cache sizes and lengths that are not multiples of the tiles; the same bytes on
// every thread count; F16 storage read as its float values. And the engine around it: the
// observer does not change the logits, `observe_from` hands over exactly the tail rows.

#include "depthkv/llama/detail/flash_attention.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "depthkv/llama/engine.hpp"
#include "support/random_model.hpp"
#include "support/simd_guard.hpp"

namespace {

using depthkv::llama::RowMatrix;
using depthkv::llama::detail::FlashHead;
using depthkv::llama::detail::FlashShape;

// Random queries and per-KV-head key/value rows (stride head_dim + 3, to test the stride).
struct FlashCase {
  FlashShape shape;
  RowMatrix q;                        // [T x n_heads*hd]
  std::vector<std::vector<float>> kv;  // per KV head: keys then values, rows of `ld`
  std::vector<int> n, n_old;
  std::ptrdiff_t ld = 0;

  FlashCase(int T, int n_heads, int n_kv, int hd, int n_old0, unsigned seed) : shape{T, n_heads, n_kv, hd} {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(T, n_heads * hd);
    for (Eigen::Index i = 0; i < q.size(); ++i) q.data()[i] = 2.0f * nd(rng);  // peaked attention
    ld = hd + 3;
    for (int h = 0; h < n_kv; ++h) {
      const int old = std::max(0, n_old0 - 5 * h);  // heads of different sizes (pruned caches)
      n_old.push_back(old);
      n.push_back(old + T);
      std::vector<float> rows(static_cast<std::size_t>(2 * (old + T)) * static_cast<std::size_t>(ld));
      for (float& x : rows) x = nd(rng);
      kv.push_back(std::move(rows));
    }
  }
  template <class S>
  std::vector<FlashHead<S>> heads(const std::vector<std::vector<S>>& data) const {
    std::vector<FlashHead<S>> hs;
    for (std::size_t h = 0; h < data.size(); ++h) {
      FlashHead<S> r;
      r.k = data[h].data();
      r.v = data[h].data() + static_cast<std::ptrdiff_t>(n[h]) * ld;
      r.ld = ld;
      r.n = n[h];
      r.n_old = n_old[h];
      hs.push_back(r);
    }
    return hs;
  }
  RowMatrix run(int threads, depthkv::ThreadPool* pool = nullptr) const {
    RowMatrix out(shape.T, q.cols());
    const auto hs = heads(kv);
    depthkv::llama::detail::flash_attention(hs.data(), shape, q.data(), q.cols(), out.data(), out.cols(), threads,
                                            depthkv::cpu_simd_level(), pool);
    return out;
  }
  // softmax(q k^T / sqrt(hd)) v in double, row by row
  RowMatrix naive() const {
    const int G = shape.n_heads / shape.n_kv_heads, hd = shape.head_dim;
    RowMatrix out(shape.T, q.cols());
    for (int qh = 0; qh < shape.n_heads; ++qh) {
      const std::size_t h = static_cast<std::size_t>(qh / G);
      const float* K = kv[h].data();
      const float* V = K + static_cast<std::ptrdiff_t>(n[h]) * ld;
      for (int i = 0; i < shape.T; ++i) {
        const int vis = std::min(n[h], n_old[h] + i + 1);
        std::vector<double> s(static_cast<std::size_t>(vis));
        double mx = -1e300, sum = 0;
        for (int j = 0; j < vis; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += double(q(i, qh * hd + e)) * K[j * ld + e];
          s[static_cast<std::size_t>(j)] = d / std::sqrt(double(hd));
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int e = 0; e < hd; ++e) {
          double o = 0;
          for (int j = 0; j < vis; ++j) o += s[static_cast<std::size_t>(j)] * V[j * ld + e];
          out(i, qh * hd + e) = static_cast<float>(o / sum);
        }
      }
    }
    return out;
  }
};

TEST_CASE("flash attention equals the naive softmax attention within 1e-5", "[flash]") {
  struct Shape {
    int T, heads, kv, hd, n_old;
  };
  // GQA ratios 1, 4, 7, 8; lengths off the 128-slot key tile and the query blocks; long caches
  // with one or a few query rows (key parts merged), prefill blocks against a cache
  const Shape shapes[] = {{1, 4, 4, 16, 0},    {1, 14, 2, 64, 3000}, {3, 8, 1, 32, 1700}, {7, 8, 2, 16, 300},
                          {130, 4, 1, 16, 0},  {70, 14, 2, 64, 129}, {33, 6, 3, 8, 1},    {1, 32, 4, 64, 2500},
                          {200, 2, 2, 32, 257}};
  unsigned seed = 1;
  for (const Shape& sh : shapes) {
    CAPTURE(sh.T, sh.heads, sh.kv, sh.hd, sh.n_old);
    const FlashCase c(sh.T, sh.heads, sh.kv, sh.hd, sh.n_old, seed++);
    const double d = (c.run(1) - c.naive()).cwiseAbs().maxCoeff();
    INFO("max abs difference " << d);
    CHECK(d < 1e-5);
  }
}

TEST_CASE("flash attention gives the same bytes on every thread count, OpenMP or a ThreadPool", "[flash]") {
  depthkv::ThreadPool pool;
  for (const auto& sh : {std::vector<int>{1, 14, 2, 64, 3000}, std::vector<int>{150, 8, 2, 32, 400}}) {
    const FlashCase c(sh[0], sh[1], sh[2], sh[3], sh[4], 9);
    const RowMatrix one = c.run(1);
    for (int threads : {2, 3, 8}) {
      CAPTURE(threads);
      CHECK((c.run(threads).array() == one.array()).all());
      CHECK((c.run(threads, &pool).array() == one.array()).all());
    }
  }
}

// `c`'s rows stored as S (rounded), and `c` rewritten to hold the rounded values as floats.
template <class S>
std::vector<std::vector<S>> rounded_rows(FlashCase& c) {
  std::vector<std::vector<S>> out;
  for (auto& rows : c.kv) {
    std::vector<S> srows(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      srows[i] = S(rows[i]);
      rows[i] = static_cast<float>(srows[i]);  // the float case now holds the rounded values
    }
    out.push_back(std::move(srows));
  }
  return out;
}

TEST_CASE("flash attention: decode-sized tasks (DecodeTile) equal the naive attention at every SIMD level",
          "[flash]") {
  // 1-2 query rows of groups of 1-4 heads (<= 8 query vectors), head sizes 64 and 256, caches
  // longer than a tile and split into parts; F16 rows (DecodeTile from level 2) and float rows
  // (Eigen's products at every level)
  for (const auto& [T, n_heads, n_kv, hd, n_old] : std::vector<std::array<int, 5>>{
           {1, 9, 3, 64, 700}, {1, 4, 1, 256, 1500}, {2, 8, 2, 64, 130}, {1, 2, 2, 64, 3}}) {
    FlashCase c(T, n_heads, n_kv, hd, n_old, 11);
    const auto half = rounded_rows<Eigen::half>(c);
    const RowMatrix want = c.naive();
    const auto hf = c.heads(c.kv);
    const auto hh = c.heads(half);
    for (int simd = 0; simd <= depthkv::cpu_simd_level(); ++simd) {
      RowMatrix out_f(T, c.q.cols()), out_h(T, c.q.cols());
      depthkv::llama::detail::flash_attention(hf.data(), c.shape, c.q.data(), c.q.cols(), out_f.data(), out_f.cols(),
                                              1, simd);
      depthkv::llama::detail::flash_attention(hh.data(), c.shape, c.q.data(), c.q.cols(), out_h.data(), out_h.cols(),
                                              2, simd);
      INFO("T " << T << " heads " << n_heads << "/" << n_kv << " head_dim " << hd << " SIMD level " << simd);
      CHECK((out_f - want).cwiseAbs().maxCoeff() < 1e-5);
      CHECK((out_h - want).cwiseAbs().maxCoeff() < 1e-5);  // F16 rows: their float values
      if (simd < 2) CHECK((out_h.array() == out_f.array()).all());  // the same products: bit for bit
    }
  }
}

#if defined(DEPTHKV_AVX2_DISPATCH)
TEST_CASE("TileSoftmax (the F16 tiles' softmax): e^x within 2e-7 of std::exp, every tail length", "[flash]") {
  using depthkv::llama::detail::TileSoftmax;
  depthkv_test::require_simd_level(2, "AVX2 and FMA");
  // e^x over [-87, 88] against double precision (below -87.34 the result is FLT_MIN, not 0)
  std::vector<float> x;
  for (double v = -87.0; v < 88.0; v += 0.0031) x.push_back(static_cast<float>(v));
  std::vector<float> y = x;
  TileSoftmax::exp_sum(y.data(), static_cast<int>(y.size()), 0.0f);  // e^(x - 0)
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - want) / want);
  }
  INFO("largest relative error " << worst);
  CHECK(worst < 2e-7);
  // scale_max and exp_sum over rows of 1..40 slots: the maximum, the weights and their sum
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int w = 1; w <= 40; ++w) {
    std::vector<float> row(static_cast<std::size_t>(w) + 3, 7.0f), raw(static_cast<std::size_t>(w));
    for (float& v : raw) v = nd(rng);
    std::copy(raw.begin(), raw.end(), row.begin());
    const float m = TileSoftmax::scale_max(row.data(), w, 0.125f);
    float want_m = -1e30f;
    for (float v : raw) want_m = std::max(want_m, v * 0.125f);
    CHECK(m == want_m);
    const float sum = TileSoftmax::exp_sum(row.data(), w, m);
    double want_sum = 0.0;
    for (int j = 0; j < w; ++j) {
      const double e = std::exp(static_cast<double>(raw[static_cast<std::size_t>(j)] * 0.125f) - m);
      want_sum += e;
      CHECK(row[static_cast<std::size_t>(j)] == Approx(e).epsilon(1e-6));
    }
    CHECK(sum == Approx(want_sum).epsilon(1e-6));
    for (int j = w; j < w + 3; ++j) CHECK(row[static_cast<std::size_t>(j)] == 7.0f);  // nothing past the row
  }
}
#endif

TEMPLATE_TEST_CASE("flash attention over F16 and BF16 rows equals it over their float values at every SIMD level",
                   "[flash]", Eigen::half, Eigen::bfloat16) {
  // Eigen's products on the converted tiles: the float run's bytes; F16 from level 2 with a head
  // size that is a multiple of 16 runs BlockTile (prefill-sized tasks): the naive attention's
  // values within 1e-5
  // 36: a row tail after the 8-wide conversion, and no BlockTile; 5 old slots: every key tile
  // partial; 13 rows of groups of 3: 39 query vectors, a block of 4 and a remainder of 3; 1,540
  // slots: the keys split into parts
  for (const auto& [T, n_heads, n_kv, hd, n_old] : std::vector<std::array<int, 5>>{
           {40, 8, 2, 32, 700}, {40, 8, 2, 36, 700}, {40, 8, 2, 64, 700}, {40, 8, 2, 64, 5}, {13, 9, 3, 64, 300},
           {40, 8, 2, 64, 1500}}) {
    {
      FlashCase c(T, n_heads, n_kv, hd, n_old, 5);
      const auto stored = rounded_rows<TestType>(c);
      const auto hs = c.heads(stored);
      const RowMatrix want = c.run(1), naive = c.naive();
      for (int simd = 0; simd <= depthkv::cpu_simd_level(); ++simd) {
        RowMatrix out(c.shape.T, c.q.cols());
        depthkv::llama::detail::flash_attention(hs.data(), c.shape, c.q.data(), c.q.cols(), out.data(), out.cols(), 2,
                                                simd);
        INFO("T " << T << " heads " << n_heads << "/" << n_kv << " head_dim " << hd << " cache " << n_old
                   << " SIMD level " << simd);
        if (std::is_same<TestType, Eigen::half>::value && simd >= 2 && hd % 16 == 0)
          CHECK((out - naive).cwiseAbs().maxCoeff() < 1e-5);
        else
          CHECK((out.array() == want.array()).all());
      }
    }
  }
}

struct ObservedRows {
  std::vector<std::int32_t> pos0;
  std::vector<int> rows;
  std::vector<std::vector<float>> probs;  // per call, [rows x n]
};

RowMatrix observed_prefill(const depthkv::llama::LlamaEngine& engine, const std::vector<int>& tokens,
                           std::int32_t observe_from, ObservedRows* seen) {
  auto cache = engine.make_cache();
  depthkv::llama::ForwardOptions opt;
  opt.chunk_size = 40;
  opt.observe_from = observe_from;
  if (seen)
    opt.observer = [seen](int, int, std::int32_t p0, int nq, const float* p, int ld, int n) {
      seen->pos0.push_back(p0);
      seen->rows.push_back(nq);
      std::vector<float> rows;
      for (int i = 0; i < nq; ++i) rows.insert(rows.end(), p + static_cast<std::ptrdiff_t>(i) * ld, p + i * ld + n);
      seen->probs.push_back(std::move(rows));
    };
  return engine.prefill(tokens, 0, cache, opt);
}

TEST_CASE("engine: an observer leaves the logits bit-identical and observe_from hands over the tail rows",
          "[flash][engine]") {
  depthkv_test::RandomSpec spec;
  spec.seq_len = 512;
  const depthkv::llama::LlamaModel model = depthkv_test::random_model(spec);
  const depthkv::llama::LlamaEngine engine(model);
  std::vector<int> tokens(100);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 17 + 3) % 50);
  ObservedRows all, tail;
  const RowMatrix plain = observed_prefill(engine, tokens, 0, nullptr);
  CHECK((observed_prefill(engine, tokens, 0, &all).array() == plain.array()).all());
  CHECK((observed_prefill(engine, tokens, 90, &tail).array() == plain.array()).all());
  // chunks of 40: [0, 40) is not observed, [40, 80) neither, [80, 100) from row 10
  REQUIRE(tail.pos0.size() == all.pos0.size() / 3);
  const std::size_t per_chunk = tail.pos0.size();
  for (std::size_t k = 0; k < per_chunk; ++k) {
    CHECK(tail.pos0[k] == 90);
    CHECK(tail.rows[k] == 10);
    const std::vector<float>& full = all.probs[2 * per_chunk + k];  // the third chunk's call for the same head
    const std::vector<float>& got = tail.probs[k];
    REQUIRE(full.size() == got.size() * 2);                         // 20 rows against 10
    double d = 0;  // the same values up to the products' rounding (other tile rows)
    for (std::size_t j = 0; j < got.size(); ++j) d = std::max(d, double(std::fabs(got[j] - full[full.size() / 2 + j])));
    CHECK(d < 1e-6);
  }
}

}  // namespace
