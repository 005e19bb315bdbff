// PrunedGeneration, the library's prefill-evict-decode driver: each mode equals the pipeline
// assembled by hand from the engine, the scorers, score_and_evict and EvictionSchedule (the same
// bits), on Llama and Gemma 3 blocks; and bad requests are refused before the cache changes.

#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../support/random_model.hpp"
#include "depthkv/error.hpp"
#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/llama/pruned_generation.hpp"

namespace {

using namespace depthkv;
using namespace depthkv::llama;
using depthkv_test::random_model;
using depthkv_test::random_tokens;

/// Greedy decoding of `steps` tokens after `prompt`: the driver's logits at every step.
std::vector<RowMatrix> drive(PrunedGeneration<HostCache>& g, const std::vector<int>& prompt, int steps) {
  std::vector<RowMatrix> out{g.prefill(prompt)};
  for (int i = 0; i < steps; ++i) out.push_back(g.step(last_argmax(out.back())));
  return out;
}

/// The same by hand: prefill (observed when `scorers`), then `prune` (may be empty), then greedy steps.
template <class Prune>
std::vector<RowMatrix> by_hand(const LlamaEngine& engine, HostCache& cache, const std::vector<int>& prompt, int steps,
                               const ForwardOptions& opt, Prune prune) {
  std::vector<RowMatrix> out{engine.prefill(prompt, 0, cache, opt)};
  prune(out.back());
  ForwardOptions dopt;
  dopt.chunk_size = opt.chunk_size;
  for (int i = 0; i < steps; ++i) {
    const int t = last_argmax(out.back());
    out.push_back(engine.forward(&t, 1, static_cast<std::int32_t>(prompt.size()) + i, cache, dopt));
  }
  return out;
}

void require_same(const std::vector<RowMatrix>& a, const std::vector<RowMatrix>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == b[i]);
}

depthkv_test::RandomSpec shape(bool gemma) {
  depthkv_test::RandomSpec s = depthkv_test::eval_spec(11, 3);
  s.gemma3 = gemma;
  s.window = 24;
  return s;
}

}  // namespace

TEST_CASE("PrunedGeneration without a spec: the engine's prefill and decode, nothing evicted", "[driver]") {
  const LlamaModel model = random_model(shape(false));
  const LlamaEngine engine(model);
  const std::vector<int> prompt = random_tokens(70, model.config.vocab_size, 3);
  ForwardOptions run;
  run.chunk_size = 16;
  PrunedGeneration<HostCache> g(engine, engine.make_cache(), std::nullopt, {}, nullptr, run);
  HostCache ref = engine.make_cache();
  ForwardOptions opt = run;
  opt.all_logits = false;
  require_same(drive(g, prompt, 12), by_hand(engine, ref, prompt, 12, opt, [](const RowMatrix&) {}));
  REQUIRE(g.cache().lengths() == ref.lengths());
  REQUIRE_FALSE(g.report().pruned);
  REQUIRE(g.report().tokens_seen == 82);
}

TEST_CASE("PrunedGeneration with a oneshot spec equals score_and_evict after the prefill", "[driver]") {
  const bool gemma = GENERATE(false, true);
  const bool lookahead = GENERATE(false, true);
  CAPTURE(gemma, lookahead);
  const LlamaModel model = random_model(shape(gemma));
  const LlamaEngine engine(model);
  const OutputProjections wo(model);
  const std::vector<int> prompt = random_tokens(90, model.config.vocab_size, 5);
  PruneSpec spec;
  spec.scorer = scorer_config("snapkv");
  spec.scorer.output_aware = true;
  spec.scorer.lookahead = lookahead ? 6 : 0;
  spec.scorer.context_weight = lookahead ? 0.25 : 0.0;
  spec.protection = {2, 4};
  spec.budget = Budget::keep(0.3);
  ForwardOptions run;
  run.chunk_size = 32;
  PrunedGeneration<HostCache> g(engine, engine.make_cache(), spec, {}, &wo, run);
  const std::vector<RowMatrix> got = drive(g, prompt, 10);

  HostCache ref = engine.make_cache();
  std::vector<TokenScorer> scorers = make_scorers(model.config, spec.scorer);
  ForwardOptions opt = run;
  opt.all_logits = false;
  opt.observer = observe_into(scorers);
  PolicyData data;
  data.layer_window = model.config.layer_window;
  PruneReport rep;
  const std::vector<RowMatrix> want = by_hand(engine, ref, prompt, 10, opt, [&](const RowMatrix& logits) {
    if (lookahead) observe_lookahead(engine, ref, last_argmax(logits), 90, {&scorers});
    rep = score_and_evict(ref, scorers, spec, data, &wo.views());
  });
  require_same(got, want);
  REQUIRE(g.report().pruned);
  REQUIRE(g.report().prune.budgets == rep.budgets);
  REQUIRE(g.report().lookahead == (lookahead ? 6 : 0));
  REQUIRE(g.cache().lengths() == ref.lengths());
  REQUIRE(g.cache().bytes() < g.report().peak_bytes);
}

TEST_CASE("PrunedGeneration with a chunked spec equals an EvictionSchedule driven by hand", "[driver]") {
  const bool gemma = GENERATE(false, true);
  CAPTURE(gemma);
  const LlamaModel model = random_model(shape(gemma));
  const LlamaEngine engine(model);
  const std::vector<int> prompt = random_tokens(100, model.config.vocab_size, 9);
  PruneSpec spec;
  spec.protection = {2, 4};
  spec.budget = Budget::tokens(60);
  spec.schedule = {ScheduleMode::kChunked, 16, 8};
  ForwardOptions run;
  run.chunk_size = 16;
  PrunedGeneration<HostCache> g(engine, engine.make_cache(), spec, {}, nullptr, run);
  const std::vector<RowMatrix> got = drive(g, prompt, 30);

  PolicyData data;
  data.layer_window = model.config.layer_window;
  EvictionSchedule s(spec, data, model.config.n_layers, model.config.n_heads, model.config.n_kv_heads);
  HostCache ref = engine.make_cache();
  ForwardOptions opt = run;
  opt.all_logits = false;
  opt.observer = s.observer();
  opt.after_chunk = [&](int, std::int32_t) { s.after_chunk(ref); };
  std::vector<RowMatrix> want{engine.prefill(prompt, 0, ref, opt)};
  for (int i = 0; i < 30; ++i) {
    const int t = last_argmax(want.back());
    ForwardOptions d;
    d.observer = s.observer();
    d.observe_from = s.observe_from();
    want.push_back(engine.forward(&t, 1, 100 + i, ref, d));
    s.after_decode_step(ref);
  }
  require_same(got, want);
  REQUIRE(g.report().evictions == s.n_evictions());
  REQUIRE(g.report().evictions > 3);
  REQUIRE(g.cache().lengths() == ref.lengths());
}

TEST_CASE("PrunedGeneration refuses bad requests before its cache changes", "[driver][errors]") {
  const LlamaModel model = random_model(shape(false));
  const LlamaEngine engine(model);
  ForwardOptions run;
  PruneSpec aware;
  aware.scorer = scorer_config("snapkv");
  aware.scorer.output_aware = true;
  aware.budget = Budget::keep(0.5);
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>(engine, engine.make_cache(), aware, {}, nullptr, run),
                      Catch::Contains("output projections"));
  PruneSpec head;
  head.policy = AllocationPolicy::kHeadOptimal;
  head.budget = Budget::keep(0.5);
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>(engine, engine.make_cache(), head, {}, nullptr, run),
                      Catch::Contains("head curves"));
  PruneSpec bad;
  bad.budget = Budget::keep(1.5);
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>(engine, engine.make_cache(), bad, {}, nullptr, run),
                      Catch::Contains("keep ratio"));
  PruneSpec ok;
  ok.budget = Budget::keep(0.5);
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>(engine, engine.make_cache(), ok, {}, nullptr, run, "worst"),
                      Catch::Contains("unknown preset"));

  PrunedGeneration<HostCache> g(engine, engine.make_cache(), ok, {}, nullptr, run);
  REQUIRE_THROWS_WITH(g.step(1), Catch::Contains("prefill a prompt first"));
  REQUIRE_THROWS_WITH(g.prefill({}), Catch::Contains("no tokens"));
  REQUIRE_THROWS_WITH(g.prefill({1, 2, 9999}), Catch::Contains("9999"));
  REQUIRE(g.cache().lengths() == std::vector<int>(3, 0));
  g.prefill(random_tokens(40, model.config.vocab_size, 1));
  REQUIRE_THROWS_WITH(g.prefill({1, 2}), Catch::Contains("already prefilled (40 positions)"));
}

TEST_CASE("PrunedGeneration with a preset runs its per-input rule on the prompt", "[driver][preset]") {
  // classifier gain 1: predictions near uniform (trusted); 40: confidently wrong on random ids
  const float gain = GENERATE(1.0f, 40.0f);
  CAPTURE(gain);
  depthkv_test::RandomSpec s = shape(false);
  s.classifier_gain = gain;
  const LlamaModel model = random_model(s);
  const LlamaEngine engine(model);
  PruneSpec spec;
  spec.scorer = scorer_config("h2o");
  spec.protection = {2, 4};
  spec.budget = Budget::keep(0.4);
  ForwardOptions run;
  PrunedGeneration<HostCache> g(engine, engine.make_cache(), spec, {}, nullptr, run, "best");
  const std::vector<int> prompt = random_tokens(80, model.config.vocab_size, 4);
  g.prefill(prompt);
  const GenerationReport& r = g.report();
  REQUIRE(r.rule_ran);
  REQUIRE(r.nll_tokens == kPresetTrustTokens);
  // the signal is the NLL of the prompt's last tokens as the full prefill predicts them
  HostCache full = engine.make_cache();
  const RowMatrix all = engine.prefill(prompt, 0, full, ForwardOptions());
  const std::vector<int> targets(prompt.end() - kPresetTrustTokens, prompt.end());
  const RowMatrix rows = all.middleRows(80 - 1 - kPresetTrustTokens, kPresetTrustTokens);
  REQUIRE(r.context_nll == Approx(compare_logits(rows, rows, targets).nll_full).epsilon(1e-4));
  REQUIRE(r.trusted == preset_trusts_input("best", r.context_nll, model.config.vocab_size));
  REQUIRE(r.trusted == (gain < 10.0f));
  // trusted: the spec as given; distrusted: plain SnapKV with uniform budgets
  REQUIRE(scorer_name(r.spec.scorer) == (r.trusted ? "h2o" : "snapkv"));
  REQUIRE(r.pruned);
}

TEST_CASE("PrunedGeneration: a keep ratio below the protected tokens keeps the protected tokens", "[driver]") {
  const LlamaModel model = random_model(shape(false));
  const LlamaEngine engine(model);
  PruneSpec spec;  // protection {4, 16} by default
  spec.budget = Budget::keep(0.3);
  PrunedGeneration<HostCache> g(engine, engine.make_cache(), spec, {}, nullptr, ForwardOptions());
  g.prefill(random_tokens(30, model.config.vocab_size, 2));  // keep 0.3: 9 of 30 per layer, below 20 protected
  REQUIRE(g.report().raised_to_protection);
  REQUIRE(g.cache().lengths() == std::vector<int>(3, 20));
  PrunedGeneration<HostCache> h(engine, engine.make_cache(), spec, {}, nullptr, ForwardOptions());
  h.prefill(random_tokens(100, model.config.vocab_size, 2));  // 30 of 100: above the protection
  REQUIRE_FALSE(h.report().raised_to_protection);
  REQUIRE(h.cache().lengths() == std::vector<int>(3, 30));
}

TEST_CASE("PrunedGeneration on sliding-window layers: a keep ratio beyond what they hold keeps all they hold",
          "[driver][window]") {
  // window 24 on every layer but the last: 90 tokens at keep 0.9 ask for 0.9 * 3 * 90 = 243 slots,
  // the layers hold 23 + 23 + 90 = 136 once the slots outside the windows are dropped
  const LlamaModel model = random_model(shape(true));
  const LlamaEngine engine(model);
  const PolicyCurves no_curves;
  for (const char* scorer : {"snapkv", "keydiff"}) {
    CAPTURE(scorer);
    PruneSpec spec;
    spec.scorer = scorer_config(scorer);
    spec.protection = {2, 4};
    spec.budget = Budget::keep(0.9);
    PrunedGeneration<HostCache> g(engine, engine.make_cache(), spec, no_curves, nullptr, ForwardOptions());
    REQUIRE_NOTHROW(g.prefill(random_tokens(90, model.config.vocab_size, 7)));
    for (int l = 0; l < model.config.n_layers; ++l)
      CHECK(g.cache().lengths()[static_cast<std::size_t>(l)] == (model.config.window(l) > 0 ? 23 : 90));
  }
}

TEST_CASE("PrunedGeneration::feed: a prompt fed chunk by chunk equals prefill, and the caller's hook sees each append",
          "[driver]") {
  const LlamaModel model = random_model(shape(true));
  const LlamaEngine engine(model);
  const std::vector<int> prompt = random_tokens(96, model.config.vocab_size, 8);
  PruneSpec spec;
  spec.protection = {2, 4};
  spec.budget = Budget::keep(0.4);
  spec.schedule = {ScheduleMode::kChunked, 16, 4};
  ForwardOptions run;
  run.chunk_size = 16;
  int appends = 0;
  std::size_t before_eviction = 0;
  PrunedGeneration<HostCache>* watched = nullptr;
  run.after_chunk = [&](int, std::int32_t) {
    ++appends;
    before_eviction = std::max(before_eviction, watched->cache().bytes());
  };
  PrunedGeneration<HostCache> a(engine, engine.make_cache(), spec, {}, nullptr, run);
  watched = &a;
  RowMatrix la = a.prefill(prompt);
  REQUIRE(appends == 6);
  PrunedGeneration<HostCache> b(engine, engine.make_cache(), spec, {}, nullptr, run);
  watched = &b;
  RowMatrix lb;
  for (int p0 = 0; p0 < 96; p0 += 16) lb = b.feed(prompt.data() + p0, 16);
  REQUIRE(appends == 12);
  REQUIRE(la == lb);
  REQUIRE(a.cache().lengths() == b.cache().lengths());
  REQUIRE(a.report().prune.budgets == b.report().prune.budgets);
  REQUIRE(before_eviction == b.report().peak_bytes);
  for (int i = 0; i < 8; ++i) REQUIRE(a.step(i) == b.step(i));
  REQUIRE(appends == 28);

  PruneSpec oneshot;
  oneshot.budget = Budget::keep(0.5);
  PrunedGeneration<HostCache> c(engine, engine.make_cache(), oneshot, {}, nullptr, ForwardOptions());
  REQUIRE_THROWS_WITH(c.feed(prompt.data(), 16), Catch::Contains("use prefill"));
  REQUIRE(c.cache().lengths() == std::vector<int>(3, 0));
  // a bad id in a later chunk: refused before the first chunk is appended
  PrunedGeneration<HostCache> d(engine, engine.make_cache(), spec, {}, nullptr, ForwardOptions());
  std::vector<int> bad = prompt;
  bad[90] = -3;
  REQUIRE_THROWS_WITH(d.prefill(bad), Catch::Contains("token -3 at position 90"));
  REQUIRE(d.cache().lengths() == std::vector<int>(3, 0));
  REQUIRE(d.position() == 0);
}

TEST_CASE("PrunedGeneration::teacher_force equals stepping token by token, and prefill(evict_at_end) ends on the budget",
          "[driver]") {
  const bool gemma = GENERATE(false, true);
  CAPTURE(gemma);
  const LlamaModel model = random_model(shape(gemma));
  const LlamaEngine engine(model);
  const std::vector<int> prompt = random_tokens(70, model.config.vocab_size, 4);
  const std::vector<int> known = random_tokens(23, model.config.vocab_size, 5);
  PruneSpec spec;
  spec.protection = {2, 4};
  spec.budget = Budget::tokens(60);
  spec.schedule = {ScheduleMode::kDecode, 16, 5};
  ForwardOptions run;
  run.chunk_size = 16;
  PrunedGeneration<HostCache> a(engine, engine.make_cache(), spec, {}, nullptr, run);
  PrunedGeneration<HostCache> b(engine, engine.make_cache(), spec, {}, nullptr, run);
  REQUIRE_THROWS_WITH(a.teacher_force(known), Catch::Contains("prefill a prompt first"));
  a.prefill(prompt, /*evict_at_end=*/true);
  b.prefill(prompt, true);
  REQUIRE(a.report().evictions > 0);
  long long held = 0;  // 70 tokens seen, the last eviction after the prompt: at most the budget
  for (int n : a.cache().lengths()) held += n;
  REQUIRE(held <= 60);
  const RowMatrix all = a.teacher_force(known);
  REQUIRE(all.rows() == 23);
  for (int i = 0; i < 23; ++i) {  // the same evictions; products over a block round apart from one row's
    CAPTURE(i);
    REQUIRE((all.row(i) - b.step(known[static_cast<std::size_t>(i)]).row(0)).cwiseAbs().maxCoeff() < 1e-4);
    REQUIRE(a.report().evictions >= b.report().evictions);
  }
  REQUIRE(a.cache().lengths() == b.cache().lengths());
  REQUIRE(a.report().evictions == b.report().evictions);
  REQUIRE(a.position() == 93);

  // without a spec: the engine's teacher forcing, nothing evicted
  PrunedGeneration<HostCache> full(engine, engine.make_cache(), std::nullopt, {}, nullptr, run);
  full.prefill(prompt);
  HostCache ref = engine.make_cache();
  ForwardOptions opt = run;
  opt.all_logits = false;
  engine.prefill(prompt, 0, ref, opt);
  REQUIRE(full.teacher_force(known) == engine.teacher_force(known, 70, ref, run));
  REQUIRE(full.cache().lengths() == ref.lengths());
}

TEST_CASE("PrunedGeneration with span pooling keeps or drops each span whole (one per head may straddle the edge)",
          "[driver][span]") {
  const LlamaModel model = random_model(shape(false));
  const LlamaEngine engine(model);
  const int n = 120;
  const std::vector<int> prompt = random_tokens(n, model.config.vocab_size, 5);
  std::vector<std::int32_t> spans(static_cast<std::size_t>(n));  // spans of 1..6 positions
  for (int i = 0, start = 0; i < n; ++i) {
    if (i - start >= 1 + (start * 7) % 6) start = i;
    spans[static_cast<std::size_t>(i)] = start;
  }
  PruneSpec spec;
  spec.scorer = scorer_config("snapkv");
  spec.protection = {4, 16};
  spec.budget = Budget::keep(0.3);
  // per (layer, KV head): the spans outside the protected positions that are kept in part
  const auto partial_spans = [&](bool pooled) {
    PruneSpec s = spec;
    s.scorer.span_pooling = pooled;
    PolicyCurves curves;
    if (pooled) curves.span_start = spans;
    PrunedGeneration<HostCache> g(engine, engine.make_cache(), s, curves, nullptr, ForwardOptions{});
    g.prefill(prompt);
    REQUIRE(g.report().pruned);
    std::vector<int> out;
    for (int l = 0; l < g.cache().n_layers(); ++l)
      for (int h = 0; h < g.cache().layer(l).n_kv_heads(); ++h) {
        std::vector<int> kept(static_cast<std::size_t>(n), 0), size(static_cast<std::size_t>(n), 0);
        for (int i = 0; i < g.cache().layer(l).size(h); ++i) kept[static_cast<std::size_t>(spans[static_cast<std::size_t>(g.cache().layer(l).positions(h)[i])])]++;
        for (int p = 0; p < n; ++p) size[static_cast<std::size_t>(spans[static_cast<std::size_t>(p)])]++;
        int partial = 0;
        for (int st = 0; st < n; ++st) {
          const int len = size[static_cast<std::size_t>(st)];
          const bool protected_part = st < 4 || st + len > n - 16;
          partial += len > 0 && !protected_part && kept[static_cast<std::size_t>(st)] > 0 && kept[static_cast<std::size_t>(st)] < len;
        }
        out.push_back(partial);
      }
    return out;
  };
  const std::vector<int> pooled = partial_spans(true), plain = partial_spans(false);
  int sum_pooled = 0, sum_plain = 0;
  for (int p : pooled) {
    CHECK(p <= 1);
    sum_pooled += p;
  }
  for (int p : plain) sum_plain += p;
  CHECK(sum_plain > sum_pooled);  // without pooling SnapKV keeps pieces of many spans
  // the spec asks for spans the caller did not give: refused before anything runs
  PruneSpec s = spec;
  s.scorer.span_pooling = true;
  REQUIRE_THROWS_WITH((PrunedGeneration<HostCache>(engine, engine.make_cache(), s, {}, nullptr, ForwardOptions{})),
                      Catch::Contains("scorer.span_pooling needs the tokens' spans"));
}

TEST_CASE("PrunedGeneration::prefill_shared: one pass, then each adopted copy equals its own prefill", "[driver][shared]") {
  const bool gemma = GENERATE(false, true);
  const float gain = GENERATE(1.0f, 40.0f);  // the presets' rule trusts (1) or distrusts (40) the prompt
  CAPTURE(gemma, gain);
  depthkv_test::RandomSpec s = shape(gemma);
  s.classifier_gain = gain;
  const LlamaModel model = random_model(s);
  const LlamaEngine engine(model);
  const OutputProjections wo(model);
  const std::vector<int> prompt = random_tokens(90, model.config.vocab_size, 6);
  ForwardOptions run;
  run.chunk_size = 32;
  PruneSpec snap;
  snap.scorer = scorer_config("snapkv");
  snap.scorer.output_aware = true;
  snap.scorer.lookahead = 5;
  snap.scorer.context_weight = 0.25;
  snap.protection = {2, 4};
  snap.budget = Budget::keep(0.3);
  PruneSpec h2o;
  h2o.scorer = scorer_config("h2o");
  h2o.protection = {2, 4};
  h2o.budget = Budget::keep(0.5);
  PruneSpec keep_all = h2o;
  keep_all.budget = Budget::keep(1.0);
  struct Run {
    std::optional<PruneSpec> spec;
    std::string preset;
  };
  const std::vector<Run> runs = {{std::nullopt, ""}, {snap, ""}, {h2o, "best"}, {snap, "best"}, {keep_all, ""}};
  auto make = [&](const Run& r) {
    return std::make_unique<PrunedGeneration<HostCache>>(engine, engine.make_cache(), r.spec, PolicyCurves{}, &wo, run,
                                                         r.preset);
  };
  std::vector<std::unique_ptr<PrunedGeneration<HostCache>>> shared;
  std::vector<PrunedGeneration<HostCache>*> ptrs;
  for (const Run& r : runs) {
    shared.push_back(make(r));
    ptrs.push_back(shared.back().get());
  }
  HostCache full = engine.make_cache();
  const RowMatrix first = PrunedGeneration<HostCache>::prefill_shared(ptrs, prompt, full);
  REQUIRE(full.lengths() == std::vector<int>(static_cast<std::size_t>(model.config.n_layers), 90));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    CAPTURE(i);
    PrunedGeneration<HostCache>& g = *shared[i];
    std::vector<RowMatrix> got{g.adopt(full)};
    REQUIRE(got[0] == first);
    for (int k = 0; k < 8; ++k) got.push_back(g.step(last_argmax(got.back())));
    const auto alone = make(runs[i]);
    require_same(got, drive(*alone, prompt, 8));
    const GenerationReport &a = g.report(), &b = alone->report();
    REQUIRE(a.pruned == b.pruned);
    REQUIRE(a.prune.budgets == b.prune.budgets);
    REQUIRE(a.rule_ran == b.rule_ran);
    REQUIRE(a.trusted == b.trusted);
    REQUIRE(a.context_nll == b.context_nll);
    REQUIRE(a.lookahead == b.lookahead);
    REQUIRE(scorer_name(a.spec.scorer) == scorer_name(b.spec.scorer));
    REQUIRE(g.cache().lengths() == alone->cache().lengths());
    REQUIRE_THROWS_WITH(g.adopt(full), Catch::Contains("already adopted"));
  }
  REQUIRE(shared[2]->report().trusted == (gain < 10.0f));  // both verdicts are exercised
  REQUIRE(full.lengths() == std::vector<int>(static_cast<std::size_t>(model.config.n_layers), 90));  // copies only
}

TEST_CASE("PrunedGeneration::prefill_shared refuses what it cannot share, before any generation changes",
          "[driver][shared][errors]") {
  const LlamaModel model = random_model(shape(false));
  const LlamaEngine engine(model), other(model);
  ForwardOptions run;
  PruneSpec ok;
  ok.budget = Budget::keep(0.5);
  PruneSpec chunked = ok;
  chunked.budget = Budget::tokens(40);
  chunked.schedule = {ScheduleMode::kChunked, 16, 16};
  using Gen = PrunedGeneration<HostCache>;
  Gen a(engine, engine.make_cache(), ok, {}, nullptr, run), b(engine, engine.make_cache(), chunked, {}, nullptr, run),
      c(other, other.make_cache(), ok, {}, nullptr, run);
  const std::vector<int> prompt = random_tokens(50, model.config.vocab_size, 2);
  HostCache full = engine.make_cache();
  REQUIRE_THROWS_WITH(Gen::prefill_shared({}, prompt, full), Catch::Contains("no generations"));
  REQUIRE_THROWS_WITH(Gen::prefill_shared({&a, &b}, prompt, full), Catch::Contains("generation 1 has a schedule"));
  REQUIRE_THROWS_WITH(Gen::prefill_shared({&a, &c}, prompt, full), Catch::Contains("another engine"));
  REQUIRE_THROWS_WITH(Gen::prefill_shared({&a}, {1, 9999}, full), Catch::Contains("9999"));
  REQUIRE_THROWS_WITH(a.adopt(full), Catch::Contains("no prefill_shared included"));
  REQUIRE(full.lengths() == std::vector<int>(3, 0));
  REQUIRE(a.position() == 0);
  HostCache copy = engine.make_cache();
  Gen::prefill_shared({&a}, prompt, full);
  REQUIRE_THROWS_WITH(Gen::prefill_shared({&a}, prompt, copy), Catch::Contains("generation 0 is already prefilled"));
  REQUIRE_THROWS_WITH(a.prefill(prompt), Catch::Contains("already prefilled"));
  REQUIRE_THROWS_WITH(a.step(1), Catch::Contains("prefill a prompt first"));
  copy = full;
  REQUIRE_THROWS_WITH(a.adopt(copy), Catch::Contains("not the cache its prefill_shared filled"));
  Gen d(engine, engine.make_cache(), ok, {}, nullptr, run);
  REQUIRE_THROWS_WITH(Gen::prefill_shared({&d}, prompt, full), Catch::Contains("not empty"));
  a.adopt(full);
  REQUIRE(a.position() == 50);
}

TEST_CASE("PrunedGeneration::step_batch: one batched forward equals each generation stepped alone", "[driver][batch]") {
  const bool gemma = GENERATE(false, true);
  CAPTURE(gemma);
  const LlamaModel model = random_model(shape(gemma));
  const LlamaEngine engine(model);
  PruneSpec spec;
  spec.protection = {2, 4};
  spec.budget = Budget::keep(0.4);
  spec.schedule = {ScheduleMode::kChunked, 16, 4};
  ForwardOptions run;
  run.chunk_size = 16;
  // three sequences at different positions: pruned, pruned, full cache
  const std::vector<int> lengths = {40, 67, 23};
  std::vector<std::unique_ptr<PrunedGeneration<HostCache>>> batch, alone;
  std::vector<int> next;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    const std::optional<PruneSpec> sp = s < 2 ? std::optional<PruneSpec>(spec) : std::nullopt;
    const std::vector<int> prompt = random_tokens(lengths[s], model.config.vocab_size, 40 + static_cast<unsigned>(s));
    batch.push_back(std::make_unique<PrunedGeneration<HostCache>>(engine, engine.make_cache(), sp, PolicyCurves{}, nullptr, run));
    alone.push_back(std::make_unique<PrunedGeneration<HostCache>>(engine, engine.make_cache(), sp, PolicyCurves{}, nullptr, run));
    REQUIRE(batch.back()->prefill(prompt) == alone.back()->prefill(prompt));
    next.push_back(last_argmax(alone.back()->step(7)));
    batch.back()->step(7);
  }
  std::vector<PrunedGeneration<HostCache>*> ptrs;
  for (auto& g : batch) ptrs.push_back(g.get());
  double worst = 0.0;
  for (int i = 0; i < 20; ++i) {
    const RowMatrix got = PrunedGeneration<HostCache>::step_batch(ptrs, next);
    REQUIRE(got.rows() == 3);
    for (std::size_t s = 0; s < batch.size(); ++s) {
      CAPTURE(i, s);
      const RowMatrix want = alone[s]->step(next[s]);
      worst = std::max(worst, static_cast<double>((got.row(static_cast<Eigen::Index>(s)) - want.row(0)).cwiseAbs().maxCoeff()));
      REQUIRE(batch[s]->position() == alone[s]->position());
      REQUIRE(batch[s]->cache().lengths() == alone[s]->cache().lengths());
      for (int l = 0; l < model.config.n_layers; ++l)
        for (int h = 0; h < model.config.n_kv_heads; ++h) {
          const auto& a = batch[s]->cache().layer(l);
          const auto& b = alone[s]->cache().layer(l);
          REQUIRE(std::equal(a.positions(h), a.positions(h) + a.size(h), b.positions(h)));
        }
      REQUIRE(batch[s]->report().evictions == alone[s]->report().evictions);
      next[s] = last_argmax(want);
    }
  }
  REQUIRE(worst < 1e-4);
  REQUIRE(batch[0]->report().evictions > 3);
  // errors: nothing changes in any generation
  const auto lengths_of = [&] {
    std::vector<std::vector<int>> out;
    for (auto& g : batch) out.push_back(g->cache().lengths());
    return out;
  };
  const auto before = lengths_of();
  const std::int32_t pos_before = batch[1]->position();
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>::step_batch(ptrs, {1, 2}), Catch::Contains("3 generations and 2 tokens"));
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>::step_batch({ptrs[0], ptrs[0]}, {1, 2}), Catch::Contains("given twice"));
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>::step_batch(ptrs, {1, model.config.vocab_size, 2}),
                      Catch::Contains("token " + std::to_string(model.config.vocab_size) + " outside"));
  PrunedGeneration<HostCache> fresh(engine, engine.make_cache(), std::nullopt, {}, nullptr, run);
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>::step_batch({ptrs[0], &fresh}, {1, 2}), Catch::Contains("no prefilled prompt"));
  const LlamaEngine other(model);
  PrunedGeneration<HostCache> elsewhere(other, other.make_cache(), std::nullopt, {}, nullptr, run);
  elsewhere.prefill({1, 2, 3});
  REQUIRE_THROWS_WITH(PrunedGeneration<HostCache>::step_batch({ptrs[0], &elsewhere}, {1, 2}), Catch::Contains("another engine"));
  REQUIRE(lengths_of() == before);
  REQUIRE(batch[1]->position() == pos_before);
}
