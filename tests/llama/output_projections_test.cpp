// Tests of depthkv/llama/output_projections.hpp: float32 wo viewed in place, wo stored as F16,
// BF16 and Q8_0 converted to float copies (against the tests' own decoders), output-aware scores
// and the PruningEvaluator on F16 and Q8_0 GGUF files against their dequantized twins, and the
// errors.

#include "depthkv/llama/output_projections.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/llama/gguf.hpp"
#include "llama/gguf_writer.hpp"
#include "support/random_model.hpp"
#include "support/test_data.hpp"

using namespace depthkv;
using namespace depthkv::llama;
using depthkv_test::Bytes;

namespace {

// A random float model and a copy whose wo of the layers in `stored_layers` is held as `type`
// (F16, BF16 or Q8_0) in bytes its QuantWeight keeps alive; `twin` is the float model with those
// wo replaced by the stored values, decoded with the tests' reference decoders (gguf_writer.hpp).
struct StoredWo {
  LlamaModel stored;
  LlamaModel twin;
};

StoredWo stored_wo(GgmlType type, unsigned seed, const std::vector<int>& stored_layers) {
  const LlamaModel base = depthkv_test::random_model(depthkv_test::eval_spec(seed, 3));
  StoredWo s{base, base};
  for (int l : stored_layers) {
    RowMatrix& wo = s.twin.layers[static_cast<std::size_t>(l)].wo;
    const Eigen::Index rows = wo.rows(), cols = wo.cols();
    auto bytes = std::make_shared<Bytes>();
    for (Eigen::Index r = 0; r < rows; ++r) {
      const float* x = wo.row(r).data();
      Bytes row;
      if (type == GgmlType::kF16) {
        row = depthkv_test::f16_bytes(x, static_cast<std::size_t>(cols));
        for (Eigen::Index k = 0; k < cols; ++k) {
          std::uint16_t h;
          std::memcpy(&h, row.data() + 2 * k, 2);
          wo(r, k) = static_cast<float>(depthkv_test::ref_half(h));
        }
      } else if (type == GgmlType::kBF16) {
        for (Eigen::Index k = 0; k < cols; ++k) {
          std::uint32_t u;
          std::memcpy(&u, x + k, 4);
          const std::uint16_t h = static_cast<std::uint16_t>(u >> 16);
          depthkv_test::put(row, h);
          wo(r, k) = static_cast<float>(depthkv_test::ref_bf16(h));
        }
      } else {
        REQUIRE(type == GgmlType::kQ8_0);
        row = depthkv_test::q8_0_bytes(x, static_cast<std::size_t>(cols));
        for (Eigen::Index k = 0; k < cols; ++k) {
          const std::size_t blk = static_cast<std::size_t>(k / 32) * 34;
          std::uint16_t d;
          std::memcpy(&d, row.data() + blk, 2);
          const auto q = static_cast<std::int8_t>(row[blk + 2 + static_cast<std::size_t>(k % 32)]);
          wo(r, k) = static_cast<float>(depthkv_test::ref_half(d) * q);
        }
      }
      bytes->insert(bytes->end(), row.begin(), row.end());
    }
    QuantWeight q;
    q.type = type;
    q.data = bytes->data();
    q.rows = rows;
    q.cols = cols;
    q.row_bytes = ggml_row_bytes(type, cols);
    q.keep_alive = bytes;
    REQUIRE(bytes->size() == q.n_bytes());
    LlamaLayerWeights& w = s.stored.layers[static_cast<std::size_t>(l)];
    w.wo.resize(0, 0);
    w.wo_quant = q;
  }
  return s;
}

// Element-wise equality of a view (default layout) and a float matrix.
bool same_values(const OutputProjection& v, const RowMatrix& m) {
  return v.dim == m.rows() && static_cast<Eigen::Index>(v.n_heads) * v.head_dim == m.cols() && v.row_stride == 0 &&
         v.col_stride == 1 && Eigen::Map<const RowMatrix>(v.data, m.rows(), m.cols()) == m;
}

// stories260K.gguf with its 2-D tensors as F16, or as Q8_0 where rows hold whole blocks.
Bytes stories_requantized(bool q8_0) {
  return depthkv_test::requantized_copy(GgufFile::open(depthkv_test::data_path("models/stories260K/stories260K.gguf")),
                                        q8_0);
}

}  // namespace

TEST_CASE("OutputProjections: float32 wo viewed in place, F16, BF16 and Q8_0 wo as float copies of the stored values",
          "[llama][output_projections]") {
  const OutputProjections none;
  CHECK(none.empty());
  CHECK(none.n_layers() == 0);
  CHECK(none.views().empty());
  CHECK(none.n_copied() == 0);
  CHECK(none.copied_bytes() == 0);

  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    CAPTURE(ggml_type_name(type));
    const StoredWo s = stored_wo(type, 3, {0, 1, 2});
    // the float twin: views into the model, no copy; output_projections gives the same views
    const OutputProjections f(s.twin);
    REQUIRE(f.n_layers() == 3);
    CHECK(f.n_copied() == 0);
    CHECK(f.copied_bytes() == 0);
    const std::vector<OutputProjection> fv = output_projections(s.twin);
    for (int l = 0; l < 3; ++l) {
      CHECK(f.layer(l).data == s.twin.layers[static_cast<std::size_t>(l)].wo.data());
      CHECK(fv[static_cast<std::size_t>(l)].data == f.layer(l).data);
      CHECK(same_values(f.layer(l), s.twin.layers[static_cast<std::size_t>(l)].wo));
    }
    // the stored model: one float copy per layer, exactly the stored values
    auto p = std::make_unique<OutputProjections>(s.stored);
    REQUIRE(p->n_layers() == 3);
    CHECK(p->n_copied() == 3);
    CHECK(p->copied_bytes() == 3u * 32u * 32u * sizeof(float));
    for (int l = 0; l < 3; ++l) CHECK(same_values(p->layer(l), s.twin.layers[static_cast<std::size_t>(l)].wo));
    // a copy's views stay valid after the original is gone
    const OutputProjections copy = *p;
    p.reset();
    for (int l = 0; l < 3; ++l) {
      CHECK(copy.views()[static_cast<std::size_t>(l)].data == copy.layer(l).data);
      CHECK(same_values(copy.layer(l), s.twin.layers[static_cast<std::size_t>(l)].wo));
    }
    // the no-copy views refuse the stored form and say what converts it
    CHECK_THROWS_WITH(output_projections(s.stored),
                      Catch::Contains("layer 0: wo is stored as " + ggml_type_name(type)) &&
                          Catch::Contains("OutputProjections"));
  }
  // mixed: layer 1 float32 (viewed in place), layers 0 and 2 stored (copied)
  const StoredWo mixed = stored_wo(GgmlType::kQ8_0, 4, {0, 2});
  const OutputProjections m(mixed.stored);
  CHECK(m.n_copied() == 2);
  CHECK(m.layer(1).data == mixed.stored.layers[1].wo.data());
  for (int l = 0; l < 3; ++l) CHECK(same_values(m.layer(l), mixed.twin.layers[static_cast<std::size_t>(l)].wo));
}

TEST_CASE("OutputProjections: a wo of the wrong shape, with two forms or an unconverted type is an error naming the layer",
          "[llama][output_projections]") {
  const StoredWo s = stored_wo(GgmlType::kQ8_0, 5, {2});
  LlamaModel bad = s.stored;
  bad.layers[1].wo = RowMatrix::Zero(32, 16);
  CHECK_THROWS_WITH(OutputProjections(bad), Catch::EndsWith("layer 1: output-aware scoring needs the output projection wo "
                                                             "[32][32], the model holds [32][16]"));
  CHECK_THROWS_WITH(output_projections(bad), Catch::Contains("layer 2: wo is stored as Q8_0"));
  bad = s.stored;
  bad.layers[2].wo_quant.rows = 16;
  CHECK_THROWS_WITH(OutputProjections(bad), Catch::EndsWith("layer 2: output-aware scoring needs the output projection wo "
                                                             "[32][32], the model holds Q8_0 [16][32]"));
  bad = s.stored;
  bad.layers[2].wo = RowMatrix::Zero(32, 32);
  CHECK_THROWS_WITH(OutputProjections(bad), Catch::EndsWith("layer 2: wo is held both as float and as Q8_0"));
  bad = s.stored;
  bad.layers[2].wo_quant.row_bytes = 32;
  CHECK_THROWS_WITH(OutputProjections(bad), Catch::EndsWith("layer 2: wo (Q8_0) has rows of 32 bytes, expected 34"));
  bad = s.stored;
  bad.layers[2].wo_quant.type = GgmlType::kIQ2_XXS;
  CHECK_THROWS_WITH(OutputProjections(bad), Catch::Contains("layer 2: wo is stored as IQ2_XXS, which has no float conversion"));
  bad = s.stored;
  bad.layers.pop_back();
  CHECK_THROWS_WITH(OutputProjections(bad), Catch::EndsWith("2 layer weight sets for 3 layers"));
}

TEST_CASE("output-aware scores on F16 and Q8_0 GGUFs equal those with the dequantized float wo, the evaluator runs",
          "[llama][output_projections][gguf][eval]") {
  for (bool q8_0 : {false, true}) {
    CAPTURE(q8_0);
    const Bytes file = stories_requantized(q8_0);
    const LlamaModel qm = load_gguf_from_memory(file.data(), file.size());
    const LlamaModel twin = load_gguf_from_memory(file.data(), file.size(), "twin", GgufLoadOptions{true});
    const LlamaConfig& c = qm.config;
    REQUIRE(qm.layers[0].wo_quant.type == (q8_0 ? GgmlType::kQ8_0 : GgmlType::kF16));
    REQUIRE(twin.layers[0].wo_quant.empty());
    const OutputProjections wo(qm);
    REQUIRE(wo.n_copied() == c.n_layers);
    const std::vector<OutputProjection> twin_wo = output_projections(twin);
    for (int l = 0; l < c.n_layers; ++l) CHECK(same_values(wo.layer(l), twin.layers[static_cast<std::size_t>(l)].wo));

    // the same cache scored with either: identical scores, identical evictions
    const LlamaEngine engine(qm);
    ScorerConfig sc;
    sc.kind = ScorerKind::kSnapKV;
    sc.window = 8;
    sc.kernel = 3;
    sc.output_aware = true;
    HostCache a = engine.make_cache();
    std::vector<TokenScorer> scorers = make_scorers(c, sc);
    ForwardOptions opt;
    opt.observer = observe_into(scorers);
    engine.prefill(depthkv_test::random_tokens(48, c.vocab_size, 6), 0, a, opt);
    HostCache b = a;
    const std::vector<LayerScores> s = layer_scores(scorers, a, &wo.views());
    CHECK(s == layer_scores(scorers, a, &twin_wo));
    std::vector<TokenScorer> scorers_b = scorers;
    depthkv::detail::PruneRequest req;
    req.budget.keep_ratio = 0.3;
    req.protection = Protection{1, 2};
    req.output_projections = &wo.views();
    const PruneReport ra = score_and_evict(a, scorers, req);
    req.output_projections = &twin_wo;
    const PruneReport rb = score_and_evict(b, scorers_b, req);
    for (int l = 0; l < c.n_layers; ++l)
      CHECK(ra.evictions[static_cast<std::size_t>(l)].kept_slots == rb.evictions[static_cast<std::size_t>(l)].kept_slots);

    // the evaluator with an output-aware scorer runs on the stored model; it changes the result
    EvalConfig cfg;
    cfg.scorers.clear();
    cfg.scorers.push_back(sc);
    sc.output_aware = false;
    cfg.scorers.push_back(sc);
    cfg.spec.protection = Protection{1, 2};
    const PruningEvaluator ev(engine, depthkv_test::random_windows(2, 40, 12, c.vocab_size, 7), cfg);
    const std::vector<double> plan(static_cast<std::size_t>(c.n_layers), 0.3);
    const std::vector<WindowResult> oa = ev.evaluate_plan(plan, 0), plain = ev.evaluate_plan(plan, 1);
    bool differs = false;
    for (std::size_t w = 0; w < oa.size(); ++w) {
      CHECK(std::isfinite(oa[w].metrics.loss.kl));
      CHECK(oa[w].metrics.loss.kl > 0.0);
      differs |= oa[w].metrics.loss.kl != plain[w].metrics.loss.kl;
    }
    CHECK(differs);
  }
}
