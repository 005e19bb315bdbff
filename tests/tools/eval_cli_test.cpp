// Tests of `depthkv profile`, `allocate` and `eval` (tools/cmd_*.cpp) as separate processes on the
// real stories260K model, with small settings so that they run in seconds.

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "depthkv/profile_io.hpp"
#include "support/run_cli.hpp"
#include "support/test_data.hpp"

using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

namespace {

std::string tmp_path(const std::string& name) {
  const char* t = std::getenv("TMPDIR");
  return std::string(t ? t : "/tmp") + "/depthkv_eval_cli_" + std::to_string(::getpid()) + "_" + name;
}

struct Fixture {
  std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  std::string profile = tmp_path("profile.json");
  // 4 calibration windows (0..3) of 64 + 16 tokens, two ratios, two scorers.
  std::string common = " --context 64 --continuation 16 --sinks 2 --window 4 --threads 1";
  Fixture() {
    const auto r = run_cli("profile --model " + model + " --text " + text + common +
                           " --windows 4 --ratios 0.2,0.5 --scorers h2o,snapkv -o " + shell_quoted(profile));
    REQUIRE(r.status == 0);
  }
  ~Fixture() { std::remove(profile.c_str()); }
};

}  // namespace

TEST_CASE("profile writes a complete profile file describing its calibration windows",
          "[cli][profile][real]") {
  Fixture fx;
  const depthkv::ProfileFile f = depthkv::load_profile(fx.profile);
  REQUIRE(f.n_layers == 5);
  REQUIRE(f.keep_ratios == std::vector<double>{0.2, 0.5});
  REQUIRE(f.has_scorer("h2o"));
  REQUIRE(f.has_scorer("snapkv"));
  REQUIRE(f.calibration.window_begin == 0);
  REQUIRE(f.calibration.window_end == 4);
  REQUIRE(f.calibration.context == 64);
  // the selection the curves were measured under, as structured fields
  REQUIRE(f.calibration.selection.n_sink == 2);
  REQUIRE(f.calibration.selection.n_recent == 4);
  REQUIRE(f.calibration.selection.window == 4);
  REQUIRE(f.calibration.selection.kernel == 7);
  const depthkv::SensitivityProfile p = f.profile("h2o");
  // Keeping more of a layer never costs more in these measurements (loss at 0.5 <= loss at 0.2
  // for the mean over layers) and pruning costs something.
  REQUIRE(p.loss.col(0).sum() > 0.0);
  REQUIRE(p.loss.col(1).sum() <= p.loss.col(0).sum());
}

TEST_CASE("eval refuses windows overlapping the calibration windows, accepts disjoint ones",
          "[cli][eval][real]") {
  Fixture fx;
  const std::string base =
      "eval --model " + fx.model + " --text " + fx.text + " --profile " + shell_quoted(fx.profile) +
      " --sinks 2 --window 4 --threads 1 --keep 0.3 --policies uniform,optimal --windows 3";
  const auto overlap = run_cli(base + " --skip 2", "2>&1");
  REQUIRE(overlap.status != 0);
  REQUIRE(overlap.out.find("overlap") != std::string::npos);
  const auto ok = run_cli(base + " --json");  // default skip: the first window after calibration
  REQUIRE(ok.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(ok.out);
  REQUIRE(rows.size() == 4);  // 2 scorers x 1 keep x 2 policies
  for (const auto& r : rows) {
    for (const char* key : {"scorer", "policy", "keep", "budgets", "kl", "dnll", "top1", "nll_full",
                            "bytes_kept", "bytes_full"})
      REQUIRE(r.contains(key));
    const auto b = r["budgets"].get<std::vector<int>>();
    REQUIRE(b.size() == 5);
    REQUIRE(std::accumulate(b.begin(), b.end(), 0) == static_cast<int>(std::lround(0.3 * 64 * 5)));
    REQUIRE(r["kl"].get<double>() >= 0.0);
    REQUIRE(r["bytes_kept"].get<double>() < r["bytes_full"].get<double>());
  }
  // A scorer the profile lacks, and a profile of another model, are refused.
  const auto tova = run_cli(base + " --scorers tova", "2>&1");
  REQUIRE(tova.status != 0);
  REQUIRE(tova.out.find("tova") != std::string::npos);
  const std::string other = shell_quoted(depthkv_test::data_path("models/aidreams260K/aidreams260K.bin"));
  const auto wrong = run_cli("eval --model " + other + " --text " + fx.text + " --profile " +
                                 shell_quoted(fx.profile) + " --windows 1 --skip 10",
                             "2>&1");
  REQUIRE(wrong.status != 0);
  REQUIRE(wrong.out.find("error") != std::string::npos);
}

TEST_CASE("allocate prints budgets that sum to the global budget", "[cli][allocate][real]") {
  Fixture fx;
  for (const char* policy : {"uniform", "pyramid", "proportional", "middle", "optimal"}) {
    const auto r = run_cli("allocate --profile " + shell_quoted(fx.profile) +
                           " --keep 0.25 --sinks 2 --window 4 --json --policy " + policy);
    INFO(policy << ": " << r.out);
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    const auto b = j["budgets"].get<std::vector<int>>();
    REQUIRE(std::accumulate(b.begin(), b.end(), 0) == 80);  // 0.25 * 64 tokens * 5 layers
  }
  const auto bad =
      run_cli("allocate --profile " + shell_quoted(fx.profile) + " --keep 0.25 --policy nonsense", "2>&1");
  REQUIRE(bad.status != 0);
}

TEST_CASE("allocate and eval note protection other than the profile was measured with",
          "[cli][allocate][real]") {
  Fixture fx;
  const std::string note =
      "note: the profile was measured keeping 2 sinks and 4 recent tokens (scorer window 4)";
  const std::string alloc = "allocate --profile " + shell_quoted(fx.profile) + " --keep 0.5 --json ";
  // same settings, or a policy that does not read the curves: no note (stderr joined to stdout)
  REQUIRE(run_cli(alloc + "--sinks 2 --window 4 --policy optimal", "2>&1").out.find("note:") ==
          std::string::npos);
  REQUIRE(run_cli(alloc + "--sinks 3 --policy uniform", "2>&1").out.find("note:") == std::string::npos);
  // other sinks or window: the note names the profile's settings and the flags that match them
  for (const char* other : {"--sinks 3 --window 4", "--sinks 2 --window 8", ""}) {
    const auto r = run_cli(alloc + other + " --policy optimal", "2>&1");
    INFO(other << ": " << r.out);
    REQUIRE(r.status == 0);
    REQUIRE(r.out.find(note) != std::string::npos);
    REQUIRE(r.out.find("Pass --sinks 2 --window 4 to prune as the profile measured") != std::string::npos);
  }
  // eval says so before it starts (here it then stops: its windows overlap the calibration windows)
  const auto ev = run_cli("eval --model " + fx.model + " --text " + fx.text + " --profile " +
                              shell_quoted(fx.profile) + " --keep 0.3 --policies uniform,optimal --skip 2",
                          "2>&1");
  REQUIRE(ev.status != 0);
  REQUIRE(ev.out.find(note) != std::string::npos);
  // a profile written before calibration.selection existed: read from the calibration description
  nlohmann::json j = depthkv::profile_to_json(depthkv::load_profile(fx.profile));
  j["calibration"].erase("selection");
  REQUIRE(j["calibration"]["description"].get<std::string>().find("sinks=2 window=4 kernel=7") == 0);
  const std::string old_file = tmp_path("old_profile.json");
  {
    std::ofstream out(old_file);
    out << j.dump();
  }
  REQUIRE_FALSE(depthkv::load_profile(old_file).calibration.selection.recorded());
  const auto r = run_cli(
      "allocate --profile " + shell_quoted(old_file) + " --keep 0.5 --sinks 3 --policy optimal", "2>&1");
  REQUIRE(r.status == 0);
  REQUIRE(r.out.find(note) != std::string::npos);
  std::remove(old_file.c_str());
}

TEST_CASE("generate --profile prunes with the budgets allocate computes from the same profile",
          "[cli][generate][real]") {
  Fixture fx;
  // protection and SnapKV window as the profile was measured (--sinks 2 --window 4)
  const std::string base =
      "generate --model " + fx.model +
      " --prompt 'Once upon a time there was a little girl named Lily. She loved to play outside"
      " with her friends in the big park.' -t 0 -n 60 --scorer snapkv --sink 2 --recent 4"
      " --window 4 --keep 0.4 ";
  // stderr says "kv cache: snapkv/<policy> keep 0.400 -> per-layer tokens b0 ... b4 of N; ..."
  auto budgets_of = [](const std::string& out, int& n_prompt) {
    const std::size_t at = out.find("per-layer tokens ");
    REQUIRE(at != std::string::npos);
    std::istringstream is(out.substr(at + 17));
    std::vector<int> b;
    std::string word;
    while (is >> word && word != "of") b.push_back(std::stoi(word));
    is >> n_prompt;
    return b;
  };
  for (const char* policy : {"optimal", "proportional"}) {
    const auto g = run_cli(base + "--policy " + policy + " --profile " + shell_quoted(fx.profile), "2>&1");
    INFO(policy << ": " << g.out);
    REQUIRE(g.status == 0);
    int n_prompt = 0;
    const std::vector<int> got = budgets_of(g.out, n_prompt);
    REQUIRE(got.size() == 5);
    REQUIRE(n_prompt > 20);
    const auto a =
        run_cli("allocate --profile " + shell_quoted(fx.profile) + " --scorer snapkv --sinks 2 --window 4" +
                " --keep 0.4 --json --policy " + policy + " --length " + std::to_string(n_prompt));
    REQUIRE(a.status == 0);
    REQUIRE(got == nlohmann::json::parse(a.out)["budgets"].get<std::vector<int>>());
    REQUIRE(g.out.find("note: the profile was measured") == std::string::npos);  // same protection
  }
  // other protection than the profile measured: a note names the profile's settings
  const auto other_prot =
      run_cli("generate --model " + fx.model +
                  " --prompt 'Once upon a time there was a"
                  " little girl named Lily.' -t 0 -n 30 --keep 0.5 --scorer snapkv --policy optimal"
                  " --profile " +
                  shell_quoted(fx.profile),
              "2>&1");
  REQUIRE(other_prot.status == 0);
  REQUIRE(other_prot.out.find(
              "note: the profile was measured keeping 2 sinks and 4 recent tokens (scorer "
              "window 4); this run keeps 0 sinks and 0 recent tokens (scorer window 32). Pass "
              "--sink 2 --recent 4 --window 4 to prune as the profile measured.") != std::string::npos);
  // a curve-based policy without a profile, a scorer the profile lacks, a profile of another model
  const auto none = run_cli(base + "--policy optimal", "2>&1");
  REQUIRE(none.status == 1);
  REQUIRE(none.out.find("needs --profile") != std::string::npos);
  const auto tova =
      run_cli("generate --model " + fx.model +
                  " -t 0 -n 40 --prompt 'Once upon a time, a cat sat"
                  " on the mat and looked at the sun.' --keep 0.5 --scorer tova --policy optimal"
                  " --profile " +
                  shell_quoted(fx.profile),
              "2>&1");
  REQUIRE(tova.status == 1);
  REQUIRE(tova.out.find("tova") != std::string::npos);
  const std::string other = shell_quoted(depthkv_test::data_path("models/aidreams260K/aidreams260K.bin"));
  const auto wrong =
      run_cli("generate --model " + other + " -t 0 -n 10 --keep 0.5 --policy optimal --profile " +
                  shell_quoted(fx.profile),
              "2>&1");
  REQUIRE(wrong.status == 1);
  REQUIRE(wrong.out.find("error") != std::string::npos);
}
