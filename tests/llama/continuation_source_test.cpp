// Tests of EvalConfig::continuation_source (the model's own greedy continuation), the oracle
// scores (EvalConfig::oracle) and the lookahead's slots in WindowResult::bytes_peak.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "depthkv/llama/eval.hpp"
#include "support/random_model.hpp"

using namespace depthkv;
using namespace depthkv::llama;

namespace {

LlamaModel contsrc_model(unsigned seed) { return depthkv_test::random_model(depthkv_test::eval_spec(seed, 3)); }

int contsrc_argmax(const RowMatrix& logits, Eigen::Index row) {
  Eigen::Index t = 0;
  logits.row(row).maxCoeff(&t);
  return static_cast<int>(t);
}

// The hand-written protocol: prefill, `n` greedy decode steps one token at a time, then the
// tokens teacher-forced on a fresh full cache of the context.
struct ContsrcHand {
  std::vector<int> tokens;
  RowMatrix logits;
};
ContsrcHand contsrc_hand(const LlamaEngine& engine, const std::vector<int>& context, int n, int chunk) {
  ForwardOptions opt;
  opt.chunk_size = chunk;
  opt.all_logits = false;
  HostCache gen = engine.make_cache();
  const RowMatrix last = engine.prefill(context, 0, gen, opt);
  ContsrcHand h;
  int token = contsrc_argmax(last, last.rows() - 1);
  for (int i = 0; i < n; ++i) {
    h.tokens.push_back(token);
    const RowMatrix l = engine.forward(&token, 1, static_cast<std::int32_t>(context.size()) + i, gen, ForwardOptions());
    token = contsrc_argmax(l, 0);
  }
  HostCache full = engine.make_cache();
  engine.prefill(context, 0, full, opt);
  ForwardOptions fo;
  fo.chunk_size = chunk;
  h.logits = engine.teacher_force(h.tokens, static_cast<std::int32_t>(context.size()), full, fo);
  return h;
}

bool contsrc_same(const RowMatrix& a, const RowMatrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

}  // namespace

TEST_CASE("continuation source model: the greedy continuation, teacher-forced, bit for bit", "[eval][continuation]") {
  const LlamaModel model = contsrc_model(11);
  const LlamaEngine engine(model);
  const auto windows = depthkv_test::random_windows(3, 30, 10, model.config.vocab_size, 4);
  EvalConfig cfg;
  cfg.spec.protection = {};
  cfg.spec.schedule.chunk = 16;
  cfg.continuation_source = ContinuationSource::kModel;
  const PruningEvaluator ev(engine, windows, cfg);
  EvalConfig text_cfg = cfg;
  text_cfg.continuation_source = ContinuationSource::kText;
  const PruningEvaluator text(engine, windows, text_cfg);
  for (int w = 0; w < ev.n_windows(); ++w) {
    CAPTURE(w);
    const ContsrcHand h = contsrc_hand(engine, windows[static_cast<std::size_t>(w)].context, 10, 16);
    REQUIRE(ev.windows()[static_cast<std::size_t>(w)].continuation == h.tokens);
    REQUIRE(contsrc_same(ev.full_logits(w), h.logits));
    // the continuation is the full run's argmax sequence
    for (Eigen::Index i = 0; i + 1 < ev.full_logits(w).rows(); ++i)
      REQUIRE(contsrc_argmax(ev.full_logits(w), i) == h.tokens[static_cast<std::size_t>(i) + 1]);
    // text: the window's own tokens, as before
    REQUIRE(text.windows()[static_cast<std::size_t>(w)].continuation == windows[static_cast<std::size_t>(w)].continuation);
    REQUIRE(text.windows()[static_cast<std::size_t>(w)].continuation != h.tokens);
    REQUIRE(!contsrc_same(text.full_logits(w), h.logits));
  }
  // the full cache reproduces the reference; reuse equals recomputation on the model's continuation
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator naive(engine, windows, naive_cfg);
  for (const WindowResult& r : ev.evaluate_plan({1.0, 1.0, 1.0})) REQUIRE(r.metrics.loss.kl == 0.0);
  const auto a = ev.evaluate_plan({0.3, 0.2, 0.4}), b = naive.evaluate_plan({0.3, 0.2, 0.4});
  for (std::size_t w = 0; w < a.size(); ++w) REQUIRE(std::abs(a[w].metrics.loss.kl - b[w].metrics.loss.kl) < 1e-5);
  REQUIRE(parse_continuation_source("model") == ContinuationSource::kModel);
  REQUIRE(std::string(to_string(ContinuationSource::kText)) == "text");
  REQUIRE_THROWS_WITH(parse_continuation_source("greedy"), Catch::Contains("unknown continuation source 'greedy'"));
}

TEST_CASE("oracle scores: the continuation's own attention (a lookahead of the whole model continuation)",
          "[eval][oracle]") {
  const LlamaModel model = contsrc_model(12);
  const LlamaEngine engine(model);
  const int tc = 12;
  const auto windows = depthkv_test::random_windows(4, 40, tc, model.config.vocab_size, 5);
  ScorerConfig plain, look;
  look.lookahead = tc;
  EvalConfig cfg;
  cfg.scorers = {plain, look, plain};
  cfg.oracle = {false, false, true};
  cfg.spec.protection = Protection{1, 2};
  cfg.continuation_source = ContinuationSource::kModel;
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator ev(engine, windows, cfg), naive(engine, windows, naive_cfg);
  const std::vector<double> plan{0.2, 0.3, 0.2};
  const auto ctx = ev.evaluate_plan(plan, 0), la = ev.evaluate_plan(plan, 1), orc = ev.evaluate_plan(plan, 2);
  const auto orc_naive = naive.evaluate_plan(plan, 2);
  double d_ctx = 0;
  for (std::size_t w = 0; w < windows.size(); ++w) {
    CAPTURE(w);
    // on the model's continuation, the greedy lookahead of Tc tokens reads exactly the rows the oracle reads
    REQUIRE(std::abs(orc[w].metrics.loss.kl - la[w].metrics.loss.kl) < 1e-5 * (1 + la[w].metrics.loss.kl));
    REQUIRE(std::abs(orc[w].metrics.loss.kl - orc_naive[w].metrics.loss.kl) < 1e-5);
    d_ctx += std::abs(orc[w].metrics.loss.kl - ctx[w].metrics.loss.kl);
    // the oracle decodes nothing before the eviction: its peak is the full context
    REQUIRE(orc[w].bytes_peak == orc[w].bytes_full);
  }
  REQUIRE(d_ctx > 1e-4);  // and it is not the context's own scores
  // not for schedules or chunked plans; one flag per scorer
  PruneSpec sched;
  sched.protection = cfg.spec.protection;
  sched.schedule = {ScheduleMode::kChunked, cfg.spec.schedule.chunk, 1};
  REQUIRE_THROWS_WITH(ev.evaluate(sched, {}, 2), Catch::Contains("oracle"));
  EvalConfig bad = cfg;
  bad.oracle = {true};
  REQUIRE_THROWS_WITH(PruningEvaluator(engine, windows, bad), Catch::Contains("oracle flags for 1 of 3 scorers"));
  bad = cfg;
  bad.chunked_plans = true;
  bad.scorers = {plain, plain};
  bad.oracle = {false, true};
  REQUIRE_THROWS_WITH(PruningEvaluator(engine, windows, bad), Catch::Contains("oracle scores need the continuation"));
}

TEST_CASE("bytes_peak counts the lookahead's G slots in every head of every layer", "[eval][lookahead]") {
  const LlamaModel model = contsrc_model(13);
  const LlamaEngine engine(model);
  const LlamaConfig& c = model.config;
  const auto windows = depthkv_test::random_windows(2, 48, 6, c.vocab_size, 6);
  ScorerConfig plain, look;
  look.lookahead = 8;
  EvalConfig cfg;
  cfg.scorers = {plain, look};
  cfg.spec.protection = Protection{1, 2};
  const std::size_t slot_bytes =
      static_cast<std::size_t>(c.n_layers) * static_cast<std::size_t>(c.n_kv_heads * c.head_dim) * 2 * sizeof(float);
  for (bool reuse : {true, false}) {
    CAPTURE(reuse);
    EvalConfig rc = cfg;
    rc.reuse = reuse;
    const PruningEvaluator ev(engine, windows, rc);
    const std::vector<double> plan{0.25, 0.25, 0.25};
    const auto p = ev.evaluate_plan(plan, 0), l = ev.evaluate_plan(plan, 1);
    for (std::size_t w = 0; w < p.size(); ++w) {
      REQUIRE(p[w].bytes_full == 48 * slot_bytes);
      REQUIRE(p[w].bytes_peak == p[w].bytes_full);            // the full context, before the eviction
      REQUIRE(l[w].bytes_peak == p[w].bytes_full + 8 * slot_bytes);  // and the lookahead's 8 slots
      REQUIRE(l[w].bytes_kept == p[w].bytes_kept);
    }
  }
}

TEST_CASE("context_nll: the mean NLL of the context's last tokens, from an all-logits prefill", "[eval][trust]") {
  const LlamaModel model = contsrc_model(14);
  const LlamaEngine engine(model);
  const auto windows = depthkv_test::random_windows(2, 40, 6, model.config.vocab_size, 8);
  for (int tokens : {0, 8, 100}) {
    CAPTURE(tokens);
    EvalConfig cfg;
    cfg.spec.schedule.chunk = 16;
    cfg.context_nll_tokens = tokens;
    const PruningEvaluator ev(engine, windows, cfg);
    for (int w = 0; w < ev.n_windows(); ++w) {
      const std::vector<int>& ctx = windows[static_cast<std::size_t>(w)].context;
      HostCache cache = engine.make_cache();
      ForwardOptions opt;
      opt.all_logits = true;
      const RowMatrix all = engine.prefill(ctx, 0, cache, opt);
      const int n = std::min(tokens, static_cast<int>(ctx.size()) - 1);
      double nll = 0;
      for (int i = static_cast<int>(ctx.size()) - n; i < static_cast<int>(ctx.size()); ++i) {
        const Eigen::RowVectorXd row = all.row(i - 1).cast<double>();
        const double lse = row.maxCoeff() + std::log((row.array() - row.maxCoeff()).exp().sum());
        nll += lse - row(ctx[static_cast<std::size_t>(i)]);
      }
      if (n > 0) nll /= n;
      REQUIRE(ev.context_nll(w) == Approx(nll).epsilon(1e-4));
      if (tokens > 0) REQUIRE(ev.context_nll(w) > 0.5);  // random tokens: far from predictable
    }
  }
}
