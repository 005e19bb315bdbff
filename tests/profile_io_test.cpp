#include "depthkv/profile_io.hpp"
#include "depthkv/preset.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "support/temp_dir.hpp"

using Catch::Contains;
using depthkv::ProfileFile;

namespace {

std::string temp_path(const std::string& name) {
  return depthkv_test::scratch_dir().file("depthkv_profile_io_" + name);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// `good` edited by `edit` is refused by profile_from_json with an error containing `msg`.
void expect_refused(const nlohmann::json& good, const std::function<void(nlohmann::json&)>& edit,
                    const std::string& msg) {
  nlohmann::json j = good;
  edit(j);
  INFO(msg);
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains(msg));
}

/// Random metrics of 8 samples.
depthkv::SampleMetrics random_metrics(std::mt19937& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  depthkv::SampleMetrics m;
  for (int i = 0; i < 8; ++i) {
    m.kl.push_back(u(rng));
    m.dnll.push_back(u(rng) - 0.5);
    m.top1_disagree.push_back(u(rng));
  }
  return m;
}

/// A selection record: sinks, recent, observation window, kernel, pooling.
depthkv::PruneSpec selection_of(int sinks, int recent, int window, int kernel, const std::string& pooling) {
  depthkv::PruneSpec s;
  s.protection = {sinks, recent};
  s.scorer.window = window;
  s.scorer.kernel = kernel;
  s.scorer.pooling = depthkv::parse_pooling(pooling);
  return s;
}

/// A profile of two scorers (one partial), filled by the profiler with random metrics.
ProfileFile sample_file() {
  ProfileFile f;
  f.model.file_name = "m.bin";
  f.model.size = 1234;
  f.model.header_hash = "fnv1a64:0123456789abcdef";
  f.model.header_bytes = 1234;
  f.n_layers = 3;
  f.keep_ratios = {0.1, 0.3, 0.6};
  f.calibration = {"tinystories_valid.txt", 384, 128, 2, 8, 2, 10, "first part", selection_of(4, 16, 32, 7, "avg"), 0, {}};
  std::mt19937 rng(1);
  auto engine = [&](const depthkv::KeepPlan&) { return random_metrics(rng); };
  depthkv::ProfilerOptions o;
  o.keep_ratios = f.keep_ratios;
  depthkv::SensitivityProfiler a(3, o);
  a.run(engine);
  f.scorers["h2o"] = a.state();
  o.progress = [](int done, int) { return done < 4; };
  depthkv::SensitivityProfiler b(3, o);
  b.run(engine);
  f.scorers["snapkv"] = b.state();
  f.layer_metrics["infonce/post_attn"] = {{1.0, 2.0, 3.0}, {0.9, 1.8, 2.7}, {1.1, 2.2, 3.3}};
  return f;
}

}  // namespace

TEST_CASE("save_profile writes no profile that load_profile would refuse", "[profile_io]") {
  ProfileFile f = sample_file();
  f.scorers["h2o"].metrics.kl.loss(1, 0) = 1.2e17;  // a model whose logits blow up: not a loss
  const std::string path = temp_path("refused.json");
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(depthkv::save_profile(f, path),
                      Catch::Contains("cannot write profile file") && Catch::Contains("it would not load") &&
                          Catch::Contains("is not a loss"));
  REQUIRE_FALSE(std::ifstream(path).good());
}

TEST_CASE("profile JSON round trip is exact", "[profile_io]") {
  const ProfileFile f = sample_file();
  const std::string path = temp_path("roundtrip.json");
  depthkv::save_profile(f, path);
  const ProfileFile g = depthkv::load_profile(path);
  REQUIRE(g.model.file_name == f.model.file_name);
  REQUIRE(g.model.size == f.model.size);
  REQUIRE(g.model.header_hash == f.model.header_hash);
  REQUIRE(g.n_layers == 3);
  REQUIRE(g.keep_ratios == f.keep_ratios);
  REQUIRE(g.metric == "kl");
  REQUIRE(g.calibration.text_file == "tinystories_valid.txt");
  REQUIRE(g.calibration.context == 384);
  REQUIRE(g.calibration.continuation == 128);
  REQUIRE(g.calibration.skip == 2);
  REQUIRE(g.calibration.samples == 8);
  REQUIRE(g.calibration.window_begin == 2);
  REQUIRE(g.calibration.window_end == 10);
  REQUIRE(g.calibration.description == "first part");
  REQUIRE(g.calibration.selection);
  const depthkv::PruneSpec& gs = *g.calibration.selection;
  REQUIRE(gs.protection.n_sink == 4);
  REQUIRE(gs.protection.n_recent == 16);
  REQUIRE(gs.scorer.window == 32);
  REQUIRE(gs.scorer.kernel == 7);
  REQUIRE(gs.scorer.pooling == depthkv::Pooling::kAvg);
  REQUIRE(gs.describe_selection() == "sinks=4 recent=16 obs_window=32 kernel=7 pooling=avg");
  REQUIRE(gs.same_selection(selection_of(4, 16, 32, 7, "avg")));
  REQUIRE_FALSE(gs.same_selection(selection_of(5, 16, 32, 7, "avg")));
  REQUIRE_FALSE(gs.same_selection(selection_of(4, 15, 32, 7, "avg")));
  REQUIRE_FALSE(gs.same_selection(selection_of(4, 16, 16, 7, "avg")));
  REQUIRE_FALSE(gs.same_selection(selection_of(4, 16, 32, 5, "avg")));
  REQUIRE_FALSE(gs.same_selection(selection_of(4, 16, 32, 7, "max")));
  REQUIRE(g.scorers.size() == 2);
  for (const auto& kv : f.scorers) {
    const auto& a = kv.second;
    const auto& b = g.scorers.at(kv.first);
    REQUIRE(b.metrics.n_samples == a.metrics.n_samples);
    REQUIRE(b.done == a.done);
    REQUIRE(b.metrics.kl.loss == a.metrics.kl.loss);
    REQUIRE(b.metrics.kl.loss_stderr == a.metrics.kl.loss_stderr);
    REQUIRE(b.metrics.dnll.loss == a.metrics.dnll.loss);
    REQUIRE(b.metrics.top1.loss_stderr == a.metrics.top1.loss_stderr);
  }
  REQUIRE_FALSE(g.scorers.at("snapkv").complete());
  REQUIRE(g.layer_metrics.at("infonce/post_attn").ci_high == std::vector<double>{1.1, 2.2, 3.3});
  REQUIRE(g.profile("h2o").loss == f.scorers.at("h2o").metrics.kl.loss);
  REQUIRE(g.profile("h2o", depthkv::LossMetric::kNLLIncrease).loss.minCoeff() >= 0.0);
  REQUIRE_THROWS_WITH(g.profile("tova"), Contains("no measurements for scorer 'tova' (it has: h2o, snapkv)"));
  REQUIRE_THROWS_WITH(g.profile("snapkv"), Contains("incomplete (4 of 9 runs)"));
  // A partial profile resumes.
  depthkv::ProfilerOptions o;
  o.keep_ratios = g.keep_ratios;
  depthkv::SensitivityProfiler p(3, o);
  p.resume(g.scorers.at("snapkv"));
  REQUIRE(p.state().n_done() == 4);
  std::remove(path.c_str());
}

TEST_CASE("the document split of the calibration text: written only when recorded", "[profile_io]") {
  ProfileFile f = sample_file();
  // unrecorded (the default split): no key, so files of the default split are unchanged
  REQUIRE_FALSE(f.calibration.documents.recorded());
  REQUIRE_FALSE(depthkv::profile_to_json(f)["calibration"].contains("documents"));
  REQUIRE_FALSE(depthkv::profile_from_json(depthkv::profile_to_json(f)).calibration.documents.recorded());
  for (const depthkv::DocumentRecord& r : {depthkv::DocumentRecord{"separator", "<|endoftext|>"},
                                           depthkv::DocumentRecord{"whole", ""},
                                           depthkv::DocumentRecord{"opening", ""}}) {
    f.calibration.documents = r;
    const nlohmann::json j = depthkv::profile_to_json(f);
    REQUIRE(j["calibration"]["documents"] == nlohmann::json({{"rule", r.rule}, {"marker", r.marker}}));
    const depthkv::DocumentRecord back = depthkv::profile_from_json(j).calibration.documents;
    REQUIRE(back.rule == r.rule);
    REQUIRE(back.marker == r.marker);
  }
  nlohmann::json j = depthkv::profile_to_json(f);
  j["calibration"]["documents"]["rule"] = "lines";
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains("bad document split"));
  j["calibration"]["documents"] = {{"rule", "separator"}, {"marker", ""}};
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains("bad document split"));
  j["calibration"]["documents"] = {{"rule", ""}, {"marker", ""}};
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains("'calibration.documents.rule' is empty"));
  j["calibration"]["documents"] = {{"rule", "whole"}};
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains("missing key 'calibration.documents.marker'"));
}

TEST_CASE("model identity and mismatched models", "[profile_io]") {
  const std::string m1 = temp_path("model1.bin"), m2 = temp_path("model2.bin"), m3 = temp_path("model3.bin");
  write_file(m1, std::string(1000, 'a'));
  write_file(m2, std::string(999, 'a') + "b");
  write_file(m3, std::string(1000, 'a'));
  const auto id1 = depthkv::model_identity(m1);
  REQUIRE(id1.file_name == "depthkv_profile_io_model1.bin");
  REQUIRE(id1.size == 1000);
  REQUIRE(id1.header_bytes == 1000);
  REQUIRE(id1.header_hash.rfind("fnv1a64:", 0) == 0);
  REQUIRE(id1.header_hash.size() == 8 + 16);
  REQUIRE(depthkv::model_identity(m2).header_hash != id1.header_hash);
  REQUIRE(depthkv::model_identity(m1, 10).header_hash == depthkv::model_identity(m2, 10).header_hash);
  REQUIRE_THROWS_WITH(depthkv::model_identity(temp_path("missing.bin")), Contains("cannot open model file"));

  ProfileFile f = sample_file();
  f.model = id1;
  const std::string path = temp_path("model.json");
  depthkv::save_profile(f, path);
  REQUIRE_NOTHROW(depthkv::load_profile(path, m1));
  REQUIRE_NOTHROW(depthkv::load_profile(path, m3));  // same content under another name
  REQUIRE_THROWS_WITH(depthkv::load_profile(path, m2), Contains("measured on another model"));
  for (const auto& p : {m1, m2, m3, path}) std::remove(p.c_str());
}

TEST_CASE("corrupt profile files are rejected with the key named", "[profile_io]") {
  const nlohmann::json good = depthkv::profile_to_json(sample_file());
  REQUIRE_NOTHROW(depthkv::profile_from_json(good));
  auto expect = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& msg) {
    expect_refused(good, edit, msg);
    nlohmann::json j = good;
    edit(j);
    const std::string path = temp_path("corrupt.json");
    write_file(path, j.dump());
    REQUIRE_THROWS_WITH(depthkv::load_profile(path), Contains("profile file '" + path + "'") && Contains(msg));
    std::remove(path.c_str());
  };
  expect([](nlohmann::json& j) { j["version"] = 2; }, "unsupported profile version 2");
  expect([](nlohmann::json& j) { j["format"] = "other"; }, "'format' is not");
  expect([](nlohmann::json& j) { j.erase("keep_ratios"); }, "missing key 'keep_ratios'");
  expect([](nlohmann::json& j) { j["model"].erase("header_hash"); }, "missing key 'model.header_hash'");
  expect([](nlohmann::json& j) { j["calibration"].erase("context"); }, "missing key 'calibration.context'");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"].erase("dnll"); }, "missing key 'scorers.h2o.dnll'");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["kl"]["mean"][1][2] = nullptr; },
         "'scorers.h2o.kl.mean[1][2]' is not a number (null)");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["kl"]["mean"][1][2] = -1.0; }, "negative");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["kl"]["mean"][1].erase(0); }, "has 2 entries, expected 3 (wrong shape)");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["top1"]["stderr"].erase(0); }, "array of 3 rows (wrong shape)");
  expect([](nlohmann::json& j) { j["keep_ratios"] = {0.3, 0.1, 0.6}; }, "not strictly ascending");
  expect([](nlohmann::json& j) { j["n_layers"] = 4; }, "array of 4 rows");
  expect([](nlohmann::json& j) { j["n_layers"] = "3"; }, "'n_layers' is not an integer");
  expect([](nlohmann::json& j) { j["metric"] = "ppl"; }, "unknown loss metric 'ppl'");
  expect([](nlohmann::json& j) { j["scorers"]["snapkv"]["done"][0][0] = 2; }, "holds 2 (0 or 1 expected)");
  expect([](nlohmann::json& j) { j["layer_metrics"]["infonce/post_attn"]["mean"].erase(0); }, "does not have 3 entries");
  expect([](nlohmann::json& j) { j["calibration"]["selection"].erase("kernel"); },
         "missing key 'calibration.selection.kernel'");
  expect([](nlohmann::json& j) { j["calibration"]["selection"].erase("pooling"); },
         "missing key 'calibration.selection.pooling'");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["obs_window"] = 0; }, "bad selection settings");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["pooling"] = "sum"; }, "bad selection settings");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["sinks"] = -2; },
         "'calibration.selection.sinks' -2 is out of range");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["recent"] = 1.5; },
         "'calibration.selection.recent' is not an integer");
  // the older spelling {n_sink, n_recent, window, kernel}: read, with max pooling; checked alike
  {
    nlohmann::json j = depthkv::profile_to_json(sample_file());
    j["calibration"]["selection"] = {{"n_sink", 2}, {"n_recent", 8}, {"window", 4}, {"kernel", 5}};
    const depthkv::PruneSpec r = *depthkv::profile_from_json(j).calibration.selection;
    REQUIRE(r.describe_selection() == "sinks=2 recent=8 obs_window=4 kernel=5 pooling=max");
    REQUIRE(depthkv::profile_to_json(depthkv::profile_from_json(j))["calibration"]["selection"] ==
            nlohmann::json{{"sinks", 2}, {"recent", 8}, {"obs_window", 4}, {"kernel", 5}, {"pooling", "max"}});
    j["calibration"]["selection"].erase("kernel");
    REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains("missing key 'calibration.selection.kernel'"));
    j["calibration"]["selection"]["kernel"] = 5;
    j["calibration"]["selection"]["window"] = 0;
    REQUIRE_THROWS_WITH(depthkv::profile_from_json(j), Contains("bad selection settings"));
  }
  // unrecorded settings (older files): no key written, none read back
  {
    ProfileFile f = sample_file();
    f.calibration.selection.reset();
    const nlohmann::json j = depthkv::profile_to_json(f);
    REQUIRE_FALSE(j["calibration"].contains("selection"));
    REQUIRE_FALSE(depthkv::profile_from_json(j).calibration.selection);
    f.calibration.selection = selection_of(4, 16, 32, 4, "max");  // an even kernel: refused when written
    REQUIRE_THROWS_WITH(depthkv::profile_to_json(f), Contains("scorer.kernel must be odd"));
  }

  const std::string path = temp_path("broken.json");
  write_file(path, good.dump().substr(0, 100));
  REQUIRE_THROWS_WITH(depthkv::load_profile(path), Contains("is not valid JSON"));
  std::remove(path.c_str());
  REQUIRE_THROWS_WITH(depthkv::load_profile(temp_path("absent.json")), Contains("cannot open profile file"));
}

TEST_CASE("output-aware and cross-head settings: round trip, written only when set, refused when bad", "[profile_io]") {
  ProfileFile f = sample_file();
  // defaults: nothing new written, the JSON is what it was
  const nlohmann::json plain = depthkv::profile_to_json(f);
  REQUIRE_FALSE(plain["calibration"]["selection"].contains("output_aware"));
  REQUIRE_FALSE(plain["calibration"]["selection"].contains("head_alloc"));
  REQUIRE_FALSE(plain["calibration"]["selection"].contains("head_alpha"));
  const ProfileFile old = depthkv::profile_from_json(plain);  // a file without the keys
  const depthkv::PruneSpec& os = *old.calibration.selection;
  REQUIRE_FALSE(os.scorer.output_aware);
  REQUIRE(os.head_split.mode == depthkv::HeadAllocation::kUniform);
  REQUIRE(os.head_split.alpha == 0.2);
  REQUIRE(os.describe_selection() == "sinks=4 recent=16 obs_window=32 kernel=7 pooling=avg");
  REQUIRE(depthkv::profile_to_json(old) == plain);
  // set: written, read back, described, compared
  f.calibration.selection->scorer.output_aware = true;
  f.calibration.selection->head_split = {depthkv::HeadAllocation::kAdaptive, 0.25};
  const std::string path = temp_path("head_settings.json");
  depthkv::save_profile(f, path);
  const ProfileFile g = depthkv::load_profile(path);
  std::remove(path.c_str());
  const depthkv::PruneSpec& gs = *g.calibration.selection;
  REQUIRE(gs.scorer.output_aware);
  REQUIRE(gs.head_split.mode == depthkv::HeadAllocation::kAdaptive);
  REQUIRE(gs.head_split.alpha == 0.25);
  REQUIRE(gs.describe_selection() ==
          "sinks=4 recent=16 obs_window=32 kernel=7 pooling=avg output_aware=1 head_alloc=adaptive head_alpha=0.25");
  REQUIRE_FALSE(gs.same_selection(os));
  REQUIRE(gs.same_selection(*f.calibration.selection));
  depthkv::PruneSpec r = *f.calibration.selection;
  r.scorer.output_aware = false;
  REQUIRE_FALSE(gs.same_selection(r));
  r = *f.calibration.selection;
  r.head_split.alpha = 0.2;
  REQUIRE_FALSE(gs.same_selection(r));
  // bad values
  const nlohmann::json good = depthkv::profile_to_json(f);
  auto expect = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& msg) {
    expect_refused(good, edit, msg);
  };
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["head_alloc"] = "ada"; }, "unknown head allocation 'ada'");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["head_alpha"] = 1.5; }, "head_split.alpha 1.5 outside [0, 1]");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["head_alpha"] = "x"; },
         "'calibration.selection.head_alpha' is not a number");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["output_aware"] = 1; },
         "'calibration.selection.output_aware' must be a boolean");
  expect([](nlohmann::json& j) { j["calibration"]["selection"]["head_alloc"] = 3; }, "calibration.selection.head_alloc");
}

TEST_CASE("the lookahead of the selection: round trip, written only when set, refused when bad", "[profile_io]") {
  ProfileFile f = sample_file();
  const nlohmann::json plain = depthkv::profile_to_json(f);
  REQUIRE_FALSE(plain["calibration"]["selection"].contains("lookahead"));
  REQUIRE(depthkv::profile_from_json(plain).calibration.selection->scorer.lookahead == 0);  // a file without the key
  f.calibration.selection->scorer.lookahead = 32;
  const nlohmann::json j = depthkv::profile_to_json(f);
  REQUIRE(j["calibration"]["selection"]["lookahead"] == 32);
  const ProfileFile g = depthkv::profile_from_json(j);
  const depthkv::PruneSpec& gs = *g.calibration.selection;
  REQUIRE(gs.scorer.lookahead == 32);
  REQUIRE(gs.describe_selection() == "sinks=4 recent=16 obs_window=32 kernel=7 pooling=avg lookahead=32");
  depthkv::PruneSpec r = gs;
  REQUIRE(gs.same_selection(r));
  r.scorer.lookahead = 0;
  REQUIRE_FALSE(gs.same_selection(r));
  expect_refused(j, [](nlohmann::json& k) { k["calibration"]["selection"]["lookahead"] = -3; },
                 "'calibration.selection.lookahead' -3 is out of range");
  expect_refused(j, [](nlohmann::json& k) { k["calibration"]["selection"]["lookahead"] = "x"; },
                 "calibration.selection.lookahead");
}

TEST_CASE("head curves: round trip beside the layer curves, older files load, malformed ones refused", "[profile_io]") {
  ProfileFile f = sample_file();
  // a file without head curves has no "heads" key and none are read back (older files)
  const nlohmann::json plain = depthkv::profile_to_json(f);
  REQUIRE_FALSE(plain["scorers"]["h2o"].contains("heads"));
  REQUIRE(depthkv::profile_from_json(plain).head_curves.empty());
  REQUIRE_FALSE(depthkv::profile_from_json(plain).has_head_curves("h2o"));
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(plain).head_profile("h2o"),
                      Contains("no head curves for scorer 'h2o'") && Contains("--head-curves"));
  // 3 layers x 2 KV heads, measured by the profiler over 6 units
  std::mt19937 rng(7);
  auto engine = [&](int, const std::vector<double>& ratios) {
    std::vector<depthkv::SampleMetrics> out;
    for (std::size_t i = 0; i < ratios.size(); ++i) out.push_back(random_metrics(rng));
    return out;
  };
  depthkv::ProfilerOptions o;
  o.keep_ratios = f.keep_ratios;
  depthkv::SensitivityProfiler heads(6, o);
  REQUIRE(heads.run_batched(engine));
  f.head_curves["h2o"] = {2, heads.state()};
  o.progress = [](int done, int) { return done < 9; };
  depthkv::SensitivityProfiler partial(6, o);
  REQUIRE_FALSE(partial.run_batched(engine));
  f.head_curves["snapkv"] = {2, partial.state()};
  const std::string path = temp_path("heads.json");
  depthkv::save_profile(f, path);
  const ProfileFile g = depthkv::load_profile(path);
  std::remove(path.c_str());
  REQUIRE(g.head_curves.size() == 2);
  REQUIRE(g.head_curves.at("h2o").n_kv_heads == 2);
  REQUIRE(g.head_curves.at("h2o").state.metrics.kl.loss == heads.state().metrics.kl.loss);
  REQUIRE(g.head_curves.at("h2o").state.metrics.dnll.loss_stderr == heads.state().metrics.dnll.loss_stderr);
  REQUIRE(g.head_curves.at("snapkv").state.done == partial.state().done);
  REQUIRE(g.has_head_curves("h2o"));
  REQUIRE_FALSE(g.has_head_curves("snapkv"));
  REQUIRE(g.head_profile("h2o").loss == heads.state().metrics.kl.loss);
  REQUIRE(g.head_profile("h2o").n_layers() == 6);
  REQUIRE_THROWS_WITH(g.head_profile("snapkv"), Contains("head curves of scorer 'snapkv' are incomplete (9 of 18 runs)"));
  REQUIRE(g.profile("h2o").loss == f.scorers.at("h2o").metrics.kl.loss);  // the layer curves are untouched
  // a partial head profile resumes
  depthkv::SensitivityProfiler resumed(6, depthkv::ProfilerOptions{f.keep_ratios, nullptr, nullptr});
  resumed.resume(g.head_curves.at("snapkv").state);
  REQUIRE(resumed.state().n_done() == 9);
  // malformed head curves are refused with the key named
  const nlohmann::json good = depthkv::profile_to_json(f);
  auto expect = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& msg) {
    expect_refused(good, edit, msg);
  };
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"].erase("n_kv_heads"); },
         "missing key 'scorers.h2o.heads.n_kv_heads'");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"]["n_kv_heads"] = 0; },
         "'scorers.h2o.heads.n_kv_heads' 0 is out of range");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"]["n_kv_heads"] = 3; },
         "'scorers.h2o.heads.kl.mean' must be an array of 9 rows");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"].erase("top1"); }, "missing key 'scorers.h2o.heads.top1'");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"]["kl"]["mean"][4][1] = nullptr; },
         "'scorers.h2o.heads.kl.mean[4][1]' is not a number (null)");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"]["kl"]["mean"][4][1] = -0.5; }, "'scorers.h2o.heads'");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"]["kl"]["mean"][4][1] = -0.5; },
         "metric 'kl': validate: loss of layer 4 at keep ratio 0.3 is negative");
  expect([](nlohmann::json& j) { j["scorers"]["h2o"]["heads"]["dnll"]["stderr"][5].erase(0); },
         "'scorers.h2o.heads.dnll.stderr[5]' has 2 entries, expected 3 (wrong shape)");
  expect([](nlohmann::json& j) { j["scorers"]["snapkv"]["heads"]["done"][0][0] = 3; },
         "'scorers.snapkv.heads.done' holds 3");
  // the in-memory checks
  ProfileFile orphan = f;
  orphan.head_curves["tova"] = f.head_curves.at("h2o");
  REQUIRE_THROWS_WITH(depthkv::profile_to_json(orphan), Contains("'scorers.tova.heads': head curves of a scorer without layer curves"));
  ProfileFile rows = f;
  rows.head_curves["h2o"].n_kv_heads = 4;
  REQUIRE_THROWS_WITH(depthkv::profile_to_json(rows), Contains("has 6 rows, expected n_layers x n_kv_heads = 12"));
}

TEST_CASE("bad values are described briefly, deep nesting is refused, counts and losses are bounded",
          "[profile_io]") {
  const nlohmann::json good = depthkv::profile_to_json(sample_file());
  // an array nested 100,000 deep where a number belongs: described by its type (dumping it
  // recursed once per level and overflowed the stack)
  {
    nlohmann::json deep = 1.0;
    for (int i = 0; i < 100000; ++i) {
      nlohmann::json a = nlohmann::json::array();
      a.push_back(std::move(deep));
      deep = std::move(a);
    }
    nlohmann::json j = good;
    j["scorers"]["h2o"]["kl"]["mean"][1][2] = std::move(deep);
    REQUIRE_THROWS_WITH(depthkv::profile_from_json(j),
                        Contains("'scorers.h2o.kl.mean[1][2]' is not a number (an array of 1 element)"));
  }
  // a long string: a bounded prefix and its length; an object: its key count
  expect_refused(good, [](nlohmann::json& j) { j["n_layers"] = std::string(100000, 'x'); },
                 "'n_layers' is not an integer (the string \"" + std::string(40, 'x') + "\"... (100000 bytes))");
  expect_refused(good, [](nlohmann::json& j) { j["metric"] = {{"a", 1}, {"b", 2}}; },
                 "'metric' is not a string (an object of 2 keys)");
  expect_refused(good, [](nlohmann::json& j) { j["calibration"]["selection"]["output_aware"] = {1, 2, 3}; },
                 "'calibration.selection.output_aware' must be a boolean, got an array of 3 elements");
  // ints of the file: a value of 2^31 must not wrap into a negative int
  expect_refused(good, [](nlohmann::json& j) { j["calibration"]["context"] = 2147483648LL; },
                 "'calibration.context' 2147483648 is out of range [0, 2147483647]");
  expect_refused(good, [](nlohmann::json& j) { j["calibration"]["continuation"] = -1; },
                 "'calibration.continuation' -1 is out of range [0, 2147483647]");
  expect_refused(good, [](nlohmann::json& j) { j["scorers"]["h2o"]["n_samples"] = 4294967296LL; },
                 "'scorers.h2o.n_samples' 4294967296 is out of range");
  expect_refused(good, [](nlohmann::json& j) { j["n_layers"] = 1LL << 40; }, "'n_layers' 1099511627776 is out of range [1, 65536]");
  expect_refused(good, [](nlohmann::json& j) { j["n_layers"] = 0; }, "'n_layers' 0 is out of range [1, 65536]");
  expect_refused(good, [](nlohmann::json& j) { j["model"]["size"] = 18446744073709551615ULL; },
                 "'model.size' 18446744073709551615 is out of range");
  // losses: finite but absurd values would overflow the predicted loss and the allocator's slopes
  expect_refused(good, [](nlohmann::json& j) { j["scorers"]["h2o"]["kl"]["mean"][0][0] = 1e308; },
                 "'scorers.h2o.kl.mean[0][0]' 1e+308 is not a loss (|value| <= 1e+09)");
  expect_refused(good, [](nlohmann::json& j) { j["scorers"]["h2o"]["dnll"]["stderr"][2][1] = -1e300; },
                 "'scorers.h2o.dnll.stderr[2][1]' -1e+300 is not a loss");
}

TEST_CASE("profile files: JSON nested deeper than 64 levels and directories are refused on load", "[profile_io]") {
  const std::string path = temp_path("deep.json");
  const int depth = 70000;
  write_file(path, std::string(depth, '[') + std::string(depth, ']'));
  REQUIRE_THROWS_WITH(depthkv::load_profile(path),
                      Contains("profile file '" + path + "' is not valid JSON: arrays or objects nested deeper than 64 levels"));
  write_file(path, std::string(64, '[') + std::string(64, ']'));  // 64 levels parse (then: not an object)
  REQUIRE_THROWS_WITH(depthkv::load_profile(path), Contains("not a JSON object"));
  std::remove(path.c_str());
  const std::string dir = depthkv_test::scratch_dir().path();
  REQUIRE_THROWS_WITH(depthkv::load_profile(dir), Contains("'" + dir + "' is a directory, not a profile file"));
  REQUIRE_THROWS_WITH(depthkv::model_identity(dir), Contains("'" + dir + "' is a directory, not a model file"));
}

TEST_CASE("the layers' sliding windows and the KV shape: written only when set, round trip, refused when bad",
          "[profile_io][window]") {
  ProfileFile f = sample_file();
  REQUIRE_FALSE(depthkv::profile_to_json(f).contains("layer_window"));
  REQUIRE_FALSE(depthkv::profile_to_json(f).contains("kv_shape"));
  f.layer_window.assign(static_cast<std::size_t>(f.n_layers), 512);
  f.layer_window.back() = 0;
  f.kv_heads = 1;
  f.head_dim = 256;
  const nlohmann::json j = depthkv::profile_to_json(f);
  const ProfileFile back = depthkv::profile_from_json(j);
  REQUIRE(back.layer_window == f.layer_window);
  REQUIRE((back.kv_heads == 1 && back.head_dim == 256));
  // the policies read them: the windows become the allocator's caps
  REQUIRE(depthkv::policy_curves(back, back.scorers.begin()->first, depthkv::AllocationPolicy::kUniform).data().layer_window ==
          f.layer_window);
  nlohmann::json bad = j;
  bad["layer_window"] = {512};
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(bad), Contains("'layer_window' has 1 entries"));
  bad["layer_window"] = "512";
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(bad), Contains("'layer_window' must be an array"));
  bad = j;
  bad["layer_window"][0] = -1;
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(bad), Contains("layer_window[0]"));
  bad = j;
  bad["kv_shape"]["head_dim"] = 0;
  REQUIRE_THROWS_WITH(depthkv::profile_from_json(bad), Contains("kv_shape.head_dim"));
}
