#pragma once
// Building the allocator request of the allocate, eval and generate subcommands from a profile file.

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_common.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/profile_io.hpp"

namespace depthkv_cli {

/// The InfoNCE stage the InfoNCE-guided policies (mga, mlma*) read from a profile.
inline const char* kInfoNCEKey = "infonce/post_attn";

/// Allocator inputs for one (policy, keep ratio) on layers of `lengths` tokens.
struct PolicyInputs {
  depthkv::BudgetRequest req;
  depthkv::SensitivityProfile profile;  ///< of the scorer in use (empty when not needed)
  bool has_profile = false;
};

/// Adds what `policy` reads from a profile file to `req`: the loss curves of `scorer` (into
/// `profile`; proportional, optimal, mga, mlma*) and the per-layer InfoNCE scores (mga, mlma*).
/// @return whether `profile` was filled
/// @throws depthkv::Error when the policy needs data the file lacks, or no file was given
inline bool add_profile_inputs(depthkv::AllocationPolicy policy, const depthkv::ProfileFile* file,
                               const std::string& scorer, depthkv::BudgetRequest& req,
                               depthkv::SensitivityProfile& profile) {
  using namespace depthkv;
  bool filled = false;
  if (policy_needs_profile(policy)) {
    DEPTHKV_CHECK(file != nullptr, "policy '" << to_string(policy) << "' needs --profile");
    profile = file->profile(scorer);  // refuses a scorer the profile lacks
    filled = true;
  }
  if (policy_needs_infonce(policy)) {
    DEPTHKV_CHECK(file != nullptr,
                  "policy '" << to_string(policy) << "' needs --profile with InfoNCE scores");
    const auto it = file->layer_metrics.find(kInfoNCEKey);
    DEPTHKV_CHECK(it != file->layer_metrics.end(),
                  "policy '" << to_string(policy) << "' needs the profile's '" << kInfoNCEKey
                             << "' scores: run depthkv profile --metric kl,infonce");
    req.infonce = it->second.mean;
  }
  return filled;
}

/// The token selection a profile was measured under: its `calibration.selection`, or for files
/// written before that field existed, the selection `depthkv profile` put at the start of the
/// calibration description: "sinks=S window=W kernel=K" (recent = observation window = W, max
/// pooling) or SelectionSettings::describe()'s "sinks=S recent=R obs_window=W kernel=K pooling=P".
/// @return the record; not recorded() when neither says (a profile written by other code)
inline depthkv::SelectionRecord measured_selection(const depthkv::ProfileFile& f) {
  if (f.calibration.selection.recorded()) return f.calibration.selection;
  depthkv::SelectionRecord r;
  const std::string& d = f.calibration.description;
  const std::size_t at = d.find("sinks=");
  if (at == std::string::npos) return r;
  int sinks = 0, recent = 0, window = 0, kernel = 0;
  char pooling[8] = {};
  if (std::sscanf(d.c_str() + at, "sinks=%d recent=%d obs_window=%d kernel=%d pooling=%7s", &sinks, &recent, &window,
                  &kernel, pooling) == 5)
    r = {sinks, recent, window, kernel, pooling};
  else if (std::sscanf(d.c_str() + at, "sinks=%d window=%d kernel=%d", &sinks, &window, &kernel) == 3)
    r = {sinks, window, window, kernel, "max"};
  return r;
}

/// A note for stderr when `policy` prunes by the profile's loss curves but this run's selection
/// differs from the one the curves were measured under (curves measured under other protection
/// describe another pruning); "" otherwise. The note names the flags that match the profile.
inline std::string selection_note(depthkv::AllocationPolicy policy, const depthkv::ProfileFile& f,
                                  const SelectionSettings& sel) {
  if (!depthkv::policy_needs_profile(policy)) return "";
  const depthkv::SelectionRecord m = measured_selection(f);
  if (!m.differs(sel.record())) return "";
  std::ostringstream os;
  os << "depthkv: note: the profile was measured with " << m.describe() << "; this run uses " << sel.describe()
     << ". Pass --sinks " << m.sinks << " --recent " << m.recent << " --obs-window " << m.obs_window << " --kernel "
     << m.kernel << " --pooling " << m.pooling;
  const depthkv::SelectionRecord r = sel.record();
  if (m.has_head_settings() || r.has_head_settings()) {
    if (m.output_aware) os << " --output-aware";
    os << " --head-alloc " << m.head_allocation << " --head-alpha " << m.head_alpha;
    if (r.output_aware && !m.output_aware) os << " (without --output-aware)";
  }
  if (m.lookahead != r.lookahead) os << " --lookahead " << m.lookahead;
  os << " to prune as the profile measured.\n";
  return os.str();
}

/// The allocator request of a keep ratio on layers of `lengths` tokens, before any profile data:
/// floors from the protection (depthkv::protection_floors), the safeguard floor and pyramid's
/// window (the observation window).
/// @param min_tokens safeguard floor (-1: sinks + recent + depthkv::kSafeguardMargin, the margin
///   halved until the floors fit (BudgetRequest::safeguard_shrink); 0: off; N: N tokens)
inline depthkv::BudgetRequest layer_request(double keep, const std::vector<int>& lengths, const SelectionSettings& sel,
                                            int min_tokens) {
  depthkv::BudgetRequest req;
  req.lengths = lengths;
  req.keep_ratio = keep;
  req.floors = depthkv::protection_floors(lengths, sel.protection());
  req.window = sel.obs_window;
  req.min_tokens = depthkv::safeguard_floor(sel.protection(), min_tokens);
  req.safeguard_shrink = min_tokens < 0;
  return req;
}

/// Allocator inputs of a curve-based or rule-based policy on layers of `lengths` tokens: the
/// request of `layer_request` and what the policy reads from the profile file.
/// @throws depthkv::Error when the policy needs data the profile lacks
inline PolicyInputs policy_inputs(depthkv::AllocationPolicy policy, double keep,
                                  const std::vector<int>& lengths, const depthkv::ProfileFile* file,
                                  const std::string& scorer, const SelectionSettings& sel, int min_tokens) {
  PolicyInputs in;
  in.req = layer_request(keep, lengths, sel, min_tokens);
  in.has_profile = add_profile_inputs(policy, file, scorer, in.req, in.profile);
  return in;
}

/// The CLI name of the head-level curve-optimal allocation (LU-KV, depthkv::head_optimal_budgets
/// on the profile's head curves), accepted beside the layer policies by eval --policies and
/// allocate --policy.
inline const std::string kHeadOptimal = "head-optimal";

/// A policy of the command line: a layer policy, or head-optimal (policy kOptimal, head_level).
struct PolicyChoice {
  depthkv::AllocationPolicy policy = depthkv::AllocationPolicy::kUniform;
  bool head_level = false;
  std::string name;  ///< as printed in tables and rows
};

/// @throws depthkv::Error on an unknown name (listing the valid ones)
inline PolicyChoice parse_policy_choice(const std::string& name) {
  if (name == kHeadOptimal) return {depthkv::AllocationPolicy::kOptimal, true, kHeadOptimal};
  for (depthkv::AllocationPolicy p : depthkv::all_allocation_policies())
    if (depthkv::to_string(p) == name) return {p, false, name};
  DEPTHKV_FAIL("unknown allocation policy '" << name << "' (expected " << depthkv::allocation_policy_names() << " or "
                                             << kHeadOptimal << ")");
}

/// The head-level optimal budgets k[l][h] of `scorer`'s head curves for the layer request `req`
/// (floors, caps, safeguard floor per head as per layer), and the head curves used.
/// @throws depthkv::Error when the profile holds no (complete) head curves of `scorer`, or the
///   request is infeasible
inline std::vector<std::vector<int>> head_level_budgets(const depthkv::ProfileFile& f, const std::string& scorer,
                                                        const depthkv::BudgetRequest& req,
                                                        depthkv::SensitivityProfile& head_profile, int& n_kv_heads) {
  head_profile = f.head_profile(scorer);  // refuses a scorer without head curves
  n_kv_heads = f.head_curves.at(scorer).n_kv_heads;
  return depthkv::head_optimal_budgets(head_profile, n_kv_heads, req);
}

/// The scorer of one request among `candidates`: the one whose head-optimal budgets for `req`
/// have the lowest predicted loss (depthkv::predicted_head_loss on its own head curves, all
/// measured on the same calibration windows; ties: the earlier candidate). Candidates without
/// (complete) head curves in the profile are skipped.
struct ScorerChoice {
  std::string scorer;                                      ///< the chosen one
  std::vector<std::pair<std::string, double>> predicted;  ///< each candidate considered, its predicted loss
};

/// @param req the layer request (layer_request): its lengths are the tokens each head of layer l holds
/// @throws depthkv::Error when the profile holds head curves of no candidate, or the request is
///   infeasible
inline ScorerChoice lowest_predicted_scorer(const depthkv::ProfileFile& f, const std::vector<std::string>& candidates,
                                            const depthkv::BudgetRequest& req) {
  ScorerChoice c;
  double best = 0.0;
  for (const std::string& s : candidates) {
    if (!f.has_head_curves(s)) continue;
    depthkv::SensitivityProfile hp;
    int H = 0;
    const std::vector<std::vector<int>> k = head_level_budgets(f, s, req, hp, H);
    const double pred = depthkv::predicted_head_loss(hp, k, req.lengths);
    c.predicted.emplace_back(s, pred);
    if (c.scorer.empty() || pred < best) {
      c.scorer = s;
      best = pred;
    }
  }
  std::ostringstream names;
  for (std::size_t i = 0; i < candidates.size(); ++i) names << (i ? ", " : "") << candidates[i];
  DEPTHKV_CHECK(!c.scorer.empty(), "the profile has no complete head curves of any of the scorers "
                                       << names.str() << ": profile it with depthkv profile --preset best");
  return c;
}

/// "snapkv 0.0123, h2o 0.0456": a choice's predicted losses, for reports.
inline std::string describe_predicted(const ScorerChoice& c) {
  std::ostringstream os;
  for (std::size_t i = 0; i < c.predicted.size(); ++i)
    os << (i ? ", " : "") << c.predicted[i].first << ' ' << c.predicted[i].second;
  return os.str();
}

}  // namespace depthkv_cli
