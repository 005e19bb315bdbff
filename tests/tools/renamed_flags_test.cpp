// Renamed flags (docs/architecture.md, "Glossary"): the new name works, and the old name stays a
// hidden alias for one release that sets the same value and prints
// "depthkv: note: <old> is deprecated here, use <new>" on stderr (stdout unchanged).

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

namespace {

std::string renamed_path(const std::string& name) { return depthkv_test::scratch_dir().file("renamed_" + name); }
std::string renamed_model() { return shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin")); }
std::string renamed_text() { return shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")); }

std::string renamed_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// `depthkv profile` of stories260K on one small window (ratios 0.2 and 0.5, h2o) with the extra
/// flags `more`, written to the scratch file `name`. @return the run (stderr only) and the file
struct RenamedProfile {
  depthkv_test::CliRun run;
  std::string file;
};
RenamedProfile renamed_profile(const std::string& name, const std::string& more) {
  RenamedProfile p;
  const std::string path = renamed_path(name);
  p.run = run_cli("profile --model " + renamed_model() + " --text " + renamed_text() +
                      " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 1 "
                      "--ratios 0.2,0.5 --scorers h2o " +
                      more + " -o " + shell_quoted(path),
                  "2>&1 >/dev/null");
  p.file = renamed_read(path);
  return p;
}

const std::string kKeepNote = "depthkv: note: --keep is deprecated here, use --layer-keep";
const std::string kMetricNote = "depthkv: note: --metric is deprecated here, use --metrics";
const std::string kKeepsNote = "depthkv: note: --keep is deprecated here, use --keeps";

/// `text` without its lines holding "seconds" (run times).
std::string renamed_untimed(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line))
    if (line.find("\"seconds\"") == std::string::npos) out += line + "\n";
  return out;
}

/// analyze's JSON of the profile `prof` with the extra flags `more`: stdout, or stderr with `err`.
depthkv_test::CliRun renamed_analyze(const std::string& prof, const std::string& more, bool err) {
  return run_cli("analyze --model " + renamed_model() + " --profile " + prof + " --text " + renamed_text() +
                     " --samples 4 --batch 4 --recompute --max-tokens 8 --threads 1 --json " + more,
                 err ? "2>&1 >/dev/null" : "2>/dev/null");
}

/// eval's JSON (one window, context 64 + 16, uniform h2o) of the profile `prof` with the extra
/// flags `more`: stdout, or stderr with `err`.
depthkv_test::CliRun renamed_eval(const std::string& prof, const std::string& more, bool err) {
  return run_cli("eval --model " + renamed_model() + " --profile " + prof + " --text " + renamed_text() +
                     " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1 --windows 1"
                     " --policies uniform --json " + more,
                 err ? "2>&1 >/dev/null" : "2>/dev/null");
}

}  // namespace

TEST_CASE("profile: --metrics sets the metric, --metric is a deprecated alias that says so on stderr", "[cli][renamed]") {
  const RenamedProfile fresh = renamed_profile("metrics_new.json", "--metrics dnll");
  REQUIRE(fresh.run.status == 0);
  CHECK(fresh.file.find("\"metric\": \"dnll\"") != std::string::npos);
  CHECK(fresh.run.out.find("deprecated") == std::string::npos);

  const RenamedProfile old = renamed_profile("metrics_old.json", "--metric dnll");
  REQUIRE(old.run.status == 0);
  CHECK(old.file.find("\"metric\": \"dnll\"") != std::string::npos);  // the default is kl
  CHECK(old.run.out.find(kMetricNote + "\n") != std::string::npos);

  // the alias refuses what the new name refuses, and both names together are an error
  require_error(run_cli("profile --model " + renamed_model() + " --text " + renamed_text() + " --metric bogus -o " +
                            shell_quoted(renamed_path("never.json")),
                        "2>&1"),
                "bogus");
  require_error(run_cli("profile --model " + renamed_model() + " --text " + renamed_text() +
                            " --metric kl --metrics kl -o " + shell_quoted(renamed_path("never.json")),
                        "2>&1"),
                "--metric excludes --metrics");
}

TEST_CASE("analyze: --layer-keep is the per-layer ratio, --keep is a deprecated alias with the same output",
          "[cli][renamed]") {
  REQUIRE(renamed_profile("analyze.json", "").run.status == 0);
  const std::string prof = shell_quoted(renamed_path("analyze.json"));
  const depthkv_test::CliRun dflt = renamed_analyze(prof, "", false);
  const depthkv_test::CliRun fresh = renamed_analyze(prof, "--layer-keep 0.5", false);
  const depthkv_test::CliRun old = renamed_analyze(prof, "--keep 0.5", false);
  REQUIRE(dflt.status == 0);
  REQUIRE(fresh.status == 0);
  REQUIRE(old.status == 0);
  CHECK(fresh.out.find("\"keep\": 0.5,") != std::string::npos);
  CHECK(dflt.out.find("\"keep\": 0.2,") != std::string::npos);
  CHECK(fresh.out != dflt.out);
  CHECK(renamed_untimed(old.out) == renamed_untimed(fresh.out));  // the note goes to stderr

  CHECK(renamed_analyze(prof, "--keep 0.5", true).out.find(kKeepNote + "\n") != std::string::npos);
  CHECK(renamed_analyze(prof, "--layer-keep 0.5", true).out.find("deprecated") == std::string::npos);

  const std::string an = "analyze --model " + renamed_model() + " --profile " + prof + " --text " + renamed_text() + " ";
  require_error(run_cli(an + "--keep nan", "2>&1"), "--keep: expected a finite number, got nan");
  require_error(run_cli(an + "--layer-keep 1", "2>&1"), "--layer-keep must be in (0, 1), got 1");
  require_error(run_cli(an + "--keep 0.5 --layer-keep 0.5", "2>&1"), "--keep excludes --layer-keep");
}

TEST_CASE("eval: --keeps takes the list of keep ratios, --keep is a deprecated alias with the same output",
          "[cli][renamed]") {
  REQUIRE(renamed_profile("eval.json", "").run.status == 0);
  const std::string prof = shell_quoted(renamed_path("eval.json"));
  const depthkv_test::CliRun fresh = renamed_eval(prof, "--keeps 0.3,0.5", false);
  const depthkv_test::CliRun old = renamed_eval(prof, "--keep 0.3,0.5", false);
  REQUIRE(fresh.status == 0);
  REQUIRE(old.status == 0);
  CHECK(fresh.out.find("\"keep\": 0.3,") != std::string::npos);
  CHECK(fresh.out.find("\"keep\": 0.5,") != std::string::npos);
  CHECK(fresh.out.find("\"keep\": 0.1,") == std::string::npos);  // not the default list
  CHECK(old.out == fresh.out);  // the note goes to stderr

  CHECK(renamed_eval(prof, "--keep 0.3,0.5", true).out.find(kKeepsNote + "\n") != std::string::npos);
  CHECK(renamed_eval(prof, "--keeps 0.3,0.5", true).out.find("deprecated") == std::string::npos);

  // both names refuse the same values, naming eval's flag; both together are an error
  require_error(run_cli("eval --model " + renamed_model() + " --profile " + prof + " --text " + renamed_text() +
                            " --keeps 0.3,1.5",
                        "2>&1"),
                "--keeps: 1.5 outside (0, 1]");
  require_error(run_cli("eval --model " + renamed_model() + " --profile " + prof + " --text " + renamed_text() +
                            " --keep 0.3,x",
                        "2>&1"),
                "--keeps: 'x' is not a number");
  require_error(run_cli("eval --model " + renamed_model() + " --profile " + prof + " --text " + renamed_text() +
                            " --keep 0.3 --keeps 0.3",
                        "2>&1"),
                "--keep excludes --keeps");
  // allocate's --keep takes one ratio and keeps its name
  require_error(run_cli("allocate --profile " + prof + " --keep 1.5", "2>&1"), "--keep: 1.5 outside (0, 1]");
}

TEST_CASE("help lists the new names only", "[cli][renamed]") {
  const depthkv_test::CliRun an = run_cli("analyze --help");
  CHECK(an.out.find("--layer-keep") != std::string::npos);
  CHECK(an.out.find("--keep") == std::string::npos);
  const depthkv_test::CliRun pr = run_cli("profile --help");
  CHECK(pr.out.find("--metrics") != std::string::npos);
  for (std::size_t at = pr.out.find("--metric"); at != std::string::npos; at = pr.out.find("--metric", at + 1))
    CHECK(pr.out.compare(at, 9, "--metrics") == 0);
  const depthkv_test::CliRun ev = run_cli("eval --help");
  CHECK(ev.out.find("--keeps") != std::string::npos);
  for (std::size_t at = ev.out.find("--keep"); at != std::string::npos; at = ev.out.find("--keep", at + 1))
    CHECK(ev.out.compare(at, 7, "--keeps") == 0);
}
