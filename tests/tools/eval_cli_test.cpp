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
#include <utility>
#include <vector>

#include "depthkv/llama/gguf.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "llama/gguf_writer.hpp"
#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

using depthkv_test::tmp_path;

namespace {

struct Fixture {
  std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  std::string profile = tmp_path("profile.json");
  // 4 calibration windows (0..3) of 64 + 16 tokens, two ratios, two scorers.
  std::string common = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  Fixture() {
    const auto r = run_cli("profile --model " + model + " --text " + text + common +
                           " --windows 4 --ratios 0.2,0.5 --scorers h2o,snapkv -o " + shell_quoted(profile));
    REQUIRE(r.status == 0);
  }
  ~Fixture() { std::remove(profile.c_str()); }
};

// Profiles `model` (default stories260K) on 3 calibration windows of 64 + 16 tokens (2 sinks,
// 4 recent, 1 thread) with `flags` into the scratch file `name`. @return its path
std::string small_profile(const std::string& flags, const std::string& name,
                          const std::string& model = depthkv_test::data_path("models/stories260K/stories260K.bin")) {
  const std::string path = tmp_path(name);
  REQUIRE(run_cli("profile --model " + shell_quoted(model) +
                  " --text " + shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")) +
                  " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 3 " + flags +
                  " -o " + shell_quoted(path))
              .status == 0);
  return path;
}

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
  REQUIRE(f.calibration.selection->protection.n_sink == 2);
  REQUIRE(f.calibration.selection->protection.n_recent == 4);
  REQUIRE(f.calibration.selection->scorer.window == 4);
  REQUIRE(f.calibration.selection->scorer.kernel == 7);
  REQUIRE(f.calibration.selection->scorer.pooling == depthkv::Pooling::kMax);
  REQUIRE(f.calibration.description == "sinks=2 recent=4 obs_window=4 kernel=7 pooling=max text");
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
      " --sinks 2 --recent 4 --obs-window 4 --threads 1 --keeps 0.3 --policies uniform,optimal --windows 3";
  require_error(run_cli(base + " --skip 2", "2>&1"),
                "evaluation windows (tokens 160..400 of tinystories_valid.txt) overlap the profile's calibration "
                "windows (tokens 0..320): use --skip >= 4");
  const auto ok = run_cli(base + " --json");  // default skip: the first window after calibration
  REQUIRE(ok.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(ok.out);
  REQUIRE(rows.size() == 4);  // 2 scorers x 1 keep x 2 policies
  for (const auto& r : rows) {
    for (const char* key : {"scorer", "policy", "keep", "budgets", "kl", "kl_se", "dnll", "dnll_se", "top1",
                            "nll_full", "bytes_kept", "bytes_full"})
      REQUIRE(r.contains(key));
    REQUIRE(r["kl_se"].get<double>() > 0.0);  // the standard error over 3 windows of different KL
    REQUIRE(r["dnll_se"].get<double>() > 0.0);
    const auto b = r["budgets"].get<std::vector<int>>();
    REQUIRE(b.size() == 5);
    REQUIRE(std::accumulate(b.begin(), b.end(), 0) == static_cast<int>(std::lround(0.3 * 64 * 5)));
    REQUIRE(r["kl"].get<double>() >= 0.0);
    REQUIRE(r["bytes_kept"].get<double>() < r["bytes_full"].get<double>());
  }
  // A scorer the profile lacks, and a profile of another model, are refused.
  require_error(run_cli(base + " --scorers tova", "2>&1"),
                "the profile has no measurements for scorer 'tova': profile it first (depthkv profile --scorers tova)");
  const std::string other = shell_quoted(depthkv_test::data_path("models/aidreams260K/aidreams260K.bin"));
  require_error(run_cli("eval --model " + other + " --text " + fx.text + " --profile " + shell_quoted(fx.profile) +
                            " --windows 1 --skip 10",
                        "2>&1"),
                "the profile was measured on another model: profile 'stories260K.bin'");
  // keep ratios outside (0, 1], and a malformed list
  const std::string no_keep = "eval --model " + fx.model + " --text " + fx.text + " --profile " +
                              shell_quoted(fx.profile) + " --threads 1 --policies uniform --windows 1";
  require_error(run_cli(no_keep + " --keeps 0.3,0", "2>&1"), "--keeps: 0 outside (0, 1]");
  require_error(run_cli(no_keep + " --keeps 0.3,x", "2>&1"), "--keeps: 'x' is not a number");
}

TEST_CASE("eval --windows-out writes the evaluation windows' ids and evaluates nothing", "[cli][eval][real]") {
  Fixture fx;
  const std::string out = tmp_path("windows.json");
  const std::string base = "eval --model " + fx.model + " --text " + fx.text + " --profile " + shell_quoted(fx.profile) +
                           " --threads 1 --windows 3";
  const auto r = run_cli(base + " --windows-out " + shell_quoted(out));
  REQUIRE(r.status == 0);
  REQUIRE(r.out.empty());  // no table printed
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j["model"] == "stories260K.bin");
  REQUIRE(j["source"] == "tinystories_valid.txt");
  REQUIRE(j["context"] == 64);
  REQUIRE(j["continuation"] == 16);
  REQUIRE(j["skip"] == 4);  // the first window after the 4 calibration windows
  REQUIRE(j["windows"].size() == 3);
  for (int i = 0; i < 3; ++i) {
    const auto& w = j["windows"][static_cast<std::size_t>(i)];
    REQUIRE(w["index"] == 4 + i);
    const auto c = w["context"].get<std::vector<int>>(), t = w["continuation"].get<std::vector<int>>();
    REQUIRE(c.size() == 64);
    REQUIRE(t.size() == 16);
    for (const std::vector<int>* v : {&c, &t})
      for (int id : *v) REQUIRE((id >= 0 && id < 512));
  }
  REQUIRE(j["windows"][0]["context"] != j["windows"][1]["context"]);
  std::remove(out.c_str());
  require_error(run_cli(base + " --windows-out /nonexistent-dir/w.json", "2>&1"), "cannot write '/nonexistent-dir/w.json'");
}

TEST_CASE("the selection flags are --sinks --recent --obs-window --kernel --pooling everywhere, --window is refused",
          "[cli][real]") {
  Fixture fx;
  const std::string split = "--window is no longer an option: use --recent N --obs-window N (--window N set both)";
  const std::string alloc = "allocate --profile " + shell_quoted(fx.profile) + " --keep 0.5 --json --policy optimal ";
  require_error(run_cli(alloc + "--window 4", "2>&1"), split);
  require_error(run_cli("eval --model " + fx.model + " --text " + fx.text + " --profile " + shell_quoted(fx.profile) +
                            " --window 4",
                        "2>&1"),
                split);
  require_error(run_cli("profile --model " + fx.model + " --text " + fx.text + " --window 4 -o " +
                            shell_quoted(tmp_path("unused.json")),
                        "2>&1"),
                split);
  require_error(run_cli("generate --model " + fx.model + " --window 8", "2>&1"),
                "--window is no longer an option: use --obs-window N");
  require_error(run_cli("generate --model " + fx.model + " --sink 2", "2>&1"),
                "--sink is no longer an option: use --sinks N");
  // the new flags are checked
  require_error(run_cli(alloc + "--sinks 2 --recent 4 --obs-window 4 --pooling mean", "2>&1"),
                "--pooling: unknown pooling 'mean' (expected none, max or avg)");
  require_error(run_cli(alloc + "--kernel 4", "2>&1"),
                "bad selection settings: sinks=4 recent=16 obs_window=16 kernel=4 pooling=max (--sinks, --recent, "
                "--lookahead >= 0; --obs-window >= 1; odd --kernel >= 1)");
  require_error(run_cli(alloc + "--obs-window 0", "2>&1"), "--obs-window: must be >= 1, got 0");
  require_error(run_cli(alloc + "--recent -1", "2>&1"), "--recent: must be >= 0, got -1");
  // --help names the new flags and not the old ones
  for (const char* cmd : {"profile", "eval", "allocate", "generate"}) {
    const auto help = run_cli(std::string(cmd) + " --help");
    INFO(cmd << ": " << help.out);
    REQUIRE(help.status == 0);
    for (const char* flag : {"--sinks", "--recent", "--obs-window", "--kernel", "--pooling"})
      REQUIRE(help.out.find(flag) != std::string::npos);
    REQUIRE(help.out.find("--window ") == std::string::npos);
    REQUIRE(help.out.find("--sink ") == std::string::npos);
  }
  // a usage error is reported like every other error
  require_error(run_cli("allocate --keep 0.5", "2>&1"), "--profile is required");
}

TEST_CASE("allocate prints budgets that sum to the global budget", "[cli][allocate][real]") {
  Fixture fx;
  for (const char* policy : {"uniform", "pyramid", "proportional", "middle", "optimal"}) {
    const auto r = run_cli("allocate --profile " + shell_quoted(fx.profile) +
                           " --keep 0.25 --sinks 2 --recent 4 --obs-window 4 --json --policy " + policy);
    INFO(policy << ": " << r.out);
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    const auto b = j["budgets"].get<std::vector<int>>();
    REQUIRE(std::accumulate(b.begin(), b.end(), 0) == 80);  // 0.25 * 64 tokens * 5 layers
  }
  require_error(run_cli("allocate --profile " + shell_quoted(fx.profile) + " --keep 0.25 --policy nonsense", "2>&1"),
                "unknown allocation policy 'nonsense' (expected uniform, pyramid, proportional, middle, optimal, mga, "
                "mlma2, mlma4, mlma6, mlp or head-optimal)");
  // one keep range, (0, 1], as eval and generate
  require_error(run_cli("allocate --profile " + shell_quoted(fx.profile) + " --keep 0 --policy uniform", "2>&1"),
                "--keep: 0 outside (0, 1]");
  require_error(run_cli("allocate --profile " + shell_quoted(fx.profile) + " --keep 1.5 --policy uniform", "2>&1"),
                "--keep: 1.5 outside (0, 1]");
  const auto one = run_cli("allocate --profile " + shell_quoted(fx.profile) + " --keep 1 --json --policy optimal " +
                           "--sinks 2 --recent 4 --obs-window 4");
  REQUIRE(one.status == 0);
  REQUIRE(nlohmann::json::parse(one.out)["budgets"].get<std::vector<int>>() == std::vector<int>(5, 64));
}

TEST_CASE("allocate and eval note protection other than the profile was measured with",
          "[cli][allocate][real]") {
  Fixture fx;
  const std::string note = "depthkv: note: the profile was measured with sinks=2 recent=4 obs_window=4 kernel=7 "
                           "pooling=max; this run uses ";
  const std::string pass =
      ". Pass --sinks 2 --recent 4 --obs-window 4 --kernel 7 --pooling max to prune as the profile measured.\n";
  const std::string alloc = "allocate --profile " + shell_quoted(fx.profile) + " --keep 0.5 --json ";
  // same settings, or a policy that does not read the curves: no note (stderr joined to stdout)
  REQUIRE(run_cli(alloc + "--sinks 2 --recent 4 --obs-window 4 --policy optimal", "2>&1").out.find("note:") ==
          std::string::npos);
  REQUIRE(run_cli(alloc + "--sinks 3 --policy uniform", "2>&1").out.find("note:") == std::string::npos);
  // any other setting: the note names the profile's settings, this run's, and the flags that match
  const std::string same = " --sinks 2 --recent 4 --obs-window 4";
  for (const auto& other : std::vector<std::pair<std::string, std::string>>{
           {" --sinks 3 --recent 4 --obs-window 4", "sinks=3 recent=4 obs_window=4 kernel=7 pooling=max"},
           {" --sinks 2 --recent 8 --obs-window 4", "sinks=2 recent=8 obs_window=4 kernel=7 pooling=max"},
           {" --sinks 2 --recent 4 --obs-window 8", "sinks=2 recent=4 obs_window=8 kernel=7 pooling=max"},
           {same + " --kernel 5", "sinks=2 recent=4 obs_window=4 kernel=5 pooling=max"},
           {same + " --pooling avg", "sinks=2 recent=4 obs_window=4 kernel=7 pooling=avg"},
           {"", "sinks=4 recent=16 obs_window=16 kernel=7 pooling=max"}}) {  // allocate's defaults
    const auto r = run_cli(alloc + other.first + " --policy optimal", "2>&1");
    INFO(other.first << ": " << r.out);
    REQUIRE(r.status == 0);
    REQUIRE(r.out.find(note + other.second + pass) != std::string::npos);
  }
  // eval says so before it starts (here it then stops: its windows overlap the calibration windows)
  const auto ev = run_cli("eval --model " + fx.model + " --text " + fx.text + " --profile " +
                              shell_quoted(fx.profile) + " --keeps 0.3 --policies uniform,optimal --skip 2",
                          "2>&1");
  require_error(ev, "overlap the profile's calibration windows");
  REQUIRE(ev.out.find(note + "sinks=4 recent=16 obs_window=16 kernel=7 pooling=max" + pass) != std::string::npos);
  // profiles written before calibration.selection existed: read from the calibration description,
  // in the older "sinks=S window=W kernel=K" (recent = observation window = W) and in today's spelling
  nlohmann::json j = depthkv::profile_to_json(depthkv::load_profile(fx.profile));
  j["calibration"].erase("selection");
  const std::string old_file = tmp_path("old_profile.json");
  for (const char* description : {"sinks=2 window=4 kernel=7 text", "sinks=2 recent=4 obs_window=4 kernel=7 pooling=max text"}) {
    j["calibration"]["description"] = description;
    {
      std::ofstream out(old_file);
      out << j.dump();
    }
    REQUIRE_FALSE(depthkv::load_profile(old_file).calibration.selection);
    const auto r = run_cli(
        "allocate --profile " + shell_quoted(old_file) + " --keep 0.5 --sinks 3 --policy optimal", "2>&1");
    INFO(description << ": " << r.out);
    REQUIRE(r.status == 0);
    REQUIRE(r.out.find(note + "sinks=3 recent=16 obs_window=16 kernel=7 pooling=max" + pass) != std::string::npos);
  }
  // and calibration.selection in the older spelling {n_sink, n_recent, window, kernel}
  j["calibration"]["description"] = "";
  j["calibration"]["selection"] = {{"n_sink", 2}, {"n_recent", 4}, {"window", 4}, {"kernel", 7}};
  {
    std::ofstream out(old_file);
    out << j.dump();
  }
  REQUIRE(depthkv::load_profile(old_file).calibration.selection->scorer.pooling == depthkv::Pooling::kMax);
  const auto r = run_cli("allocate --profile " + shell_quoted(old_file) + " --keep 0.5 --policy optimal", "2>&1");
  REQUIRE(r.status == 0);
  REQUIRE(r.out.find(note + "sinks=4 recent=16 obs_window=16 kernel=7 pooling=max" + pass) != std::string::npos);
  REQUIRE(run_cli("allocate --profile " + shell_quoted(old_file) + " --keep 0.5 --policy optimal" + same, "2>&1")
              .out.find("note:") == std::string::npos);
  std::remove(old_file.c_str());
}

TEST_CASE("generate --profile prunes with the budgets allocate computes from the same profile",
          "[cli][generate][real]") {
  Fixture fx;
  // protection and SnapKV window as the profile was measured (--sinks 2 --recent 4 --obs-window 4)
  const std::string base =
      "generate --model " + fx.model +
      " --prompt 'Once upon a time there was a little girl named Lily. She loved to play outside"
      " with her friends in the big park.' -t 0 -n 60 --scorer snapkv --sinks 2 --recent 4"
      " --obs-window 4 --keep 0.4 ";
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
        run_cli("allocate --profile " + shell_quoted(fx.profile) + " --scorer snapkv --sinks 2 --recent 4 --obs-window 4" +
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
              "depthkv: note: the profile was measured with sinks=2 recent=4 obs_window=4 kernel=7 pooling=max; "
              "this run uses sinks=4 recent=16 obs_window=16 kernel=7 pooling=max. Pass --sinks 2 --recent 4 "
              "--obs-window 4 --kernel 7 --pooling max to prune as the profile measured.\n") != std::string::npos);
  // a curve-based policy without a profile, a scorer the profile lacks, a profile of another model
  require_error(run_cli(base + "--policy optimal", "2>&1"), "policy 'optimal' needs --profile");
  const auto tova =
      run_cli("generate --model " + fx.model +
                  " -t 0 -n 40 --prompt 'Once upon a time, a cat sat"
                  " on the mat and looked at the sun.' --keep 0.5 --scorer tova --policy optimal"
                  " --profile " +
                  shell_quoted(fx.profile),
              "2>&1");
  require_error(tova, "the profile has no measurements for scorer 'tova' (it has: h2o, snapkv)");
  const std::string other = shell_quoted(depthkv_test::data_path("models/aidreams260K/aidreams260K.bin"));
  const auto wrong =
      run_cli("generate --model " + other + " -t 0 -n 10 --keep 0.5 --policy optimal --profile " +
                  shell_quoted(fx.profile),
              "2>&1");
  require_error(wrong, "the profile was measured on another model: profile 'stories260K.bin'");
}

TEST_CASE("output-aware and head-allocation flags: recorded in profiles and eval rows, checked",
          "[cli][eval][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string profile = tmp_path("profile_oa.json");
  const std::string common = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  const std::string flags = " --output-aware --head-alloc adaptive --head-alpha 0.25";
  REQUIRE(run_cli("profile --model " + model + " --text " + text + common + flags +
                  " --windows 3 --ratios 0.2,0.5 --scorers snapkv -o " + shell_quoted(profile))
              .status == 0);
  const depthkv::ProfileFile f = depthkv::load_profile(profile);
  REQUIRE(f.calibration.selection->scorer.output_aware);
  REQUIRE(f.calibration.selection->head_split.mode == depthkv::HeadAllocation::kAdaptive);
  REQUIRE(f.calibration.selection->head_split.alpha == 0.25);
  const std::string eval = "eval --model " + model + " --text " + text + " --profile " + shell_quoted(profile) +
                           common + " --keeps 0.3 --policies uniform,optimal --windows 2";
  const std::string csv = tmp_path("oa.csv");
  const auto r = run_cli(eval + flags + " --json --csv " + shell_quoted(csv), "2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  REQUIRE(rows.size() == 2);
  for (const auto& row : rows) {
    REQUIRE(row["output_aware"] == true);
    REQUIRE(row["head_alloc"] == "adaptive");
    REQUIRE(row["head_alpha"] == 0.25);
  }
  {
    std::ifstream in(csv);
    std::string header;
    std::getline(in, header);
    REQUIRE(header == "scorer,policy,keep,kl,kl_stderr,dnll,top1,nll_full,bytes_kept,bytes_full,budgets,"
                      "output_aware,head_alloc,head_alpha");
  }
  // the defaults write the rows as before (no new keys), and note the profile's other settings
  const auto plain = run_cli(eval + " --json", "2>&1");
  REQUIRE(plain.status == 0);
  REQUIRE(plain.out.find("\"output_aware\"") == std::string::npos);
  REQUIRE(plain.out.find("--head-alloc adaptive --head-alpha 0.25") != std::string::npos);
  REQUIRE(plain.out.find(" --output-aware") != std::string::npos);
  // the results change with the settings
  const nlohmann::json prow = nlohmann::json::parse(plain.out.substr(plain.out.find('[')));
  REQUIRE(prow[0]["kl"] != rows[0]["kl"]);
  // bad values are refused, naming the flag
  require_error(run_cli(eval + " --head-alloc ada", "2>&1"),
                "--head-alloc: unknown head allocation 'ada' (expected uniform or adaptive)");
  require_error(run_cli(eval + " --head-alpha 1.5", "2>&1"), "--head-alpha: must be in [0, 1], got 1.5");
  require_error(run_cli("generate --model " + model + " --scorer knorm --keep 0.5 --output-aware --steps 4", "2>&1"),
                "scorer.output_aware: only for h2o, snapkv and tova, not knorm");
  // generate prunes with them
  const auto g = run_cli("generate --model " + model + " --scorer snapkv --keep 0.5 --steps 20 --temperature 0" + flags,
                         "2>&1");
  INFO(g.out);
  REQUIRE(g.status == 0);
  std::remove(profile.c_str());
  std::remove(csv.c_str());
}

TEST_CASE("preset best sets scorers, pooling, output-aware, head curves and head-optimal, rows name it",
          "[cli][eval][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string common = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  const std::string profile = small_profile("--preset best --ratios 0.1,0.2,0.5", "profile_best.json");
  const depthkv::ProfileFile f = depthkv::load_profile(profile);
  REQUIRE(f.has_scorer("snapkv"));
  REQUIRE(f.has_scorer("h2o"));
  REQUIRE(f.calibration.selection->scorer.output_aware);
  REQUIRE(f.calibration.selection->head_split.mode == depthkv::HeadAllocation::kUniform);
  REQUIRE(f.calibration.selection->scorer.pooling == depthkv::Pooling::kMax);
  REQUIRE(f.has_head_curves("snapkv"));
  REQUIRE(f.has_head_curves("h2o"));
  REQUIRE(f.calibration.selection->scorer.lookahead == 32);  // the preset's lookahead
  REQUIRE(f.calibration.selection->scorer.context_weight == 0.0);  // curves of the lookahead alone
  const std::string base =
      "eval --model " + model + " --text " + text + " --profile " + shell_quoted(profile) + common + " --windows 2";
  const std::string eval = base + " --keeps 0.1,0.3,0.5";
  const auto r = run_cli(eval + " --preset best --json", "2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  REQUIRE(rows.size() == 3);  // one row per keep: the chosen scorer, one policy
  std::ostringstream weight;
  weight << depthkv::kPresetContextWeight;
  const std::string spelled_flags =
      " --policies head-optimal --pooling max --output-aware --lookahead 32 --context-weight " + weight.str() + " --json";
  for (const auto& row : rows) {
    REQUIRE(row["preset"] == "best");
    REQUIRE(row["policy"] == "head-optimal");
    REQUIRE(row["output_aware"] == true);
    REQUIRE(row["head_alloc"] == "uniform");
    REQUIRE(row["head_alpha"] == 0.2);
    REQUIRE(row["pooling"] == "max");
    REQUIRE(row["sinks"] == 2);
    REQUIRE(row["recent"] == 4);
    REQUIRE(row["lookahead"] == 32);
    REQUIRE(row.value("context_weight", 0.0) == depthkv::kPresetContextWeight);  // written when not 0
    // the chosen scorer has the lowest predicted loss, each as allocate predicts it for that scorer
    const nlohmann::json& pred = row["predicted_loss"];
    REQUIRE(pred.size() == 2);
    std::string lowest;
    for (const std::string sc : {"snapkv", "h2o"}) {
      const double keep = row["keep"];
      const auto al = run_cli("allocate --profile " + shell_quoted(profile) + " --policy head-optimal --scorer " + sc +
                                  " --keep " + std::to_string(keep) +
                                  " --sinks 2 --recent 4 --obs-window 4 --pooling max --output-aware --json",
                              "2>/dev/null");
      REQUIRE(al.status == 0);
      REQUIRE(pred[sc].get<double>() == Approx(nlohmann::json::parse(al.out)["predicted_loss"].get<double>()));
      if (lowest.empty() || pred[sc].get<double>() < pred[lowest].get<double>()) lowest = sc;
    }
    REQUIRE(row["scorer"] == lowest);
    // the same flags spelled out, with the chosen scorer, give the same row
    const auto spelled = run_cli(base + " --scorers " + lowest + spelled_flags + " --keeps " +
                                     std::to_string(row["keep"].get<double>()),
                                 "2>/dev/null");
    REQUIRE(spelled.status == 0);
    const nlohmann::json srow = nlohmann::json::parse(spelled.out).at(0);
    REQUIRE(srow["kl"] == row["kl"]);
    REQUIRE(srow["budgets"] == row["budgets"]);
  }
  // --lookahead given with the preset wins over the preset's, and is the spelled-out flag's row
  const auto r0 = run_cli(base + " --keeps 0.3 --preset best --lookahead 0 --json", "2>/dev/null");
  REQUIRE(r0.status == 0);
  const nlohmann::json row0 = nlohmann::json::parse(r0.out).at(0);
  REQUIRE(row0["lookahead"] == 0);
  const auto s0 = run_cli(base + " --keeps 0.3 --scorers " + row0["scorer"].get<std::string>() +
                              " --policies head-optimal --pooling max --output-aware --json",
                          "2>/dev/null");
  REQUIRE(s0.status == 0);
  REQUIRE(nlohmann::json::parse(s0.out).at(0)["kl"] == row0["kl"]);
  require_error(run_cli(base + " --keeps 0.3 --preset best --lookahead -1", "2>&1"), "--lookahead: must be >= 0, got -1");
  // a profile of one candidate (the earlier preset's): that scorer; one without head curves: refused
  const std::string one = small_profile("--scorers snapkv --pooling max --output-aware --head-curves --ratios 0.2,0.5",
                                        "profile_best_snapkv.json");
  const std::string eval_one = "eval --model " + model + " --text " + text + " --profile " + shell_quoted(one) + common +
                               " --keeps 0.3 --windows 2 --preset best --json";
  const auto r1 = run_cli(eval_one, "2>/dev/null");
  REQUIRE(r1.status == 0);
  REQUIRE(nlohmann::json::parse(r1.out).at(0)["scorer"] == "snapkv");
  const std::string none =
      small_profile("--scorers snapkv,h2o --pooling max --output-aware --ratios 0.2,0.5", "profile_best_none.json");
  require_error(run_cli("eval --model " + model + " --text " + text + " --profile " + shell_quoted(none) + common +
                            " --keeps 0.3 --windows 2 --preset best",
                        "2>&1"),
                "--preset best chooses among the scorers snapkv,h2o, and the profile has complete curves and head "
                "curves of none: profile it with depthkv profile --preset best");
  // a flag the preset sets cannot be given with it; an unknown preset is refused
  require_error(run_cli(eval + " --preset best --scorers h2o", "2>&1"), "--scorers excludes --preset");
  require_error(run_cli("profile --model " + model + " --text " + text + common +
                            " --preset best --head-curves --windows 3 -o " + shell_quoted(tmp_path("never.json")),
                        "2>&1"),
                "--head-curves excludes --preset");
  require_error(run_cli(eval + " --preset fastest", "2>&1"),
                "--preset: unknown preset 'fastest' (expected best, retrieval)");
  // allocate and generate take it too, and choose the scorer allocate predicts lowest
  const auto al = run_cli("allocate --profile " + shell_quoted(profile) +
                              " --preset best --sinks 2 --recent 4 --obs-window 4 --keep 0.3 --length 64 --json",
                          "2>&1 >/dev/null");
  REQUIRE(al.status == 0);
  REQUIRE_THAT(al.out, Catch::Contains("--preset best: scorer " + rows[1]["scorer"].get<std::string>()));
  const auto g = run_cli("generate --model " + model + " --profile " + shell_quoted(profile) +
                             " --preset best --sinks 2 --recent 4 --obs-window 4 --keep 0.8 --steps 60 --temperature 0"
                             " --prompt 'Once upon a time, Lily found a red ball in the park. She was very happy.'",
                         "2>&1");
  INFO(g.out);
  REQUIRE(g.status == 0);
  REQUIRE_THAT(g.out, Catch::Contains("--preset best: scorer "));
  const auto gb = run_cli("generate --model " + model + " --profile " + shell_quoted(profile) +
                              " --preset best --sinks 2 --recent 4 --obs-window 4 --max-kv-tokens 100 --steps 60 "
                              "--temperature 0 --prompt 'Once upon a time'",
                          "2>&1");
  INFO(gb.out);
  REQUIRE(gb.status == 0);
  REQUIRE_THAT(gb.out, Catch::Contains("no lookahead with --max-kv-tokens"));
  require_error(run_cli("generate --model " + model + " --lookahead 4 --max-kv-tokens 100 --steps 30 --prompt 'Once'",
                        "2>&1"),
                "lookahead (4) needs the whole context first");
  require_error(run_cli("generate --model " + model + " --preset best --keep 0.5 --steps 20", "2>&1"),
                "--preset best needs --profile with head curves");
  std::remove(profile.c_str());
  std::remove(one.c_str());
  std::remove(none.c_str());
}

TEST_CASE("preset best: its context weight is the lookahead alone, --context-weight given wins", "[cli][eval][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string profile = small_profile("--preset best --ratios 0.2,0.5", "profile_best_cw.json");
  const std::string base = "eval --model " + model + " --text " + text + " --profile " + shell_quoted(profile) +
                           " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 2"
                           " --keeps 0.3 --json";
  const auto rp = run_cli(base + " --preset best", "2>/dev/null");
  const auto rw = run_cli(base + " --preset best --context-weight 0.5", "2>/dev/null");
  REQUIRE(rp.status == 0);
  REQUIRE(rw.status == 0);
  const nlohmann::json rowp = nlohmann::json::parse(rp.out).at(0), roww = nlohmann::json::parse(rw.out).at(0);
  REQUIRE(rowp.value("context_weight", 0.0) == depthkv::kPresetContextWeight);  // written when not 0
  REQUIRE(roww["context_weight"] == 0.5);
  REQUIRE(roww["scorer"] == rowp["scorer"]);
  // the preset's weight 0: the same row as its flags spelled out with the lookahead alone
  const auto sw = run_cli(base + " --scorers " + rowp["scorer"].get<std::string>() +
                              " --policies head-optimal --pooling max --output-aware --lookahead 32",
                          "2>/dev/null");
  REQUIRE(sw.status == 0);
  REQUIRE(depthkv::kPresetContextWeight == 0.0);
  REQUIRE(nlohmann::json::parse(sw.out).at(0)["kl"] == rowp["kl"]);
  REQUIRE(roww["kl"] != rowp["kl"]);  // a weight given changes the row
  require_error(run_cli(base + " --scorers h2o --context-weight 1", "2>&1"), "--context-weight 1 needs --lookahead");
  std::remove(profile.c_str());
}

TEST_CASE("preset best and --output-aware run on Q8_0 and F16 GGUFs (wo dequantized for the scores)",
          "[cli][eval][real][gguf]") {
  const depthkv::llama::GgufFile src =
      depthkv::llama::GgufFile::open(depthkv_test::data_path("models/stories260K/stories260K.gguf"));
  const depthkv_test::TempDir dir;
  const std::string q8 = dir.write("stories260K-Q8_0.gguf", depthkv_test::requantized_copy(src, true));
  const std::string f16 = dir.write("stories260K-F16.gguf", depthkv_test::requantized_copy(src, false));
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string common = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  // Q8_0: profile and eval with --preset best, generate with its profile
  const std::string best = small_profile("--preset best --ratios 0.2,0.5", "profile_best_q8_0.json", q8);
  REQUIRE(depthkv::load_profile(best).calibration.selection->scorer.output_aware);
  const auto e = run_cli("eval --model " + shell_quoted(q8) + " --text " + text + " --profile " + shell_quoted(best) +
                         common + " --windows 2 --keeps 0.3 --preset best --json");
  REQUIRE(e.status == 0);
  const nlohmann::json row = nlohmann::json::parse(e.out).at(0);
  REQUIRE(row["preset"] == "best");
  REQUIRE(row["output_aware"] == true);
  REQUIRE(std::isfinite(row["kl"].get<double>()));
  const auto g = run_cli("generate --model " + shell_quoted(q8) + " --profile " + shell_quoted(best) +
                             " --preset best --sinks 2 --recent 4 --obs-window 4 --keep 0.8 --steps 30 --temperature 0"
                             " --prompt 'Once upon a time, Lily found a red ball in the park.'",
                         "2>&1");
  INFO(g.out);
  REQUIRE(g.status == 0);
  REQUIRE_THAT(g.out, Catch::Contains("--preset best: scorer "));
  // F16: --output-aware spelled out
  const std::string oa = small_profile("--scorers snapkv --output-aware --ratios 0.2,0.5", "profile_oa_f16.json", f16);
  const auto ef = run_cli("eval --model " + shell_quoted(f16) + " --text " + text + " --profile " + shell_quoted(oa) +
                              common + " --windows 2 --keeps 0.3 --scorers snapkv --output-aware --json",
                          "2>&1 >/dev/null");
  INFO(ef.out);
  REQUIRE(ef.status == 0);
  std::remove(best.c_str());
  std::remove(oa.c_str());
}

TEST_CASE("profile --head-curves, then eval and allocate with head-optimal budgets per KV head", "[cli][eval][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string profile = tmp_path("profile_heads.json");
  const std::string common = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  const auto p = run_cli("profile --model " + model + " --text " + text + common +
                         " --windows 3 --ratios 0.2,0.5 --scorers snapkv --head-curves -o " + shell_quoted(profile));
  REQUIRE(p.status == 0);
  REQUIRE_THAT(p.out, Catch::Contains("cost of the head curves (5 layers x 4 KV heads x 2 ratios x 1 scorers = 40 runs)"));
  const depthkv::ProfileFile f = depthkv::load_profile(profile);
  REQUIRE(f.has_head_curves("snapkv"));
  REQUIRE(f.head_curves.at("snapkv").n_kv_heads == 4);
  REQUIRE(f.head_profile("snapkv").n_layers() == 20);
  REQUIRE(f.head_profile("snapkv").loss.maxCoeff() > 0.0);
  // allocate: per-head budgets summing to heads x the layer budget
  const auto a = run_cli("allocate --profile " + shell_quoted(profile) +
                         " --sinks 2 --recent 4 --obs-window 4 --policy head-optimal --keep 0.3 --length 64 --json");
  REQUIRE(a.status == 0);
  const nlohmann::json j = nlohmann::json::parse(a.out);
  long long sum = 0;
  for (const auto& row : j["head_budgets"]) {
    REQUIRE(row.size() == 4);
    for (const auto& k : row) {
      REQUIRE(k.get<int>() >= 6);  // the protected tokens
      sum += k.get<int>();
    }
  }
  REQUIRE(sum == 4LL * std::llround(0.3 * 64 * 5));
  REQUIRE(j["total"] == sum);
  CHECK_FALSE(j.contains("layer_window"));  // the profile records none
  {  // a profile with sliding-window layers: its windows in the JSON, as the per-layer policies give them
    nlohmann::json pj = nlohmann::json::parse(std::ifstream(profile));
    pj["layer_window"] = {32, 0, 32, 0, 32};
    const std::string windowed = tmp_path("profile_heads_windows.json");
    std::ofstream(windowed) << pj.dump();
    const auto w = run_cli("allocate --profile " + shell_quoted(windowed) +
                           " --sinks 2 --recent 4 --obs-window 4 --policy head-optimal --keep 0.3 --length 64 --json");
    REQUIRE(w.status == 0);
    CHECK(nlohmann::json::parse(w.out)["layer_window"] == pj["layer_window"]);
  }
  // eval: head-optimal rows beside the layer policies, at the same KV bytes
  const std::string eval = "eval --model " + model + " --text " + text + " --profile " + shell_quoted(profile) + common +
                           " --keeps 0.3 --windows 2 --policies optimal,head-optimal --json";
  const auto e = run_cli(eval, "2>/dev/null");
  REQUIRE(e.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(e.out);
  REQUIRE(rows.size() == 2);
  REQUIRE(rows[1]["policy"] == "head-optimal");
  REQUIRE(rows[1]["bytes_kept"] == rows[0]["bytes_kept"]);
  REQUIRE(rows[1]["budgets"].size() == 5);
  // adaptive heads re-split each layer's head-optimal total by the scores
  const auto ad = run_cli(eval + " --head-alloc adaptive", "2>/dev/null");
  REQUIRE(ad.status == 0);
  REQUIRE(nlohmann::json::parse(ad.out)[1]["kl"] != rows[1]["kl"]);
  // refused: head-optimal without head curves, or with a schedule; an unknown policy lists it
  const std::string plain = small_profile("--ratios 0.2,0.5 --scorers snapkv", "profile_noheads.json");
  require_error(run_cli("eval --model " + model + " --text " + text + " --profile " + shell_quoted(plain) + common +
                            " --keeps 0.3 --windows 2 --policies head-optimal",
                        "2>&1"),
                "no head curves for scorer 'snapkv': measure them with depthkv profile --head-curves");
  // the chunked schedule with one chunk per context evicts once, as oneshot; with 16-token chunks it bounds memory
  const auto one = run_cli(eval + " --schedule chunked --chunk 1024", "2>/dev/null");
  REQUIRE(one.status == 0);
  REQUIRE(std::abs(nlohmann::json::parse(one.out)[1]["kl"].get<double>() - rows[1]["kl"].get<double>()) < 1e-12);
  const auto chunked = run_cli(eval + " --schedule chunked --chunk 16", "2>/dev/null");
  REQUIRE(chunked.status == 0);
  const nlohmann::json crow = nlohmann::json::parse(chunked.out)[1];
  REQUIRE(crow["peak_kv_bytes"].get<double>() < rows[1]["full_kv_bytes"].get<double>());
  // generate takes it, after the prompt and bounded
  const std::string prompt = " --prompt 'Once upon a time, Lily found a red ball in the park. She was very happy.'";
  for (const std::string mode : {" --keep 0.5", " --max-kv-tokens 100 --interval 4"}) {
    const auto g = run_cli("generate --model " + model + " --profile " + shell_quoted(profile) +
                               " --scorer snapkv --policy head-optimal --sinks 2 --recent 4 --obs-window 4 --steps 60 -t 0" +
                               mode + prompt,
                           "2>&1");
    INFO(g.out);
    REQUIRE(g.status == 0);
  }
  require_error(run_cli("allocate --profile " + shell_quoted(profile) + " --policy heads", "2>&1"),
                "unknown allocation policy 'heads' (expected uniform, pyramid");
  std::remove(profile.c_str());
  std::remove(plain.c_str());
}
