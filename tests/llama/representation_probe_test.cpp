// Tests of the engine-side representation probe (depthkv/llama/representation_probe.hpp): two
// forward passes per sample, determinism, finite metrics, bootstrap CIs around the means, the
// known answer of an unperturbed positive, truncation, and the profile round trip. On a small
// random-weight model with the real 512-token vocabulary, and on the real stories260K.

#include "depthkv/llama/representation_probe.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/profile_io.hpp"
#include "support/random_model.hpp"
#include "support/test_data.hpp"
#include "support/stories_data.hpp"

using depthkv::RepresentationStage;
using depthkv::llama::CapturePoint;
using depthkv::llama::LlamaConfig;
using depthkv::llama::LlamaEngine;
using depthkv::llama::LlamaModel;
using depthkv::llama::ProbeOptions;
using depthkv::llama::ProbeResult;
using depthkv::llama::RowMatrix;

namespace {

LlamaModel random_model(int layers, int vocab, unsigned seed) {
  depthkv_test::RandomSpec s;
  s.layers = layers;
  s.vocab = vocab;
  s.seed = seed;
  s.seq_len = 128;
  return depthkv_test::random_model(s);
}

const std::vector<std::string>& stories() {
  static const std::vector<std::string> s = depthkv::llama::split_stories(
      depthkv::llama::read_text_file(depthkv_test::data_path("text/tinystories_valid.txt")));
  return s;
}

std::vector<std::string> some_stories(std::size_t skip, std::size_t n) {
  REQUIRE(stories().size() >= skip + n);
  return std::vector<std::string>(stories().begin() + static_cast<std::ptrdiff_t>(skip),
                                  stories().begin() + static_cast<std::ptrdiff_t>(skip + n));
}

void check_finite_and_cis(const ProbeResult& r, int n_layers, int n_samples, int dim) {
  REQUIRE(r.n_layers == n_layers);
  REQUIRE(r.n_samples == n_samples);
  for (RepresentationStage st : depthkv::llama::representation_stages()) {
    const auto& m = r.stage(st);
    REQUIRE(m.infonce.size() == static_cast<std::size_t>(n_layers));
    REQUIRE(m.losses.size() == static_cast<std::size_t>(n_layers));
    REQUIRE(m.erank.size() == static_cast<std::size_t>(n_layers));
    REQUIRE(m.sentropy.size() == static_cast<std::size_t>(n_layers));
    const double max_rank = std::min(n_samples, dim);
    for (int l = 0; l < n_layers; ++l) {
      const auto& c = m.infonce[static_cast<std::size_t>(l)];
      INFO("stage " << depthkv::to_string(st) << " layer " << l);
      CHECK(std::isfinite(c.mean));
      CHECK(c.mean >= 0.0);
      CHECK(c.ci_low <= c.mean);
      CHECK(c.mean <= c.ci_high);
      CHECK(m.losses[static_cast<std::size_t>(l)].size() == static_cast<std::size_t>(n_samples));
      for (double v : m.losses[static_cast<std::size_t>(l)]) CHECK(std::isfinite(v));
      CHECK(m.erank[static_cast<std::size_t>(l)] >= 1.0 - 1e-9);
      CHECK(m.erank[static_cast<std::size_t>(l)] <= max_rank + 1e-9);
      CHECK(m.sentropy[static_cast<std::size_t>(l)] >= -1e-12);
      CHECK(m.sentropy[static_cast<std::size_t>(l)] <= std::log(max_rank) + 1e-9);
    }
  }
}

}  // namespace

TEST_CASE("probe: exactly two forward passes per sample, counted by the engine", "[probe]") {
  const LlamaModel model = random_model(3, 512, 11);
  const LlamaEngine engine(model);
  const auto texts = some_stories(0, 6);
  for (int chunk : {1024, 7}) {
    INFO("chunk " << chunk);
    ProbeOptions opt;
    opt.chunk_size = chunk;
    opt.infonce.batch_size = 4;
    int passes = 0;
    std::set<CapturePoint> points;
    opt.capture = [&](int layer, CapturePoint p, std::int32_t pos0, const RowMatrix&) {
      points.insert(p);
      if (layer == 0 && p == CapturePoint::kAttnInput && pos0 == 0) ++passes;  // first chunk of a pass
    };
    depthkv::llama::EngineStats stats;
    opt.stats = &stats;
    const ProbeResult r = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, opt);
    CHECK(passes == 2 * static_cast<int>(texts.size()));
    CHECK(r.forward_passes == 2 * static_cast<long long>(texts.size()));
    long long tokens = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) tokens += r.tokens[i] + r.tokens_perturbed[i];
    CHECK(stats.tokens == tokens);  // each sample's two sequences, once each
    CHECK(points == std::set<CapturePoint>{CapturePoint::kAttnInput, CapturePoint::kAttnOutput,
                                           CapturePoint::kAttnResidual, CapturePoint::kLayerOutput});
    for (std::size_t i = 0; i < texts.size(); ++i) {
      CHECK(r.tokens[i] <= model.config.seq_len);
      CHECK(r.tokens_perturbed[i] < r.tokens[i]);  // 10% of the words dropped
    }
    check_finite_and_cis(r, 3, 6, model.config.dim);
  }
}

TEST_CASE("probe: chunked prefill gives the same metrics", "[probe]") {
  const LlamaModel model = random_model(2, 512, 5);
  const LlamaEngine engine(model);
  const auto texts = some_stories(10, 5);
  ProbeOptions a, b;
  b.chunk_size = 13;
  const ProbeResult ra = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, a);
  const ProbeResult rb = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, b);
  for (int s = 0; s < 4; ++s) {
    for (int l = 0; l < 2; ++l) {
      for (int i = 0; i < 5; ++i) {
        CHECK(ra.stages[static_cast<std::size_t>(s)]
                  .losses[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)] ==
              Approx(rb.stages[static_cast<std::size_t>(s)]
                         .losses[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)])
                  .margin(1e-4));
      }
    }
  }
}

TEST_CASE("probe: deterministic under a fixed seed, the seed changes the perturbation", "[probe]") {
  const LlamaModel model = random_model(2, 512, 3);
  const LlamaEngine engine(model);
  const auto texts = some_stories(20, 8);
  ProbeOptions opt;
  opt.seed = 42;
  const ProbeResult r1 = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, opt);
  const ProbeResult r2 = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, opt);
  for (int s = 0; s < 4; ++s) {
    const auto& a = r1.stages[static_cast<std::size_t>(s)];
    const auto& b = r2.stages[static_cast<std::size_t>(s)];
    CHECK(a.losses == b.losses);
    CHECK(a.erank == b.erank);
    CHECK(a.sentropy == b.sentropy);
    for (std::size_t l = 0; l < a.infonce.size(); ++l) {
      CHECK(a.infonce[l].mean == b.infonce[l].mean);
      CHECK(a.infonce[l].ci_low == b.infonce[l].ci_low);
      CHECK(a.infonce[l].ci_high == b.infonce[l].ci_high);
    }
  }
  opt.seed = 43;
  const ProbeResult r3 = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, opt);
  CHECK(r3.stages[0].losses != r1.stages[0].losses);
  CHECK(r3.tokens == r1.tokens);  // the texts themselves do not depend on the seed
}

TEST_CASE("probe: an unperturbed positive gives the minimum loss for its negatives", "[probe]") {
  const LlamaModel model = random_model(2, 512, 9);
  const LlamaEngine engine(model);
  const auto texts = some_stories(30, 6);
  ProbeOptions none, some;
  none.drop_fraction = 0.0;
  const ProbeResult r0 = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, none);
  const ProbeResult r1 = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, some);
  CHECK(r0.tokens_perturbed == r0.tokens);
  for (int s = 0; s < 4; ++s) {
    for (int l = 0; l < 2; ++l) {
      for (int i = 0; i < 6; ++i) {
        // Same anchors (texts), hence the same negatives; sim(z, z) = 1 is the largest positive.
        CHECK(r0.stages[static_cast<std::size_t>(s)]
                  .losses[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)] <=
              r1.stages[static_cast<std::size_t>(s)]
                      .losses[static_cast<std::size_t>(l)][static_cast<std::size_t>(i)] +
                  1e-12);
      }
    }
  }
}

TEST_CASE("probe: texts are cut to whole words within max_tokens", "[probe]") {
  const LlamaModel model = random_model(2, 512, 4);
  const LlamaEngine engine(model);
  const auto texts = some_stories(40, 4);
  ProbeOptions opt;
  opt.max_tokens = 24;
  const ProbeResult r = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts, opt);
  CHECK(r.truncated == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(r.tokens[static_cast<std::size_t>(i)] <= 24);
    CHECK(r.tokens[static_cast<std::size_t>(i)] >= 18);  // a word is at most a few tokens
    CHECK(r.tokens_perturbed[static_cast<std::size_t>(i)] <= r.tokens[static_cast<std::size_t>(i)]);
  }
  check_finite_and_cis(r, 2, 4, model.config.dim);
}

TEST_CASE("probe: invalid input throws", "[probe]") {
  const LlamaModel model = random_model(2, 512, 4);
  const LlamaEngine engine(model);
  // the messages name probe_representations (the function called), not its helpers
  CHECK_THROWS_WITH(
      depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), {"Once upon a time."}),
      Catch::StartsWith("depthkv: probe_representations: the representation probe needs at least 2 texts"));
  CHECK_THROWS_WITH(depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(),
                                                          {"One two three.", "   "}),
                    Catch::StartsWith("depthkv: probe_representations: text 1 has no word that fits"));
  ProbeOptions bad;
  bad.drop_fraction = 1.5;
  CHECK_THROWS_AS(depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), {"a b c", "d e f"}, bad),
                  depthkv::Error);
  bad = ProbeOptions();
  bad.infonce.batch_size = 1;
  CHECK_THROWS_AS(depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), {"a b c", "d e f"}, bad),
                  depthkv::Error);
}

TEST_CASE("probe: layer metrics round-trip through the profile JSON", "[probe][profile]") {
  const LlamaModel model = random_model(3, 512, 8);
  const LlamaEngine engine(model);
  depthkv::ProfileFile f;
  f.model.file_name = "random.bin";
  f.model.size = 1234;
  f.model.header_hash = "fnv1a64:0000000000000000";
  f.model.header_bytes = 1234;
  f.keep_ratios = {0.2, 0.5};
  f.layer_metrics["user/other"] = {{1.0, 2.0, 3.0}, {}, {}};
  ProbeOptions opt;
  opt.infonce.batch_size = 4;
  const ProbeResult r =
      depthkv::llama::add_representation_metrics(f, engine, depthkv_test::stories_tok512(), some_stories(50, 6), opt);
  CHECK(f.n_layers == 3);
  CHECK(f.layer_metrics.size() == 13);  // 3 metrics x 4 stages + the user's entry, kept
  const depthkv::ProfileFile g = depthkv::profile_from_json(depthkv::profile_to_json(f));
  REQUIRE(g.layer_metrics.size() == f.layer_metrics.size());
  for (const auto& kv : f.layer_metrics) {
    INFO(kv.first);
    REQUIRE(g.layer_metrics.count(kv.first) == 1);
    const auto& b = g.layer_metrics.at(kv.first);
    REQUIRE(b.mean.size() == kv.second.mean.size());
    for (std::size_t l = 0; l < b.mean.size(); ++l)
      CHECK(b.mean[l] == Approx(kv.second.mean[l]).epsilon(1e-12));
    CHECK(b.ci_low.size() == kv.second.ci_low.size());
    CHECK(b.ci_high.size() == kv.second.ci_high.size());
  }
  const auto& inf = g.layer_metrics.at("infonce/post_attn");
  REQUIRE(inf.ci_low.size() == 3);
  for (int l = 0; l < 3; ++l) {
    const auto& c = r.stage(RepresentationStage::kPostAttention).infonce[static_cast<std::size_t>(l)];
    CHECK(inf.mean[static_cast<std::size_t>(l)] == Approx(c.mean).epsilon(1e-12));
    CHECK(inf.ci_low[static_cast<std::size_t>(l)] <= inf.mean[static_cast<std::size_t>(l)]);
    CHECK(inf.mean[static_cast<std::size_t>(l)] <= inf.ci_high[static_cast<std::size_t>(l)]);
  }
  CHECK(g.layer_metrics.at("erank/post_mlp").ci_low.empty());
  // A profile of another depth is refused.
  depthkv::ProfileFile other = f;
  other.n_layers = 5;
  other.layer_metrics.clear();
  CHECK_THROWS_AS(depthkv::llama::write_layer_metrics(other, r), depthkv::Error);
}

TEST_CASE("probe: stories260K, 16 stories", "[probe][real]") {
  const LlamaModel model =
      depthkv::llama::load_llama2c(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const LlamaEngine engine(model);
  const auto texts = some_stories(100, 16);
  const ProbeResult r = depthkv::llama::probe_representations(engine, depthkv_test::stories_tok512(), texts);
  check_finite_and_cis(r, model.config.n_layers, 16, model.config.dim);
  CHECK(r.forward_passes == 32);
  // A trained model keeps a text recognisable after dropping 10% of its words: the positive beats
  // the in-batch negatives, InfoNCE below log(16) = 2.77 (only a little at the residual-stream
  // stages, whose mean-pooled vectors share a large common direction; see docs/infonce.md).
  for (double v : r.infonce_mean(RepresentationStage::kPostMLP)) CHECK(v < std::log(16.0));
}
