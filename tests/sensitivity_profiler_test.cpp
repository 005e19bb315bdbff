#include "depthkv/sensitivity_profiler.hpp"

#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

using Catch::Contains;
using depthkv::KeepPlan;
using depthkv::SampleMetrics;
using depthkv::SensitivityProfiler;

namespace {

/// A synthetic engine: layer l's true mean KL at keep ratio r is a_l (1 - r)^2; each sample adds
/// deterministic zero-mean noise that depends only on (layer, ratio, sample), so reruns and
/// resumed runs see the same numbers.
struct SyntheticEngine {
  int n_layers = 6;
  int n_samples = 400;
  double noise = 0.05;
  std::vector<double> amp = {2.0, 0.3, 1.0, 0.05, 0.7, 1.5};
  int calls = 0;

  double truth(int l, double r) const { return amp[static_cast<std::size_t>(l)] * (1.0 - r) * (1.0 - r); }

  SampleMetrics eval(int l, double r) const {
    SampleMetrics m;
    std::mt19937 rng(static_cast<unsigned>(1000 * l + std::lround(r * 1000)));
    std::normal_distribution<double> nd(0.0, noise);
    for (int i = 0; i < n_samples; ++i) {
      const double e = nd(rng);
      m.kl.push_back(std::max(0.0, truth(l, r) + e));
      m.dnll.push_back(0.5 * truth(l, r) + e);
      m.top1_disagree.push_back(std::min(1.0, std::max(0.0, 0.1 * truth(l, r) + 0.1 * e)));
    }
    return m;
  }

  SampleMetrics operator()(const KeepPlan& plan) {
    ++calls;
    REQUIRE(static_cast<int>(plan.size()) == n_layers);
    int pruned = -1;
    for (int l = 0; l < n_layers; ++l) {
      if (plan[static_cast<std::size_t>(l)] != 1.0) {
        REQUIRE(pruned == -1);  // only one layer pruned per run
        pruned = l;
      }
    }
    REQUIRE(pruned >= 0);
    return eval(pruned, plan[static_cast<std::size_t>(pruned)]);
  }
};

}  // namespace

TEST_CASE("profiler recovers known per-layer losses", "[profiler]") {
  SyntheticEngine eng;
  SensitivityProfiler prof(eng.n_layers);
  REQUIRE(prof.total_runs() == 36);
  REQUIRE(prof.run([&](const KeepPlan& p) { return eng(p); }));
  REQUIRE(eng.calls == 36);
  const depthkv::MetricProfiles mp = prof.result();
  REQUIRE(mp.n_samples == 400);
  REQUIRE_NOTHROW(mp.validate());
  const auto& r = mp.kl.keep_ratios;
  REQUIRE(r == std::vector<double>{0.05, 0.1, 0.2, 0.3, 0.5, 0.75});
  for (int l = 0; l < eng.n_layers; ++l) {
    for (int k = 0; k < 6; ++k) {
      const double t = eng.truth(l, r[static_cast<std::size_t>(k)]);
      // dnll has exactly zero-mean noise: within 4 standard errors of the truth.
      REQUIRE(std::abs(mp.dnll.loss(l, k) - 0.5 * t) <= 4.0 * mp.dnll.loss_stderr(l, k));
      REQUIRE(mp.dnll.loss_stderr(l, k) == Approx(eng.noise / std::sqrt(400.0)).epsilon(0.2));
      // kl is clipped at 0 per sample, so only approximately unbiased for small truths.
      REQUIRE(mp.kl.loss(l, k) == Approx(t).margin(0.02));
      REQUIRE(mp.top1.loss(l, k) >= 0.0);
    }
  }
  // The allocator-ready profile keeps the order of the layers' sensitivities.
  const depthkv::SensitivityProfile p = mp.profile(depthkv::LossMetric::kKL);
  REQUIRE(p.loss(0, 2) > p.loss(5, 2));
  REQUIRE(p.loss(5, 2) > p.loss(2, 2));
  REQUIRE(p.loss(3, 2) < p.loss(1, 2));
}

TEST_CASE("mean and standard error by hand", "[profiler]") {
  const auto ms = depthkv::mean_and_stderr({1.0, 2.0, 3.0, 4.0});
  REQUIRE(ms.first == Approx(2.5));
  REQUIRE(ms.second == Approx(std::sqrt(5.0 / 3.0 / 4.0)));
  REQUIRE(depthkv::mean_and_stderr({7.0}).second == 0.0);
}

TEST_CASE("batched runs give the same profile as single runs", "[profiler]") {
  SyntheticEngine eng;
  SensitivityProfiler a(eng.n_layers), b(eng.n_layers);
  REQUIRE(a.run([&](const KeepPlan& p) { return eng(p); }));
  int batches = 0;
  REQUIRE(b.run_batched([&](int layer, const std::vector<double>& ratios) {
    ++batches;
    REQUIRE(ratios.size() == 6);
    std::vector<SampleMetrics> out;
    for (double r : ratios) out.push_back(eng.eval(layer, r));
    return out;
  }));
  REQUIRE(batches == eng.n_layers);
  REQUIRE(a.result().kl.loss == b.result().kl.loss);
  REQUIRE(a.result().dnll.loss_stderr == b.result().dnll.loss_stderr);
  REQUIRE(a.result().top1.loss == b.result().top1.loss);
}

TEST_CASE("stop and resume give the uninterrupted result", "[profiler]") {
  SyntheticEngine eng;
  SensitivityProfiler full(eng.n_layers);
  REQUIRE(full.run([&](const KeepPlan& p) { return eng(p); }));

  // Stop through the progress callback after 7 runs.
  depthkv::ProfilerOptions opts;
  std::vector<std::pair<int, int>> seen;
  opts.progress = [&](int done, int total) {
    seen.emplace_back(done, total);
    return done < 7;
  };
  SensitivityProfiler first(eng.n_layers, opts);
  REQUIRE_FALSE(first.run([&](const KeepPlan& p) { return eng(p); }));
  REQUIRE(first.state().n_done() == 7);
  REQUIRE(seen.back() == std::make_pair(7, 36));
  REQUIRE_THROWS_WITH(first.result(), Contains("7 of 36 runs done"));
  const depthkv::ProfilerState saved = first.state();

  // Stop through the flag, in batched mode, after resuming.
  std::atomic<bool> stop{false};
  depthkv::ProfilerOptions opts2;
  opts2.stop = &stop;
  opts2.progress = [&](int done, int) {
    if (done >= 20) stop = true;
    return true;
  };
  SensitivityProfiler second(eng.n_layers, opts2);
  second.resume(saved);
  std::vector<std::size_t> asked;
  auto batched = [&](int layer, const std::vector<double>& ratios) {
    asked.push_back(ratios.size());
    std::vector<SampleMetrics> out;
    for (double r : ratios) out.push_back(eng.eval(layer, r));
    return out;
  };
  REQUIRE_FALSE(second.run_batched(batched));
  REQUIRE(asked.front() == 5);  // layer 1: ratio 0.05 was done before the stop
  REQUIRE(second.state().n_done() == 24);

  SensitivityProfiler third(eng.n_layers);
  third.resume(second.state());
  eng.calls = 0;
  REQUIRE(third.run([&](const KeepPlan& p) { return eng(p); }));
  REQUIRE(eng.calls == 12);
  REQUIRE(third.result().kl.loss == full.result().kl.loss);
  REQUIRE(third.result().kl.loss_stderr == full.result().kl.loss_stderr);
  REQUIRE(third.result().dnll.loss == full.result().dnll.loss);
  REQUIRE(third.result().top1.loss == full.result().top1.loss);
}

TEST_CASE("profiler rejects malformed engine output and states", "[profiler]") {
  SyntheticEngine eng;
  eng.n_layers = 2;
  REQUIRE_THROWS_WITH(SensitivityProfiler(0), Contains("n_layers 0"));
  depthkv::ProfilerOptions bad;
  bad.keep_ratios = {0.5, 0.2};
  REQUIRE_THROWS_WITH(SensitivityProfiler(2, bad), Contains("not strictly ascending"));

  SensitivityProfiler p(2);
  int n = 0;
  REQUIRE_THROWS_WITH(p.run([&](const KeepPlan&) {
    SampleMetrics m = eng.eval(0, 0.5);
    if (++n == 2) m.kl.pop_back(), m.dnll.pop_back(), m.top1_disagree.pop_back();
    return m;
  }),
                      Contains("399 samples, earlier runs had 400"));
  REQUIRE(p.state().n_done() == 1);  // the good cell is kept
  REQUIRE_THROWS_WITH(p.run([&](const KeepPlan&) {
    SampleMetrics m = eng.eval(0, 0.5);
    m.kl[3] = std::nan("");
    return m;
  }),
                      Contains("sample 3: KL nan is NaN or negative"));
  REQUIRE_THROWS_WITH(p.run([&](const KeepPlan&) {
    SampleMetrics m = eng.eval(0, 0.5);
    m.top1_disagree[0] = 1.5;
    return m;
  }),
                      Contains("top-1 disagreement 1.5"));
  REQUIRE_THROWS_WITH(p.run([&](const KeepPlan&) {
    SampleMetrics m = eng.eval(0, 0.5);
    m.dnll.clear();
    return m;
  }),
                      Contains("metric vectors differ in length"));
  REQUIRE_THROWS_WITH(p.run([&](const KeepPlan&) { return SampleMetrics{}; }), Contains("no samples"));
  REQUIRE_THROWS_WITH(p.run_batched([&](int, const std::vector<double>&) { return std::vector<SampleMetrics>(1); }),
                      Contains("returned 1 results for"));

  SensitivityProfiler other(3);
  REQUIRE_THROWS_WITH(other.resume(p.state()), Contains("state has 2 layers, the profiler 3"));
  depthkv::ProfilerOptions o;
  o.keep_ratios = {0.1, 0.9};
  SensitivityProfiler other2(2, o);
  REQUIRE_THROWS_WITH(other2.resume(p.state()), Contains("other keep ratios"));
  depthkv::ProfilerState broken = p.state();
  broken.done.pop_back();
  REQUIRE_THROWS_WITH(SensitivityProfiler(2).resume(broken), Contains("done mask has 11 entries"));
}
