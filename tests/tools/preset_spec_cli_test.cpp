// `depthkv eval --preset best` evaluates exactly the spec the library's depthkv::preset returns:
// each JSON row's "spec" (read back with prune_spec_from_json) equals, field for field,
// depthkv::preset("best", profile, base, lengths[, lookahead]) for the base settings the flags
// spell out. A CLI that changed any field after calling the library (lookahead, policy, scorer,
// safeguard, schedule, ...) fails here.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"
#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

namespace {

constexpr int kPresetSpecContext = 64;

std::string preset_spec_model() { return shell_quoted(depthkv_test::data_path("models/stories260K/stories260K.bin")); }
std::string preset_spec_text() { return shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")); }
const std::string kPresetSpecSelection = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";

/// A profile of stories260K measured with `--preset best` (head curves of snapkv and h2o) on 3
/// calibration windows of 64 + 16 tokens.
std::string preset_spec_profile() {
  const std::string path = depthkv_test::tmp_path("preset_spec_best.json");
  REQUIRE(run_cli("profile --model " + preset_spec_model() + " --text " + preset_spec_text() + kPresetSpecSelection +
                  " --windows 3 --ratios 0.1,0.2,0.5 --preset best -o " + shell_quoted(path))
              .status == 0);
  return path;
}

/// The base settings the flags spell out (protection 2/4, observation window 4, kernel 7),
/// with the keep ratio `keep`, the safeguard of `--min-tokens min_tokens` and `schedule`.
depthkv::PruneSpec preset_spec_base(double keep, int min_tokens, const depthkv::ScheduleSpec& schedule) {
  depthkv::PruneSpec base;
  base.protection = {2, 4};
  base.scorer.window = 4;
  base.scorer.kernel = 7;
  base.budget = depthkv::Budget::keep(keep);
  base.safeguard = depthkv::Safeguard::from_min_tokens(min_tokens);
  base.schedule = schedule;
  return base;
}

/// Runs `eval --preset best --json` with `flags` and checks every row's spec against the
/// library's preset for the same profile, base settings and lengths. @return the rows checked
int check_rows_against_library(const std::string& profile, const std::string& flags, const std::vector<double>& keeps,
                               int min_tokens, const depthkv::ScheduleSpec& schedule, std::optional<int> lookahead) {
  const auto r = run_cli("eval --model " + preset_spec_model() + " --text " + preset_spec_text() + " --profile " +
                             shell_quoted(profile) + kPresetSpecSelection + " --windows 1 --preset best --json" + flags,
                         "2>/dev/null");
  REQUIRE(r.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  REQUIRE(rows.size() == keeps.size());  // one policy (head-optimal), one chosen scorer per keep ratio
  const depthkv::ProfileFile f = depthkv::load_profile(profile);
  const std::vector<int> lengths(static_cast<std::size_t>(f.n_layers), kPresetSpecContext);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i << ": " << rows[i].dump());
    REQUIRE(rows[i].contains("spec"));
    const depthkv::PruneSpec cli = depthkv::prune_spec_from_json(rows[i]["spec"], "row.spec");
    const depthkv::PresetChoice lib =
        depthkv::preset("best", f, preset_spec_base(keeps[i], min_tokens, schedule), lengths, lookahead);
    CHECK(cli == lib.spec);
    CHECK(rows[i]["scorer"] == depthkv::scorer_name(lib.spec.scorer));
    // the comparison sees the fields a CLI could change after calling the library
    depthkv::PruneSpec other = lib.spec;
    other.scorer.lookahead += 1;
    CHECK_FALSE(cli == other);
    other = lib.spec;
    other.policy = depthkv::AllocationPolicy::kOptimal;
    CHECK_FALSE(cli == other);
    other = lib.spec;
    other.safeguard.margin += 1;
    CHECK_FALSE(cli == other);
  }
  return static_cast<int>(rows.size());
}

}  // namespace

TEST_CASE("eval --preset best: each row's spec is depthkv::preset's, field for field", "[cli][eval][preset][real]") {
  const std::string profile = preset_spec_profile();
  const depthkv::ScheduleSpec oneshot;
  // the preset's own lookahead, the automatic safeguard
  CHECK(check_rows_against_library(profile, " --keeps 0.2,0.5", {0.2, 0.5}, -1, oneshot, std::nullopt) == 2);
  // a lookahead given on the command line, a fixed safeguard floor
  CHECK(check_rows_against_library(profile, " --keeps 0.3 --lookahead 8 --min-tokens 12", {0.3}, 12, oneshot, 8) == 1);
  // no lookahead, so a chunked schedule; the safeguard off
  depthkv::ScheduleSpec chunked;
  chunked.mode = depthkv::ScheduleMode::kChunked;
  chunked.chunk = 32;
  chunked.interval = 4;
  CHECK(check_rows_against_library(profile, " --keeps 0.3 --lookahead 0 --schedule chunked --chunk 32 --interval 4 --min-tokens 0",
                                   {0.3}, 0, chunked, 0) == 1);
}

TEST_CASE("a prompt shorter than the protected tokens: preset and generate --preset best keep the protected tokens",
          "[cli][generate][preset][real]") {
  const std::string profile = preset_spec_profile();
  const depthkv::ProfileFile f = depthkv::load_profile(profile);
  // 5 tokens per layer, below the protected 2 + 4: keep 0.3 (2 tokens a layer) is raised to the 5 held
  const std::vector<int> lengths(static_cast<std::size_t>(f.n_layers), 5);
  const depthkv::ScheduleSpec oneshot;
  const depthkv::PresetChoice c = depthkv::preset("best", f, preset_spec_base(0.3, -1, oneshot), lengths);
  CHECK(c.spec.budget == depthkv::Budget::keep(0.3));  // the spec keeps the request's budget; the driver raises it
  REQUIRE(c.predicted.size() == 2);
  for (const auto& p : c.predicted) CHECK(p.second == 0.0);  // every token kept: no predicted loss
  const auto r = run_cli("generate --model " + preset_spec_model() + " --profile " + shell_quoted(profile) +
                             " --sinks 2 --recent 4 --obs-window 4 --threads 1 --prompt 'Once upon a time' -n 24 -t 0"
                             " --preset best --keep 0.3",
                         "2>&1");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("is below the protected 2 sinks + 4 recent tokens per layer: the protected tokens "
                                    "are kept"));
  CHECK_THAT(r.out, Catch::Contains("-> per-layer tokens 5 5 5 5 5 of 5"));
}
