// Tests of EvictionSchedule::observe_from (eviction_schedule.hpp): a prefill in chunks and a
// decode that form only the attention rows observe_from asks for give the same logits, the same
// evictions and the same caches, bit for bit, as forming every row; and they form fewer rows where
// the scorer keeps only its last positions (SnapKV, TOVA), none fewer for H2O. (Between
// evictions the scorers' state may differ: observe_from promises the rows of the next eviction.)

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/engine_lookahead.hpp"
#include "support/random_model.hpp"

using namespace depthkv;
using depthkv::llama::ForwardOptions;
using depthkv::llama::LlamaEngine;
using depthkv::llama::RowMatrix;

namespace {

struct ObserveRun {
  std::vector<RowMatrix> logits;  // every call's
  llama::HostCache cache;
  long long rows = 0;             // attention rows handed to the observer
  std::vector<std::vector<int>> budgets;  // every eviction's per-layer budgets
};

// Prefill of `prompt` in calls of `chunk` tokens, then `decode` teacher-forced tokens one call
// each, the schedule called after every call; `use_from`: observe_from before every call.
ObserveRun observe_run(const LlamaEngine& engine, const depthkv::detail::ScheduleConfig& sc, const std::vector<int>& tokens, int prompt,
                       int chunk, bool use_from) {
  const auto& c = engine.config();
  EvictionSchedule s(sc, c.n_layers, c.n_heads, c.n_kv_heads);
  ObserveRun r{{}, engine.make_cache(), 0, {}};
  int evictions = 0;
  const AttentionObserver feed = s.observer();
  ForwardOptions opt;
  opt.observer = [&](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
    r.rows += nq;
    feed(l, q, p0, nq, pr, ld, n);
  };
  for (int p0 = 0; p0 < static_cast<int>(tokens.size());) {
    const int n = p0 < prompt ? std::min(chunk, prompt - p0) : 1;
    opt.observe_from = use_from ? s.observe_from(n) : 0;
    r.logits.push_back(engine.forward(tokens.data() + p0, n, p0, r.cache, opt));
    if (p0 < prompt)
      s.after_chunk(r.cache);
    else
      s.after_decode_step(r.cache);
    if (s.n_evictions() > evictions) r.budgets.push_back(s.budgets());
    evictions = s.n_evictions();
    p0 += n;
  }
  return r;
}

bool same_caches(const llama::HostCache& a, const llama::HostCache& b) {
  for (int l = 0; l < a.n_layers(); ++l) {
    const HostLayer<float>& x = a.layer(l);
    const HostLayer<float>& y = b.layer(l);
    for (int h = 0; h < x.n_kv_heads(); ++h) {
      if (x.size(h) != y.size(h)) return false;
      for (int j = 0; j < x.size(h); ++j)
        if (x.positions(h)[j] != y.positions(h)[j] ||
            std::memcmp(x.key(h, j), y.key(h, j), sizeof(float) * static_cast<std::size_t>(x.head_dim())) != 0)
          return false;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("observe_from: the rows it skips change nothing, bit for bit", "[schedule][observe_from]") {
  const llama::LlamaModel model = depthkv_test::random_model(depthkv_test::eval_spec(31, 3));
  const LlamaEngine engine(model);
  const std::vector<int> tokens = depthkv_test::random_tokens(200, model.config.vocab_size, 5);
  for (const char* scorer : {"snapkv", "tova", "h2o"})
    for (int window : {4, 16})
      for (int interval : {1, 5, 24})
        for (int chunk : {7, 40}) {
          CAPTURE(scorer, window, interval, chunk);
          depthkv::detail::ScheduleConfig sc;
          sc.budget.keep_ratio = 0.3;
          sc.protection = {2, 3};
          sc.scorer = scorer_config(scorer);
          sc.scorer.window = window;
          sc.interval = interval;
          const ObserveRun all = observe_run(engine, sc, tokens, 120, chunk, false);
          const ObserveRun some = observe_run(engine, sc, tokens, 120, chunk, true);
          REQUIRE(all.logits.size() == some.logits.size());
          for (std::size_t i = 0; i < all.logits.size(); ++i) REQUIRE(all.logits[i] == some.logits[i]);
          REQUIRE(same_caches(all.cache, some.cache));
          REQUIRE(all.budgets == some.budgets);
          REQUIRE(all.budgets.size() >= 5);  // evictions happened (200 tokens, intervals up to 24)
          const long long per_row = static_cast<long long>(model.config.n_layers) * model.config.n_heads;
          REQUIRE(all.rows == per_row * 200);
          if (std::string(scorer) == "h2o") REQUIRE(some.rows == all.rows);
          // the scorer keeps its last w positions: fewer rows whenever an interval or chunk spans more
          if (std::string(scorer) != "h2o" && (interval > window || chunk > window)) REQUIRE(some.rows < all.rows);
        }
}

TEST_CASE("observe_from: positions from the interval, the window and the call's length", "[schedule][observe_from]") {
  depthkv::detail::ScheduleConfig sc;
  sc.budget.keep_ratio = 0.5;
  sc.scorer = scorer_config("snapkv");
  sc.scorer.window = 8;
  sc.interval = 32;
  EvictionSchedule s(sc, 2, 4, 2);
  REQUIRE(s.observe_from() == 24);      // the first eviction after position 31 needs 24..31
  REQUIRE(s.observe_from(100) == 92);   // a call of 100 tokens is followed by an eviction
  REQUIRE(s.observe_from(10) == 24);
  REQUIRE_THROWS_WITH(s.observe_from(0), Catch::Contains("n_tokens must be >= 1"));
  sc.scorer = scorer_config("h2o");
  REQUIRE(EvictionSchedule(sc, 2, 4, 2).observe_from() == 0);
  sc.scorer = scorer_config("knorm");
  REQUIRE(EvictionSchedule(sc, 2, 4, 2).observe_from() == std::numeric_limits<std::int32_t>::max());
}
