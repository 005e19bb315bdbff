// Tests of the lookahead observation (ScorerConfig::lookahead, llama::observe_lookahead): the
// scores against a reference built from the engine's attention rows of an explicit greedy
// decode, the restored cache, the evaluator's two paths, and the errors.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/eval.hpp"
#include "support/random_model.hpp"

using namespace depthkv;
using namespace depthkv::llama;

namespace {

LlamaModel model_of(unsigned seed) { return depthkv_test::random_model(depthkv_test::eval_spec(seed, 3)); }

std::vector<int> tokens_of(int n, int vocab, unsigned seed) {
  return depthkv_test::random_windows(1, n, 1, vocab, seed).front().context;
}

// Every head's slots, positions, keys and values of a cache.
struct Snapshot {
  std::vector<std::vector<std::int32_t>> positions;
  std::vector<std::vector<float>> keys, values;
};
Snapshot snapshot(const HostCache& c) {
  Snapshot s;
  for (int l = 0; l < c.n_layers(); ++l)
    for (int h = 0; h < c.layer(l).n_kv_heads(); ++h) {
      const auto& layer = c.layer(l);
      std::vector<std::int32_t> p;
      std::vector<float> k, v;
      for (int j = 0; j < layer.size(h); ++j) {
        p.push_back(layer.positions(h)[j]);
        k.insert(k.end(), layer.key(h, j), layer.key(h, j) + layer.head_dim());
        v.insert(v.end(), layer.value(h, j), layer.value(h, j) + layer.head_dim());
      }
      s.positions.push_back(p);
      s.keys.push_back(k);
      s.values.push_back(v);
    }
  return s;
}
bool operator==(const Snapshot& a, const Snapshot& b) {
  return a.positions == b.positions && a.keys == b.keys && a.values == b.values;
}

// The reference: greedy-decode G tokens on a copy of `cache` (the first `first`), summing the
// attention rows of steps [g0, G) over the context's n slots, per layer and KV head (over the
// group's query heads); `last_only`: the last step's row only.
std::vector<std::vector<std::vector<double>>> reference(const LlamaEngine& engine, HostCache cache, int first, int G,
                                                        bool last_only) {
  const LlamaConfig& c = engine.config();
  const int n = cache.layer(0).size(0), group = c.n_heads / c.n_kv_heads;
  std::vector<std::vector<std::vector<double>>> acc(
      static_cast<std::size_t>(c.n_layers),
      std::vector<std::vector<double>>(static_cast<std::size_t>(c.n_kv_heads), std::vector<double>(static_cast<std::size_t>(n))));
  int step = 0, token = first;
  ForwardOptions opt;
  opt.observer = [&](int l, int q, std::int32_t, int nq, const float* probs, int ld, int m) {
    if (last_only && step != G - 1) return;
    REQUIRE(nq == 1);
    REQUIRE(m == n + step + 1);
    for (int j = 0; j < n; ++j)
      acc[static_cast<std::size_t>(l)][static_cast<std::size_t>(q / group)][static_cast<std::size_t>(j)] += probs[j];
    (void)ld;
  };
  for (step = 0; step < G; ++step) {
    const RowMatrix logits = engine.forward(&token, 1, n + step, cache, opt);
    Eigen::Index t = 0;
    logits.row(0).maxCoeff(&t);
    token = static_cast<int>(t);
  }
  return acc;
}

}  // namespace

TEST_CASE("observe_lookahead: scores are the greedy continuation's attention, the cache is restored", "[lookahead]") {
  const LlamaModel model = model_of(3);
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  const std::vector<int> context = tokens_of(30, c.vocab_size, 11);
  HostCache cache = engine.make_cache();
  ForwardOptions po;
  po.all_logits = false;
  po.chunk_size = 7;
  const RowMatrix last = engine.prefill(context, 0, cache, po);
  const int first = last_argmax(last);
  const Snapshot before = snapshot(cache);
  const int G = 6;
  const auto sums = reference(engine, cache, first, G, false);
  const auto last_row = reference(engine, cache, first, G, true);

  // h2o, snapkv (kernel 1; its `window` 2 is not used: the window is the lookahead) and tova,
  // observed together in one lookahead (tova with a shorter one: the first 3 steps)
  ScorerConfig h2o, snap, tova;
  h2o.lookahead = G;
  snap.kind = ScorerKind::kSnapKV;
  snap.window = 2;
  snap.kernel = 1;
  snap.lookahead = G;
  tova.kind = ScorerKind::kTOVA;
  tova.lookahead = 3;
  std::vector<TokenScorer> a = make_scorers(c, h2o), b = make_scorers(c, snap), t = make_scorers(c, tova);
  observe_lookahead(engine, cache, first, static_cast<std::int32_t>(context.size()), {&a, &b, &t});
  REQUIRE(snapshot(cache) == before);
  const auto tova_ref = reference(engine, cache, first, 3, true);
  for (const auto* set : {&a, &b, &t}) {
    const std::vector<LayerScores> s = layer_scores(*set, cache);
    const auto& ref = set == &a || set == &b ? sums : tova_ref;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        CAPTURE(l, h);
        const auto& row = s[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
        REQUIRE(row.size() == context.size());
        for (std::size_t j = 0; j < row.size(); ++j)
          REQUIRE(row[j] == Approx(ref[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)][j]).margin(1e-5));
      }
  }
  // the rows differ from the context's own attention (the lookahead is not a no-op), and the
  // last-step reference differs from the sums
  std::vector<TokenScorer> plain = make_scorers(c, ScorerConfig{});
  HostCache again = engine.make_cache();
  ForwardOptions ob = po;
  ob.observer = observe_into(plain);
  engine.prefill(context, 0, again, ob);
  const std::vector<LayerScores> ps = layer_scores(plain, again), ls = layer_scores(a, cache);
  double diff = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (std::size_t j = 0; j < context.size(); ++j)
        diff += std::abs(ps[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)][j] -
                         ls[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)][j]);
  REQUIRE(diff > 1.0);
  REQUIRE(last_row[0][0] != sums[0][0]);
}

TEST_CASE("observe_lookahead: errors leave the cache as it was", "[lookahead]") {
  const LlamaModel model = model_of(4);
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  const std::vector<int> context = tokens_of(12, c.vocab_size, 5);
  HostCache cache = engine.make_cache();
  engine.prefill(context, 0, cache);
  const Snapshot before = snapshot(cache);
  ScorerConfig la;
  la.lookahead = 4;
  std::vector<TokenScorer> ok = make_scorers(c, la), none = make_scorers(c, ScorerConfig{});
  // a set without lookahead
  REQUIRE_THROWS_WITH(observe_lookahead(engine, cache, 0, 12, {&ok, &none}), Catch::Contains("without lookahead"));
  // a scorer count other than the layers
  std::vector<TokenScorer> short_set(ok.begin(), ok.begin() + 1);
  REQUIRE_THROWS_WITH(observe_lookahead(engine, cache, 0, 12, {&short_set}), Catch::Contains("scorers for"));
  // the engine refuses the first token (outside the vocabulary): the cache is restored, the
  // scorers reset
  REQUIRE_THROWS_AS(observe_lookahead(engine, cache, c.vocab_size + 3, 12, {&ok}), Error);
  REQUIRE(snapshot(cache) == before);
  for (int h = 0; h < c.n_kv_heads; ++h) REQUIRE(ok[0].observed_size(h) == 0);
  // the configurations that cannot have a lookahead
  ScorerConfig neg;
  neg.lookahead = -1;
  REQUIRE_THROWS_WITH(TokenScorer(neg, 4, 2), Catch::Contains("lookahead must be >= 0"));
  ScorerConfig kn;
  kn.kind = ScorerKind::kKeyNorm;
  kn.lookahead = 2;
  REQUIRE_THROWS_WITH(TokenScorer(kn, 4, 2), Catch::Contains("not knorm"));
  depthkv::detail::ScheduleConfig sc;
  sc.budget.total_tokens = 40;
  sc.scorer = la;
  REQUIRE_THROWS_WITH(EvictionSchedule(sc, c.n_layers, c.n_heads, c.n_kv_heads), Catch::Contains("lookahead"));
  EvalConfig ec;
  ec.scorers = {la};
  ec.chunked_plans = true;
  const auto windows = depthkv_test::random_windows(1, 12, 4, c.vocab_size, 2);
  REQUIRE_THROWS_WITH(PruningEvaluator(engine, windows, ec), Catch::Contains("lookahead"));
}

TEST_CASE("PruningEvaluator with lookahead scorers: activation reuse equals recomputation, and it changes the result",
          "[lookahead][eval]") {
  const LlamaModel model = model_of(5);
  const LlamaEngine engine(model);
  const auto windows = depthkv_test::random_windows(3, 40, 12, model.config.vocab_size, 9);
  EvalConfig cfg;
  cfg.scorers.clear();
  for (int la : {0, 8}) {
    ScorerConfig h2o;
    h2o.lookahead = la;
    ScorerConfig snap;
    snap.kind = ScorerKind::kSnapKV;
    snap.window = 4;
    snap.kernel = 3;
    snap.output_aware = true;
    snap.lookahead = la;
    cfg.scorers.push_back(h2o);
    cfg.scorers.push_back(snap);
  }
  cfg.spec.protection = Protection{1, 2};
  cfg.spec.schedule.chunk = 16;
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator reuse(engine, windows, cfg), naive(engine, windows, naive_cfg);
  const std::vector<double> plan{0.2, 0.3, 0.2};
  std::vector<std::vector<WindowResult>> res;
  for (int s = 0; s < reuse.n_scorers(); ++s) {
    CAPTURE(s);
    const auto a = reuse.evaluate_plan(plan, s), b = naive.evaluate_plan(plan, s);
    REQUIRE(a.size() == b.size());
    for (std::size_t w = 0; w < a.size(); ++w) {
      REQUIRE(std::abs(a[w].metrics.loss.kl - b[w].metrics.loss.kl) < 1e-5);
      REQUIRE(a[w].bytes_kept == b[w].bytes_kept);
      // the lookahead's G tokens are not in the cache the continuation reads
      const LlamaConfig& c = model.config;
      REQUIRE(a[w].bytes_full == static_cast<std::size_t>(c.n_layers * c.n_kv_heads * 40 * c.head_dim) * 2 * sizeof(float));
    }
    res.push_back(a);
  }
  // scorers 2 and 3 (lookahead 8) keep other tokens than 0 and 1 (lookahead 0)
  double d = 0;
  for (std::size_t w = 0; w < windows.size(); ++w)
    d += std::abs(res[2][w].metrics.loss.kl - res[0][w].metrics.loss.kl) +
         std::abs(res[3][w].metrics.loss.kl - res[1][w].metrics.loss.kl);
  REQUIRE(d > 1e-4);
}

TEST_CASE("observe_lookahead and the evaluator refuse a lookahead beyond the model's context", "[lookahead]") {
  const LlamaModel model = model_of(6);  // seq_len 512
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  REQUIRE(c.seq_len == 512);
  const std::vector<int> context = tokens_of(12, c.vocab_size, 7);
  HostCache cache = engine.make_cache();
  engine.prefill(context, 0, cache);
  const Snapshot before = snapshot(cache);
  ScorerConfig la;
  la.lookahead = 501;  // 12 + 501 > 512: would decode positions the model has no context for
  std::vector<TokenScorer> s = make_scorers(c, la);
  REQUIRE_THROWS_WITH(observe_lookahead(engine, cache, 0, 12, {&s}),
                      Catch::Contains("lookahead: 501 greedy tokens after a context of 12 tokens do not fit the model's "
                                      "context of 512 tokens") &&
                          Catch::Contains("at most 500 here"));
  REQUIRE(snapshot(cache) == before);
  // 500 fit (the last at position 511)
  la.lookahead = 500;
  std::vector<TokenScorer> fits = make_scorers(c, la);
  observe_lookahead(engine, cache, 0, 12, {&fits});
  REQUIRE(snapshot(cache) == before);
  // the evaluator refuses it up front, before any full run
  EvalConfig ec;
  la.lookahead = 100000;
  ec.scorers = {la};
  const auto windows = depthkv_test::random_windows(1, 12, 4, c.vocab_size, 2);
  REQUIRE_THROWS_WITH(PruningEvaluator(engine, windows, ec),
                      Catch::Contains("100000 greedy tokens after a context of 12 tokens do not fit"));
}

TEST_CASE("observe_lookahead with a context weight: the lookahead's scores plus the context window's, in the "
          "evaluator's two paths alike",
          "[lookahead][eval]") {
  const LlamaModel model = model_of(6);
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  const std::vector<int> context = tokens_of(30, c.vocab_size, 13);
  const double w = 0.5;
  ScorerConfig la;  // h2o over the lookahead's rows
  la.lookahead = 5;
  la.window = 4;
  la.kernel = 3;
  ScorerConfig mixed = la, window;
  mixed.context_weight = w;
  window.kind = ScorerKind::kSnapKV;  // the context's own window, pooled as the mixed scorer pools it
  window.window = 4;
  window.kernel = 3;
  std::vector<TokenScorer> a = make_scorers(c, la), m = make_scorers(c, mixed), ctx = make_scorers(c, window);
  HostCache cache = engine.make_cache();
  ForwardOptions po;
  po.all_logits = false;
  po.observer = [&](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
    m[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
    ctx[static_cast<std::size_t>(l)].observe_block(q, p0, nq, pr, ld, n);
  };
  const RowMatrix last = engine.prefill(context, 0, cache, po);
  observe_lookahead(engine, cache, last_argmax(last), static_cast<std::int32_t>(context.size()), {&a, &m});
  const std::vector<LayerScores> sa = layer_scores(a, cache), sm = layer_scores(m, cache), sc = layer_scores(ctx, cache);
  double moved = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const auto& la_row = sa[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      const auto& c_row = sc[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      const auto& m_row = sm[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
      double L = 0, C = 0;
      for (std::size_t j = 0; j < la_row.size(); ++j) {
        L += la_row[j];
        C += c_row[j];
      }
      REQUIRE(C > 0);
      for (std::size_t j = 0; j < la_row.size(); ++j) {
        REQUIRE(m_row[j] == Approx(la_row[j] + w * (L / C) * c_row[j]).epsilon(1e-4).margin(1e-6));
        moved += std::abs(m_row[j] - la_row[j]);
      }
    }
  REQUIRE(moved > 0.1);
  // the evaluator: activation reuse equals recomputation, and the weight changes the result
  const auto windows = depthkv_test::random_windows(3, 40, 12, c.vocab_size, 19);
  EvalConfig cfg;
  cfg.scorers = {la, mixed};
  cfg.spec.protection = Protection{1, 2};
  cfg.spec.schedule.chunk = 16;
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator reuse(engine, windows, cfg), naive(engine, windows, naive_cfg);
  const std::vector<double> plan{0.2, 0.3, 0.2};
  double d = 0;
  const auto a0 = reuse.evaluate_plan(plan, 0);
  const auto r1 = reuse.evaluate_plan(plan, 1), n1 = naive.evaluate_plan(plan, 1);
  for (std::size_t i = 0; i < windows.size(); ++i) {
    REQUIRE(std::abs(r1[i].metrics.loss.kl - n1[i].metrics.loss.kl) < 1e-5);
    d += std::abs(r1[i].metrics.loss.kl - a0[i].metrics.loss.kl);
  }
  REQUIRE(d > 1e-5);
}
