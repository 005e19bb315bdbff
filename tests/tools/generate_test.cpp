// Tests of `depthkv generate` (tools/cmd_generate.cpp), run as a separate process.

#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

#include "depthkv/llama/text_windows.hpp"
#include "support/run_cli.hpp"
#include "support/test_data.hpp"

namespace {

using Run = depthkv_test::CliRun;
using depthkv_test::require_error;
using depthkv_test::run_cli;


}  // namespace

TEST_CASE("generate: greedy 200 steps from BOS equals llama2.c's output byte for byte", "[generate][real]") {
  const std::string expected =
      depthkv::llama::read_text_file(depthkv_test::data_path("models/stories260K/expected_greedy_t0_n200.txt"));
  const Run r = run_cli("generate --model " + depthkv_test::stories_model_arg() + " --temperature 0 --steps 200");
  REQUIRE(r.status == 0);
  REQUIRE(r.out == expected);
  // the same with an explicit tokenizer and a small prefill chunk
  const Run r2 = run_cli("generate --model " + depthkv_test::stories_model_arg() + " --tokenizer '" +
                         depthkv_test::data_path("models/stories260K/tok512.bin") + "' -t 0 -n 200 --chunk 3");
  REQUIRE(r2.out == expected);
  // the GGUF file, with the tokenizer stored inside it
  const Run r3 = run_cli("generate --model '" + depthkv_test::data_path("models/stories260K/stories260K.gguf") +
                         "' -t 0 -n 200");
  REQUIRE(r3.status == 0);
  REQUIRE(r3.out == expected);
  // on a float32 cache (llama2.c's run.c holds float keys and values) as on the default F16 one
  const Run r4 = run_cli("generate --model " + depthkv_test::stories_model_arg() + " -t 0 -n 200 --kv-type f32");
  REQUIRE(r4.out == expected);
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --kv-type f8", "2>&1"),
                "--kv-type: f8 not in {f16,f32}");
}

TEST_CASE("generate: prompts, seeds and a pruned cache", "[generate][real]") {
  const std::string base = "generate --model " + depthkv_test::stories_model_arg() + " --prompt 'Once upon a time' --steps 60 ";
  const Run a = run_cli(base + "--seed 7"), b = run_cli(base + "--seed 7"), c = run_cli(base + "--seed 8");
  REQUIRE(a.status == 0);
  REQUIRE(a.out.rfind("Once upon a time", 0) == 0);  // the prompt is echoed as run.c does
  REQUIRE(a.out == b.out);                           // same seed, same text
  REQUIRE(a.out != c.out);
  REQUIRE(a.out.back() == '\n');
  // greedy with a prompt equals greedy on a full cache when --keep 1; a pruned cache still runs
  const std::string g = "generate --model " + depthkv_test::stories_model_arg() +
                        " --prompt 'Once upon a time there was a little girl named Lily. She loved to play.' -t 0 -n 120 ";
  const Run full = run_cli(g), keep1 = run_cli(g + "--keep 1");
  REQUIRE(full.out == keep1.out);
  const Run pruned = run_cli(g + "--keep 0.5 --policy pyramid --scorer snapkv --obs-window 8 --sinks 1 --recent 4");
  REQUIRE(pruned.status == 0);
  REQUIRE(pruned.out.rfind("Once upon a time there was a little girl named Lily.", 0) == 0);
  // steps shorter than the prompt print only the forced prompt tokens
  const Run shortp = run_cli("generate --model " + depthkv_test::stories_model_arg() + " --prompt 'Once upon a time' -t 0 -n 3");
  REQUIRE(shortp.out == "Once upon a\n");
}

TEST_CASE("generate: errors are reported as 'depthkv: error: ...' with exit code 1", "[generate]") {
  const Run missing = run_cli("generate --model /nonexistent/model.bin", "2>&1");
  REQUIRE(missing.out.find("depthkv: error: ") == 0);
  require_error(missing, "cannot open model file '/nonexistent/model.bin'");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --keep 1.5", "2>&1"), "--keep: 1.5 outside (0, 1]");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --keep 0", "2>&1"), "--keep: 0 outside (0, 1]");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --keep 0.5 --policy nope", "2>&1"),
                "unknown allocation policy 'nope' (expected uniform, pyramid, proportional, middle, optimal, mga, "
                "mlma2, mlma4, mlma6, mlp or head-optimal)");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --keep 0.5 --scorer nope", "2>&1"),
                "unknown scorer kind 'nope' (expected h2o, h2o-v1, h2o-v2, snapkv, tova, knorm, keydiff or snapkv-keydiff)");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --chunk 0", "2>&1"), "--chunk: must be >= 1, got 0");
  require_error(run_cli("generate", "2>&1"), "--model is required");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --no-such-flag", "2>&1"),
                "The following argument was not expected: --no-such-flag");
  // the selection flags: the older spellings name their replacements, the new ones are checked
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --sink 1", "2>&1"),
                "--sink is no longer an option: use --sinks N");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --window 8", "2>&1"),
                "--window is no longer an option: use --obs-window N");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --keep 0.5 --kernel 2", "2>&1"),
                "bad selection settings: sinks=4 recent=16 obs_window=16 kernel=2 pooling=max");
  require_error(run_cli("generate --model " + depthkv_test::stories_model_arg() + " --keep 0.5 --pooling sum", "2>&1"),
                "--pooling: unknown pooling 'sum' (expected none, max or avg)");
}

TEST_CASE("generate: the selection flags are accepted, and its defaults spelled out give its default output",
          "[generate][real]") {
  const std::string g = "generate --model " + depthkv_test::stories_model_arg() +
                        " --prompt 'Once upon a time there was a little girl named Lily. She loved to play.' -t 0 -n 120 "
                        "--keep 0.3 --policy uniform --scorer snapkv ";
  const Run dflt = run_cli(g), spelled = run_cli(g + "--sinks 4 --recent 16 --obs-window 16 --kernel 7 --pooling max");
  REQUIRE(dflt.status == 0);
  REQUIRE(spelled.out == dflt.out);
  for (const char* flag : {"--sinks 0", "--recent 2", "--obs-window 4", "--kernel 1", "--pooling avg", "--pooling none"}) {
    INFO(flag);
    REQUIRE(run_cli(g + flag).status == 0);
  }
}

TEST_CASE("generate --span-pooling: the same budgets, words and numbers kept or dropped whole", "[generate][real][span]") {
  const std::string g = "generate --model " + depthkv_test::stories_model_arg() +
                        " --prompt 'Lily had 7017563 red balls and 3846855 blue balls in the big box at home' -t 0 -n 40"
                        " --keep 0.4 --scorer snapkv ";
  const Run plain = run_cli(g, "2>&1"), span = run_cli(g + "--span-pooling", "2>&1");
  REQUIRE(plain.status == 0);
  REQUIRE(span.status == 0);
  CHECK_THAT(span.out, Catch::Contains("; scores pooled over the prompt's words and digit runs"));
  CHECK_THAT(plain.out, !Catch::Contains("pooled over"));
  const auto budgets = [](const std::string& out) { return out.substr(out.find("per-layer tokens"), 40); };
  CHECK(budgets(span.out) == budgets(plain.out));
}
