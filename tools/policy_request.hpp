#pragma once
// Building the allocator request of the allocate, eval and generate subcommands from a profile file.

#include <algorithm>
#include <cstdio>
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

/// The protection a profile was measured with: `depthkv profile` writes its selection settings
/// ("sinks=S window=W kernel=K ...", SelectionSettings::describe) into the calibration description.
/// @return false when the description does not say (a profile written by other code)
inline bool measured_protection(const depthkv::ProfileFile& f, int& sinks, int& window) {
  const std::string& d = f.calibration.description;
  const std::size_t at = d.find("sinks=");
  return at != std::string::npos && std::sscanf(d.c_str() + at, "sinks=%d window=%d", &sinks, &window) == 2;
}

/// @param min_tokens safeguard floor (-1: sinks + window + kSafeguardMargin)
/// @throws depthkv::Error when the policy needs data the profile lacks
inline PolicyInputs policy_inputs(depthkv::AllocationPolicy policy, double keep,
                                  const std::vector<int>& lengths, const depthkv::ProfileFile* file,
                                  const std::string& scorer, const SelectionSettings& sel, int min_tokens) {
  PolicyInputs in;
  in.req.lengths = lengths;
  in.req.keep_ratio = keep;
  in.req.floors.resize(lengths.size());
  for (std::size_t l = 0; l < lengths.size(); ++l)
    in.req.floors[l] = std::min(lengths[l], sel.sinks + sel.window);
  in.req.window = sel.window;
  in.req.min_tokens = min_tokens >= 0 ? min_tokens : sel.sinks + sel.window + kSafeguardMargin;
  in.has_profile = add_profile_inputs(policy, file, scorer, in.req, in.profile);
  return in;
}

}  // namespace depthkv_cli
