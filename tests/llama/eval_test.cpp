// Tests of depthkv/llama/eval.hpp: the decode-loop helpers, the metrics, and PruningEvaluator's
// activation reuse against naive recomputation (random-weight models and the real stories260K).

#include "depthkv/llama/eval.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "support/random_model.hpp"
#include "support/test_data.hpp"

using namespace depthkv;
using namespace depthkv::llama;

namespace {

// The evaluator tests' model with a larger second FFN matrix and classifier.
LlamaModel random_model(unsigned seed, int layers = 4) {
  depthkv_test::RandomSpec s = depthkv_test::eval_spec(seed, layers);
  s.w2_gain = 1.0f;
  s.classifier_gain = 2.0f;
  return depthkv_test::random_model(s);
}

using depthkv_test::random_windows;

void require_same(const std::vector<WindowResult>& a, const std::vector<WindowResult>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (std::size_t w = 0; w < a.size(); ++w) {
    CAPTURE(w);
    REQUIRE(std::abs(a[w].metrics.loss.kl - b[w].metrics.loss.kl) < tol);
    REQUIRE(std::abs(a[w].metrics.loss.dnll - b[w].metrics.loss.dnll) < tol);
    REQUIRE(std::abs(a[w].metrics.loss.top1_disagree - b[w].metrics.loss.top1_disagree) < tol);
    REQUIRE(std::abs(a[w].metrics.nll_full - b[w].metrics.nll_full) < tol);
    REQUIRE(a[w].budgets == b[w].budgets);
    REQUIRE(a[w].bytes_kept == b[w].bytes_kept);
    REQUIRE(a[w].bytes_full == b[w].bytes_full);
  }
}

}  // namespace

TEST_CASE("compare_logits: zero for identical logits, KL by hand, targets", "[eval]") {
  RowMatrix a(2, 3), b(2, 3);
  a << 0.0f, 1.0f, 2.0f, 1.0f, 1.0f, 1.0f;
  const auto same = compare_logits(a, a, {1, -1});
  REQUIRE(same.loss.kl == 0.0);
  REQUIRE(same.loss.dnll == 0.0);
  REQUIRE(same.loss.top1_disagree == 0.0);
  REQUIRE(same.n_targets == 1);
  b << 2.0f, 1.0f, 0.0f, 1.0f, 1.0f, 1.0f;
  const auto m = compare_logits(a, b, {2, 0});
  // row 0: p = softmax(0,1,2), q = reversed; KL = sum p (log p - log q) = sum p * (a - b) (same lse)
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  const double kl0 = (1 / z) * (0 - 2) + (std::exp(1.0) / z) * 0 + (std::exp(2.0) / z) * 2;
  REQUIRE(std::abs(m.loss.kl - kl0 / 2) < 1e-12);
  REQUIRE(m.loss.top1_disagree == 0.5);
  REQUIRE(std::abs(m.nll_full - (std::log(z) - 2 + std::log(3.0)) / 2) < 1e-9);
  REQUIRE(std::abs(m.loss.dnll - (2.0 / 2)) < 1e-9);  // token 2 in row 0: -log q = lse - 0 vs lse - 2
  REQUIRE_THROWS_AS(compare_logits(a, b, {1}), Error);
  REQUIRE_THROWS_AS(compare_logits(a, b, {3, 0}), Error);
  REQUIRE(continuation_targets({5, 6, 7}) == std::vector<int>{6, 7, -1});
  // the full run's log-softmax given: the same result, the same checks
  const auto given = depthkv::compare_log_softmax(depthkv::log_softmax_rows(a), b, {2, 0});
  REQUIRE(given.loss.kl == m.loss.kl);
  REQUIRE(given.loss.dnll == m.loss.dnll);
  REQUIRE(given.loss.top1_disagree == m.loss.top1_disagree);
  REQUIRE_THROWS_AS(depthkv::compare_log_softmax(depthkv::log_softmax_rows(a), b, {3, 0}), Error);
  REQUIRE_THROWS_AS(depthkv::compare_log_softmax(depthkv::log_softmax_rows(a.topRows(1)), b, {2, 0}), Error);
}

TEST_CASE("keep_tokens: rounding, protection, full", "[eval]") {
  REQUIRE(keep_tokens(1.0, 100, {}) == 100);
  REQUIRE(keep_tokens(0.25, 100, {}) == 25);
  REQUIRE(keep_tokens(0.005, 100, {}) == 1);  // llround(0.5) = 1
  REQUIRE(keep_tokens(0.0, 100, {}) == 0);
  REQUIRE(keep_tokens(0.05, 100, Protection{4, 8}) == 12);
  REQUIRE(keep_tokens(0.5, 10, Protection{8, 8}) == 10);
  REQUIRE_THROWS_AS(keep_tokens(-0.1, 10, {}), Error);
}

TEST_CASE("score_and_evict: budgets from the allocator, cache and scorers compacted", "[eval]") {
  const LlamaModel model = random_model(3);
  const LlamaEngine engine(model);
  const auto win = random_windows(1, 50, 10, model.config.vocab_size, 1)[0];
  for (auto policy : {AllocationPolicy::kUniform, AllocationPolicy::kPyramid, AllocationPolicy::kMiddle}) {
    HostCache cache = engine.make_cache();
    auto scorers = make_scorers(model.config, ScorerConfig{});
    ForwardOptions opt;
    opt.observer = observe_into(scorers);
    engine.prefill(win.context, 0, cache, opt);
    depthkv::detail::PruneRequest req;
    req.policy = policy;
    req.budget.keep_ratio = 0.4;
    req.budget.window = 4;
    req.protection = Protection{2, 3};
    const PruneReport rep = score_and_evict(cache, scorers, req);
    int total = 0;
    for (int l = 0; l < 4; ++l) {
      total += rep.budgets[static_cast<std::size_t>(l)];
      REQUIRE(rep.budgets[static_cast<std::size_t>(l)] >= 5);
      for (int h = 0; h < 2; ++h) {
        REQUIRE(cache.layer(l).size(h) == rep.budgets[static_cast<std::size_t>(l)]);
        REQUIRE(scorers[static_cast<std::size_t>(l)].observed_size(h) ==
                rep.budgets[static_cast<std::size_t>(l)]);
        REQUIRE(cache.layer(l).positions(h)[0] == 0);                            // sinks
        REQUIRE(cache.layer(l).positions(h)[cache.layer(l).size(h) - 1] == 49);  // recent
      }
    }
    REQUIRE(total == 80);  // 0.4 * 4 layers * 50 tokens
    REQUIRE(rep.lengths == std::vector<int>(4, 50));
    REQUIRE(rep.bytes_before == cache.bytes() * 200 / 80);
    REQUIRE(rep.bytes_after == cache.bytes());
    // decoding continues on the pruned cache with the true positions
    const RowMatrix lg = engine.teacher_force(win.continuation, 50, cache);
    REQUIRE(lg.rows() == 10);
    REQUIRE(lg.allFinite());
  }
}

TEST_CASE("PruningEvaluator: activation reuse equals naive recomputation (random models)", "[eval]") {
  const LlamaModel model = random_model(5);
  const LlamaEngine engine(model);
  const auto windows = random_windows(3, 40, 20, model.config.vocab_size, 9);
  EvalConfig cfg;
  cfg.scorers.clear();
  for (const char* k : {"h2o", "h2o-v2", "snapkv", "tova", "knorm"}) {
    ScorerConfig s;
    s.kind = parse_scorer_kind(k);
    s.window = 8;
    s.kernel = 3;
    cfg.scorers.push_back(s);
  }
  cfg.spec.protection = Protection{1, 2};
  cfg.spec.schedule.chunk = 16;  // context and continuation both span several chunks
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator reuse(engine, windows, cfg), naive(engine, windows, naive_cfg);
  std::vector<std::vector<double>> plans;
  for (int l = 0; l < 4; ++l)
    for (double r : {0.1, 0.5}) {
      std::vector<double> p(4, 1.0);
      p[static_cast<std::size_t>(l)] = r;
      plans.push_back(p);
    }
  plans.push_back({1.0, 0.3, 1.0, 0.6});
  plans.push_back({0.2, 0.2, 0.2, 0.2});
  plans.push_back({0.0, 1.0, 1.0, 0.0});  // protection keeps 3
  bool any_loss = false;
  for (int s = 0; s < reuse.n_scorers(); ++s)
    for (const auto& plan : plans) {
      CAPTURE(s, plan);
      const auto a = reuse.evaluate_plan(plan, s), b = naive.evaluate_plan(plan, s);
      require_same(a, b, 1e-5);
      for (const auto& r : a) any_loss |= r.metrics.loss.kl > 1e-3;
    }
  REQUIRE(any_loss);  // the plans do change the outputs
  // the full plan is exactly lossless
  for (const auto& r : reuse.evaluate_plan(std::vector<double>(4, 1.0))) {
    REQUIRE(r.metrics.loss.kl == 0.0);
    REQUIRE(r.metrics.loss.dnll == 0.0);
    REQUIRE(r.metrics.loss.top1_disagree == 0.0);
    REQUIRE(r.bytes_kept == r.bytes_full);
  }
  // budgets in tokens (per layer) agree too
  require_same(reuse.evaluate_budgets({40, 7, 3, 100}, 2), naive.evaluate_budgets({40, 7, 3, 100}, 2), 1e-5);
  REQUIRE(reuse.evaluate_budgets({40, 7, 3, 100})[0].budgets == std::vector<int>{40, 7, 3, 40});
  // reuse runs fewer layer-tokens than recomputation
  REQUIRE(reuse.layer_tokens_run() * 4 < naive.layer_tokens_run());
}

TEST_CASE("PruningEvaluator: the profiler functions", "[eval]") {
  const LlamaModel model = random_model(8, 3);
  const LlamaEngine engine(model);
  EvalConfig cfg;
  cfg.spec.protection = {};  // keep 0.1 and 0.5 of 30 tokens below the default protection's 20
  const PruningEvaluator ev(engine, random_windows(4, 30, 8, model.config.vocab_size, 2), cfg);
  // a layer's ratios run in one batch; each equals its own plan run (ratio 1: the reference)
  const std::vector<double> ratios = {0.1, 0.5, 1.0};
  const auto per_layer = ev.layer_metrics(1, ratios);
  REQUIRE(per_layer.size() == 3);
  for (std::size_t k = 0; k < ratios.size(); ++k) {
    const SampleMetrics single = ev.plan_function()({1.0, ratios[k], 1.0});
    REQUIRE(single.kl.size() == 4);
    for (std::size_t w = 0; w < 4; ++w) {
      REQUIRE(per_layer[k].kl[w] == Approx(single.kl[w]).epsilon(1e-4).margin(1e-9));
      REQUIRE(per_layer[k].dnll[w] == Approx(single.dnll[w]).epsilon(1e-4).margin(1e-9));
      REQUIRE(per_layer[k].top1_disagree[w] == single.top1_disagree[w]);
    }
  }
  for (std::size_t w = 0; w < 4; ++w) {
    REQUIRE(per_layer[0].kl[w] > per_layer[1].kl[w]);
    REQUIRE(per_layer[2].kl[w] == 0.0);
  }
  SensitivityProfiler a(3, ProfilerOptions{{0.2, 0.6}, nullptr, nullptr}),
      b(3, ProfilerOptions{{0.2, 0.6}, nullptr, nullptr});
  REQUIRE(a.run(ev.plan_function()));
  REQUIRE(b.run_batched(ev.layer_function()));
  REQUIRE(a.result().kl.loss == b.result().kl.loss);
  REQUIRE(a.result().kl.loss.minCoeff() >= 0.0);
  REQUIRE(a.result().n_samples == 4);
  // errors
  REQUIRE_THROWS_AS(ev.evaluate_plan({1.0, 1.0}), Error);
  REQUIRE_THROWS_AS(ev.evaluate_plan({1.0, 1.5, 1.0}), Error);
  REQUIRE_THROWS_AS(ev.evaluate_plan({1.0, 1.0, 1.0}, 1), Error);
  REQUIRE_THROWS_AS(ev.layer_metrics(3, {0.5}), Error);
  REQUIRE_THROWS_AS(ev.evaluate_budgets({1, -1, 1}), Error);
  REQUIRE_THROWS_AS(PruningEvaluator(engine, {EvalWindow{{1, 2}, {}}}), Error);
}

TEST_CASE("PruningEvaluator [real]: reuse equals recomputation on stories260K", "[eval][real]") {
  const LlamaModel model = load_llama2c(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const Tokenizer tok(depthkv_test::data_path("models/stories260K/tok512.bin"), 512);
  const auto ids = encode_stories(
      tok, split_stories(read_text_file(depthkv_test::data_path("text/tinystories_valid.txt"))));
  const auto windows = split_windows(token_windows(ids, 512, 0, 3), 384);
  const LlamaEngine engine(model);
  EvalConfig cfg;
  ScorerConfig snap;
  snap.kind = ScorerKind::kSnapKV;
  cfg.scorers = {ScorerConfig{}, snap};
  cfg.spec.protection = Protection{4, 0};
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator reuse(engine, windows, cfg), naive(engine, windows, naive_cfg);
  for (int s = 0; s < 2; ++s)
    for (const std::vector<double>& plan :
         {std::vector<double>{1, 1, 0.1, 1, 1}, std::vector<double>{1, 1, 1, 1, 0.3},
          std::vector<double>{0.5, 0.2, 0.3, 0.2, 0.1}}) {
      CAPTURE(s, plan);
      require_same(reuse.evaluate_plan(plan, s), naive.evaluate_plan(plan, s), 1e-5);
    }
  // more pruning of a layer costs more (mean over windows, H2O, layer 2)
  const auto m = reuse.layer_metrics(2, {0.05, 0.5});
  double lo = 0, hi = 0;
  for (int w = 0; w < 3; ++w) {
    lo += m[0].kl[static_cast<std::size_t>(w)];
    hi += m[1].kl[static_cast<std::size_t>(w)];
  }
  REQUIRE(lo > hi);
  REQUIRE(hi > 0.0);
  REQUIRE(std::abs(reuse.nll_full(0) - naive.evaluate_plan({1, 1, 1, 1, 1})[0].metrics.nll_full) < 1e-9);
}

TEST_CASE("output-aware scores and adaptive head budgets through score_and_evict and the evaluator", "[eval][head_budget]") {
  const LlamaModel model = random_model(7);
  const LlamaEngine engine(model);
  const auto windows = random_windows(2, 40, 12, model.config.vocab_size, 4);
  const std::vector<OutputProjection> wo = output_projections(model);
  REQUIRE(wo.size() == 4);
  REQUIRE(wo[1].data == model.layers[1].wo.data());

  // score_and_evict: the kept slots are those of head_budgets + evict on the same scores
  for (bool output_aware : {false, true}) {
    ScorerConfig sc;
    sc.kind = ScorerKind::kSnapKV;
    sc.window = 8;
    sc.kernel = 3;
    sc.output_aware = output_aware;
    HostCache a = engine.make_cache();
    auto scorers = make_scorers(model.config, sc);
    ForwardOptions opt;
    opt.observer = observe_into(scorers);
    engine.prefill(windows[0].context, 0, a, opt);
    HostCache b = a;
    depthkv::detail::PruneRequest req;
    req.budget.keep_ratio = 0.3;
    req.protection = Protection{1, 2};
    req.head_allocation = HeadAllocation::kAdaptive;
    req.head_alpha = 0.25;
    req.output_projections = &wo;
    const std::vector<LayerScores> s = layer_scores(scorers, b, &wo);
    if (output_aware) CHECK_THROWS_WITH(layer_scores(scorers, b), Catch::Contains("no output projection"));
    const PruneReport rep = score_and_evict(a, scorers, req);
    const auto k = head_budgets(HeadAllocation::kAdaptive, b, s, rep.budgets, req.protection, 0.25);
    const auto ev = evict(b, s, k, req.protection);
    bool uneven = false;
    for (int l = 0; l < 4; ++l) {
      int sum = 0;
      for (int h = 0; h < 2; ++h) {
        REQUIRE(rep.evictions[static_cast<std::size_t>(l)].kept_slots[static_cast<std::size_t>(h)] ==
                ev[static_cast<std::size_t>(l)].kept_slots[static_cast<std::size_t>(h)]);
        sum += a.layer(l).size(h);
        REQUIRE(scorers[static_cast<std::size_t>(l)].observed_size(h) == a.layer(l).size(h));
        uneven |= a.layer(l).size(h) != rep.budgets[static_cast<std::size_t>(l)];
      }
      REQUIRE(sum == 2 * rep.budgets[static_cast<std::size_t>(l)]);
    }
    CHECK(uneven);  // the heads did get different budgets somewhere
  }

  // the evaluator: activation reuse equals recomputation and the chunked path; settings change results
  EvalConfig cfg;
  cfg.scorers.clear();
  for (const char* k : {"h2o", "snapkv", "tova"})
    for (bool oa : {false, true}) {
      ScorerConfig s;
      s.kind = parse_scorer_kind(k);
      s.window = 8;
      s.kernel = 3;
      s.output_aware = oa;
      cfg.scorers.push_back(s);
    }
  cfg.spec.protection = Protection{1, 2};
  cfg.spec.schedule.chunk = 64;  // one chunk: the chunked plan evicts once, as the one-shot run
  for (HeadAllocation ha : {HeadAllocation::kUniform, HeadAllocation::kAdaptive}) {
    CAPTURE(to_string(ha));
    cfg.spec.head_split.mode = ha;
    EvalConfig naive_cfg = cfg, chunked_cfg = cfg;
    naive_cfg.reuse = false;
    chunked_cfg.chunked_plans = true;
    const PruningEvaluator reuse(engine, windows, cfg), naive(engine, windows, naive_cfg),
        chunked(engine, windows, chunked_cfg);
    const std::vector<double> plan = {1.0, 0.3, 0.2, 0.5};
    for (int s = 0; s < reuse.n_scorers(); ++s) {
      CAPTURE(s);
      const auto a = reuse.evaluate_plan(plan, s);
      require_same(a, naive.evaluate_plan(plan, s), 1e-5);
      require_same(a, chunked.evaluate_plan(plan, s), 1e-5);
      if (s % 2 == 1) {  // output-aware differs from its plain scorer
        const auto p = reuse.evaluate_plan(plan, s - 1);
        bool differs = false;
        for (std::size_t w = 0; w < a.size(); ++w) differs |= a[w].metrics.loss.kl != p[w].metrics.loss.kl;
        CHECK(differs);
      }
    }
  }
  EvalConfig bad = cfg;
  bad.spec.head_split.alpha = 1.5;
  CHECK_THROWS_WITH(PruningEvaluator(engine, windows, bad), Catch::Contains("head_split.alpha 1.5 outside [0, 1]"));
}

TEST_CASE("adaptive head budgets change the evaluation", "[eval][head_budget]") {
  const LlamaModel model = random_model(8);
  const LlamaEngine engine(model);
  const auto windows = random_windows(2, 40, 12, model.config.vocab_size, 5);
  EvalConfig cfg;
  cfg.spec.protection = Protection{1, 2};
  const PruningEvaluator uni(engine, windows, cfg);
  cfg.spec.head_split.mode = HeadAllocation::kAdaptive;
  cfg.spec.head_split.alpha = 0.0;
  const PruningEvaluator ada(engine, windows, cfg);
  const std::vector<double> plan = {0.2, 0.2, 0.2, 0.2};
  const auto a = uni.evaluate_plan(plan), b = ada.evaluate_plan(plan);
  bool differs = false;
  for (std::size_t w = 0; w < a.size(); ++w) {
    differs |= a[w].metrics.loss.kl != b[w].metrics.loss.kl;
    CHECK(a[w].bytes_kept == b[w].bytes_kept);  // the same tokens per layer
  }
  CHECK(differs);
  cfg.spec.head_split.alpha = 1.0;  // alpha 1: the uniform split
  const PruningEvaluator one(engine, windows, cfg);
  require_same(one.evaluate_plan(plan), a, 1e-12);
}

TEST_CASE("PruningEvaluator: per-head budgets and head curves", "[eval][head_budget]") {
  const LlamaModel model = random_model(11, 3);  // 2 KV heads per layer
  const LlamaEngine engine(model);
  const auto windows = random_windows(3, 40, 12, model.config.vocab_size, 4);
  EvalConfig cfg;
  cfg.spec.protection = Protection{1, 2};
  cfg.spec.schedule.chunk = 16;
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator ev(engine, windows, cfg), naive(engine, windows, naive_cfg);
  REQUIRE(ev.n_kv_heads() == 2);
  // every head of a layer at the same count is the layer plan
  require_same(ev.evaluate_head_budgets({{40, 40}, {7, 7}, {3, 3}}), ev.evaluate_budgets({40, 7, 3}), 1e-12);
  // unequal heads: reuse equals recomputation; budgets report the mean per head
  const std::vector<std::vector<int>> uneven = {{40, 5}, {20, 9}, {3, 40}};
  const auto a = ev.evaluate_head_budgets(uneven), b = naive.evaluate_head_budgets(uneven);
  require_same(a, b, 1e-5);
  REQUIRE(a[0].budgets == std::vector<int>{23, 15, 22});  // (40+5)/2 = 22.5 -> 23, 14.5 -> 15, 21.5 -> 22
  const std::size_t per_token = 2 * sizeof(float) * static_cast<std::size_t>(model.config.head_dim);
  REQUIRE(a[0].bytes_kept == per_token * (45 + 29 + 43));
  // each head matters on its own: the two single-head plans of layer 0 give other losses
  const auto h0 = ev.head_metrics(0, 0, {0.1}), h1 = ev.head_metrics(0, 1, {0.1});
  REQUIRE(h0[0].kl != h1[0].kl);
  // head_metrics is the per-head plan, and the head function numbers units layer * H + head
  const int k01 = keep_tokens(0.1, 40, cfg.spec.protection);
  const auto direct = ev.evaluate_head_budgets({{40, 40}, {40, k01}, {40, 40}});
  const auto unit = ev.head_function()(3, {0.1});
  for (std::size_t w = 0; w < direct.size(); ++w) REQUIRE(unit[0].kl[w] == direct[w].metrics.loss.kl);
  // a profiler over units gives L * H rows of curves, >= 0, lossless at ratio 1 by definition
  SensitivityProfiler prof(3 * 2, ProfilerOptions{{0.2, 0.6}, nullptr, nullptr});
  REQUIRE(prof.run_batched(ev.head_function()));
  REQUIRE(prof.result().kl.loss.rows() == 6);
  REQUIRE(prof.result().kl.loss.minCoeff() >= 0.0);
  REQUIRE(prof.result().kl.loss.maxCoeff() > 0.0);
  // chunked plans take per-head budgets too: the full budgets are lossless
  EvalConfig chunked = cfg;
  chunked.chunked_plans = true;
  const PruningEvaluator ch(engine, windows, chunked);
  for (const auto& r : ch.evaluate_head_budgets({{40, 40}, {40, 40}, {40, 40}})) REQUIRE(r.metrics.loss.kl == 0.0);
  const auto c1 = ch.evaluate_head_budgets(uneven);
  bool lossy = false;
  for (const auto& r : c1) lossy |= r.metrics.loss.kl > 0.0;
  REQUIRE(lossy);
  // with resplit, an adaptive evaluator moves tokens between the heads of a layer, same totals
  EvalConfig ada = cfg;
  ada.spec.head_split.mode = HeadAllocation::kAdaptive;
  ada.spec.head_split.alpha = 0.0;
  const PruningEvaluator ad(engine, windows, ada);
  require_same(ad.evaluate_head_budgets(uneven), a, 1e-12);  // no resplit: exact
  const auto re = ad.evaluate_head_budgets(uneven, 0, /*resplit=*/true);
  bool moved = false;
  for (std::size_t w = 0; w < re.size(); ++w) {
    REQUIRE(re[w].bytes_kept == a[w].bytes_kept);
    moved |= re[w].metrics.loss.kl != a[w].metrics.loss.kl;
  }
  REQUIRE(moved);
  // errors
  REQUIRE_THROWS_AS(ev.evaluate_head_budgets({{40, 40}, {40, 40}}), Error);
  REQUIRE_THROWS_AS(ev.evaluate_head_budgets({{40, 40}, {40}, {40, 40}}), Error);
  REQUIRE_THROWS_AS(ev.evaluate_head_budgets({{40, 40}, {40, -1}, {40, 40}}), Error);
  REQUIRE_THROWS_AS(ev.evaluate_head_budgets({{40, 40}, {40, 1}, {40, 40}}), Error);  // below 3 protected
  REQUIRE_THROWS_AS(ev.head_metrics(0, 2, {0.5}), Error);
  REQUIRE_THROWS_AS(ev.head_metrics(3, 0, {0.5}), Error);
}

TEST_CASE("PruningEvaluator and EvictionSchedule on a sliding-window model (Gemma 3's block)", "[eval][window]") {
  depthkv_test::RandomSpec s = depthkv_test::eval_spec(12, 4);
  s.gemma3 = true;
  s.window = 8;  // layers 0-2 local, layer 3 global
  const LlamaModel model = depthkv_test::random_model(s);
  const LlamaEngine engine(model);
  const int n_ctx = 40, W = s.window;
  const auto windows = random_windows(3, n_ctx, 12, model.config.vocab_size, 4);
  EvalConfig cfg;
  cfg.spec.protection = Protection{1, 2};
  cfg.spec.schedule.chunk = 16;
  EvalConfig naive_cfg = cfg;
  naive_cfg.reuse = false;
  const PruningEvaluator reuse(engine, windows, cfg), naive(engine, windows, naive_cfg);
  SECTION("reuse equals recomputation; window - 1 tokens in a local layer lose nothing") {
    for (const std::vector<int>& b : {std::vector<int>{W - 1, W - 1, W - 1, n_ctx}, std::vector<int>{3, W - 1, 5, 10},
                                      std::vector<int>{W - 1, 3, W - 1, 20}}) {
      CAPTURE(b);
      require_same(reuse.evaluate_budgets(b), naive.evaluate_budgets(b), 1e-5);
    }
    for (const auto& r : reuse.evaluate_budgets({W - 1, W - 1, W - 1, n_ctx})) REQUIRE(r.metrics.loss.kl < 1e-9);
    bool lossy = false;  // a local layer below its window does lose
    for (const auto& r : reuse.evaluate_budgets({3, W - 1, W - 1, n_ctx})) lossy |= r.metrics.loss.kl > 1e-4;
    REQUIRE(lossy);
  }
  SECTION("a spec's budgets cap the local layers at window - 1 and give the rest to the global layer") {
    PruneSpec spec;
    spec.protection = cfg.spec.protection;
    spec.budget = Budget::keep(0.5);
    spec.schedule.chunk = cfg.spec.schedule.chunk;
    const auto r = reuse.evaluate(spec, PolicyData{});
    REQUIRE(r.front().budgets == std::vector<int>{W - 1, W - 1, W - 1, n_ctx});  // 80 tokens asked, 61 usable
    spec.budget = Budget::keep(0.25);  // 40 tokens: 7 + 7 + 7 + 19 (uniform 10 each, the local layers' 3 moved)
    REQUIRE(reuse.evaluate(spec, PolicyData{}).front().budgets == std::vector<int>{W - 1, W - 1, W - 1, 40 - 3 * (W - 1)});
  }
  SECTION("a schedule frees the local layers' slots outside their window and keeps its scorers in step") {
    depthkv::detail::ScheduleConfig sc;
    sc.budget.keep_ratio = 0.3;
    sc.protection = cfg.spec.protection;
    sc.scorer.kind = ScorerKind::kH2O;
    sc.layer_window = model.config.layer_window;
    EvictionSchedule schedule(sc, 4, s.heads, s.kv_heads);
    HostCache cache = engine.make_cache();
    ForwardOptions opt;
    opt.chunk_size = 8;
    opt.observer = schedule.observer();
    int most_local = 0;
    opt.after_chunk = [&](int, std::int32_t) {
      most_local = std::max(most_local, cache.layer(0).max_size());
      schedule.after_chunk(cache);
      REQUIRE(cache.layer(1).max_size() <= W - 1);
    };
    const std::vector<int>& ctx = windows.front().context;
    engine.prefill(ctx, 0, cache, opt);
    REQUIRE(most_local <= W - 1 + 8);
    // the global budget: 0.3 x 4 layers x 40 tokens = 48; the local layers hold at most 7 each,
    // so the global layer holds more than a uniform share (12), and the cache stays within budget
    REQUIRE(schedule.n_evictions() > 0);
    long long held = 0;
    for (int n : cache.lengths()) held += n;
    CAPTURE(cache.lengths(), schedule.budgets());
    REQUIRE(held <= 48);
    REQUIRE(cache.layer(3).max_size() > 12);
    ForwardOptions dopt;
    dopt.observer = schedule.observer();
    for (int t = 0; t < 10; ++t) {  // decode: the schedule keeps up
      engine.forward(&windows.front().continuation[static_cast<std::size_t>(t)], 1, n_ctx + t, cache, dopt);
      schedule.after_decode_step(cache);
      REQUIRE(cache.layer(2).max_size() <= W - 1);
    }
  }
}
