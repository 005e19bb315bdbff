// budget_demo: the core library on its own, with no model. Builds an 8-layer KV cache of 1024
// synthetic tokens, feeds every layer's scorer synthetic attention rows, splits a 20% global
// budget across layers with each allocation policy, evicts, and prints the memory kept per layer.
//
// Everything here is synthetic (random keys/values, attention rows with a recency bias and a few
// heavy hitters, and a made-up loss profile in which the early layers are the most sensitive):
// it shows the calls an engine makes, not quality. The real-model benchmark is
// `depthkv eval` (scripts/main-job.sh).

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <depthkv/depthkv.hpp>

using namespace depthkv;

namespace {

constexpr int kLayers = 8, kHeads = 8, kKvHeads = 4, kHeadDim = 64, kTokens = 1024;

/// A causal attention row for query position q over q+1 keys: recency bias plus heavy hitters.
void attention_row(int q, int layer, std::mt19937& rng, std::vector<float>& row) {
  std::uniform_real_distribution<float> u(0.f, 1.f);
  row.assign(static_cast<std::size_t>(q + 1), 0.f);
  float sum = 0.f;
  for (int j = 0; j <= q; ++j) {
    float w = std::exp(-0.02f * (layer + 1) * static_cast<float>(q - j)) + 0.05f * u(rng);
    if (j % 97 == 0) w += 1.0f;  // heavy hitters
    row[static_cast<std::size_t>(j)] = w;
    sum += w;
  }
  for (float& w : row) w /= sum;
}

/// A synthetic loss profile: loss of layer l at keep ratio r = a_l * (1 - r)^2.
SensitivityProfile synthetic_profile() {
  SensitivityProfile profile;
  profile.keep_ratios = {0.05, 0.1, 0.2, 0.3, 0.5, 0.75};
  profile.loss.resize(kLayers, 6);
  for (int l = 0; l < kLayers; ++l)
    for (int k = 0; k < 6; ++k)
      profile.loss(l, k) = (1.0 / (1 + l)) * std::pow(1.0 - profile.keep_ratios[static_cast<std::size_t>(k)], 2);
  return profile;
}

/// Every layer holds kTokens random keys and values (from `g`), and its scorer (appended to
/// `scorers`, H2O) has observed synthetic attention rows of every 8th query.
KVCache<HostLayer<float>> prefill(std::vector<TokenScorer>& scorers, std::mt19937& rng,
                                  std::normal_distribution<float>& g) {
  KVCache<HostLayer<float>> cache;
  std::vector<float> k(kKvHeads * kHeadDim), v(k.size()), row;
  for (int l = 0; l < kLayers; ++l) {
    HostLayer<float>& layer = cache.add_layer(HostLayer<float>(kKvHeads, kHeadDim, kTokens));
    scorers.emplace_back(ScorerConfig{}, kHeads, kKvHeads);  // H2O
    for (int t = 0; t < kTokens; ++t) {
      for (std::size_t i = 0; i < k.size(); ++i) k[i] = g(rng), v[i] = g(rng);
      layer.append(k.data(), v.data(), t);
    }
    for (int q = 0; q < kTokens; q += 8)  // every 8th query, to keep the demo fast
      for (int h = 0; h < kHeads; ++h) {
        attention_row(q, l, rng, row);
        scorers.back().observe(h, q, row.data(), q + 1);
      }
  }
  return cache;
}

/// The memory each layer keeps after the eviction, against `before_layer` bytes before it.
void print_kept(const KVCache<HostLayer<float>>& cache, const std::vector<int>& budgets,
                const std::vector<std::size_t>& before_layer) {
  std::printf("  layer  keep  KiB before  KiB after  saved\n");
  for (int l = 0; l < kLayers; ++l)
    std::printf("  %5d  %4d  %10.1f  %9.1f  %4.1f%%\n", l, budgets[static_cast<std::size_t>(l)],
                before_layer[static_cast<std::size_t>(l)] / 1024.0, cache.bytes(l) / 1024.0,
                100.0 * (1.0 - static_cast<double>(cache.bytes(l)) / before_layer[static_cast<std::size_t>(l)]));
}

}  // namespace

int main() {
  try {
    std::mt19937 rng(2026);
    std::normal_distribution<float> g(0.f, 1.f);
    const Protection prot{4, 32};  // 4 sink tokens and a 32-token recent window
    const std::vector<AllocationPolicy> policies = {AllocationPolicy::kUniform, AllocationPolicy::kPyramid,
                                                    AllocationPolicy::kProportional, AllocationPolicy::kMiddle,
                                                    AllocationPolicy::kOptimal};
    const SensitivityProfile profile = synthetic_profile();

    std::printf("budget_demo: %d layers x %d KV heads x %d tokens x head_dim %d (float32), keep 20%%\n", kLayers,
                kKvHeads, kTokens, kHeadDim);
    for (AllocationPolicy policy : policies) {
      // 1. The engine's cache after prefill, and one scorer per layer fed during prefill.
      std::vector<TokenScorer> scorers;
      KVCache<HostLayer<float>> cache = prefill(scorers, rng, g);
      // 2. Per-layer budgets under one global budget.
      BudgetRequest req;
      req.lengths = cache.lengths();
      req.keep_ratio = 0.2;
      req.floors.assign(kLayers, prot.n_sink + prot.n_recent);
      req.window = prot.n_recent;
      const std::vector<int> budgets = BudgetAllocator().allocate(policy, req, &profile);
      // 3. Scores and eviction (validated first; on error the cache is unchanged).
      std::vector<LayerScores> scores;
      for (int l = 0; l < kLayers; ++l) scores.push_back(scorers[static_cast<std::size_t>(l)].scores(cache.layer(l)));
      const std::size_t before = cache.bytes();
      const std::vector<std::size_t> before_layer = cache.bytes_per_layer();
      evict(cache, scores, budgets, prot);
      std::printf("\npolicy %-12s predicted loss %.4f\n", to_string(policy).c_str(),
                  predicted_loss(profile, budgets, req.lengths));
      print_kept(cache, budgets, before_layer);
      std::printf("  total: %.1f KiB -> %.1f KiB (%.1f%% saved), storage allocated now %.1f KiB\n", before / 1024.0,
                  cache.bytes() / 1024.0, 100.0 * (1.0 - static_cast<double>(cache.bytes()) / before),
                  cache.bytes_allocated() / 1024.0);
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
