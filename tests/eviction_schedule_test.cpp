// Tests of depthkv/eviction_schedule.hpp: EvictionSchedule on the reference engine with random
// models (budget bounds after every chunk and interval, exact totals, one chunk == oneshot bit for
// bit, H2O state after compaction, all-or-nothing errors) and score_and_evict's move to the core.

#include "depthkv/eviction_schedule.hpp"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "support/random_model.hpp"

using namespace depthkv;
using depthkv::llama::ForwardOptions;
using depthkv::llama::LlamaEngine;
using depthkv::llama::LlamaModel;

namespace {

using depthkv_test::random_tokens;

LlamaModel model_of(unsigned seed, int layers = 4) { return depthkv_test::random_model(depthkv_test::eval_spec(seed, layers)); }

long long sum_of(const std::vector<int>& v) {
  long long s = 0;
  for (int x : v) s += x;
  return s;
}

/// A chunked (or decode) spec of the evaluator's settings `cfg` (its first scorer).
PruneSpec schedule_spec(const llama::EvalConfig& cfg, Budget budget, ScheduleMode mode = ScheduleMode::kChunked,
                        int interval = 1) {
  PruneSpec s = cfg.spec;
  if (!cfg.scorers.empty()) s.scorer = cfg.scorers.front();
  s.budget = budget;
  s.schedule = {mode, cfg.spec.schedule.chunk, interval};
  return s;
}

bool same_layer(const HostLayer<float>& a, const HostLayer<float>& b) {
  if (a.n_kv_heads() != b.n_kv_heads() || a.head_dim() != b.head_dim()) return false;
  for (int h = 0; h < a.n_kv_heads(); ++h) {
    if (a.size(h) != b.size(h)) return false;
    const std::size_t bytes = static_cast<std::size_t>(a.head_dim()) * sizeof(float);
    for (int j = 0; j < a.size(h); ++j) {
      if (a.positions(h)[j] != b.positions(h)[j]) return false;
      if (std::memcmp(a.key(h, j), b.key(h, j), bytes) != 0) return false;
      if (std::memcmp(a.value(h, j), b.value(h, j), bytes) != 0) return false;
    }
  }
  return true;
}

bool same_cache(const llama::HostCache& a, const llama::HostCache& b) {
  if (a.n_layers() != b.n_layers()) return false;
  for (int l = 0; l < a.n_layers(); ++l)
    if (!same_layer(a.layer(l), b.layer(l))) return false;
  return true;
}

bool same_scores(const std::vector<TokenScorer>& a, const std::vector<TokenScorer>& b, const llama::HostCache& cache) {
  return layer_scores(a, cache) == layer_scores(b, cache);
}

// Prefills `tokens` in chunks of `chunk`, calling the schedule after each; checks the bounds.
void run_chunked(const LlamaEngine& engine, EvictionSchedule& s, llama::HostCache& cache, const std::vector<int>& tokens,
                 int chunk, int interval) {
  ForwardOptions opt;
  opt.chunk_size = chunk;
  opt.all_logits = false;
  opt.observer = s.observer();
  opt.after_chunk = [&](int, std::int32_t) {
    const bool evicted = s.after_chunk(cache);
    const std::vector<int> held = cache.lengths();
    const long long B = s.global_budget(s.tokens_seen(), held);
    if (evicted) {
      REQUIRE(sum_of(held) == B);  // total exact
      REQUIRE(held == s.budgets());
    }
    if (!s.budgets().empty())
      for (std::size_t l = 0; l < held.size(); ++l)  // budget plus at most one interval (or chunk)
        REQUIRE(held[l] <= s.budgets()[l] + std::max(interval - 1, evicted ? 0 : chunk));
  };
  engine.prefill(tokens, 0, cache, opt);
}

}  // namespace

TEST_CASE("EvictionSchedule: one chunk equals score_and_evict bit for bit", "[schedule]") {
  const LlamaModel model = model_of(11);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const std::vector<int> tokens = random_tokens(96, c.vocab_size, 1);
  for (double keep : {0.0, 0.1, 0.3, 1.0}) {
    CAPTURE(keep);
    // oneshot
    llama::HostCache a = engine.make_cache();
    std::vector<TokenScorer> sa = llama::make_scorers(c, ScorerConfig{});
    ForwardOptions opt;
    opt.observer = observe_into(sa);
    opt.all_logits = false;
    engine.prefill(tokens, 0, a, opt);
    depthkv::detail::PruneRequest req;
    req.budget.keep_ratio = keep;
    req.protection = {2, 4};
    if (keep < 0.1) req.budget.keep_ratio = 0.1;  // 0.0 is below the protected tokens: raised by the schedule only
    score_and_evict(a, sa, req);
    // schedule, one chunk
    depthkv::detail::ScheduleConfig sc;
    sc.budget.keep_ratio = req.budget.keep_ratio;
    sc.protection = req.protection;
    EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
    llama::HostCache b = engine.make_cache();
    run_chunked(engine, s, b, tokens, 1024, 1);
    REQUIRE(same_cache(a, b));
    REQUIRE(same_scores(sa, s.scorers(), a));
  }
}

TEST_CASE("EvictionSchedule: bounds after every chunk, exact totals (ratio and fixed budgets)", "[schedule]") {
  const LlamaModel model = model_of(12);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const std::vector<int> tokens = random_tokens(200, c.vocab_size, 2);
  for (int chunk : {1, 7, 32, 64})
    for (int interval : {1, 5, 32})
      for (int fixed : {0, 1}) {
        CAPTURE(chunk, interval, fixed);
        depthkv::detail::ScheduleConfig sc;
        if (fixed)
          sc.budget.total_tokens = 120;
        else
          sc.budget.keep_ratio = 0.2;
        sc.protection = {1, 3};
        sc.interval = interval;
        EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
        llama::HostCache cache = engine.make_cache();
        run_chunked(engine, s, cache, tokens, chunk, interval);
        REQUIRE(s.tokens_seen() == 200);
        REQUIRE(s.n_evictions() > 0);
        // every layer ends within its budget plus one interval (or chunk)
        const std::vector<int> held = cache.lengths();
        for (std::size_t l = 0; l < held.size(); ++l) REQUIRE(held[l] <= s.budgets()[l] + std::max(interval, chunk));
        // the cache is still usable: decode steps with the schedule keep it bounded
        ForwardOptions opt;
        opt.observer = s.observer();
        for (int t = 0; t < 40; ++t) {
          const int tok = t % c.vocab_size;
          engine.forward(&tok, 1, 200 + t, cache, opt);
          const bool ev = s.after_decode_step(cache);
          const std::vector<int> h = cache.lengths();
          if (ev) REQUIRE(sum_of(h) == s.global_budget(s.tokens_seen(), h));
          for (std::size_t l = 0; l < h.size(); ++l)
            REQUIRE(h[l] <= s.budgets()[l] + std::max(interval - 1, t == 0 ? chunk : 0) + 1);
        }
        if (fixed) {
          REQUIRE(sum_of(s.budgets()) == 120);
        }
      }
}

TEST_CASE("EvictionSchedule: decode-time eviction every interval tokens", "[schedule]") {
  const LlamaModel model = model_of(13, 3);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  depthkv::detail::ScheduleConfig sc;
  sc.budget.total_tokens = 3 * 20;
  sc.interval = 8;
  sc.protection = {1, 2};
  EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache cache = engine.make_cache();
  ForwardOptions opt;
  opt.observer = s.observer();
  int evictions = 0;
  for (int t = 0; t < 100; ++t) {
    const int tok = (t * 7) % c.vocab_size;
    engine.forward(&tok, 1, t, cache, opt);
    if (s.after_decode_step(cache)) {
      ++evictions;
      REQUIRE(cache.lengths() == std::vector<int>(3, 20));
      REQUIRE(s.pending() == 0);
    }
    for (int n : cache.lengths()) REQUIRE(n <= 20 + sc.interval - 1);
  }
  // first eviction once the cache exceeds 20 tokens per layer (t = 20), then every 8 tokens
  REQUIRE(evictions == 1 + (100 - 21) / 8);
}

TEST_CASE("EvictionSchedule: H2O state after compaction equals a scorer fed only the kept history", "[schedule]") {
  // H2O: s_j = sum_i a_ij, so after eviction the survivors' accumulators are exactly the sums of
  // the probability columns of the kept slots; later rows (over the compacted cache) add on top.
  const LlamaModel model = model_of(14, 2);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  depthkv::detail::ScheduleConfig sc;
  sc.budget.keep_ratio = 0.4;
  sc.interval = 1;
  EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache cache = engine.make_cache();
  // record every attention row the engine produces, per layer and query head, with the cache's
  // positions at the time (to replay only the kept columns)
  struct Rec {
    int layer, q_head, n;
    std::vector<float> row;
    std::vector<std::int32_t> pos;  // position of each column
  };
  std::vector<Rec> recs;
  const AttentionObserver inner = s.observer();
  ForwardOptions opt;
  opt.chunk_size = 16;
  opt.all_logits = false;
  opt.observer = [&](int layer, int q_head, std::int32_t q_pos0, int nq, const float* probs, int ld, int n) {
    inner(layer, q_head, q_pos0, nq, probs, ld, n);
    const int kvh = q_head / (c.n_heads / c.n_kv_heads);
    for (int i = 0; i < nq; ++i) {
      Rec r{layer, q_head, n, std::vector<float>(probs + i * ld, probs + i * ld + n), {}};
      r.pos.assign(cache.layer(layer).positions(kvh), cache.layer(layer).positions(kvh) + n);
      recs.push_back(std::move(r));
    }
  };
  opt.after_chunk = [&](int, std::int32_t) { s.after_chunk(cache); };
  engine.prefill(random_tokens(80, c.vocab_size, 3), 0, cache, opt);
  REQUIRE(s.n_evictions() == 5);
  // reference: per layer and KV head, the sum over every recorded row of the columns whose
  // position is still held
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerScores got = s.scorers()[static_cast<std::size_t>(l)].scores(cache.layer(l));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const auto& L = cache.layer(l);
      std::vector<double> want(static_cast<std::size_t>(L.size(h)), 0.0);
      for (const Rec& r : recs) {
        if (r.layer != l || r.q_head / (c.n_heads / c.n_kv_heads) != h) continue;
        for (int j = 0; j < r.n; ++j)
          for (int k = 0; k < L.size(h); ++k)
            if (L.positions(h)[k] == r.pos[static_cast<std::size_t>(j)]) want[static_cast<std::size_t>(k)] += r.row[static_cast<std::size_t>(j)];
      }
      for (int k = 0; k < L.size(h); ++k)
        REQUIRE(got[static_cast<std::size_t>(h)][static_cast<std::size_t>(k)] ==
                Approx(want[static_cast<std::size_t>(k)]).epsilon(1e-5).margin(1e-6));
    }
  }
}

TEST_CASE("EvictionSchedule: errors leave the cache, the scorers and the counters unchanged", "[schedule]") {
  const LlamaModel model = model_of(15, 3);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  SECTION("bad configurations") {
    depthkv::detail::ScheduleConfig sc;
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads), Error);  // no budget
    sc.budget.keep_ratio = 0.5;
    sc.budget.total_tokens = 10;
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads), Error);  // both
    sc.budget.total_tokens = -1;
    sc.budget.keep_ratio = 1.5;
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads), Error);
    sc.budget.keep_ratio = 0.5;
    sc.interval = 0;
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads), Error);
    sc.interval = 1;
    sc.policy = AllocationPolicy::kOptimal;
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads), Error);  // no profile
    sc.policy = AllocationPolicy::kUniform;
    sc.budget.lengths = {1, 2, 3};
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads), Error);
    sc.budget.lengths.clear();
    REQUIRE_THROWS_AS(EvictionSchedule(sc, 3, c.n_heads, 3), Error);  // heads not a multiple
    REQUIRE_NOTHROW(EvictionSchedule(sc, 3, c.n_heads, c.n_kv_heads));
  }
  SECTION("bad calls") {
    depthkv::detail::ScheduleConfig sc;
    sc.budget.keep_ratio = 0.5;
    sc.interval = 4;
    EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
    llama::HostCache cache = engine.make_cache();
    ForwardOptions opt;
    opt.observer = s.observer();
    opt.all_logits = false;
    engine.prefill(random_tokens(10, c.vocab_size, 4), 0, cache, opt);
    const llama::HostCache before = cache;
    const std::vector<TokenScorer> scorers_before = s.scorers();
    auto unchanged = [&] {
      REQUIRE(same_cache(cache, before));
      REQUIRE(same_scores(s.scorers(), scorers_before, before));
      REQUIRE(s.tokens_seen() == 0);
      REQUIRE(s.n_evictions() == 0);
    };
    // a cache of another depth
    llama::HostCache other(std::vector<HostLayer<float>>(2, HostLayer<float>(c.n_kv_heads, c.head_dim)));
    REQUIRE_THROWS_AS(s.after_chunk(other), Error);
    unchanged();
    // layers grown by different counts
    const std::vector<float> kv(static_cast<std::size_t>(c.head_dim), 0.5f);
    llama::HostCache uneven = cache;
    for (int h = 0; h < c.n_kv_heads; ++h) uneven.layer(1).append_head(h, kv.data(), kv.data(), 10);
    REQUIRE_THROWS_AS(s.after_chunk(uneven), Error);
    unchanged();
    // a score the evictor rejects (NaN attention observed): nothing changes
    std::vector<float> nan_row(10, 0.0f);
    nan_row[3] = std::numeric_limits<float>::quiet_NaN();
    REQUIRE_THROWS_AS(s.scorers()[0].observe(0, 9, nan_row.data(), 10), Error);  // rejected at the source
    unchanged();
    // an infeasible fixed budget cannot happen (raised to the protected tokens); a valid call works
    REQUIRE(s.after_chunk(cache));
    REQUIRE(s.tokens_seen() == 10);
    REQUIRE(cache.lengths() == std::vector<int>(static_cast<std::size_t>(c.n_layers), 5));
    // evicted outside the schedule: the layer shrank
    llama::HostCache shrunk = cache;
    std::vector<std::int32_t> keep = {0, 1};
    for (int h = 0; h < c.n_kv_heads; ++h) shrunk.layer(0).compact(h, keep.data(), 2);
    const llama::HostCache after = cache;
    REQUIRE_THROWS_AS(s.after_chunk(shrunk), Error);
    REQUIRE(s.tokens_seen() == 10);
    REQUIRE(same_cache(cache, after));
  }
}

TEST_CASE("EvictionSchedule: keep-all and protection-raised budgets", "[schedule]") {
  const LlamaModel model = model_of(16, 2);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  depthkv::detail::ScheduleConfig sc;
  sc.budget.keep_ratio = 1.0;
  EvictionSchedule full(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache a = engine.make_cache();
  run_chunked(engine, full, a, random_tokens(50, c.vocab_size, 5), 8, 1);
  REQUIRE(full.n_evictions() == 0);
  REQUIRE(a.lengths() == std::vector<int>(2, 50));
  sc.budget.keep_ratio = 0.0;
  sc.protection = {2, 3};
  EvictionSchedule none(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache b = engine.make_cache();
  run_chunked(engine, none, b, random_tokens(50, c.vocab_size, 5), 8, 1);
  REQUIRE(b.lengths() == std::vector<int>(2, 5));  // only the protected tokens
  for (int h = 0; h < c.n_kv_heads; ++h) {
    const std::int32_t* p = b.layer(0).positions(h);
    REQUIRE(std::vector<std::int32_t>(p, p + 5) == std::vector<std::int32_t>{0, 1, 47, 48, 49});
  }
}

TEST_CASE("PruningEvaluator, chunked spec: one chunk equals oneshot, chunked peak within budget + one chunk",
          "[schedule][eval]") {
  const LlamaModel model = model_of(17, 3);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const std::vector<llama::EvalWindow> windows = depthkv_test::random_windows(3, 96, 24, c.vocab_size, 20);
  const std::size_t token_bytes =
      static_cast<std::size_t>(c.n_layers) * static_cast<std::size_t>(c.n_kv_heads) * static_cast<std::size_t>(c.head_dim) * 2 * sizeof(float);
  for (int chunk : {1024, 16}) {
    CAPTURE(chunk);
    llama::EvalConfig cfg;
    cfg.spec.protection = {1, 2};
    cfg.spec.schedule.chunk = chunk;
    cfg.n_threads = 1;
    const llama::PruningEvaluator ev(engine, windows, cfg);
    const std::vector<llama::WindowResult> sched = ev.evaluate(schedule_spec(cfg, Budget::keep(0.25)), {});
    BudgetRequest br;
    br.lengths.assign(3, 96);
    br.keep_ratio = 0.25;
    br.floors = protection_floors(br.lengths, cfg.spec.protection);
    const std::vector<int> plan = BudgetAllocator().allocate(AllocationPolicy::kUniform, br);
    const std::vector<llama::WindowResult> once = ev.evaluate_budgets(plan);
    for (std::size_t w = 0; w < windows.size(); ++w) {
      CAPTURE(w);
      REQUIRE(sched[w].budgets == plan);  // same final budget
      REQUIRE(sched[w].bytes_kept == once[w].bytes_kept);
      REQUIRE(sched[w].bytes_full_peak == token_bytes * 120);
      REQUIRE(once[w].bytes_full_peak == token_bytes * 120);
      REQUIRE(once[w].bytes_peak == token_bytes * 96);  // the full context, before the eviction
      const std::size_t end = once[w].bytes_kept + token_bytes * 24;
      if (chunk == 1024) {
        REQUIRE(sched[w].bytes_peak == once[w].bytes_peak);
        REQUIRE(sched[w].metrics.loss.kl == Approx(once[w].metrics.loss.kl).margin(1e-9));
        REQUIRE(sched[w].metrics.loss.dnll == Approx(once[w].metrics.loss.dnll).margin(1e-9));
      } else {  // never more than the budget of the tokens seen plus one chunk, or the end state
        REQUIRE(sched[w].bytes_peak <= std::max(end, once[w].bytes_kept + token_bytes * 16));
        REQUIRE(sched[w].bytes_peak < once[w].bytes_peak);
      }
    }
  }
}

TEST_CASE("PruningEvaluator, decode spec: equals decoding token by token, peak within budget + interval",
          "[schedule][eval]") {
  const LlamaModel model = model_of(19, 3);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const std::vector<llama::EvalWindow> windows = depthkv_test::random_windows(2, 32, 64, c.vocab_size, 40);
  const std::size_t token_bytes =
      static_cast<std::size_t>(c.n_layers) * static_cast<std::size_t>(c.n_kv_heads) * static_cast<std::size_t>(c.head_dim) * 2 * sizeof(float);
  llama::EvalConfig cfg;
  cfg.spec.protection = {1, 2};
  cfg.spec.schedule.chunk = 16;
  cfg.n_threads = 1;
  const llama::PruningEvaluator ev(engine, windows, cfg);
  for (const bool fixed : {false, true}) {
    for (int interval : {1, 8, 13}) {
      CAPTURE(fixed, interval);
      // a fixed total above the context: the cache first grows to it
      const Budget budget = fixed ? Budget::tokens(3 * 40) : Budget::keep(0.25);
      const PruneSpec spec = schedule_spec(cfg, budget, ScheduleMode::kDecode, interval);
      const auto dec = ev.evaluate(spec, {});
      const auto pre = ev.evaluate(schedule_spec(cfg, budget, ScheduleMode::kChunked, interval), {});
      for (std::size_t w = 0; w < windows.size(); ++w) {
        CAPTURE(w);
        // the reference: the same schedule, the continuation decoded one token at a time
        EvictionSchedule s(spec, {}, c.n_layers, c.n_heads, c.n_kv_heads);
        llama::HostCache cache = engine.make_cache();
        ForwardOptions po;
        po.chunk_size = cfg.spec.schedule.chunk;
        po.all_logits = false;
        po.observer = s.observer();
        std::size_t peak = 0;
        po.after_chunk = [&](int, std::int32_t) {
          peak = std::max(peak, cache.bytes());
          s.after_chunk(cache);
        };
        engine.prefill(windows[w].context, 0, cache, po);
        s.evict_now(cache);
        REQUIRE(dec[w].budgets == cache.lengths());
        ForwardOptions fo;
        fo.observer = s.observer();
        llama::RowMatrix logits(64, c.vocab_size);
        long long seen = 32;
        for (int t = 0; t < 64; ++t) {
          logits.row(t) = engine.forward(&windows[w].continuation[static_cast<std::size_t>(t)], 1, 32 + t, cache, fo);
          peak = std::max(peak, cache.bytes());
          ++seen;
          s.after_decode_step(cache);
          const long long B = s.global_budget(seen, cache.lengths());
          for (int n : cache.lengths()) REQUIRE(n <= (B + 2) / 3 + interval);  // budget plus at most one interval
        }
        const auto ref = depthkv::compare_logits(ev.full_logits(static_cast<int>(w)), logits,
                                               depthkv::continuation_targets(windows[w].continuation));
        REQUIRE(dec[w].metrics.loss.kl == Approx(ref.loss.kl).margin(1e-6));
        REQUIRE(dec[w].metrics.loss.dnll == Approx(ref.loss.dnll).margin(1e-6));
        REQUIRE(dec[w].bytes_peak == peak);
        REQUIRE(peak <= token_bytes * static_cast<std::size_t>(fixed ? 40 + interval : 24 + interval));
        REQUIRE(dec[w].bytes_peak < pre[w].bytes_peak);  // the continuation is bounded too
      }
    }
  }
}

TEST_CASE("PruningEvaluator chunked_plans: one chunk equals oneshot, chunks equal the uniform EvictionSchedule",
          "[schedule][eval]") {
  const LlamaModel model = model_of(23, 3);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const std::vector<llama::EvalWindow> windows = depthkv_test::random_windows(3, 96, 24, c.vocab_size, 60);
  llama::EvalConfig cfg;
  cfg.spec.protection = {1, 2};
  cfg.n_threads = 1;
  const std::vector<double> plan = {0.25, 0.25, 0.25};  // 0.25 * 16k tokens is an integer
  const std::vector<double> one_layer = {1.0, 0.25, 1.0};
  // one chunk: the same as eviction after the whole context
  cfg.spec.schedule.chunk = 1024;
  const llama::PruningEvaluator once(engine, windows, cfg);
  cfg.chunked_plans = true;
  const llama::PruningEvaluator once_chunked(engine, windows, cfg);
  for (const auto& p : {plan, one_layer}) {
    const auto a = once.evaluate_plan(p), b = once_chunked.evaluate_plan(p);
    for (std::size_t w = 0; w < windows.size(); ++w) {
      REQUIRE(a[w].budgets == b[w].budgets);
      REQUIRE(a[w].bytes_kept == b[w].bytes_kept);
      REQUIRE(b[w].metrics.loss.kl == Approx(a[w].metrics.loss.kl).margin(1e-9));
    }
  }
  // chunks of 16: every layer keeps a quarter of the tokens seen after each chunk, which is what the
  // uniform schedule at keep 0.25 gives (independent code: allocator + EvictionSchedule)
  cfg.spec.schedule.chunk = 16;
  const llama::PruningEvaluator chunked(engine, windows, cfg);
  const auto s = chunked.evaluate(schedule_spec(cfg, Budget::keep(0.25)), {});
  const auto p = chunked.evaluate_plan(plan);
  const auto q = chunked.evaluate_plan(one_layer);
  const auto o = once.evaluate_plan(one_layer), op = once.evaluate_plan(plan);
  for (std::size_t w = 0; w < windows.size(); ++w) {
    CAPTURE(w);
    REQUIRE(p[w].budgets == std::vector<int>(3, 24));
    REQUIRE(s[w].budgets == p[w].budgets);
    REQUIRE(p[w].bytes_kept == s[w].bytes_kept);
    REQUIRE(p[w].bytes_peak == s[w].bytes_peak);
    REQUIRE(p[w].metrics.loss.kl == Approx(s[w].metrics.loss.kl).margin(1e-9));
    REQUIRE(q[w].bytes_kept == o[w].bytes_kept);   // the same final budget as oneshot
    REQUIRE(p[w].bytes_peak < op[w].bytes_peak);   // no layer ever held the whole context
  }
  // the profiler's function runs under the chunked eviction as well
  const auto m = chunked.layer_metrics(1, {0.25});
  REQUIRE(m.size() == 1);
  for (std::size_t w = 0; w < windows.size(); ++w) REQUIRE(m[0].kl[w] == Approx(q[w].metrics.loss.kl).margin(1e-12));
}

TEST_CASE("EvictionSchedule with output-aware scores and adaptive heads: one chunk equals score_and_evict, "
          "layer totals exact after every eviction",
          "[schedule][head_budget]") {
  const LlamaModel model = model_of(23);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const std::vector<OutputProjection> wo = llama::output_projections(model);
  const std::vector<int> tokens = random_tokens(96, c.vocab_size, 3);
  ScorerConfig scfg;
  scfg.kind = ScorerKind::kSnapKV;
  scfg.window = 8;
  scfg.kernel = 3;
  scfg.output_aware = true;
  // oneshot
  llama::HostCache a = engine.make_cache();
  std::vector<TokenScorer> sa = llama::make_scorers(c, scfg);
  ForwardOptions opt;
  opt.observer = observe_into(sa);
  opt.all_logits = false;
  engine.prefill(tokens, 0, a, opt);
  depthkv::detail::PruneRequest req;
  req.budget.keep_ratio = 0.2;
  req.protection = {2, 4};
  req.head_allocation = HeadAllocation::kAdaptive;
  req.head_alpha = 0.1;
  req.output_projections = &wo;
  const PruneReport rep = score_and_evict(a, sa, req);
  // schedule, one chunk
  depthkv::detail::ScheduleConfig sc;
  sc.budget.keep_ratio = 0.2;
  sc.protection = req.protection;
  sc.scorer = scfg;
  sc.head_allocation = HeadAllocation::kAdaptive;
  sc.head_alpha = 0.1;
  sc.output_projections = &wo;
  EvictionSchedule one(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache b = engine.make_cache();
  ForwardOptions o1 = opt;
  o1.observer = one.observer();
  engine.prefill(tokens, 0, b, o1);
  REQUIRE(one.evict_now(b));
  REQUIRE(same_cache(a, b));
  bool uneven = false;
  for (int l = 0; l < c.n_layers; ++l) {
    int sum = 0;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      sum += a.layer(l).size(h);
      uneven |= a.layer(l).size(h) != rep.budgets[static_cast<std::size_t>(l)];
    }
    REQUIRE(sum == c.n_kv_heads * rep.budgets[static_cast<std::size_t>(l)]);
  }
  REQUIRE(uneven);
  // chunks of 16: after every eviction each layer holds its per-head budget times the heads, or
  // all its heads hold when a head is shorter than the budget
  EvictionSchedule many(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache m = engine.make_cache();
  ForwardOptions o2 = opt;
  o2.chunk_size = 16;
  o2.observer = many.observer();
  o2.after_chunk = [&](int, std::int32_t) {
    std::vector<std::vector<int>> sizes(static_cast<std::size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h) sizes[static_cast<std::size_t>(l)].push_back(m.layer(l).size(h));
    if (!many.after_chunk(m)) return;
    for (int l = 0; l < c.n_layers; ++l) {
      const int k = many.budgets()[static_cast<std::size_t>(l)];
      int want = 0, got = 0;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        want += std::min(k, sizes[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
        got += m.layer(l).size(h);
      }
      REQUIRE(got == want);
    }
  };
  engine.prefill(tokens, 0, m, o2);
  REQUIRE(many.n_evictions() >= 3);
  // score_and_evict refuses a bad split or missing projections before touching the cache or the scorers
  {
    llama::HostCache d = engine.make_cache();
    std::vector<TokenScorer> sd = llama::make_scorers(c, scfg);
    ForwardOptions od = opt;
    od.observer = observe_into(sd);
    engine.prefill(tokens, 0, d, od);
    const llama::HostCache copy = d;
    const std::vector<LayerScores> before = layer_scores(sd, d, &wo);
    depthkv::detail::PruneRequest r = req;
    r.head_alpha = 1.5;
    REQUIRE_THROWS_WITH(score_and_evict(d, sd, r), Catch::Contains("alpha 1.5 outside [0, 1]"));
    r = req;
    r.output_projections = nullptr;
    REQUIRE_THROWS_WITH(score_and_evict(d, sd, r), Catch::Contains("no output projection"));
    REQUIRE(same_cache(d, copy));
    REQUIRE(layer_scores(sd, d, &wo) == before);
  }
  // an output-aware scorer without projections is refused up front
  depthkv::detail::ScheduleConfig bad = sc;
  bad.output_projections = nullptr;
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads),
                      Catch::Contains("needs one output projection per layer"));
  bad = sc;
  bad.head_alpha = -0.5;
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads), Catch::Contains("head_split.alpha -0.5 outside [0, 1]"));
}

TEST_CASE("head curves in score_and_evict and EvictionSchedule: the head-optimal budgets, one chunk equals oneshot, "
          "exact totals per head after every eviction",
          "[schedule][head_budget]") {
  const LlamaModel model = model_of(29);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const int H = c.n_kv_heads;
  const std::vector<int> tokens = random_tokens(96, c.vocab_size, 5);
  // head curves: odd heads of every layer far more sensitive than even ones
  SensitivityProfile hp;
  hp.keep_ratios = {0.1, 0.3, 0.6};
  hp.loss.resize(c.n_layers * H, 3);
  for (int u = 0; u < c.n_layers * H; ++u) {
    const double s = (u % 2 ? 1.0 : 0.01) * (1.0 + 0.1 * u);
    hp.loss.row(u) << 0.9 * s, 0.5 * s, 0.2 * s;
  }
  for (HeadAllocation mode : {HeadAllocation::kUniform, HeadAllocation::kAdaptive}) {
    CAPTURE(to_string(mode));
    llama::HostCache a = engine.make_cache();
    std::vector<TokenScorer> sa = llama::make_scorers(c, ScorerConfig{});
    ForwardOptions opt;
    opt.observer = observe_into(sa);
    opt.all_logits = false;
    engine.prefill(tokens, 0, a, opt);
    depthkv::detail::PruneRequest req;
    req.budget.keep_ratio = 0.25;
    req.protection = {2, 4};
    req.head_profile = &hp;
    req.head_allocation = mode;
    req.head_alpha = 0.5;
    const PruneReport rep = score_and_evict(a, sa, req);
    // the budgets are head_optimal_budgets' on the same request
    BudgetRequest br;
    br.lengths.assign(static_cast<std::size_t>(c.n_layers), 96);
    br.keep_ratio = 0.25;
    br.floors = protection_floors(br.lengths, req.protection);
    REQUIRE(rep.head_budgets == head_optimal_budgets(hp, H, br));
    long long kept = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      long long layer_total = 0;
      for (int h = 0; h < H; ++h) {
        kept += a.layer(l).size(h);
        layer_total += rep.head_budgets[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)];
        if (mode == HeadAllocation::kUniform)
          REQUIRE(a.layer(l).size(h) == rep.head_budgets[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
        if (h % 2 == 0 && mode == HeadAllocation::kUniform)  // the insensitive heads give tokens away
          REQUIRE(a.layer(l).size(h) < a.layer(l).size(h + 1));
      }
      int held = 0;
      for (int h = 0; h < H; ++h) held += a.layer(l).size(h);
      REQUIRE(held == layer_total);  // an adaptive re-split keeps each layer's total
    }
    REQUIRE(kept == static_cast<long long>(H) * std::llround(0.25 * 96 * c.n_layers));
    // the schedule with one chunk evicts exactly the same
    depthkv::detail::ScheduleConfig sc;
    sc.budget.keep_ratio = 0.25;
    sc.protection = req.protection;
    sc.head_profile = &hp;
    sc.head_allocation = mode;
    sc.head_alpha = 0.5;
    EvictionSchedule one(sc, c.n_layers, c.n_heads, c.n_kv_heads);
    llama::HostCache b = engine.make_cache();
    ForwardOptions o1 = opt;
    o1.observer = one.observer();
    engine.prefill(tokens, 0, b, o1);
    REQUIRE(one.evict_now(b));
    REQUIRE(same_cache(a, b));
    REQUIRE(one.last_report().head_budgets == rep.head_budgets);
    // chunks of 16 with a fixed budget: after every eviction the heads hold exactly H * B
    sc.budget.keep_ratio = -1.0;
    sc.budget.total_tokens = 40 * c.n_layers;
    EvictionSchedule many(sc, c.n_layers, c.n_heads, c.n_kv_heads);
    llama::HostCache m = engine.make_cache();
    ForwardOptions o2 = opt;
    o2.chunk_size = 16;
    o2.observer = many.observer();
    int evictions = 0;
    o2.after_chunk = [&](int, std::int32_t) {
      if (!many.after_chunk(m)) return;
      ++evictions;
      long long held = 0;
      for (int l = 0; l < c.n_layers; ++l)
        for (int h = 0; h < H; ++h) held += m.layer(l).size(h);
      REQUIRE(held == static_cast<long long>(H) * 40 * c.n_layers);
    };
    engine.prefill(tokens, 0, m, o2);
    REQUIRE(evictions >= 3);
  }
  // a head profile of the wrong shape is refused
  depthkv::detail::ScheduleConfig bad;
  bad.budget.keep_ratio = 0.3;
  SensitivityProfile small = hp;
  small.loss.conservativeResize(c.n_layers, 3);
  bad.head_profile = &small;
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads), Catch::Contains("head profile has"));
}

TEST_CASE("EvictionSchedule with fixed targets: per-head targets of the tokens seen, only layers over them evicted",
          "[schedule]") {
  const LlamaModel model = model_of(31, 3);
  const LlamaEngine engine(model);
  const auto& c = model.config;
  const int n = 120;
  const std::vector<int> tokens = random_tokens(n, c.vocab_size, 7);
  depthkv::detail::ScheduleConfig sc;
  sc.protection = {1, 2};
  sc.targets.length = n;
  sc.targets.split = false;
  sc.targets.keep.assign(static_cast<std::size_t>(c.n_layers), std::vector<int>(static_cast<std::size_t>(c.n_kv_heads), n));
  sc.targets.keep[1][0] = 30;  // one head of one layer pruned, every other head keeps all
  EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  llama::HostCache cache = engine.make_cache();
  ForwardOptions opt;
  opt.chunk_size = 16;
  opt.all_logits = false;
  opt.observer = s.observer();
  int evictions = 0;
  opt.after_chunk = [&](int seen, std::int32_t) {
    const bool ev = s.after_chunk(cache);
    evictions += ev ? 1 : 0;
    if (!ev) return;
    REQUIRE(s.last_report().evictions[0].kept_slots.empty());  // layers within their targets are left alone
    REQUIRE(s.last_report().evictions[2].kept_slots.empty());
    REQUIRE(cache.layer(1).size(0) == keep_tokens(30.0 / n, seen, sc.protection));
    for (int h = 1; h < c.n_kv_heads; ++h) REQUIRE(cache.layer(1).size(h) == seen);
    REQUIRE(cache.layer(0).size(0) == seen);
  };
  engine.prefill(tokens, 0, cache, opt);
  REQUIRE(evictions == n / 16 + 1);  // after every chunk (the first chunk already holds more than 30/120 of it)
  REQUIRE(cache.layer(1).size(0) == 30);
  REQUIRE(s.budgets()[1] == (30 + (c.n_kv_heads - 1) * n + c.n_kv_heads / 2) / c.n_kv_heads);

  // bad plans name what is wrong
  depthkv::detail::ScheduleConfig bad = sc;
  bad.budget.keep_ratio = 0.5;
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads),
                      Catch::Contains("targets replace the global budget"));
  bad = sc;
  bad.targets.keep.pop_back();
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads), Catch::Contains("targets for 2 layers"));
  bad = sc;
  bad.targets.keep[2][1] = 2;
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads),
                      Catch::Contains("layer 2 head 1: target 2 below the 3 protected tokens"));
  bad = sc;
  bad.targets.length = 0;
  REQUIRE_THROWS_WITH(EvictionSchedule(bad, c.n_layers, c.n_heads, c.n_kv_heads),
                      Catch::Contains("targets.length must be >= 1"));
}
