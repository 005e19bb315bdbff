// `depthkv allocate --tiers K` and `depthkv eval --tiers K`: the budgets and tiers the library
// gives for the same request (BudgetRequest::tiers through PruneSpec::tiers), the keys written
// only with --tiers, and the refusals (another policy, a negative K, eval without optimal).

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "depthkv/budget_allocator.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"
#include "support/run_cli.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

namespace {

/// The committed stories260K profile (layer curves of h2o and snapkv, context 384).
std::string tiers_cli_profile() {
  return std::string(DEPTHKV_TEST_SOURCE_DIR) + "/../docs/results/stories260K.profile.json";
}

/// The library's budgets and tiers for `allocate --keep keep --policy optimal --scorer snapkv
/// --tiers k` with the CLI's default selection (sinks 4, recent 16, obs-window 16, automatic safeguard).
std::pair<std::vector<int>, std::vector<int>> tiers_cli_library(double keep, int k) {
  const depthkv::ProfileFile f = depthkv::load_profile(tiers_cli_profile());
  depthkv::PruneSpec s;
  s.protection = {4, 16};
  s.scorer.window = 16;
  s.budget = depthkv::Budget::keep(keep);
  s.policy = depthkv::AllocationPolicy::kOptimal;
  s.safeguard = depthkv::Safeguard::from_min_tokens(-1);
  s.tiers = k;
  s.validate();
  const depthkv::PolicyCurves curves = depthkv::policy_curves(f, "snapkv", s.policy);
  depthkv::AllocationInfo info;
  const std::vector<int> b = depthkv::BudgetAllocator().allocate(
      s.policy, s.budget_request(std::vector<int>(static_cast<std::size_t>(f.n_layers), 384)), &curves.layer, &info);
  return {b, info.tier};
}

}  // namespace

TEST_CASE("allocate --tiers: the library's tiered budgets and tiers, refusals", "[tools][tiers]") {
  const std::string base = "allocate --profile " + shell_quoted(tiers_cli_profile()) + " --scorer snapkv --json";
  for (double keep : {0.1, 0.3}) {
    for (int k : {1, 2, 3, 5}) {
      INFO("keep " << keep << ", tiers " << k);
      const auto r = run_cli(base + " --keep " + std::to_string(keep) + " --tiers " + std::to_string(k));
      REQUIRE(r.status == 0);
      const nlohmann::json j = nlohmann::json::parse(r.out);
      const auto lib = tiers_cli_library(keep, k);
      REQUIRE(j["budgets"].get<std::vector<int>>() == lib.first);
      REQUIRE(j["tier"].get<std::vector<int>>() == lib.second);
      REQUIRE(j["tiers"] == k);
      const std::vector<int> tier = j["tier"].get<std::vector<int>>();
      REQUIRE(static_cast<int>(std::set<int>(tier.begin(), tier.end()).size()) <= k);
    }
  }
  const auto plain = run_cli(base + " --keep 0.3");
  REQUIRE(plain.status == 0);
  const nlohmann::json p = nlohmann::json::parse(plain.out);
  REQUIRE_FALSE(p.contains("tiers"));
  REQUIRE_FALSE(p.contains("tier"));
  REQUIRE(p["budgets"].get<std::vector<int>>() == tiers_cli_library(0.3, 0).first);
  // the text form names each layer's tier
  const auto text = run_cli("allocate --profile " + shell_quoted(tiers_cli_profile()) + " --scorer snapkv --tiers 2");
  REQUIRE(text.status == 0);
  REQUIRE_THAT(text.out, Catch::Contains("layer  budget  keep ratio  tier"));
  require_error(run_cli(base + " --keep 0.3 --policy uniform --tiers 2", "2>&1"),
                "tiers 2: only the optimal policy takes tiers, not 'uniform'");
  const std::string heads = std::string(DEPTHKV_TEST_SOURCE_DIR) + "/../docs/results/aidreams260K.best.profile.json";
  require_error(run_cli("allocate --profile " + shell_quoted(heads) + " --keep 0.3 --policy head-optimal --tiers 2", "2>&1"),
                "tiers 2: only the optimal policy takes tiers, not 'head-optimal'");
  const auto neg = run_cli(base + " --keep 0.3 --tiers -1", "2>&1");
  REQUIRE(neg.status != 0);
  REQUIRE_THAT(neg.out, Catch::Contains("--tiers"));
}

TEST_CASE("eval --tiers: the optimal rows carry the tiers, the other policies do not, refusals", "[tools][tiers]") {
  const std::string base = "eval --model " + depthkv_test::stories_model_arg() + " --text " +
                           shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt")) + " --profile " +
                           shell_quoted(tiers_cli_profile()) +
                           " --context 64 --continuation 16 --windows 1 --threads 1 --scorers snapkv --keeps 0.5";
  const auto r = run_cli(base + " --policies uniform,optimal --tiers 1 --json");
  REQUIRE(r.status == 0);
  const nlohmann::json rows = nlohmann::json::parse(r.out);
  REQUIRE(rows.size() == 2);
  REQUIRE(rows[0]["policy"] == "uniform");
  REQUIRE_FALSE(rows[0].contains("tiers"));
  REQUIRE(rows[1]["policy"] == "optimal");
  REQUIRE(rows[1]["tiers"] == 1);
  // one tier above the safeguard floors is the uniform split: the same budgets, the same KL
  REQUIRE(rows[1]["budgets"] == rows[0]["budgets"]);
  REQUIRE(rows[1]["kl"] == rows[0]["kl"]);
  const auto exact = run_cli(base + " --policies optimal --json");
  REQUIRE(exact.status == 0);
  REQUIRE(nlohmann::json::parse(exact.out)[0]["budgets"] != rows[1]["budgets"]);  // tiers changed something
  require_error(run_cli(base + " --policies uniform --tiers 2", "2>&1"),
                "--tiers 2 applies to the optimal policy only, and --policies (uniform) has no optimal");
}
