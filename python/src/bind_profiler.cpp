// depthkv._core.profile_from_samples: a ProfileFile (depthkv/profile_io.hpp) from per-window
// metrics measured outside the C++ engine (depthkv.hf.profile), aggregated by the library's
// SensitivityProfiler (depthkv/sensitivity_profiler.hpp: mean and standard error per cell, the
// same checks), so that the file is the one `depthkv profile` would write for those metrics.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/scorer_registry.hpp"
#include "depthkv/sensitivity_profiler.hpp"

namespace depthkv_py {
namespace {

constexpr const char* kFunc = "profile_from_samples";

/// The three per-window metric arrays of one scorer, each float64 [units, n_ratios, n_windows].
using Samples = std::tuple<AnyArray, AnyArray, AnyArray>;

/// Element (u, k, w) of a checked float64 array.
double at(const AnyArray& a, std::size_t u, std::size_t k, std::size_t w) {
  const auto* p = static_cast<const double*>(a.data());
  return p[static_cast<std::int64_t>(u) * a.stride(0) + static_cast<std::int64_t>(k) * a.stride(1) +
           static_cast<std::int64_t>(w) * a.stride(2)];
}

void check_samples(const AnyArray& a, const char* what, std::size_t units, std::size_t ratios) {
  DEPTHKV_CHECK_AS(kFunc, a.device_type() == nb::device::cpu::value, what << " must be in host memory");
  DEPTHKV_CHECK_AS(kFunc, a.dtype() == nb::dtype<double>(), what << " must be float64, got " << dtype_name(a.dtype()));
  DEPTHKV_CHECK_AS(kFunc, a.ndim() == 3 && a.shape(0) == units && a.shape(1) == ratios && a.shape(2) >= 1,
                   what << " must be [" << units << " units, " << ratios << " ratios, n_windows >= 1]");
}

/// The profiler state of `units` rows (layers, or layer * n_kv_heads + head) from the samples.
depthkv::ProfilerState measure(int units, const std::vector<double>& ratios, const Samples& s, const std::string& name) {
  const AnyArray &kl = std::get<0>(s), &dnll = std::get<1>(s), &top1 = std::get<2>(s);
  const std::size_t U = static_cast<std::size_t>(units), R = ratios.size();
  check_samples(kl, "kl", U, R);
  check_samples(dnll, "dnll", U, R);
  check_samples(top1, "top1", U, R);
  const std::size_t W = kl.shape(2);
  DEPTHKV_CHECK_AS(kFunc, dnll.shape(2) == W && top1.shape(2) == W, name << ": the metric arrays differ in windows");
  depthkv::ProfilerOptions opts;
  opts.keep_ratios = ratios;
  depthkv::SensitivityProfiler prof(units, opts);
  try {
    prof.run_batched([&](int u, const std::vector<double>& asked) {
      std::vector<depthkv::SampleMetrics> out(asked.size());
      for (std::size_t k = 0; k < asked.size(); ++k)
        for (std::size_t w = 0; w < W; ++w) {
          const auto uu = static_cast<std::size_t>(u);
          out[k].kl.push_back(at(kl, uu, k, w));
          out[k].dnll.push_back(at(dnll, uu, k, w));
          out[k].top1_disagree.push_back(at(top1, uu, k, w));
        }
      return out;
    });
  } catch (const depthkv::Error& e) {
    throw depthkv::Error(std::string(kFunc) + ": scorer " + name + ": " + e.message());
  }
  return prof.state();
}

/// The selection the curves were measured under (as `depthkv profile` records its flags).
depthkv::PruneSpec selection(int n_sink, int n_recent, int obs_window, int kernel, const std::string& pooling,
                             bool output_aware) {
  depthkv::PruneSpec s;
  s.scorer = depthkv::scorer_config("h2o");
  s.scorer.window = obs_window;
  s.scorer.kernel = kernel;
  s.scorer.pooling = depthkv::parse_pooling(pooling);
  s.scorer.output_aware = output_aware;
  s.protection = {n_sink, n_recent};
  s.validate();
  return s;
}

depthkv::ProfileFile profile_from_samples(int n_layers, const std::vector<double>& keep_ratios,
                                          const std::map<std::string, Samples>& scorers,
                                          const std::map<std::string, std::pair<int, Samples>>& heads,
                                          const std::tuple<std::string, std::uint64_t, std::string, std::uint64_t>& model,
                                          const std::string& text_file, int context, int continuation, long long skip,
                                          const std::string& description, std::tuple<int, int, int, int> sel,
                                          const std::string& pooling, bool output_aware, const std::string& metric) {
  DEPTHKV_CHECK_AS(kFunc, n_layers >= 1, "n_layers must be >= 1, got " << n_layers);
  DEPTHKV_CHECK_AS(kFunc, !scorers.empty(), "no scorer's samples");
  depthkv::parse_loss_metric(metric);
  depthkv::ProfileFile f;
  f.model.file_name = std::get<0>(model);
  f.model.size = std::get<1>(model);
  f.model.header_hash = std::get<2>(model);
  f.model.header_bytes = std::get<3>(model);
  f.n_layers = n_layers;
  f.keep_ratios = keep_ratios;
  f.metric = metric;
  for (const auto& kv : scorers) f.scorers[kv.first] = measure(n_layers, keep_ratios, kv.second, kv.first);
  for (const auto& kv : heads) {
    DEPTHKV_CHECK_AS(kFunc, f.scorers.count(kv.first) == 1, "head curves of " << kv.first << " without its layer curves");
    depthkv::HeadCurves& hc = f.head_curves[kv.first];
    hc.n_kv_heads = kv.second.first;
    DEPTHKV_CHECK_AS(kFunc, hc.n_kv_heads >= 1, "n_kv_heads must be >= 1, got " << hc.n_kv_heads);
    hc.state = measure(n_layers * hc.n_kv_heads, keep_ratios, kv.second.second, kv.first + " (heads)");
  }
  depthkv::CalibrationInfo& c = f.calibration;
  c.text_file = text_file;
  c.context = context;
  c.continuation = continuation;
  c.skip = skip;
  c.samples = f.scorers.begin()->second.metrics.n_samples;
  c.window_begin = skip;
  c.window_end = skip + c.samples;
  const depthkv::PruneSpec spec =
      selection(std::get<0>(sel), std::get<1>(sel), std::get<2>(sel), std::get<3>(sel), pooling, output_aware);
  c.selection = spec;
  c.description = spec.describe_selection() + (description.empty() ? "" : " " + description);
  // what load_profile will check, checked now (a file this writes always loads)
  (void)depthkv::profile_from_json(depthkv::profile_to_json(f));
  return f;
}

}  // namespace

void bind_profiler(nb::module_& m) {
  m.def("profile_from_samples", &profile_from_samples, nb::arg("n_layers"), nb::arg("keep_ratios"), nb::arg("scorers"),
        nb::arg("heads"), nb::arg("model"), nb::arg("text_file"), nb::arg("context"), nb::arg("continuation"),
        nb::arg("skip"), nb::arg("description"), nb::arg("selection"), nb::arg("pooling"), nb::arg("output_aware"),
        nb::arg("metric"),
        "A Profile from per-window metrics: scorers maps a scorer name to (kl, dnll, top1), each float64 "
        "[n_layers, n_ratios, n_windows]; heads maps it to (n_kv_heads, (kl, dnll, top1)) of "
        "[n_layers * n_kv_heads, ...]; model is (name, size, hash, hashed_bytes); selection is (n_sink, "
        "n_recent, obs_window, kernel). Use depthkv.hf.profile.");
}

}  // namespace depthkv_py
