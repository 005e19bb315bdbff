// The README's preset snippet for engine authors ("The preset in your engine"), compiled and run
// on synthetic data: depthkv::preset gives the PruneSpec, score_and_evict prunes once with it,
// EvictionSchedule bounds the memory with it.

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "support/temp_dir.hpp"

namespace {

using ReadmeCache = depthkv::KVCache<depthkv::HostLayer<float>>;
using ReadmePrefill = std::function<void(ReadmeCache&, std::vector<depthkv::TokenScorer>&)>;

struct ReadmePresetResult {
  depthkv::PruneSpec spec, bounded;
  depthkv::PruneReport rep;
  int schedule_evictions = 0;
  depthkv::PruneReport schedule_report;
};

/// The README snippet between the markers (keep the two the same); `prefill` stands for the
/// engine's prefill feeding the scorers, `cache2` for a second sequence under the schedule.
ReadmePresetResult readme_preset_snippet(const std::string& path, ReadmeCache& cache, ReadmeCache& cache2,
                                         const std::vector<depthkv::OutputProjection>& wo, int n_layers, int n_heads,
                                         int n_kv_heads, int n_prompt, const ReadmePrefill& prefill) {
  using namespace depthkv;
  // ---- README begin ----
  ProfileFile f = load_profile(path);                   // measured with `profile --preset best`
  PruneSpec base;                                       // what the preset leaves to the request:
  base.protection = {4, 16};                            // protection, observation window, budget,
  base.scorer.window = 16;                              // safeguard and schedule
  base.budget = Budget::keep(0.2);
  const std::vector<int> lengths(n_layers, n_prompt);   // what each layer holds when it is pruned
  PruneSpec spec = preset("best", f, base, lengths).spec;
  // spec: output-aware scores with max pooling, a lookahead of 32 greedy tokens (with a
  // context_weight, also the context's own window: observe_lookahead tells the scorers where the
  // lookahead's rows begin), head-optimal budgets, and of snapkv and h2o the scorer of the lower predicted loss for this request
  PolicyCurves curves = policy_curves(f, scorer_name(spec.scorer), spec.policy);  // its head curves

  // Once after the prefill: scorers made from the spec, fed by your engine as in step 1
  std::vector<TokenScorer> scorers = make_scorers(n_layers, spec.scorer, n_heads, n_kv_heads);
  prefill(cache, scorers);                              // (then observe_lookahead)
  PruneReport rep = score_and_evict(cache, scorers, spec, curves.data(), &wo);  // wo: W_o per layer

  // Bounded memory instead: evict every 32 tokens (no lookahead: it needs the whole context first)
  base.schedule = {ScheduleMode::kChunked, /*chunk=*/256, /*interval=*/32};
  PruneSpec bounded = preset("best", f, base, lengths, /*lookahead=*/0).spec;
  PolicyCurves bounded_curves = policy_curves(f, scorer_name(bounded.scorer), bounded.policy);
  EvictionSchedule schedule(bounded, bounded_curves.data(), n_layers, n_heads, n_kv_heads, &wo);
  // ---- README end ----
  prefill(cache2, schedule.scorers());
  schedule.after_chunk(cache2);
  return {spec, bounded, rep, schedule.n_evictions(), schedule.last_report()};
}

/// Layer curves of 2 layers and head curves of 2 layers x 2 KV heads: loss (1 - r) * w per unit,
/// h2o's weights a third of snapkv's (so that preset "best" chooses h2o, the second candidate).
depthkv::ProfileFile readme_profile_file() {
  depthkv::ProfileFile f;
  f.model.file_name = "synthetic.bin";
  f.model.size = 1;
  f.model.header_hash = "fnv1a64:0000000000000000";
  f.model.header_bytes = 1;
  f.n_layers = 2;
  f.keep_ratios = {0.1, 0.2, 0.5};
  f.calibration.text_file = "synthetic.txt";
  f.calibration.context = 48;
  f.calibration.continuation = 8;
  f.calibration.samples = 2;
  f.calibration.window_end = 2;
  for (const double scale : {1.0, 3.0}) {
    const std::vector<double> w = {4.0, 1.0, 2.0, 0.5};
    auto engine = [&](int unit, const std::vector<double>& ratios) {
      std::vector<depthkv::SampleMetrics> out;
      for (double r : ratios) {
        depthkv::SampleMetrics m;
        for (int s = 0; s < 2; ++s) {
          m.kl.push_back((1.0 - r) * w[static_cast<std::size_t>(unit)] / scale + 0.01 * s);
          m.dnll.push_back(0.0);
          m.top1_disagree.push_back(0.0);
        }
        out.push_back(m);
      }
      return out;
    };
    depthkv::ProfilerOptions o;
    o.keep_ratios = f.keep_ratios;
    const std::string name = scale == 1.0 ? "snapkv" : "h2o";
    depthkv::SensitivityProfiler layers(2, o);  // a file holds head curves beside layer curves
    REQUIRE(layers.run_batched(engine));
    f.scorers[name] = layers.state();
    depthkv::SensitivityProfiler heads(4, o);
    REQUIRE(heads.run_batched(engine));
    f.head_curves[name] = {2, heads.state()};
  }
  return f;
}

/// A cache of `n_layers` layers of `n_kv_heads` heads (head_dim 4) holding `n` random tokens.
ReadmeCache readme_cache(int n_layers, int n_kv_heads, int n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  ReadmeCache c;
  for (int l = 0; l < n_layers; ++l) c.add_layer(depthkv::HostLayer<float>(n_kv_heads, 4));
  std::vector<float> k(static_cast<std::size_t>(n_kv_heads) * 4), v(k.size());
  for (int l = 0; l < n_layers; ++l)
    for (int t = 0; t < n; ++t) {
      for (std::size_t i = 0; i < k.size(); ++i) {
        k[i] = u(rng);
        v[i] = u(rng);
      }
      c.layer(l).append(k.data(), v.data(), t);
    }
  return c;
}

/// Causal attention rows with random weights for every query head and position.
void readme_feed(ReadmeCache& cache, std::vector<depthkv::TokenScorer>& scorers, int n_heads) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  const int n = cache.layer(0).size(0);
  for (std::size_t l = 0; l < scorers.size(); ++l)
    for (int q = 0; q < n_heads; ++q)
      for (int i = 0; i < n; ++i) {
        std::vector<float> p(static_cast<std::size_t>(n), 0.0f);
        float sum = 0.0f;
        for (int j = 0; j <= i; ++j) sum += (p[static_cast<std::size_t>(j)] = u(rng));
        for (int j = 0; j <= i; ++j) p[static_cast<std::size_t>(j)] /= sum;
        scorers[l].observe(q, i, p.data(), n);
      }
}

}  // namespace

TEST_CASE("README: preset(\"best\") gives the PruneSpec that score_and_evict and EvictionSchedule run",
          "[preset][readme]") {
  const int L = 2, H = 4, KV = 2, n = 200, dim = 8;
  const std::string path = depthkv_test::tmp_path("readme_best.profile.json");
  depthkv::save_profile(readme_profile_file(), path);
  std::vector<float> wo_data(static_cast<std::size_t>(dim) * H * 4);
  for (std::size_t i = 0; i < wo_data.size(); ++i) wo_data[i] = static_cast<float>((i * 7) % 13) / 13.0f - 0.4f;
  const std::vector<depthkv::OutputProjection> wo(L, depthkv::OutputProjection{wo_data.data(), dim, H, 4});
  ReadmeCache cache = readme_cache(L, KV, n, 3), cache2 = readme_cache(L, KV, n, 3);
  const auto feed = [&](ReadmeCache& c, std::vector<depthkv::TokenScorer>& s) { readme_feed(c, s, H); };

  const ReadmePresetResult r = readme_preset_snippet(path, cache, cache2, wo, L, H, KV, n, feed);
  // the spec: the preset's fields, the request's protection and budget, h2o (lower predicted loss)
  CHECK(depthkv::scorer_name(r.spec.scorer) == "h2o");
  CHECK(r.spec.scorer.output_aware);
  CHECK(r.spec.scorer.pooling == depthkv::Pooling::kMax);
  CHECK(r.spec.scorer.lookahead == depthkv::kPresetLookahead);
  CHECK(r.spec.policy == depthkv::AllocationPolicy::kHeadOptimal);
  CHECK(r.spec.protection.n_sink == 4);
  CHECK(r.spec.budget == depthkv::Budget::keep(0.2));
  CHECK(r.bounded.scorer.lookahead == 0);
  CHECK(r.bounded.schedule.interval == 32);
  // score_and_evict kept exactly the head-optimal budgets of h2o's head curves
  const depthkv::ProfileFile f = depthkv::load_profile(path);
  const std::vector<int> lengths(L, n);
  const depthkv::PolicyCurves h2o = depthkv::policy_curves(f, "h2o", depthkv::AllocationPolicy::kHeadOptimal);
  const std::vector<std::vector<int>> heads = depthkv::allocate(r.spec, lengths, h2o.data()).heads;
  REQUIRE(r.rep.head_budgets == heads);
  long long total = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < KV; ++h) {
      CHECK(cache.layer(l).size(h) == heads[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
      total += cache.layer(l).size(h);
    }
  CHECK(total < static_cast<long long>(L) * KV * n);
  // the schedule evicted once (200 tokens appended, interval 32), to its own head budgets
  REQUIRE(r.schedule_evictions == 1);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < KV; ++h)
      CHECK(cache2.layer(l).size(h) ==
            r.schedule_report.head_budgets[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)]);
  std::remove(path.c_str());
}
