#pragma once
// Building the allocator request of the allocate, eval and generate subcommands from a profile file.

#include <algorithm>
#include <cstdio>
#include <sstream>
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

/// The token selection a profile was measured under: its `calibration.selection`, or for files
/// written before that field existed, the "sinks=S window=W kernel=K" that `depthkv profile` put
/// into the calibration description (SelectionSettings::describe; recent = window there).
/// @return the record; not recorded() when neither says (a profile written by other code)
inline depthkv::SelectionRecord measured_selection(const depthkv::ProfileFile& f) {
  if (f.calibration.selection.recorded()) return f.calibration.selection;
  depthkv::SelectionRecord r;
  const std::string& d = f.calibration.description;
  const std::size_t at = d.find("sinks=");
  int sinks = 0, window = 0, kernel = 0;
  if (at != std::string::npos &&
      std::sscanf(d.c_str() + at, "sinks=%d window=%d kernel=%d", &sinks, &window, &kernel) == 3)
    r = {sinks, window, window, kernel};
  return r;
}

/// A note for stderr when `policy` prunes by the profile's loss curves but this run's protection
/// or scorer window differ from those the curves were measured under (curves measured under other
/// protection describe another pruning); "" otherwise. The note names the options that match the
/// profile: generate's `--sink --recent --window` (`generate_flags`), else eval's and allocate's
/// `--sinks --window` (one window for the recent tokens and the scorer there).
inline std::string selection_note(depthkv::AllocationPolicy policy, const depthkv::ProfileFile& f, int sinks,
                                  int recent, int window, bool generate_flags) {
  if (!depthkv::policy_needs_profile(policy)) return "";
  const depthkv::SelectionRecord m = measured_selection(f);
  if (!m.differs(sinks, recent, window)) return "";
  std::ostringstream os;
  os << "depthkv: note: the profile was measured keeping " << m.n_sink << " sinks and " << m.n_recent
     << " recent tokens (scorer window " << m.window << "); this run keeps " << sinks << " sinks and "
     << recent << " recent tokens (scorer window " << window << "). Pass ";
  if (generate_flags)
    os << "--sink " << m.n_sink << " --recent " << m.n_recent << " --window " << m.window;
  else
    os << "--sinks " << m.n_sink << " --window " << m.n_recent;
  os << " to prune as the profile measured.\n";
  return os.str();
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
