// Tests of `depthkv eval --continuation-source` and `--oracle`, of the lookahead's timing line in
// `depthkv generate`, and of --preset best's per-input rule in `depthkv eval` and `depthkv
// generate`, as separate processes on the real stories260K model.

#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::run_cli;
using depthkv_test::shell_quoted;
using depthkv_test::tmp_path;

namespace {

// 3 calibration windows of 64 + 16 tokens of stories260K, h2o and snapkv, into `name`.
std::string robust_profile(const std::string& name) {
  const std::string path = tmp_path(name);
  REQUIRE(run_cli("profile --model " + shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin")) +
                  " --text " + shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")) +
                  " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 3"
                  " --ratios 0.2,0.5 --scorers h2o,snapkv -o " + shell_quoted(path))
              .status == 0);
  return path;
}

nlohmann::json robust_rows(const std::string& cmd) {
  const auto r = run_cli(cmd);
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("eval --continuation-source and --oracle", "[cli][eval][real]") {
  const std::string profile = robust_profile("robust-profile.json");
  const std::string base = "eval --model " + shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin")) +
                           " --text " + shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")) +
                           " --profile " + shell_quoted(profile) +
                           " --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 3 --keeps 0.3"
                           " --policies uniform --scorers h2o --json";
  const nlohmann::json plain = robust_rows(base), text = robust_rows(base + " --continuation-source text");
  REQUIRE(plain.dump() == text.dump());  // text is the default
  REQUIRE(!plain[0].contains("continuation_source"));
  const nlohmann::json model = robust_rows(base + " --continuation-source model");
  REQUIRE(model[0]["continuation_source"] == "model");
  REQUIRE(model[0]["nll_full"].get<double>() < plain[0]["nll_full"].get<double>());  // the model's own tokens
  const nlohmann::json oracle = robust_rows(base + " --oracle");
  REQUIRE(oracle.size() == 2);
  REQUIRE(oracle[0].dump() == plain[0].dump());
  REQUIRE(oracle[1]["scorer"] == "h2o+oracle");
  REQUIRE(oracle[1]["oracle"] == true);
  REQUIRE(oracle[1]["budgets"] == oracle[0]["budgets"]);
  REQUIRE(oracle[1]["kl"].get<double>() != oracle[0]["kl"].get<double>());
  const auto bad = run_cli(base + " --continuation-source greedy", "2>&1");
  REQUIRE(bad.status != 0);
  REQUIRE(bad.out.find("unknown continuation source 'greedy'") != std::string::npos);
  const auto sched = run_cli(base + " --oracle --schedule chunked --chunk 16", "2>&1");
  REQUIRE(sched.status != 0);
  REQUIRE(sched.out.find("--oracle measures one-shot eviction only") != std::string::npos);
  std::remove(profile.c_str());
}

TEST_CASE("generate prints the lookahead's time apart from the prefill and the decode", "[cli][generate][real]") {
  const std::string g = "generate --model " + depthkv_test::stories_model_arg() +
                        " --prompt 'Once upon a time there was a little girl named Lily. She loved to play.' -t 0 -n 60 "
                        "--keep 0.5 --scorer h2o --threads 1";
  const auto with = run_cli(g + " --lookahead 8", "2>&1"), without = run_cli(g, "2>&1");
  REQUIRE(with.status == 0);
  REQUIRE(with.out.find("lookahead: 8 decode steps on the full prompt cache (8 extra KV slots per head) in ") !=
          std::string::npos);
  REQUIRE(without.status == 0);
  REQUIRE(without.out.find("lookahead:") == std::string::npos);
}

TEST_CASE("eval --preset best serves text the model cannot predict as plain SnapKV uniform", "[cli][eval][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string stories = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string flags = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  const std::string profile = tmp_path("robust-best-profile.json");
  REQUIRE(run_cli("profile --model " + model + " --text " + stories + flags +
                  " --windows 3 --ratios 0.1,0.5 --preset best -o " + shell_quoted(profile))
              .status == 0);
  // a constructed text of unrelated symbols and digits: the model predicts it no better than chance
  const std::string noise = tmp_path("robust-noise.txt");
  {
    std::FILE* f = std::fopen(noise.c_str(), "w");
    REQUIRE(f);
    unsigned x = 12345;
    for (int i = 0; i < 6000; ++i) {
      x = x * 1103515245u + 12345u;
      std::fputc("#{}[]<>|~^%$@&*0123456789qzxjQZXJ"[(x >> 16) % 33], f);
    }
    std::fclose(f);
  }
  const std::string base = "eval --model " + model + flags + " --windows 4 --keeps 0.2,0.5 --json --profile ";
  const nlohmann::json best = robust_rows(base + shell_quoted(profile) + " --text " + shell_quoted(noise) + " --preset best");
  const nlohmann::json plain = robust_rows(base + shell_quoted(profile) + " --text " + shell_quoted(noise) +
                                           " --scorers snapkv --policies uniform");
  REQUIRE(best.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(best[i]["fallback_windows"] == 4);
    REQUIRE(best[i]["kl"].get<double>() == plain[i]["kl"].get<double>());
  }
  // story text keeps the preset's own spec on every window
  const nlohmann::json own = robust_rows(base + shell_quoted(profile) + " --text " + stories + " --skip 3 --preset best");
  for (const auto& row : own) REQUIRE(row["fallback_windows"] == 0);
  std::remove(profile.c_str());
  std::remove(noise.c_str());
}

TEST_CASE("generate --preset best applies the per-input rule to its prompt", "[cli][generate][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string flags = " --sinks 2 --recent 4 --obs-window 4 --threads 1";
  const std::string profile = tmp_path("robust-generate-profile.json");
  REQUIRE(run_cli("profile --model " + model + " --text " +
                  shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")) + flags +
                  " --context 64 --continuation 16 --windows 3 --ratios 0.1,0.5 --preset best -o " + shell_quoted(profile))
              .status == 0);
  std::string noise;  // unrelated symbols and digits: the model predicts them no better than chance
  unsigned x = 777;
  for (int i = 0; i < 160; ++i) {
    x = x * 1103515245u + 12345u;
    noise += "#{}[]<>|~^%$@&*0123456789qzxjQZXJ"[(x >> 16) % 33];
  }
  const std::string g = "generate --model " + model + flags + " -t 0 -n 260 --keep 0.4 --prompt ";
  const std::string best = " --preset best --profile " + shell_quoted(profile);
  const auto fell = run_cli(g + shell_quoted(noise) + best, "2>&1");
  REQUIRE(fell.status == 0);
  REQUIRE(fell.out.find("its fallback, plain SnapKV with uniform budgets") != std::string::npos);
  REQUIRE(fell.out.find("kv cache: snapkv/uniform keep 0.400") != std::string::npos);
  REQUIRE(fell.out.find("lookahead:") == std::string::npos);
  // the generated text equals plain SnapKV with uniform budgets, asked for directly
  const auto text = run_cli(g + shell_quoted(noise) + best, "2>/dev/null");
  const auto plain = run_cli(g + shell_quoted(noise) + " --scorer snapkv --policy uniform", "2>/dev/null");
  REQUIRE(plain.status == 0);
  REQUIRE(text.out == plain.out);
  const auto own = run_cli(g + "'Once upon a time there was a little girl named Lily. She loved to play in the park "
                               "with her friends. One day she saw a big red ball.'" + best, "2>&1");
  REQUIRE(own.status == 0);
  REQUIRE(own.out.find(": the preset's spec") != std::string::npos);
  REQUIRE(own.out.find("/head-optimal keep 0.400") != std::string::npos);
  REQUIRE(own.out.find("lookahead: 32 decode steps") != std::string::npos);
  // a prompt that leaves less than 32 positions of the model's context: the preset's lookahead
  // shrinks to what is left; a --lookahead asked for explicitly is still refused
  std::string story;
  for (int i = 0; i < 70; ++i) story += "Lily played in the park. ";
  const auto shrunk = run_cli(g.substr(0, g.find(" -n 260")) + " -n 0 --keep 0.4 --prompt '" + story + "'" + best, "2>&1");
  REQUIRE(shrunk.status == 0);
  REQUIRE(shrunk.out.find("kv cache: --preset best: lookahead shortened to ") != std::string::npos);
  const auto asked = run_cli(g.substr(0, g.find(" -n 260")) + " -n 0 --keep 0.4 --prompt '" + story + "'" + best +
                                 " --lookahead 32",
                             "2>&1");
  REQUIRE(asked.status != 0);
  REQUIRE(asked.out.find("do not fit the model's context") != std::string::npos);
  std::remove(profile.c_str());
}
