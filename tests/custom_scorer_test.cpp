// Tests of scorer_registry.hpp / scoring_rule.hpp: scorers defined and registered here (not in
// the library) run through EvictionSchedule and evict exactly what their rule says; names map to
// configurations and back; unknown, built-in, invalid and duplicate names are refused.

#include "depthkv/scorer_registry.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "depthkv/eviction_schedule.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/token_scorer.hpp"

namespace custom_scorer_test {

// "Keep the even positions, the most recent first": s_j = (p even ? 2^20 : 0) + p for the original
// position p of slot j. Reads only the layer's positions; observes nothing.
class EvenRecentRule : public depthkv::ScoringRule {
 public:
  std::unique_ptr<depthkv::ScoringRule> clone() const override { return std::make_unique<EvenRecentRule>(*this); }
  bool observes() const override { return false; }
  void reset() override {}
  void observe(const depthkv::AttentionBlock&) override {}
  void compact(int, const std::int32_t*, int) override {}
  void score(int h, const depthkv::LayerReader& layer, std::vector<float>& s) const override {
    for (std::size_t j = 0; j < s.size(); ++j) s[j] = rank(layer.positions(h)[j]);
  }
  static float rank(std::int32_t p) { return static_cast<float>((p % 2 == 0 ? 1 << 20 : 0) + p); }
};

// "Peak attention": s_j = max over every observed row of the group's query heads of a_ij.
class PeakAttentionRule : public depthkv::ScoringRule {
 public:
  explicit PeakAttentionRule(int n_kv_heads) : peak_(static_cast<std::size_t>(n_kv_heads)) {}
  std::unique_ptr<depthkv::ScoringRule> clone() const override { return std::make_unique<PeakAttentionRule>(*this); }
  void reset() override { peak_.assign(peak_.size(), {}); }
  void observe(const depthkv::AttentionBlock& b) override {
    std::vector<float>& m = peak_[static_cast<std::size_t>(b.kv_head)];
    if (static_cast<int>(m.size()) < b.n) m.resize(static_cast<std::size_t>(b.n), 0.0f);
    for (int r = 0; r < b.n_queries; ++r)
      for (int j = 0; j < b.n; ++j) m[static_cast<std::size_t>(j)] = std::max(m[static_cast<std::size_t>(j)], b.row(r)[j]);
  }
  void compact(int kv_head, const std::int32_t* kept, int n_kept) override {
    depthkv::keep_slots(peak_[static_cast<std::size_t>(kv_head)], kept, n_kept);
  }
  void score(int h, const depthkv::LayerReader&, std::vector<float>& s) const override {
    const std::vector<float>& m = peak_[static_cast<std::size_t>(h)];
    std::copy(m.begin(), m.end(), s.begin());
  }

 private:
  std::vector<std::vector<float>> peak_;  // [kv][slot]
};

// The registration lines.
const depthkv::ScorerRegistration kEvenRecent("test-even-recent", [](const depthkv::ScorerConfig&, int, int) {
  return std::unique_ptr<depthkv::ScoringRule>(new EvenRecentRule);
});
const depthkv::ScorerRegistration kPeak("test-peak", [](const depthkv::ScorerConfig&, int, int n_kv_heads) {
  return std::unique_ptr<depthkv::ScoringRule>(new PeakAttentionRule(n_kv_heads));
});

using Cache = depthkv::KVCache<depthkv::HostLayer<float>>;
constexpr int kLayers = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 3, kBudget = 6;  // tokens per layer

Cache make_cache() {
  Cache c;
  for (int l = 0; l < kLayers; ++l) c.add_layer(depthkv::HostLayer<float>(kKvHeads, kHeadDim));
  return c;
}

// Appends tokens [pos0, pos0 + n) to every layer (random K, V).
void append_tokens(Cache& c, int pos0, int n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<std::size_t>(kKvHeads * kHeadDim)), v(k.size());
  for (int i = 0; i < n; ++i)
    for (int l = 0; l < kLayers; ++l) {
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      c.layer(l).append(k.data(), v.data(), pos0 + i);
    }
}

std::vector<std::int32_t> held(const Cache& c, int l, int h) {
  const auto& layer = c.layer(l);
  return std::vector<std::int32_t>(layer.positions(h), layer.positions(h) + layer.size(h));
}

// The `keep` positions of `cands` with the highest value of `rank`, ascending.
template <class Rank>
std::vector<std::int32_t> top_positions(std::vector<std::int32_t> cands, int keep, Rank rank) {
  std::sort(cands.begin(), cands.end(), [&](std::int32_t a, std::int32_t b) { return rank(a) > rank(b); });
  cands.resize(static_cast<std::size_t>(std::min<int>(keep, static_cast<int>(cands.size()))));
  std::sort(cands.begin(), cands.end());
  return cands;
}

depthkv::detail::ScheduleConfig test_schedule(const std::string& scorer) {
  depthkv::detail::ScheduleConfig sc;
  sc.scorer = depthkv::scorer_config(scorer);
  sc.budget.total_tokens = kLayers * kBudget;
  return sc;
}

}  // namespace custom_scorer_test

using namespace custom_scorer_test;

TEST_CASE("a registered position rule evicts exactly what it says through EvictionSchedule", "[scorer][registry]") {
  depthkv::EvictionSchedule schedule(test_schedule("test-even-recent"), kLayers, kHeads, kKvHeads);
  CHECK(depthkv::scorer_name(schedule.scorers()[0].config()) == "test-even-recent");
  Cache cache = make_cache();
  std::mt19937 rng(11);
  std::vector<std::vector<std::int32_t>> want(kLayers * kKvHeads);  // [l * kKvHeads + h] positions held
  int pos = 0;
  for (int chunk : {5, 4, 7, 3, 9}) {
    append_tokens(cache, pos, chunk, rng);
    for (auto& w : want)
      for (int i = 0; i < chunk; ++i) w.push_back(pos + i);
    pos += chunk;
    schedule.after_chunk(cache);
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        std::vector<std::int32_t>& w = want[static_cast<std::size_t>(l * kKvHeads + h)];
        w = top_positions(w, kBudget, EvenRecentRule::rank);
        INFO("after position " << pos << ", layer " << l << ", KV head " << h);
        CHECK(held(cache, l, h) == w);
      }
  }
  CHECK(schedule.n_evictions() >= 3);
  // the last eviction kept the 6 most recent even positions of 28 tokens: 16, 18, ..., 26
  CHECK(held(cache, 1, 1) == std::vector<std::int32_t>{16, 18, 20, 22, 24, 26});
}

TEST_CASE("a registered attention rule is fed, compacted and copied through EvictionSchedule", "[scorer][registry]") {
  depthkv::EvictionSchedule schedule(test_schedule("test-peak"), kLayers, kHeads, kKvHeads);
  const depthkv::AttentionObserver observe = schedule.observer();
  Cache cache = make_cache();
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  std::vector<std::map<std::int32_t, float>> peak(kLayers * kKvHeads);  // reference: position -> peak
  int pos = 0;
  for (int chunk : {8, 5, 6, 4}) {
    append_tokens(cache, pos, chunk, rng);
    for (int l = 0; l < kLayers; ++l)
      for (int q = 0; q < kHeads; ++q) {
        const int h = q / (kHeads / kKvHeads), n = cache.layer(l).size(h);
        std::vector<float> p(static_cast<std::size_t>(chunk * n));
        for (float& x : p) x = u(rng);
        observe(l, q, pos, chunk, p.data(), n, n);
        for (int r = 0; r < chunk; ++r)
          for (int j = 0; j < n; ++j) {
            float& m = peak[static_cast<std::size_t>(l * kKvHeads + h)][cache.layer(l).positions(h)[j]];
            m = std::max(m, p[static_cast<std::size_t>(r * n + j)]);
          }
      }
    const depthkv::EvictionSchedule before = schedule;  // copies the scorers' state
    pos += chunk;
    schedule.after_chunk(cache);
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        const std::map<std::int32_t, float>& m = peak[static_cast<std::size_t>(l * kKvHeads + h)];
        std::vector<std::int32_t> all;
        for (const auto& e : m) all.push_back(e.first);
        const std::vector<std::int32_t> want = top_positions(all, kBudget, [&m](std::int32_t p) { return m.at(p); });
        INFO("after position " << pos << ", layer " << l << ", KV head " << h);
        REQUIRE(held(cache, l, h) == want);
        REQUIRE(schedule.scorers()[static_cast<std::size_t>(l)].observed_size(h) == kBudget);
        // the copy taken before the eviction still holds the uncompacted state
        CHECK(before.scorers()[static_cast<std::size_t>(l)].observed_size(h) == static_cast<int>(m.size()));
      }
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) {
        std::map<std::int32_t, float>& m = peak[static_cast<std::size_t>(l * kKvHeads + h)];  // forget the evicted
        const std::vector<std::int32_t> kept = held(cache, l, h);
        for (auto it = m.begin(); it != m.end();)
          it = std::binary_search(kept.begin(), kept.end(), it->first) ? std::next(it) : m.erase(it);
      }
  }
}

TEST_CASE("scorer names map to configurations and back", "[scorer][registry]") {
  const depthkv::ScorerConfig plain;
  CHECK(plain.name.empty());
  CHECK(depthkv::scorer_name(plain) == "h2o");
  depthkv::ScorerConfig base;
  base.window = 5;
  base.kernel = 3;
  const depthkv::ScorerConfig snap = depthkv::scorer_config("snapkv", base);
  CHECK(snap.kind == depthkv::ScorerKind::kSnapKV);
  CHECK(snap.window == 5);
  CHECK(snap.kernel == 3);
  CHECK(depthkv::scorer_name(snap) == "snapkv");
  const depthkv::ScorerConfig mine = depthkv::scorer_config("test-even-recent", base);
  CHECK(mine.name == "test-even-recent");
  CHECK(mine.window == 5);
  CHECK(depthkv::scorer_name(mine) == "test-even-recent");
  // a built-in name replaces a registered one
  const depthkv::ScorerConfig back = depthkv::scorer_config("knorm", mine);
  CHECK(back.name.empty());
  CHECK(back.kind == depthkv::ScorerKind::kKeyNorm);
  for (const std::string& n : depthkv::known_scorers()) CHECK(depthkv::scorer_name(depthkv::scorer_config(n)) == n);
  const std::vector<std::string> reg = depthkv::registered_scorers();
  CHECK(std::count(reg.begin(), reg.end(), "test-even-recent") == 1);
  CHECK(std::count(reg.begin(), reg.end(), "test-peak") == 1);
  CHECK(depthkv::known_scorers().front() == "h2o");
}

TEST_CASE("unknown scorer names are refused, listing the known ones", "[scorer][registry]") {
  CHECK_THROWS_WITH(depthkv::scorer_config("nope"),
                    Catch::Contains("unknown scorer kind 'nope' (expected h2o, h2o-v1, h2o-v2, snapkv, tova, knorm") &&
                        Catch::Contains("test-even-recent") && Catch::Contains("test-peak"));
  depthkv::ScorerConfig cfg;
  cfg.name = "nope";
  CHECK_THROWS_WITH(depthkv::TokenScorer(cfg, 4, 2), Catch::Contains("unknown scorer kind 'nope'"));
  cfg.name = "snapkv";  // built-ins are selected by kind
  CHECK_THROWS_WITH(depthkv::TokenScorer(cfg, 4, 2), Catch::Contains("built-in scorer"));
  // what TokenScorer checks for every scorer applies to registered ones
  depthkv::ScorerConfig mine = depthkv::scorer_config("test-even-recent");
  mine.output_aware = true;
  CHECK_THROWS_WITH(depthkv::TokenScorer(mine, 4, 2), Catch::Contains("output-aware") && Catch::Contains("not test-even-recent"));
  mine.output_aware = false;
  mine.lookahead = 2;
  CHECK_THROWS_WITH(depthkv::TokenScorer(mine, 4, 2), Catch::Contains("lookahead applies to attention-based scorers, not test-even-recent"));
  mine = depthkv::scorer_config("test-peak");
  mine.lookahead = 2;
  CHECK_NOTHROW(depthkv::TokenScorer(mine, 4, 2));
}

TEST_CASE("duplicate, built-in and invalid registrations are refused", "[scorer][registry]") {
  const depthkv::ScoringRuleFactory f = [](const depthkv::ScorerConfig&, int, int) {
    return std::unique_ptr<depthkv::ScoringRule>(new EvenRecentRule);
  };
  const std::vector<std::string> before = depthkv::registered_scorers();
  CHECK_THROWS_WITH(depthkv::register_scorer("test-even-recent", f), Catch::Contains("'test-even-recent' is already registered"));
  CHECK_THROWS_WITH(depthkv::register_scorer("h2o", f), Catch::Contains("'h2o' is built in"));
  CHECK_THROWS_WITH(depthkv::register_scorer("", f), Catch::Contains("invalid scorer name"));
  CHECK_THROWS_WITH(depthkv::register_scorer("a b", f), Catch::Contains("invalid scorer name 'a b'"));
  CHECK_THROWS_WITH(depthkv::register_scorer("test-null", nullptr), Catch::Contains("null factory"));
  CHECK(depthkv::registered_scorers() == before);
  // a factory that returns no rule is caught when a scorer is made
  static const depthkv::ScorerRegistration kNull("test-null-rule", [](const depthkv::ScorerConfig&, int, int) {
    return std::unique_ptr<depthkv::ScoringRule>();
  });
  CHECK_THROWS_WITH(depthkv::TokenScorer(depthkv::scorer_config("test-null-rule"), 4, 2), Catch::Contains("no rule"));
}
