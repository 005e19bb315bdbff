#pragma once
// The allocate, eval and generate subcommands' requests: flags -> depthkv::PruneSpec, and what a
// spec's policy reads from a profile file (depthkv/preset.hpp's policy_curves).

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_common.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"

namespace depthkv_cli {

/// The CLI name of the head-level curve-optimal policy (depthkv::AllocationPolicy::kHeadOptimal).
inline const std::string kHeadOptimal = depthkv::to_string(depthkv::AllocationPolicy::kHeadOptimal);

/// The spec of one request: the selection flags, `scorer`, a keep ratio, `policy`, the
/// safeguard's `--min-tokens` spelling (-1 automatic, 0 off, N tokens) and `--tiers`.
inline depthkv::PruneSpec request_spec(const SelectionSettings& sel, const std::string& scorer, double keep,
                                       depthkv::AllocationPolicy policy, int min_tokens) {
  depthkv::PruneSpec s = sel.spec(scorer);
  s.budget = depthkv::Budget::keep(keep);
  s.policy = policy;
  s.tiers = sel.tiers;
  s.safeguard = depthkv::Safeguard::from_min_tokens(min_tokens);
  return s;
}

/// Allocator inputs for one (policy, keep ratio) on layers of `lengths` tokens.
struct PolicyInputs {
  depthkv::BudgetRequest req;
  depthkv::SensitivityProfile profile;  ///< of the scorer in use (empty when not needed)
  bool has_profile = false;
};

/// Adds what `policy` reads from a profile file to `req`: the layer curves of `scorer` (into
/// `profile`) and the per-layer InfoNCE scores (depthkv::policy_curves).
/// @return whether `profile` was filled
/// @throws depthkv::Error when the policy needs data the file lacks, or no file was given
inline bool add_profile_inputs(depthkv::AllocationPolicy policy, const depthkv::ProfileFile* file,
                               const std::string& scorer, depthkv::BudgetRequest& req,
                               depthkv::SensitivityProfile& profile) {
  using namespace depthkv;
  if (file == nullptr) {
    DEPTHKV_CHECK(!policy_needs_profile(policy), "policy '" << to_string(policy) << "' needs --profile");
    DEPTHKV_CHECK(!policy_needs_infonce(policy), "policy '" << to_string(policy) << "' needs --profile with InfoNCE scores");
    return false;
  }
  PolicyCurves c = policy_curves(*file, scorer, policy);
  if (!c.infonce.empty()) req.infonce = c.infonce;
  if (c.has_layer) profile = std::move(c.layer);
  return c.has_layer;
}

/// A note for stderr when `policy` prunes by the profile's curves but this run's selection
/// differs from the one the curves were measured under; "" otherwise. It names the flags that
/// match the profile.
inline std::string selection_note(depthkv::AllocationPolicy policy, const depthkv::ProfileFile& f,
                                  const SelectionSettings& sel) {
  if (!depthkv::policy_needs_profile(policy) && !depthkv::is_head_policy(policy)) return "";
  const std::optional<depthkv::PruneSpec> m = depthkv::measured_selection(f);
  const depthkv::PruneSpec r = sel.spec("h2o");
  if (!m || m->same_selection(r)) return "";
  std::ostringstream os;
  os << "depthkv: note: the profile was measured with " << m->describe_selection() << "; this run uses "
     << r.describe_selection() << ". Pass --sinks " << m->protection.n_sink << " --recent " << m->protection.n_recent
     << " --obs-window " << m->scorer.window << " --kernel " << m->scorer.kernel << " --pooling "
     << depthkv::to_string(m->scorer.pooling);
  if (m->has_head_settings() || r.has_head_settings()) {
    if (m->scorer.output_aware) os << " --output-aware";
    os << " --head-alloc " << depthkv::to_string(m->head_split.mode) << " --head-alpha " << m->head_split.alpha;
    if (r.scorer.output_aware && !m->scorer.output_aware) os << " (without --output-aware)";
  }
  if (m->scorer.lookahead != r.scorer.lookahead) os << " --lookahead " << m->scorer.lookahead;
  os << " to prune as the profile measured.\n";
  return os.str();
}

/// The allocator request of a keep ratio on layers of `lengths` tokens (PruneSpec::budget_request).
inline depthkv::BudgetRequest layer_request(double keep, const std::vector<int>& lengths, const SelectionSettings& sel,
                                            int min_tokens) {
  return request_spec(sel, "h2o", keep, depthkv::AllocationPolicy::kUniform, min_tokens).budget_request(lengths);
}

/// Allocator inputs of a policy on layers of `lengths` tokens: `layer_request` and what the
/// policy reads from the profile file.
/// @throws depthkv::Error when the policy needs data the profile lacks
inline PolicyInputs policy_inputs(depthkv::AllocationPolicy policy, double keep, const std::vector<int>& lengths,
                                  const depthkv::ProfileFile* file, const std::string& scorer,
                                  const SelectionSettings& sel, int min_tokens) {
  PolicyInputs in;
  in.req = layer_request(keep, lengths, sel, min_tokens);
  in.has_profile = add_profile_inputs(policy, file, scorer, in.req, in.profile);
  if (file != nullptr) depthkv::cap_to_windows(in.req, file->layer_window);  // local layers: at most window - 1
  return in;
}

/// "snapkv 0.0123, h2o 0.0456": a preset choice's predicted losses, for reports.
inline std::string describe_predicted(const std::vector<std::pair<std::string, double>>& predicted) {
  std::ostringstream os;
  for (std::size_t i = 0; i < predicted.size(); ++i) os << (i ? ", " : "") << predicted[i].first << ' ' << predicted[i].second;
  return os.str();
}

}  // namespace depthkv_cli
