// depthkv._core: profile files (depthkv/profile_io.hpp), the allocation of a request over a
// profile (depthkv/prune_spec.hpp allocate, as `depthkv allocate` does) and the presets
// (depthkv/preset.hpp). The loss curves are handed to Python as read-only numpy views of the
// profile's own matrices (no copy; the view keeps the Profile alive).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"

namespace depthkv_py {
namespace {

using depthkv::ProfileFile;

/// A JSON value as Python objects (dict, list, str, float, int, bool, None).
nb::object to_python(const nlohmann::json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

/// A read-only view of a column-major matrix owned by `owner`: [rows, cols], or with
/// `heads` > 0 [rows / heads, heads, cols] (row l * heads + h).
nb::object matrix_view(const Eigen::MatrixXd& m, nb::handle owner, int heads) {
  const auto rows = static_cast<std::size_t>(m.rows()), cols = static_cast<std::size_t>(m.cols());
  const auto r = static_cast<std::int64_t>(rows);
  using View = nb::ndarray<nb::numpy, const double>;
  if (heads <= 0) return nb::cast(View(m.data(), {rows, cols}, owner, {1, r}));
  const auto H = static_cast<std::size_t>(heads);
  return nb::cast(View(m.data(), {rows / H, H, cols}, owner, {static_cast<std::int64_t>(H), 1, r}));
}

/// The matrices of `metric` ("" for the file's default) in `mp`.
const depthkv::SensitivityProfile& metric_profile(const ProfileFile& f, const depthkv::MetricProfiles& mp,
                                                  const std::string& metric) {
  switch (depthkv::parse_loss_metric(metric.empty() ? f.metric : metric)) {
    case depthkv::LossMetric::kNLLIncrease: return mp.dnll;
    case depthkv::LossMetric::kTop1Disagree: return mp.top1;
    case depthkv::LossMetric::kKL: break;
  }
  return mp.kl;
}

/// Profile.curves: the stored means (or standard errors) of `scorer`, [n_layers, n_ratios].
nb::object layer_curves(const ProfileFile& f, const std::string& scorer, const std::string& metric, bool stderr_) {
  const auto it = f.scorers.find(scorer);
  if (it == f.scorers.end()) f.profile(scorer);  // throws, naming the scorers present
  const depthkv::SensitivityProfile& p = metric_profile(f, it->second.metrics, metric);
  return matrix_view(stderr_ ? p.loss_stderr : p.loss, nb::find(&f), 0);
}

/// Profile.head_curves: `scorer`'s head curves, [n_layers, n_kv_heads, n_ratios].
nb::object head_curves(const ProfileFile& f, const std::string& scorer, const std::string& metric, bool stderr_) {
  const auto it = f.head_curves.find(scorer);
  if (it == f.head_curves.end()) f.head_profile(scorer);  // throws, saying how to measure them
  const depthkv::SensitivityProfile& p = metric_profile(f, it->second.state.metrics, metric);
  return matrix_view(stderr_ ? p.loss_stderr : p.loss, nb::find(&f), it->second.n_kv_heads);
}

std::vector<std::string> scorer_names(const ProfileFile& f) {
  std::vector<std::string> out;
  for (const auto& kv : f.scorers) out.push_back(kv.first);
  return out;
}

/// Profile.selection: the selection the curves were measured under, or None.
nb::object selection(const ProfileFile& f) {
  const std::optional<depthkv::PruneSpec> s = depthkv::measured_selection(f);
  if (!s) return nb::none();
  return to_python(depthkv::prune_spec_to_json(*s, depthkv::SpecFields::kSelection));
}

void bind_profile_class(nb::module_& m) {
  nb::class_<ProfileFile>(m, "Profile", "A depthkv profile file (depthkv::ProfileFile): use depthkv.load_profile")
      .def_prop_ro("n_layers", [](const ProfileFile& f) { return f.n_layers; })
      .def_prop_ro("metric", [](const ProfileFile& f) { return f.metric; })
      .def_prop_ro("keep_ratios",
                   [](const ProfileFile& f) {
                     return nb::cast(nb::ndarray<nb::numpy, const double>(f.keep_ratios.data(), {f.keep_ratios.size()},
                                                                          nb::find(&f)));
                   })
      .def_prop_ro("scorers", &scorer_names)
      .def_prop_ro("model", [](const ProfileFile& f) { return to_python(depthkv::profile_to_json(f)["model"]); })
      .def_prop_ro("calibration",
                   [](const ProfileFile& f) { return to_python(depthkv::profile_to_json(f)["calibration"]); })
      .def_prop_ro("selection", &selection)
      .def_prop_ro("layer_metrics", [](const ProfileFile& f) { return to_python(depthkv::profile_to_json(f).value(
                                                                   "layer_metrics", nlohmann::json::object())); })
      .def("curves", &layer_curves, nb::arg("scorer"), nb::arg("metric") = "", nb::arg("stderr") = false)
      .def("head_curves", &head_curves, nb::arg("scorer"), nb::arg("metric") = "", nb::arg("stderr") = false)
      .def("has_head_curves", [](const ProfileFile& f, const std::string& s) { return f.has_head_curves(s); })
      .def("n_kv_heads",
           [](const ProfileFile& f, const std::string& s) -> std::optional<int> {
             const auto it = f.head_curves.find(s);
             return it == f.head_curves.end() ? std::nullopt : std::optional<int>(it->second.n_kv_heads);
           })
      .def("to_json", [](const ProfileFile& f) {
        return depthkv::profile_to_json(f).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      });
}

/// The request's spec as `depthkv allocate` builds it (tools/policy_request.hpp request_spec):
/// the scorer's curves are passed beside the spec, so its name does not enter the request and
/// the spec's scorer is h2o with the observation window `obs_window` (pyramid's window).
depthkv::PruneSpec request_spec(std::optional<double> keep, std::optional<long long> total_tokens, int n_sink,
                                int n_recent, int obs_window, int min_tokens) {
  DEPTHKV_CHECK_AS("allocate", keep.has_value() != total_tokens.has_value(),
                   "give exactly one of keep and total_tokens");
  DEPTHKV_CHECK_AS("allocate", !keep || (*keep > 0.0 && *keep <= 1.0), "keep " << *keep << " outside (0, 1]");
  DEPTHKV_CHECK_AS("allocate", min_tokens >= -1, "min_tokens must be -1 (automatic), 0 (off) or N >= 1, got "
                                                     << min_tokens);
  depthkv::PruneSpec s;
  s.scorer = depthkv::scorer_config("h2o");
  s.scorer.window = obs_window;
  s.protection = {n_sink, n_recent};
  s.budget = keep ? depthkv::Budget::keep(*keep) : depthkv::Budget::tokens(*total_tokens);
  s.safeguard = depthkv::Safeguard::from_min_tokens(min_tokens);
  s.validate();
  return s;
}

/// Tokens per layer: `lengths`, or the profile's context length in every layer.
std::vector<int> layer_lengths(const ProfileFile& f, const std::optional<std::vector<int>>& lengths) {
  if (lengths) {
    DEPTHKV_CHECK_AS("allocate", static_cast<int>(lengths->size()) == f.n_layers,
                     "lengths has " << lengths->size() << " entries, the profile " << f.n_layers << " layers");
    for (int x : *lengths) DEPTHKV_CHECK_AS("allocate", x >= 0, "lengths must be >= 0, got " << x);
    return *lengths;
  }
  DEPTHKV_CHECK_AS("allocate", f.calibration.context >= 1,
                   "the profile records no context length (calibration.context " << f.calibration.context
                                                                                 << "): give lengths");
  return std::vector<int>(static_cast<std::size_t>(f.n_layers), f.calibration.context);
}

/// The scorer whose curves the policy reads: `scorer`, or the profile's first (as `depthkv allocate`).
std::string resolve_scorer(const ProfileFile& f, std::string scorer, depthkv::AllocationPolicy policy) {
  if (scorer.empty()) {
    DEPTHKV_CHECK_AS("allocate", !f.scorers.empty() || !depthkv::policy_needs_profile(policy),
                     "the profile holds no loss curves");
    scorer = f.scorers.empty() ? "h2o" : f.scorers.begin()->first;
  }
  if (!f.has_scorer(scorer)) f.profile(scorer);  // throws, naming the scorers present
  return scorer;
}

long long sum_of(const std::vector<int>& v) {
  long long t = 0;
  for (int x : v) t += x;
  return t;
}

/// depthkv.allocate: `depthkv::allocate` of the request over the profile's curves.
nb::dict allocate(const ProfileFile& f, const std::string& policy_name, const std::string& scorer_name,
                  std::optional<double> keep, std::optional<long long> total_tokens,
                  std::optional<std::vector<int>> lengths_in, int n_sink, int n_recent, int obs_window, int min_tokens,
                  int tiers) {
  const depthkv::AllocationPolicy policy = depthkv::parse_allocation_policy(policy_name);
  const depthkv::PruneSpec spec = [&] {
    depthkv::PruneSpec s = request_spec(keep, total_tokens, n_sink, n_recent, obs_window, min_tokens);
    s.policy = policy;
    s.tiers = tiers;
    return s;
  }();
  std::vector<int> lengths = layer_lengths(f, lengths_in);
  const std::string scorer = resolve_scorer(f, scorer_name, policy);
  const depthkv::PolicyCurves curves = depthkv::policy_curves(f, scorer, policy);
  depthkv::Allocation a = depthkv::allocate(spec, lengths, curves.data());
  nb::dict out;
  out["policy"] = depthkv::to_string(policy);
  out["scorer"] = scorer;
  out["predicted_loss"] = nb::none();
  out["head_budgets"] = nb::none();
  if (depthkv::is_head_policy(policy)) {
    out["predicted_loss"] = depthkv::predicted_head_loss(curves.heads, a.heads, lengths);
    long long total = 0;
    std::vector<int> flat;
    for (const std::vector<int>& row : a.heads) {
      total += sum_of(row);
      flat.insert(flat.end(), row.begin(), row.end());
    }
    out["total"] = total;
    out["head_budgets"] = owning_array(std::move(flat), {a.heads.size(), static_cast<std::size_t>(curves.n_kv_heads)});
  } else {
    if (curves.has_layer) out["predicted_loss"] = depthkv::predicted_loss(curves.layer, a.layers, lengths);
    out["total"] = sum_of(a.layers);
  }
  const std::size_t n_layers = a.layers.size();
  out["tiers"] = tiers;
  out["tier"] = a.tier.empty() ? nb::none() : nb::object(owning_array(std::move(a.tier), {n_layers}));
  out["budgets"] = owning_array(std::move(a.layers), {n_layers});
  out["lengths"] = owning_array(std::move(lengths), {static_cast<std::size_t>(f.n_layers)});
  return out;
}

/// depthkv.preset: the preset's spec for one request (as JSON text, `prune_spec_to_json`) and
/// each candidate scorer's predicted loss.
nb::tuple preset(const std::string& name, const ProfileFile& f, std::optional<double> keep,
                 std::optional<long long> total_tokens, std::optional<std::vector<int>> lengths, int n_sink,
                 int n_recent, int obs_window, int kernel, int min_tokens, std::optional<int> lookahead) {
  depthkv::check_preset_name(name);
  depthkv::PruneSpec base = request_spec(keep, total_tokens, n_sink, n_recent, obs_window, min_tokens);
  base.scorer.kernel = kernel;
  base.validate();
  const depthkv::PresetChoice c = depthkv::preset(name, f, base, layer_lengths(f, lengths), lookahead);
  nb::list predicted;
  for (const auto& p : c.predicted) predicted.append(nb::make_tuple(p.first, p.second));
  return nb::make_tuple(to_python(depthkv::prune_spec_to_json(c.spec)), predicted);
}

}  // namespace

void bind_profile(nb::module_& m) {
  bind_profile_class(m);
  m.def("load_profile", [](const std::string& path) { return depthkv::load_profile(path); }, nb::arg("path"));
  m.def("save_profile", [](const ProfileFile& f, const std::string& path) { depthkv::save_profile(f, path); },
        nb::arg("profile"), nb::arg("path"));
  m.def("allocate", &allocate, nb::arg("profile"), nb::arg("policy"), nb::arg("scorer"), nb::arg("keep").none(),
        nb::arg("total_tokens").none(), nb::arg("lengths").none(), nb::arg("n_sink"), nb::arg("n_recent"),
        nb::arg("obs_window"), nb::arg("min_tokens"), nb::arg("tiers"));
  m.def("preset", &preset, nb::arg("name"), nb::arg("profile"), nb::arg("keep").none(), nb::arg("total_tokens").none(),
        nb::arg("lengths").none(), nb::arg("n_sink"), nb::arg("n_recent"), nb::arg("obs_window"), nb::arg("kernel"),
        nb::arg("min_tokens"), nb::arg("lookahead").none());
  std::vector<std::string> policies;
  for (depthkv::AllocationPolicy p : depthkv::all_allocation_policies()) policies.push_back(depthkv::to_string(p));
  policies.push_back(depthkv::to_string(depthkv::AllocationPolicy::kHeadOptimal));
  m.attr("POLICIES") = policies;
  m.attr("PRESETS") = depthkv::preset_names();
}

}  // namespace depthkv_py
