// Bad input to the `depthkv` program (issue 30, item 9: what a corruption sweep found): each case
// must end in exit code 1 and one "depthkv: error: ..." line that says what was wrong, never a
// crash, a hang, or a success with wrong output.

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llama/file_util.hpp"
#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

namespace {

std::string bad_input_path(const std::string& name) { return depthkv_test::scratch_dir().file("bad_input_" + name); }

std::string stories_model() { return shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin")); }
std::string stories_text() { return shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")); }

/// Writes `text` to the scratch file `name`. @return its path, quoted for the shell
std::string write_text(const std::string& name, const std::string& text) {
  return shell_quoted(depthkv_test::scratch_dir().write(name, depthkv_test::Bytes(text.begin(), text.end())));
}

/// A small valid profile file (2 layers, 2 ratios, scorer h2o) whose KL means are `kl_mean` (a
/// JSON text) and whose calibration context is `context` (a JSON text).
std::string profile_text(const std::string& kl_mean = "[[0.3, 0.1], [0.2, 0.05]]", const std::string& context = "64") {
  const std::string m = "{\"mean\": [[0.3, 0.1], [0.2, 0.05]], \"stderr\": [[0.01, 0.01], [0.01, 0.01]]}";
  return "{\"format\": \"depthkv-profile\", \"version\": 1, \"model\": {\"file\": \"m.bin\", \"size\": 100, "
         "\"header_hash\": \"fnv1a64:0123456789abcdef\", \"header_bytes\": 100}, \"n_layers\": 2, "
         "\"keep_ratios\": [0.2, 0.5], \"metric\": \"kl\", \"calibration\": {\"text_file\": \"t.txt\", \"context\": " +
         context +
         ", \"continuation\": 16, \"skip\": 0, \"samples\": 4, \"window_begin\": 0, \"window_end\": 4, "
         "\"description\": \"\"}, \"scorers\": {\"h2o\": {\"n_samples\": 4, \"kl\": {\"mean\": " +
         kl_mean + ", \"stderr\": [[0.01, 0.01], [0.01, 0.01]]}, \"dnll\": " + m + ", \"top1\": " + m + "}}}";
}

/// A profile of stories260K on one calibration window (64 + 16 tokens, ratio 0.5, h2o), for the
/// commands that check a profile against the model.
std::string stories_profile() {
  const std::string path = bad_input_path("stories_profile.json");
  REQUIRE(run_cli("profile --model " + stories_model() + " --text " + stories_text() +
                  " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 1 "
                  "--ratios 0.5 --scorers h2o -o " +
                  shell_quoted(path))
              .status == 0);
  return shell_quoted(path);
}

}  // namespace

TEST_CASE("allocate: a profile with an array nested 70,000 deep where a number belongs is an error, not a crash",
          "[cli][bad_input][profile_io]") {
  const int depth = 70000;
  const std::string deep = std::string(depth, '[') + "1" + std::string(depth, ']');
  const std::string p = write_text("deep.json", profile_text("[[" + deep + ", 0.1], [0.2, 0.05]]"));
  require_error(run_cli("allocate --profile " + p + " --keep 0.5", "2>&1"),
                "is not valid JSON: arrays or objects nested deeper than 64 levels");
  // a value of the wrong type is described by its type, never dumped whole
  std::string ones = "1";
  for (int i = 1; i < 5000; ++i) ones += ", 1";
  const std::string arr = write_text("arr.json", profile_text("[[[" + ones + "], 0.1], [0.2, 0.05]]"));
  const auto r = run_cli("allocate --profile " + arr + " --keep 0.5", "2>&1");
  require_error(r, "'scorers.h2o.kl.mean[0][0]' is not a number (an array of 5000 elements)");
  CHECK(r.out.size() < 400);
  // a parse error quotes a bounded prefix of the offending token (here a number of 5000 digits)
  const std::string big = write_text("big.json", profile_text("[[" + std::string(5000, '7') + ", 0.1], [0.2, 0.05]]"));
  const auto n = run_cli("allocate --profile " + big + " --keep 0.5", "2>&1");
  require_error(n, "is not valid JSON: [json.exception.out_of_range.406] number overflow parsing '7777");
  CHECK(n.out.size() < 500);
}

TEST_CASE("allocate: loss curves of 1e308 and a context of 2^31 are refused, naming the profile's keys",
          "[cli][bad_input][profile_io]") {
  const std::string huge = write_text("huge.json", profile_text("[[1e308, 1e308], [1e308, 1e308]]"));
  require_error(run_cli("allocate --profile " + huge + " --keep 0.5", "2>&1"),
                "'scorers.h2o.kl.mean[0][0]' 1e+308 is not a loss (|value| <= 1e+09)");
  const std::string wide = write_text("wide.json", profile_text("[[0.3, 0.1], [0.2, 0.05]]", "2147483648"));
  const auto r = run_cli("allocate --profile " + wide + " --keep 0.5", "2>&1");
  require_error(r, "'calibration.context' 2147483648 is out of range [0, 2147483647]");
  CHECK(r.out.find("--length") == std::string::npos);
  // the good file allocates, and a context of 0 asks for --length
  REQUIRE(run_cli("allocate --profile " + write_text("good.json", profile_text()) + " --keep 0.5").status == 0);
  require_error(run_cli("allocate --profile " + write_text("noctx.json", profile_text("[[0.3, 0.1], [0.2, 0.05]]", "0")) +
                            " --keep 0.5",
                        "2>&1"),
                "the profile records no context length (calibration.context 0): give --length");
}

TEST_CASE("numeric options out of range are refused where they are parsed", "[cli][bad_input]") {
  const std::string good = write_text("opts.json", profile_text());
  const std::string m = stories_model();
  const std::string gen = "generate --model " + m + " ";
  require_error(run_cli(gen + "--steps -1", "2>&1"), "--steps: must be >= 0, got -1");
  require_error(run_cli(gen + "--temperature nan", "2>&1"), "--temperature: must be >= 0, got nan");
  require_error(run_cli(gen + "--temperature -1", "2>&1"), "--temperature: must be >= 0, got -1");
  require_error(run_cli(gen + "--topp nan", "2>&1"), "--topp: must be in [0, 1], got nan");
  require_error(run_cli(gen + "--max-kv-tokens 0", "2>&1"), "--max-kv-tokens: must be >= 1, got 0");
  require_error(run_cli(gen + "--max-kv-tokens -1", "2>&1"), "--max-kv-tokens: must be >= 1, got -1");
  require_error(run_cli(gen + "--threads -1", "2>&1"), "--threads: must be in [0, 1024], got -1");
  require_error(run_cli("perplexity --model " + m + " --text " + stories_text() + " --threads -1", "2>&1"),
                "--threads: must be in [0, 1024], got -1");
  require_error(run_cli("allocate --profile " + good + " --length 0", "2>&1"), "--length: must be >= 1, got 0");
  require_error(run_cli("allocate --profile " + good + " --length -1", "2>&1"), "--length: must be >= 1, got -1");
  const std::string ev = "eval --model " + m + " --text " + stories_text() + " --profile " + good + " ";
  require_error(run_cli(ev + "--context -1", "2>&1"), "--context: must be >= 1, got -1");
  require_error(run_cli(ev + "--continuation 0", "2>&1"), "--continuation: must be >= 2, got 0");
  require_error(run_cli(ev + "--skip -1", "2>&1"), "--skip: must be >= 0, got -1");
  const std::string prof = "profile --model " + m + " --text " + stories_text() + " -o " +
                           shell_quoted(bad_input_path("never.json")) + " ";
  require_error(run_cli(prof + "--continuation 0", "2>&1"), "--continuation: must be >= 2, got 0");
  require_error(run_cli(prof + "--skip -1", "2>&1"), "--skip: must be >= 0, got -1");
  // a value that is no number at all is still the option's own error
  require_error(run_cli(gen + "--steps many", "2>&1"), "--steps");
}

TEST_CASE("cli: a --lookahead that does not fit the model's context is refused at once by generate, eval and profile",
          "[cli][bad_input][lookahead][real]") {
  const std::string m = stories_model();  // seq_len 512
  require_error(run_cli("generate --model " + m + " --prompt 'Once upon a time' --keep 0.5 --lookahead 100000", "2>&1"),
                "--lookahead 100000: 100000 greedy tokens after the prompt of 5 tokens do not fit the model's context "
                "of 512 tokens (at most 507)");
  const std::string common = " --text " + stories_text() + " --context 64 --continuation 16 --sinks 2 --recent 4 "
                                                           "--obs-window 4 --threads 1 --windows 1 --lookahead 100000";
  require_error(run_cli("profile --model " + m + common + " --ratios 0.5 --scorers h2o -o " +
                            shell_quoted(bad_input_path("never.json")),
                        "2>&1"),
                "--lookahead 100000: 100000 greedy tokens after the context of 64 tokens do not fit the model's "
                "context of 512 tokens (at most 448)");
  require_error(run_cli("eval --model " + m + common + " --profile " + stories_profile() + " --keeps 0.5", "2>&1"),
                "--lookahead 100000: 100000 greedy tokens after the context of 64 tokens do not fit the model's "
                "context of 512 tokens (at most 448)");
  // what fits still runs
  REQUIRE(run_cli("generate --model " + m + " --prompt 'Once upon a time' --keep 0.5 -t 0 -n 20 --lookahead 8").status ==
          0);
}

TEST_CASE("weights that are finite but huge: generate and perplexity name the layer and position, not <unk> or NaN",
          "[cli][bad_input][engine][real]") {
  // stories260K with every weight after the header set to 3e38 (finite: the loader accepts it)
  depthkv_test::Bytes b = depthkv_test::read_bytes(depthkv_test::data_path("models/stories260K/stories260K.bin"));
  const std::size_t header = 7 * sizeof(std::int32_t);
  const float huge_weight = 3e38f;
  for (std::size_t o = header; o + sizeof(float) <= b.size(); o += sizeof(float))
    std::memcpy(b.data() + o, &huge_weight, sizeof(float));
  const std::string huge = shell_quoted(depthkv_test::scratch_dir().write("bad_input_huge.bin", b));
  const std::string tok = " --tokenizer " + shell_quoted(depthkv_test::data_path("models/stories260K/tok512.bin"));
  const auto g = run_cli("generate --model " + huge + tok + " -t 0 -n 8", "2>&1");
  require_error(g, "layer 0: the residual stream at position 0 overflows float in RMSNorm");
  CHECK(g.out.find("<unk>") == std::string::npos);
  const auto p = run_cli("perplexity --model " + huge + tok + " --text " + stories_text() + " --context 64 --windows 1 --json",
                         "2>&1");
  require_error(p, "layer 0: the residual stream at position 0 overflows float in RMSNorm");
  CHECK(p.out.find("null") == std::string::npos);
}

TEST_CASE("output files and standard output that cannot be written are errors", "[cli][bad_input]") {
  const std::string good = write_text("out.json", profile_text());
  require_error(run_cli("allocate --profile " + good + " --keep 0.5 --json", "2>&1 >/dev/full"),
                "cannot write to standard output");
  const std::string m = stories_model();
  require_error(run_cli("eval --model " + m + " --text " + stories_text() + " --profile " + stories_profile() +
                            " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 "
                            "--windows 1 --keeps 0.5 --policies uniform --csv /dev/full",
                        "2>&1 >/dev/null"),
                "cannot write '/dev/full' (CSV): disk full or not writable");
  // a device that takes the rows: no sensitivity file is made beside it
  const bool had_sibling = std::filesystem::exists("/dev/null-sensitivity");
  const depthkv_test::CliRun ok = run_cli("eval --model " + m + " --text " + stories_text() + " --profile " + stories_profile() +
                                   " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 "
                                   "--windows 1 --keeps 0.5 --policies uniform --csv /dev/null",
                               "2>&1");
  CHECK(ok.status == 0);
  CHECK(ok.out.find("no sensitivity curves beside it") != std::string::npos);
  CHECK(std::filesystem::exists("/dev/null-sensitivity") == had_sibling);
}

TEST_CASE("directories are refused wherever a file is read", "[cli][bad_input]") {
  const std::string dir = shell_quoted(depthkv_test::scratch_dir().path());
  const std::string d = depthkv_test::scratch_dir().path();
  const std::string m = stories_model();
  require_error(run_cli("tokenize --model " + m + " --text-file " + dir, "2>&1"),
                "'" + d + "' is a directory, not a text file");
  require_error(run_cli("perplexity --model " + m + " --tokens " + dir, "2>&1"),
                "'" + d + "' is a directory, not a token file");
  require_error(run_cli("allocate --profile " + dir, "2>&1"), "'" + d + "' is a directory, not a profile file");
  // --model: the directory is named as the model, not a tokenizer file beside it the user never gave
  for (const std::string& cmd :
       std::vector<std::string>{"tokenize --prompt hi", "generate", "perplexity --text " + stories_text()}) {
    const auto r = run_cli(cmd + " --model " + dir, "2>&1");
    require_error(r, "--model: '" + d + "' is a directory, not a model file");
    CHECK(r.out.find("tok512") == std::string::npos);
  }
}

TEST_CASE("cli: every --threads has an upper bound (100000 threads overflowed libgomp's stack)", "[cli][bad_input]") {
  const std::string m = stories_model(), t = stories_text();
  require_error(run_cli("profile --model " + m + " --text " + t + " --context 32 --continuation 8 --windows 1 -o " +
                            shell_quoted(bad_input_path("never.json")) + " --threads 100000",
                        "2>&1"),
                "--threads: must be in [0, 1024], got 100000");
  require_error(run_cli("perplexity --model " + m + " --text " + t + " --threads 2147483647", "2>&1"),
                "--threads: must be in [0, 1024], got 2147483647");
  require_error(run_cli("generate --model " + m + " --threads 1025", "2>&1"), "--threads: must be in [0, 1024], got 1025");
  const std::string good = write_text("threads.json", profile_text());
  require_error(run_cli("eval --model " + m + " --text " + t + " --profile " + good + " --threads 5000", "2>&1"),
                "--threads: must be in [0, 1024], got 5000");
  require_error(run_cli("analyze --model " + m + " --profile " + good + " --text " + t + " --threads 5000", "2>&1"),
                "--threads: must be in [0, 1024], got 5000");
}

TEST_CASE("cli: an empty or non-numeric value of a numeric option is refused, not read as 0", "[cli][bad_input]") {
  const std::string good = write_text("empty.json", profile_text());
  const std::string m = stories_model(), t = stories_text();
  const std::string alloc = "allocate --profile " + good + " ";
  for (const char* opt : {"--length", "--recent", "--sinks", "--obs-window", "--kernel", "--lookahead", "--keep",
                          "--min-tokens"})
    require_error(run_cli(alloc + opt + " ''", "2>&1"), std::string(opt) + ": expected a number, got an empty value");
  require_error(run_cli(alloc + "--head-alloc adaptive --head-alpha ''", "2>&1"),
                "--head-alpha: expected a number, got an empty value");
  require_error(run_cli(alloc + "--length 12abc", "2>&1"), "--length: expected a number, got '12abc'");
  const std::string gen = "generate --model " + m + " ";
  require_error(run_cli(gen + "--seed ''", "2>&1"), "--seed: expected a number, got an empty value");
  require_error(run_cli(gen + "--topp ''", "2>&1"), "--topp: expected a number, got an empty value");
  require_error(run_cli(gen + "--keep ''", "2>&1"), "--keep: expected a number, got an empty value");
  const std::string ev = "eval --model " + m + " --text " + t + " --profile " + good + " ";
  require_error(run_cli(ev + "--context ''", "2>&1"), "--context: expected a number, got an empty value");
  require_error(run_cli(ev + "--interval ''", "2>&1"), "--interval: expected a number, got an empty value");
  require_error(run_cli(ev + "--head-alloc adaptive --head-alpha ''", "2>&1"),
                "--head-alpha: expected a number, got an empty value");
  require_error(run_cli("profile --model " + m + " --text " + t + " -o " + shell_quoted(bad_input_path("never.json")) +
                            " --skip ''",
                        "2>&1"),
                "--skip: expected a number, got an empty value");
  const std::string an = "analyze --model " + m + " --profile " + good + " --text " + t + " ";
  for (const char* opt : {"--samples", "--skip", "--layer-keep", "--tau", "--batch", "--seed", "--max-tokens"})
    require_error(run_cli(an + opt + " ''", "2>&1"), std::string(opt) + ": expected a number, got an empty value");
}

TEST_CASE("cli: --min-tokens takes -1 or a count, analyze's options and 64-bit values are range-checked",
          "[cli][bad_input]") {
  const std::string good = write_text("range.json", profile_text());
  const std::string m = stories_model(), t = stories_text();
  require_error(run_cli("allocate --profile " + good + " --keep 0.5 --min-tokens -5", "2>&1"),
                "--min-tokens: must be -1 (the default safeguard floor) or a count >= 0, got -5");
  require_error(run_cli("allocate --profile " + good + " --keep 0.5 --min-tokens -0.5", "2>&1"), "--min-tokens");
  // -1 (the default safeguard) and 0 (off) stay valid
  CHECK(run_cli("allocate --profile " + good + " --keep 0.5 --sinks 0 --recent 0 --min-tokens -1").status == 0);
  CHECK(run_cli("allocate --profile " + good + " --keep 0.5 --sinks 0 --recent 0 --min-tokens 0").status == 0);
  require_error(run_cli("eval --model " + m + " --text " + t + " --profile " + good + " --min-tokens -2", "2>&1"),
                "--min-tokens: must be -1 (the default safeguard floor) or a count >= 0, got -2");
  const std::string an = "analyze --model " + m + " --profile " + good + " --text " + t + " ";
  require_error(run_cli(an + "--max-tokens -5", "2>&1"), "--max-tokens: must be >= 0, got -5");
  require_error(run_cli(an + "--tau 0", "2>&1"), "--tau: must be > 0, got 0");
  require_error(run_cli(an + "--batch 1", "2>&1"), "--batch: must be >= 2, got 1");
  require_error(run_cli(an + "--layer-keep nan", "2>&1"), "--layer-keep: expected a finite number, got nan");
  require_error(run_cli(an + "--seed -3", "2>&1"), "--seed: must be in [0, 18446744073709551615], got -3");
  // no saturation at 2^63-1: an integer beyond the type is an error
  require_error(run_cli("generate --model " + m + " --max-kv-tokens 99999999999999999999", "2>&1"),
                "--max-kv-tokens: must be at most 2^63-1 (9223372036854775807), got 99999999999999999999");
}

TEST_CASE("analyze: a correlation with a constant series is reported as undefined, never as nan", "[cli][bad_input]") {
  const std::string prof = stories_profile();
  const std::string cmd = "analyze --model " + stories_model() + " --profile " + prof + " --text " + stories_text() +
                          " --samples 4 --batch 4 --recompute --max-tokens 3 --threads 1";
  const auto r = run_cli(cmd);  // 3 tokens: InfoNCE is the same in every layer
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("nan") == std::string::npos);
  CHECK(r.out.find("undefined: the rank correlation of a constant series: infonce/pre_attn is the same in every layer") !=
        std::string::npos);
  const auto j = run_cli(cmd + " --json");
  REQUIRE(j.status == 0);
  CHECK(j.out.find("null") == std::string::npos);
  CHECK(j.out.find("\"undefined\": \"constant series: infonce/pre_attn is the same in every layer\"") !=
        std::string::npos);
}

TEST_CASE("eval --plot: a device or a missing folder is refused before any work, and no side file is made",
          "[cli][bad_input]") {
  const std::string prof = stories_profile();
  const std::string ev = "eval --model " + stories_model() + " --text " + stories_text() + " --profile " + prof +
                         " --sinks 2 --recent 4 --obs-window 4 --windows 1 --keeps 0.5 --policies uniform --threads 1 ";
  const bool had_gp = std::filesystem::exists("/dev/full.gp");
  require_error(run_cli(ev + "--plot /dev/full", "2>&1"), "--plot '/dev/full': not a regular file");
  CHECK(std::filesystem::exists("/dev/full.gp") == had_gp);
  require_error(run_cli(ev + "--plot " + shell_quoted(bad_input_path("no_such_dir") + "/x.svg"), "2>&1"),
                "the folder '");
  const std::string dir = depthkv_test::scratch_dir().file("");
  require_error(run_cli(ev + "--plot " + shell_quoted(dir), "2>&1"), "not a regular file");
}

TEST_CASE("tokenize: a truncated tokenizer file is refused, as generate refuses it", "[cli][bad_input]") {
  const std::string model = shell_quoted(depthkv_test::data_path("models/aidreams260K/aidreams260K.bin"));
  const std::string full = depthkv_test::data_path("models/aidreams260K/tok512.bin");
  const depthkv_test::Bytes bytes = depthkv_test::read_bytes(full);
  REQUIRE(bytes.size() > 6195);
  const std::string cut = shell_quoted(depthkv_test::scratch_dir().write(
      "tok_truncated.bin", depthkv_test::Bytes(bytes.begin(), bytes.begin() + 6195)));
  CHECK(run_cli("tokenize -m " + model + " -z " + shell_quoted(full) + " -p hi").status == 0);
  require_error(run_cli("tokenize -m " + model + " -z " + cut + " -p hi", "2>&1"), "truncated");
  require_error(run_cli("generate -m " + model + " -z " + cut + " -i hi -n 4", "2>&1"), "truncated");
}
