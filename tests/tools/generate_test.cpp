// Tests of `depthkv generate` (tools/cmd_generate.cpp), run as a separate process.

#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

#include "depthkv/llama/text_windows.hpp"
#include "support/run_cli.hpp"
#include "support/test_data.hpp"

namespace {

using Run = depthkv_test::CliRun;
using depthkv_test::run_cli;

std::string model() { return "'" + depthkv_test::data_path("models/stories260K/stories260K.bin") + "'"; }

}  // namespace

TEST_CASE("generate: greedy 200 steps from BOS equals llama2.c's output byte for byte", "[generate][real]") {
  const std::string expected =
      depthkv::llama::read_text_file(depthkv_test::data_path("models/stories260K/expected_greedy_t0_n200.txt"));
  const Run r = run_cli("generate --model " + model() + " --temperature 0 --steps 200");
  REQUIRE(r.status == 0);
  REQUIRE(r.out == expected);
  // the same with an explicit tokenizer and a small prefill chunk
  const Run r2 = run_cli("generate --model " + model() + " --tokenizer '" +
                         depthkv_test::data_path("models/stories260K/tok512.bin") + "' -t 0 -n 200 --chunk 3");
  REQUIRE(r2.out == expected);
  // the GGUF file, with the tokenizer stored inside it
  const Run r3 = run_cli("generate --model '" + depthkv_test::data_path("models/stories260K/stories260K.gguf") +
                         "' -t 0 -n 200");
  REQUIRE(r3.status == 0);
  REQUIRE(r3.out == expected);
}

TEST_CASE("generate: prompts, seeds and a pruned cache", "[generate][real]") {
  const std::string base = "generate --model " + model() + " --prompt 'Once upon a time' --steps 60 ";
  const Run a = run_cli(base + "--seed 7"), b = run_cli(base + "--seed 7"), c = run_cli(base + "--seed 8");
  REQUIRE(a.status == 0);
  REQUIRE(a.out.rfind("Once upon a time", 0) == 0);  // the prompt is echoed as run.c does
  REQUIRE(a.out == b.out);                           // same seed, same text
  REQUIRE(a.out != c.out);
  REQUIRE(a.out.back() == '\n');
  // greedy with a prompt equals greedy on a full cache when --keep 1; a pruned cache still runs
  const std::string g = "generate --model " + model() +
                        " --prompt 'Once upon a time there was a little girl named Lily. She loved to play.' -t 0 -n 120 ";
  const Run full = run_cli(g), keep1 = run_cli(g + "--keep 1");
  REQUIRE(full.out == keep1.out);
  const Run pruned = run_cli(g + "--keep 0.5 --policy pyramid --scorer snapkv --window 8 --sink 1 --recent 4");
  REQUIRE(pruned.status == 0);
  REQUIRE(pruned.out.rfind("Once upon a time there was a little girl named Lily.", 0) == 0);
  // steps shorter than the prompt print only the forced prompt tokens
  const Run shortp = run_cli("generate --model " + model() + " --prompt 'Once upon a time' -t 0 -n 3");
  REQUIRE(shortp.out == "Once upon a\n");
}

TEST_CASE("generate: errors are reported as 'depthkv: error: ...' with exit code 1", "[generate]") {
  const Run missing = run_cli("generate --model /nonexistent/model.bin", "2>&1");
  REQUIRE(missing.status == 1);
  REQUIRE(missing.out.find("depthkv: error: ") == 0);
  const Run bad_keep = run_cli("generate --model " + model() + " --keep 1.5", "2>&1");
  REQUIRE(bad_keep.status == 1);
  REQUIRE(bad_keep.out.find("--keep") != std::string::npos);
  const Run bad_policy = run_cli("generate --model " + model() + " --keep 0.5 --policy nope", "2>&1");
  REQUIRE(bad_policy.status == 1);
  REQUIRE(bad_policy.out.find("nope") != std::string::npos);
  const Run bad_scorer = run_cli("generate --model " + model() + " --keep 0.5 --scorer nope", "2>&1");
  REQUIRE(bad_scorer.status == 1);
  const Run no_model = run_cli("generate", "2>&1");
  REQUIRE(no_model.status != 0);
}
