#pragma once
// Building the allocator request of the allocate and eval subcommands from a profile file.

#include <algorithm>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/profile_io.hpp"

namespace depthkv_cli {

/// The InfoNCE stage the InfoNCE-guided policies (mga, mlma*) read from a profile.
inline const char* kInfoNCEKey = "infonce/post_attn";

/// Default safeguard floor of the curve-based policies (optimal, proportional, mga, mlma*):
/// protected tokens (sinks + window) plus this margin, in tokens. Chosen by measurement (with and
/// without it, on stories and on non-story text), see
/// README "Safeguard floor".
inline constexpr int kSafeguardMargin = 8;

/// Allocator inputs for one (policy, keep ratio) on layers of `lengths` tokens.
struct PolicyInputs {
  depthkv::BudgetRequest req;
  depthkv::SensitivityProfile profile;  ///< of the scorer in use (empty when not needed)
  bool has_profile = false;
};

/// @param min_tokens safeguard floor (-1: sinks + window + kSafeguardMargin)
/// @throws depthkv::Error when the policy needs data the profile lacks
inline PolicyInputs policy_inputs(depthkv::AllocationPolicy policy, double keep, const std::vector<int>& lengths,
                                  const depthkv::ProfileFile* file, const std::string& scorer,
                                  const SelectionSettings& sel, int min_tokens) {
  using namespace depthkv;
  PolicyInputs in;
  in.req.lengths = lengths;
  in.req.keep_ratio = keep;
  in.req.floors.resize(lengths.size());
  for (std::size_t l = 0; l < lengths.size(); ++l) in.req.floors[l] = std::min(lengths[l], sel.sinks + sel.window);
  in.req.window = sel.window;
  in.req.min_tokens = min_tokens >= 0 ? min_tokens : sel.sinks + sel.window + kSafeguardMargin;
  if (policy_needs_profile(policy)) {
    DEPTHKV_CHECK(file != nullptr, "policy '" << to_string(policy) << "' needs --profile");
    in.profile = file->profile(scorer);  // refuses a scorer the profile lacks
    in.has_profile = true;
  }
  if (policy_needs_infonce(policy)) {
    DEPTHKV_CHECK(file != nullptr, "policy '" << to_string(policy) << "' needs --profile with InfoNCE scores");
    const auto it = file->layer_metrics.find(kInfoNCEKey);
    DEPTHKV_CHECK(it != file->layer_metrics.end(), "policy '" << to_string(policy) << "' needs the profile's '"
                                                              << kInfoNCEKey
                                                              << "' scores: run depthkv profile --metric kl,infonce");
    in.req.infonce = it->second.mean;
  }
  return in;
}

}  // namespace depthkv_cli
