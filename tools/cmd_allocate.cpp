// depthkv allocate: per-layer keep budgets from a profile file and a global keep ratio.

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/profile_io.hpp"
#include "kv_memory.hpp"
#include "policy_request.hpp"

namespace depthkv_cli {
namespace {

struct AllocateArgs {
  std::string profile, policy = "optimal", scorer;
  double keep = 0.2;
  int length = 0, min_tokens = -1;
  bool json = false;
  SelectionSettings sel;
  PresetSettings preset;
};

// allocate --policy head-optimal: budgets per (layer, KV head) from the head curves.
void print_head_level(const AllocateArgs& a, const depthkv::ProfileFile& f, const std::string& scorer,
                      const PolicyInputs& in, int length) {
  using namespace depthkv;
  const PolicyCurves curves = policy_curves(f, scorer, AllocationPolicy::kHeadOptimal);
  const SensitivityProfile& hp = curves.heads;
  const int H = curves.n_kv_heads;
  const std::vector<std::vector<int>> k = head_optimal_budgets(hp, H, in.req);
  long long total = 0;
  for (const auto& row : k)
    for (int x : row) total += x;
  const double pred = predicted_head_loss(hp, k, in.req.lengths);
  if (a.json) {
    nlohmann::json j = {{"policy", kHeadOptimal}, {"scorer", scorer},   {"keep", a.keep},
                        {"length", length},      {"n_kv_heads", H},     {"head_budgets", k},
                        {"total", total},        {"predicted_loss", pred}};
    if (!f.layer_window.empty()) j["layer_window"] = f.layer_window;  // as the per-layer policies' JSON
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  std::printf("policy %s, scorer %s, keep %.3f of %d tokens x %d layers x %d KV heads = %lld tokens\n",
              kHeadOptimal.c_str(), scorer.c_str(), a.keep, length, f.n_layers, H, total);
  std::printf("layer  budget per KV head\n");
  for (std::size_t l = 0; l < k.size(); ++l) {
    std::printf("%5zu ", l);
    for (int x : k[l]) std::printf(" %6d", x);
    std::printf("\n");
  }
  std::printf("predicted total loss (%s, convexified head curves): %.4f\n", f.metric.c_str(), pred);
}

// The per-layer table; with --tiers a column naming each layer's tier.
void print_layer_table(const std::vector<int>& b, const std::vector<int>& tier, int length,
                       const std::vector<int>& window) {
  std::printf("layer  budget  keep ratio%s%s\n", window.empty() ? "" : "  window", tier.empty() ? "" : "  tier");
  for (std::size_t l = 0; l < b.size(); ++l) {
    std::printf("%5zu  %6d  %10.3f", l, b[l], static_cast<double>(b[l]) / length);
    if (!window.empty()) {
      if (window[l] > 0) std::printf("  %6d", window[l]);
      else std::printf("  %6s", "global");
    }
    if (!tier.empty()) std::printf("  %4d", tier[l]);
    std::printf("\n");
  }
}

void run_allocate(const AllocateArgs& a) {
  using namespace depthkv;
  a.sel.check();
  const ProfileFile f = load_profile(a.profile);
  const AllocationPolicy policy = parse_allocation_policy(a.policy);
  check_keep(a.keep, "--keep");
  DEPTHKV_CHECK(a.length >= 0, "--length must be >= 1, got " << a.length);
  const int length = a.length > 0 ? a.length : f.calibration.context;
  DEPTHKV_CHECK(length >= 1, "the profile records no context length (calibration.context "
                                 << f.calibration.context << "): give --length");
  const std::vector<int> lengths(static_cast<std::size_t>(f.n_layers), length);
  std::string scorer = a.scorer;
  if (a.preset.active()) {  // the candidate of the lowest predicted loss
    const PresetChoice c = preset(a.preset.name, f, request_spec(a.sel, "h2o", a.keep, policy, a.min_tokens), lengths,
                                  a.sel.lookahead, a.sel.context_weight);
    scorer = scorer_name(c.spec.scorer);
    std::fprintf(stderr, "depthkv: --preset %s: scorer %s (predicted loss %s)\n", a.preset.name.c_str(),
                 scorer.c_str(), describe_predicted(c.predicted).c_str());
  }
  if (scorer.empty()) {
    DEPTHKV_CHECK(!f.scorers.empty() || !policy_needs_profile(policy), "the profile holds no loss curves");
    scorer = f.scorers.empty() ? "h2o" : f.scorers.begin()->first;
  }
  DEPTHKV_CHECK(f.has_scorer(scorer), "the profile has no measurements for scorer '" << scorer << "'");
  const PolicyInputs in = policy_inputs(policy, a.keep, lengths, &f, scorer, a.sel, a.min_tokens);
  std::fputs(selection_note(policy, f, a.sel).c_str(), stderr);
  if (is_head_policy(policy)) {
    print_head_level(a, f, scorer, in, length);
    return;
  }
  AllocationInfo info;
  const std::vector<int> b =
      BudgetAllocator().allocate(policy, in.req, in.has_profile ? &in.profile : nullptr, &info);
  long long total = 0;
  for (int x : b) total += x;
  const double pred = in.has_profile ? predicted_loss(in.profile, b, lengths) : -1.0;
  if (a.json) {
    nlohmann::json j = {{"policy", to_string(policy)}, {"scorer", scorer}, {"keep", a.keep},
                        {"length", length},           {"budgets", b},     {"total", total}};
    if (in.has_profile) j["predicted_loss"] = pred;
    j["kv_memory"] = kv_memory_json(kv_memory(b, length, f.layer_window, a.keep, f.kv_heads, f.head_dim));
    if (!f.layer_window.empty()) j["layer_window"] = f.layer_window;
    if (a.sel.tiers > 0) {
      j["tiers"] = a.sel.tiers;
      j["tier"] = info.tier;
    }
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  std::printf("policy %s, scorer %s, keep %.3f of %d tokens x %d layers = %lld tokens\n", to_string(policy).c_str(),
              scorer.c_str(), a.keep, length, f.n_layers, total);
  print_layer_table(b, info.tier, length, f.layer_window);
  print_kv_memory(kv_memory(b, length, f.layer_window, a.keep, f.kv_heads, f.head_dim), a.keep, length);
  if (in.has_profile) std::printf("predicted total loss (%s, convexified curves): %.4f\n", f.metric.c_str(), pred);
  if (info.safeguard_fallback) std::printf("note: the safeguard floor could not be met; uniform was used\n");
}

}  // namespace

void register_allocate(CLI::App& app) {
  auto a = std::make_shared<AllocateArgs>();
  CLI::App* c = app.add_subcommand("allocate", "print per-layer budgets for a global keep ratio");
  c->add_option("--profile", a->profile, "profile file (from depthkv profile)")->required();
  c->add_option("--keep", a->keep, "global keep ratio in (0, 1]")->capture_default_str()->check(finite_number());
  c->add_option("--policy", a->policy,
                "allocation policy: " + depthkv::allocation_policy_names() + ", or " + kHeadOptimal +
                    " (per KV head, from the profile's head curves: depthkv profile --head-curves)")
      ->capture_default_str();
  c->add_option("--scorer", a->scorer, "scorer whose loss curves to use (default: the profile's first)");
  c->add_option("--length", a->length, "tokens per layer (default: the profile's context length)")->check(at_least(1));
  c->add_option("--min-tokens", a->min_tokens,
                "safeguard floor per layer of proportional, optimal, mga and mlma* (-1: sinks + recent + 8, the 8 halved "
                "until every layer's floor fits the budget; 0: off; N: N tokens, uniform budgets when they do not fit)")
      ->capture_default_str()
      ->check(min_tokens_value());
  a->sel.add_options(c, /*old_window=*/"--recent N --obs-window N (--window N set both)");
  a->sel.add_tiers_option(c, "--policy optimal only; --json adds \"tiers\" and each layer's \"tier\"");
  c->add_flag("--json", a->json, "print JSON");
  a->preset.add_option(c, {"--policy", "--scorer", "--pooling", "--output-aware", "--head-alloc", "--head-alpha"});
  c->callback([a] {
    a->preset.apply(a->sel, &a->scorer, &a->policy);
    run_allocate(*a);
  });
}

}  // namespace depthkv_cli
