#pragma once
/// @file sensitivity_profiler.hpp
/// @brief `SensitivityProfiler`: measures every layer's loss curve by pruning one layer at a time,
/// through a function the engine supplies; engine-agnostic (Eigen only).
///
/// The profiler schedules the runs "only layer l keeps the fraction r of its tokens, all other
/// layers full" for every layer l and every probed ratio r, aggregates the engine's per-sample
/// metrics (mean and standard error over the calibration samples), reports progress, can stop
/// and resume, and fills a `MetricProfiles` (KL, NLL increase, top-1 disagreement), whose
/// `profile(LossMetric::kKL)` is what `BudgetAllocator` reads.
///
/// ## The engine's side
/// Either a plain run function (one plan per call), or a batched per-layer function (all ratios
/// of one layer in one call) so that the engine can reuse work: when only layer l is pruned,
/// every activation below layer l equals the full run's, so the engine can keep the full run's
/// hidden states per layer and restart from layer l; and the ratios of one layer can share
/// whatever the engine can share (e.g. the scores of layer l, which do not depend on the ratio).
/// Both must be deterministic for resume to reproduce an uninterrupted run exactly.
///
/// @code
/// depthkv::SensitivityProfiler prof(n_layers);              // default ratios {0.05,...,0.75}
/// prof.options().progress = [](int done, int total) { std::fprintf(stderr, "%d/%d\n", done, total); return true; };
/// bool finished = prof.run_batched([&](int layer, const std::vector<double>& ratios) {
///   std::vector<depthkv::SampleMetrics> out;
///   for (double r : ratios) out.push_back(engine.eval_only_layer_pruned(layer, r));  // engine code
///   return out;
/// });
/// if (!finished) save(prof.state());                        // resume later: prof.resume(state)
/// depthkv::SensitivityProfile p = prof.result().profile(depthkv::LossMetric::kKL);
/// @endcode

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"
#include "depthkv/sensitivity_profile.hpp"

namespace depthkv {

/// Quality of one pruned run against the full-cache run, one entry per calibration sample (the
/// same samples, in the same order, in every call). Each vector has one value per sample.
struct SampleMetrics {
  std::vector<double> kl;             ///< mean KL(full || pruned) over the sample's continuation (>= 0)
  std::vector<double> dnll;           ///< mean NLL(pruned) - mean NLL(full) of the true tokens (any sign)
  std::vector<double> top1_disagree;  ///< fraction of continuation positions whose argmax differs, in [0, 1]
};

/// A per-layer keep-ratio plan: entry l is layer l's keep ratio, 1.0 = full (no pruning).
using KeepPlan = std::vector<double>;

/// Runs the calibration samples under a plan and returns their metrics.
using PlanRunFunction = std::function<SampleMetrics(const KeepPlan& plan)>;

/// Batched form: only layer `layer` pruned, once per entry of `keep_ratios` (ascending), all
/// other layers full; returns one `SampleMetrics` per ratio, in the same order.
using LayerRunFunction = std::function<std::vector<SampleMetrics>(int layer, const std::vector<double>& keep_ratios)>;

/// Profiler options.
struct ProfilerOptions {
  /// Probed keep ratios: strictly ascending, in (0, 1).
  std::vector<double> keep_ratios = {0.05, 0.1, 0.2, 0.3, 0.5, 0.75};
  /// Called after every finished unit of work (one run, or one layer in batched mode) with the
  /// number of (layer, ratio) runs done and the total; returning false stops the profiler.
  std::function<bool(int done, int total)> progress;
  /// Optional stop flag (e.g. set by a signal handler), checked before every unit of work.
  const std::atomic<bool>* stop = nullptr;
};

/// Everything needed to resume: the aggregated cells so far and which cells are done.
/// Cells not done hold 0 in every matrix.
struct ProfilerState {
  MetricProfiles metrics;           ///< means and standard errors of the done cells
  std::vector<std::uint8_t> done;   ///< [layer * n_ratios + ratio]: 1 when measured

  /// @return number of layers
  int n_layers() const { return metrics.kl.n_layers(); }
  /// @return the probed keep ratios
  const std::vector<double>& keep_ratios() const { return metrics.kl.keep_ratios; }
  /// @return number of measured (layer, ratio) cells
  int n_done() const {
    int n = 0;
    for (auto d : done) n += d != 0;
    return n;
  }
  /// @return true when every cell is measured
  bool complete() const { return n_done() == static_cast<int>(done.size()); }
  /// @return whether cell (layer, ratio index k) is measured
  bool is_done(int layer, int k) const {
    return done[static_cast<std::size_t>(layer) * keep_ratios().size() + static_cast<std::size_t>(k)] != 0;
  }

  /// Checks shapes (done mask size == layers x ratios) and the matrices (`MetricProfiles::validate`).
  /// @throws Error naming what is wrong
  void validate() const {
    metrics.validate();
    const std::size_t cells = static_cast<std::size_t>(n_layers()) * keep_ratios().size();
    DEPTHKV_CHECK(done.size() == cells, "done mask has " << done.size() << " entries for " << n_layers()
                                                         << " layers x " << keep_ratios().size() << " ratios");
    DEPTHKV_CHECK(n_done() == 0 || metrics.n_samples >= 1,
                  n_done() << " cells measured but the sample count is " << metrics.n_samples);
  }
};

/// Mean and standard error (sample standard deviation / sqrt(n); 0 for one sample).
inline std::pair<double, double> mean_and_stderr(const std::vector<double>& v) {
  const double n = static_cast<double>(v.size());
  if (v.empty()) return {0.0, 0.0};
  double m = 0.0;
  for (double x : v) m += x;
  m /= n;
  if (v.size() < 2) return {m, 0.0};
  double ss = 0.0;
  for (double x : v) ss += (x - m) * (x - m);
  return {m, std::sqrt(ss / (n - 1.0) / n)};
}

/// Schedules the one-layer-pruned runs and aggregates them (see the file comment).
///
/// @code
/// depthkv::SensitivityProfiler prof(n_layers);
/// prof.run([&](const depthkv::KeepPlan& plan) { return engine.evaluate(plan); });
/// depthkv::MetricProfiles mp = prof.result();
/// @endcode
class SensitivityProfiler {
 public:
  /// @param n_layers number of transformer layers (>= 1)
  /// @param opts probed ratios, progress callback, stop flag
  /// @throws Error on n_layers < 1 or invalid ratios (empty, outside (0, 1), not strictly ascending)
  explicit SensitivityProfiler(int n_layers, ProfilerOptions opts = {}) : opts_(std::move(opts)) {
    DEPTHKV_CHECK(n_layers >= 1, "n_layers " << n_layers << " must be >= 1");
    SensitivityProfile empty;
    empty.keep_ratios = opts_.keep_ratios;
    empty.loss = Eigen::MatrixXd::Zero(n_layers, static_cast<Eigen::Index>(opts_.keep_ratios.size()));
    empty.loss_stderr = empty.loss;
    empty.validate();
    state_.metrics.kl = state_.metrics.dnll = state_.metrics.top1 = empty;
    state_.metrics.n_samples = 0;
    state_.done.assign(static_cast<std::size_t>(n_layers) * opts_.keep_ratios.size(), 0);
  }

  /// @return the options (the progress callback and stop flag may be changed between runs;
  ///         the ratios are fixed at construction)
  ProfilerOptions& options() { return opts_; }

  /// Continues from a saved state (e.g. loaded from a partial profile file).
  /// @param s a state with the same layer count and ratios as this profiler
  /// @throws Error when the state is malformed or its layers/ratios differ
  void resume(const ProfilerState& s) {
    s.validate();
    DEPTHKV_CHECK(s.n_layers() == state_.n_layers(),
                  "state has " << s.n_layers() << " layers, the profiler " << state_.n_layers());
    DEPTHKV_CHECK(s.keep_ratios() == state_.keep_ratios(), "state was measured at other keep ratios");
    state_ = s;
  }

  /// @return the current state (save it to resume later)
  const ProfilerState& state() const { return state_; }

  /// @return number of runs in all: layers x ratios
  int total_runs() const { return static_cast<int>(state_.done.size()); }

  /// Runs every missing cell with the plan "only layer l at ratio r", layer-major.
  /// @param fn the engine's run function
  /// @return true when every cell is done, false when stopped early (progress returned false or
  ///         the stop flag was set)
  /// @throws Error when the engine returns malformed metrics (wrong sample count, NaN, a KL below
  ///         0 beyond round-off, a top-1 value outside [0, 1]); the cells done so far are kept
  bool run(const PlanRunFunction& fn) {
    const int L = state_.n_layers(), R = static_cast<int>(state_.keep_ratios().size());
    for (int l = 0; l < L; ++l) {
      for (int k = 0; k < R; ++k) {
        if (state_.is_done(l, k)) continue;
        if (stop_requested()) return false;
        KeepPlan plan(static_cast<std::size_t>(L), 1.0);
        plan[static_cast<std::size_t>(l)] = state_.keep_ratios()[static_cast<std::size_t>(k)];
        record(l, k, fn(plan));
        if (!report()) return state_.complete();
      }
    }
    return state_.complete();
  }

  /// Like `run`, with one call per layer for all of its missing ratios (ascending).
  /// @param fn the engine's batched function
  /// @return true when every cell is done, false when stopped early
  /// @throws Error as `run`, and when fn returns another number of results than ratios asked
  bool run_batched(const LayerRunFunction& fn) {
    const int L = state_.n_layers(), R = static_cast<int>(state_.keep_ratios().size());
    for (int l = 0; l < L; ++l) {
      std::vector<int> missing;
      std::vector<double> ratios;
      for (int k = 0; k < R; ++k) {
        if (!state_.is_done(l, k)) {
          missing.push_back(k);
          ratios.push_back(state_.keep_ratios()[static_cast<std::size_t>(k)]);
        }
      }
      if (missing.empty()) continue;
      if (stop_requested()) return false;
      const std::vector<SampleMetrics> out = fn(l, ratios);
      DEPTHKV_CHECK(out.size() == ratios.size(), "layer " << l << ": the engine returned " << out.size()
                                                          << " results for " << ratios.size() << " ratios");
      for (std::size_t j = 0; j < missing.size(); ++j) record(l, missing[j], out[j]);
      if (!report()) return state_.complete();
    }
    return state_.complete();
  }

  /// @return the finished profiles
  /// @throws Error when some cells are not measured yet
  MetricProfiles result() const {
    DEPTHKV_CHECK(state_.complete(), "profiling incomplete: " << state_.n_done() << " of " << total_runs()
                                                              << " runs done");
    return state_.metrics;
  }

 private:
  bool stop_requested() const { return opts_.stop != nullptr && opts_.stop->load(); }

  bool report() const { return !opts_.progress || opts_.progress(state_.n_done(), total_runs()); }

  void record(int l, int k, const SampleMetrics& m) {
    const double r = state_.keep_ratios()[static_cast<std::size_t>(k)];
    const std::size_t n = m.kl.size();
    DEPTHKV_CHECK(n >= 1, "layer " << l << " ratio " << r << ": the engine returned no samples");
    DEPTHKV_CHECK(m.dnll.size() == n && m.top1_disagree.size() == n,
                  "layer " << l << " ratio " << r << ": metric vectors differ in length (kl " << n << ", dnll "
                           << m.dnll.size() << ", top1 " << m.top1_disagree.size() << ")");
    DEPTHKV_CHECK(state_.metrics.n_samples == 0 || static_cast<int>(n) == state_.metrics.n_samples,
                  "layer " << l << " ratio " << r << ": " << n << " samples, earlier runs had "
                           << state_.metrics.n_samples);
    for (std::size_t i = 0; i < n; ++i) {
      DEPTHKV_CHECK(std::isfinite(m.kl[i]) && m.kl[i] >= -1e-6,
                    "layer " << l << " ratio " << r << " sample " << i << ": KL " << m.kl[i] << " is NaN or negative");
      DEPTHKV_CHECK(std::isfinite(m.dnll[i]),
                    "layer " << l << " ratio " << r << " sample " << i << ": NLL increase is not finite");
      DEPTHKV_CHECK(m.top1_disagree[i] >= 0.0 && m.top1_disagree[i] <= 1.0,
                    "layer " << l << " ratio " << r << " sample " << i << ": top-1 disagreement "
                             << m.top1_disagree[i] << " outside [0, 1]");
    }
    state_.metrics.n_samples = static_cast<int>(n);
    auto put = [&](SensitivityProfile& p, const std::vector<double>& v, bool clamp0) {
      const auto ms = mean_and_stderr(v);
      p.loss(l, k) = clamp0 ? std::max(0.0, ms.first) : ms.first;  // KL round-off below 0
      p.loss_stderr(l, k) = ms.second;
    };
    put(state_.metrics.kl, m.kl, true);
    put(state_.metrics.dnll, m.dnll, false);
    put(state_.metrics.top1, m.top1_disagree, true);
    state_.done[static_cast<std::size_t>(l) * state_.keep_ratios().size() + static_cast<std::size_t>(k)] = 1;
  }

  ProfilerOptions opts_;
  ProfilerState state_;
};

}  // namespace depthkv
