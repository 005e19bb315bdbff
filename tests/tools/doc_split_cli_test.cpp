// Tests of --doc-separator and --doc-opening of `depthkv profile` and `eval` (tools/cli_common.hpp,
// DocumentSettings): how --text is cut into documents before the token windows, as separate
// processes on the real stories260K model with small settings.

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "depthkv/llama/text_windows.hpp"
#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

using depthkv_test::slurp;
using depthkv_test::tmp_path;

namespace {

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(slurp(path)); }

std::string model_flag() {
  return " --model " + shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin"));
}
const std::string kSmall = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
const std::string kProfile = " --windows 4 --ratios 0.2,0.5 --scorers h2o";
const std::string kEval = " --windows 3 --keeps 0.3 --policies uniform,optimal";

std::string tinystories() { return depthkv_test::data_path("text/tinystories_valid.txt"); }

/// The TinyStories stories joined by "\n<|endoftext|>\n" (as TinyStories' training file is laid
/// out), in the scratch folder: the separator split of it gives back exactly the stories.
const std::string& eot_text() {
  static const std::string path = [] {
    const std::string p = tmp_path("stories_eot.txt");
    std::ofstream out(p, std::ios::binary);
    for (const std::string& s : depthkv::llama::split_stories(depthkv::llama::read_text_file(tinystories())))
      out << s << "\n<|endoftext|>\n";
    return p;
  }();
  return path;
}

/// Profiles `text` with `flags` into `name` in the scratch folder; requires success.
std::string profile(const std::string& text, const std::string& flags, const std::string& name) {
  const std::string out = tmp_path(name);
  const auto r = run_cli("profile" + model_flag() + " --text " + shell_quoted(text) + kSmall + kProfile + flags +
                         " -o " + shell_quoted(out));
  REQUIRE(r.status == 0);
  return out;
}

}  // namespace

TEST_CASE(
    "profile: the default split writes no documents record and --doc-opening of the default is the default",
    "[cli][profile][doc_split][real]") {
  const std::string a = profile(tinystories(), "", "default.json");
  const std::string b = profile(tinystories(), " --doc-opening 'Once upon a time'", "opening.json");
  REQUIRE_FALSE(read_json(a)["calibration"].contains("documents"));
  REQUIRE(slurp(a) == slurp(b));  // byte for byte
}

TEST_CASE("profile and eval with --doc-separator: the same documents give the same curves and rows",
          "[cli][profile][eval][doc_split][real]") {
  const std::string plain = profile(tinystories(), "", "plain.json");
  const std::string eot = profile(eot_text(), " --doc-separator '<|endoftext|>'", "eot.json");
  const nlohmann::json jp = read_json(plain), je = read_json(eot);
  REQUIRE(je["calibration"]["documents"] ==
          nlohmann::json({{"rule", "separator"}, {"marker", "<|endoftext|>"}}));
  REQUIRE(je["scorers"] == jp["scorers"]);  // the separator split of the joined text is the stories

  // eval splits the text as the profile did unless told otherwise
  const auto ep = run_cli("eval" + model_flag() + " --text " + shell_quoted(tinystories()) + " --profile " +
                          shell_quoted(plain) + kSmall + kEval + " --json");
  const auto ee = run_cli("eval" + model_flag() + " --text " + shell_quoted(eot_text()) + " --profile " +
                          shell_quoted(eot) + kSmall + kEval + " --json");
  REQUIRE(ep.status == 0);
  REQUIRE(ee.status == 0);
  REQUIRE(nlohmann::json::parse(ee.out) == nlohmann::json::parse(ep.out));
  const auto table = run_cli("eval" + model_flag() + " --text " + shell_quoted(eot_text()) + " --profile " +
                             shell_quoted(eot) + kSmall + kEval);
  REQUIRE(table.status == 0);
  REQUIRE_THAT(table.out,
               Catch::Contains("of stories_eot.txt (documents: separator \"<|endoftext|>\"), context 64"));

  // escapes: '\n<|endoftext|>\n' is the same separator with its newlines (the pieces are trimmed)
  const std::string esc = profile(eot_text(), " --doc-separator '\\n<|endoftext|>\\n'", "esc.json");
  REQUIRE(read_json(esc)["calibration"]["documents"]["marker"] == "\n<|endoftext|>\n");
  REQUIRE(read_json(esc)["scorers"] == jp["scorers"]);

  SECTION("another split of the calibration text is refused (its windows' positions differ)") {
    require_error(run_cli("eval" + model_flag() + " --text " + shell_quoted(eot_text()) + " --profile " +
                              shell_quoted(eot) + kSmall + kEval + " --doc-separator ''",
                          "2>&1"),
                  "split into documents by separator \"<|endoftext|>\" there; here by whole text");
  }
  SECTION("the profile's separator on another text that lacks it is an error") {
    require_error(run_cli("eval" + model_flag() + " --text " + shell_quoted(tinystories()) + " --profile " +
                              shell_quoted(eot) + kSmall + kEval,
                          "2>&1"),
                  "does not contain the document separator \"<|endoftext|>\"");
  }
}

TEST_CASE("profile: --doc-separator absent from the text, a bad escape, and with --tokens are errors",
          "[cli][profile][doc_split][real]") {
  const std::string base =
      "profile" + model_flag() + kSmall + kProfile + " -o " + shell_quoted(tmp_path("err.json"));
  require_error(
      run_cli(base + " --text " + shell_quoted(tinystories()) + " --doc-separator '<|endoftext|>'", "2>&1"),
      "does not contain the document separator \"<|endoftext|>\": give the --doc-separator that is in it, "
      "or --doc-separator '' for no splitting");
  require_error(run_cli(base + " --text " + shell_quoted(tinystories()) + " --doc-separator '\\q'", "2>&1"),
                "--doc-separator: unknown escape '\\q'");
  require_error(run_cli(base + " --tokens " + shell_quoted(tinystories()) + " --doc-separator x", "2>&1"),
                "excludes --doc-separator");
  require_error(run_cli(base + " --text " + shell_quoted(tinystories()) + " --doc-separator x --doc-opening x", "2>&1"),
                "--doc-separator excludes --doc-opening");
}

TEST_CASE("profile --doc-separator '': no splitting, windows over the whole text",
          "[cli][profile][doc_split][real]") {
  const std::string out = tmp_path("whole.json");
  const auto r = run_cli("profile" + model_flag() + " --text " + shell_quoted(tinystories()) + kSmall + kProfile +
                             " --doc-separator '' -o " + shell_quoted(out),
                         "2>&1");
  REQUIRE(r.status == 0);
  REQUIRE_THAT(r.out, Catch::Contains("from tinystories_valid.txt (documents: whole text)"));
  const nlohmann::json j = read_json(out);
  REQUIRE(j["calibration"]["documents"] == nlohmann::json({{"rule", "whole"}, {"marker", ""}}));
  // one BOS in front of the text, not one per story: other windows, other curves
  REQUIRE(j["scorers"] != read_json(profile(tinystories(), "", "default2.json"))["scorers"]);
}

TEST_CASE("profile and eval: --help documents both flags", "[cli][doc_split]") {
  for (const char* cmd : {"profile", "eval"}) {
    const auto r = run_cli(std::string(cmd) + " --help");
    REQUIRE(r.status == 0);
    REQUIRE_THAT(r.out, Catch::Contains("--doc-separator STR") && Catch::Contains("--doc-opening STR") &&
                            Catch::Contains("'' (empty): no splitting"));
  }
}
