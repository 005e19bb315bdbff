// Tests of `depthkv perplexity`, run as a separate process on stories260K (.bin and .gguf).

#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_cli.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

TEST_CASE("perplexity: the same figures from .bin and .gguf, JSON and table agree, errors", "[cli][perplexity][real]") {
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string bin = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::string gguf = shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.gguf"));
  const std::string args = " --text " + text + " --context 128 --windows 6 --threads 1";
  const auto a = run_cli("perplexity --model " + bin + args + " --json");
  const auto b = run_cli("perplexity --model " + gguf + args + " --json");
  const auto t = run_cli("perplexity --model " + bin + args);
  REQUIRE(a.status == 0);
  REQUIRE(b.status == 0);
  REQUIRE(t.status == 0);
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  REQUIRE(ja["windows"] == 6);
  REQUIRE(ja["tokens_scored"] == 6 * 63);
  REQUIRE(ja["nll"].get<double>() == Approx(jb["nll"].get<double>()).epsilon(1e-6));
  REQUIRE(ja["ppl"].get<double>() == Approx(std::exp(ja["nll"].get<double>())).epsilon(1e-12));
  // a trained story model on story text: NLL well below the uniform log(512) = 6.24
  REQUIRE(ja["nll"].get<double>() > 0.5);
  REQUIRE(ja["nll"].get<double>() < 2.5);
  char ppl[32];
  std::snprintf(ppl, sizeof ppl, "PPL = %.4f", ja["ppl"].get<double>());
  REQUIRE(t.out.find(ppl) != std::string::npos);
  require_error(run_cli("perplexity --model " + bin + " --text " + text + " --context 1024", "2>&1"),
                "perplexity: context 1024 is outside [4, 512] (the model's context length)");
  require_error(run_cli("perplexity --model " + bin, "2>&1"), "give exactly one of --text FILE and --tokens FILE");
}
