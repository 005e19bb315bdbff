#pragma once
/// @file sensitivity_profile.hpp
/// @brief `SensitivityProfile`: per-layer loss curves (layers x probed keep ratios), the input of
/// the curve-based allocation policies; `LossMetric` and `MetricProfiles`, the per-metric set of
/// profiles one profiling run produces.
///
/// ## Containers, from small to large
/// - `SensitivityProfile`: ONE loss matrix (one scorer, one metric). This is what
///   `BudgetAllocator` reads.
/// - `MetricProfiles`: the three matrices of one profiling run of one scorer (mean KL, mean NLL
///   increase, mean top-1 disagreement, each with standard errors) and the sample count. This is
///   what `SensitivityProfiler` produces; `MetricProfiles::profile(metric)` gives the
///   allocator-ready `SensitivityProfile`.
/// - `ProfileFile` (in the optional `profile_io.hpp`, nlohmann/json): one `MetricProfiles` per
///   profiled scorer, plus the model identity and the calibration description, saved as JSON.
///
/// @code
/// depthkv::SensitivityProfile p;
/// p.keep_ratios = {0.1, 0.3, 0.5};
/// p.loss.resize(2, 3);
/// p.loss << 0.9, 0.4, 0.1,     // layer 0: loss increase when only layer 0 keeps 10%, 30%, 50%
///           0.2, 0.1, 0.05;    // layer 1
/// p.validate();                // throws depthkv::Error on NaN, negative loss, unsorted ratios, shapes
/// double l = p.loss_at(0, 0.2);  // 0.65, linear between the probed points
/// @endcode

#include <cmath>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"

namespace depthkv {

/// Quality metric of a pruned run against the full-cache run, over the continuation tokens.
enum class LossMetric {
  kKL,            ///< mean KL(full || pruned) of the next-token distributions ("kl"; default)
  kNLLIncrease,   ///< mean NLL of the true tokens, pruned minus full ("dnll"; may be < 0 by noise)
  kTop1Disagree,  ///< fraction of positions whose argmax differs from the full run ("top1")
};

/// @return "kl", "dnll" or "top1"
inline std::string to_string(LossMetric m) {
  switch (m) {
    case LossMetric::kKL: return "kl";
    case LossMetric::kNLLIncrease: return "dnll";
    case LossMetric::kTop1Disagree: return "top1";
  }
  return "unknown";
}

/// @param name "kl", "dnll" or "top1"
/// @return the metric
/// @throws Error on any other name
inline LossMetric parse_loss_metric(const std::string& name) {
  if (name == "kl") return LossMetric::kKL;
  if (name == "dnll") return LossMetric::kNLLIncrease;
  if (name == "top1") return LossMetric::kTop1Disagree;
  DEPTHKV_FAIL("unknown loss metric '" << name << "' (expected kl, dnll or top1)");
}

/// Measured loss curves: `loss(l, k)` is the mean loss increase over the calibration samples
/// when ONLY layer `l` keeps the fraction `keep_ratios[k]` of its tokens (all other layers full).
/// A keep ratio of 1.0 (no pruning) has loss 0 by definition and is not stored.
///
/// @code
/// depthkv::SensitivityProfile p;
/// p.keep_ratios = {0.2, 0.5};
/// p.loss = Eigen::MatrixXd::Constant(4, 2, 0.1);
/// p.validate();
/// @endcode
struct SensitivityProfile {
  std::vector<double> keep_ratios;  ///< probed keep ratios, strictly ascending, each in (0, 1)
  Eigen::MatrixXd loss;             ///< [n_layers][n_ratios] mean loss increase (>= 0)
  Eigen::MatrixXd loss_stderr;      ///< same shape: standard error of each mean (may be empty)

  /// @return number of layers (rows of `loss`)
  int n_layers() const { return static_cast<int>(loss.rows()); }
  /// @return number of probed keep ratios
  int n_ratios() const { return static_cast<int>(keep_ratios.size()); }

  /// Checks the profile. @param allow_negative_loss accept finite negative means (the raw NLL
  /// increase can be negative by noise); the allocator never passes it.
  /// @throws Error naming what is wrong: no ratios, a ratio outside (0, 1), unsorted or repeated
  ///         ratios, `loss` columns != number of ratios, `loss_stderr` shape != `loss` shape, a NaN /
  ///         infinite / negative loss (with its layer and ratio), a NaN or negative standard error.
  void validate(bool allow_negative_loss = false) const {
    DEPTHKV_CHECK(!keep_ratios.empty(), "profile has no keep ratios");
    for (std::size_t k = 0; k < keep_ratios.size(); ++k) {
      const double r = keep_ratios[k];
      DEPTHKV_CHECK(std::isfinite(r) && r > 0.0 && r < 1.0,
                    "keep ratio #" << k << " = " << r << " is outside (0, 1)");
      DEPTHKV_CHECK(k == 0 || r > keep_ratios[k - 1],
                    "keep ratios not strictly ascending: #" << k - 1 << " = " << keep_ratios[k - 1]
                                                             << ", #" << k << " = " << r);
    }
    DEPTHKV_CHECK(loss.cols() == static_cast<Eigen::Index>(keep_ratios.size()),
                  "loss matrix has " << loss.cols() << " columns for " << keep_ratios.size()
                                     << " keep ratios (shape mismatch)");
    DEPTHKV_CHECK(
        loss_stderr.size() == 0 || (loss_stderr.rows() == loss.rows() && loss_stderr.cols() == loss.cols()),
        "stderr matrix is " << loss_stderr.rows() << "x" << loss_stderr.cols() << ", loss matrix is "
                            << loss.rows() << "x" << loss.cols() << " (shape mismatch)");
    for (Eigen::Index l = 0; l < loss.rows(); ++l) {
      for (Eigen::Index k = 0; k < loss.cols(); ++k) {
        const double v = loss(l, k);
        DEPTHKV_CHECK(std::isfinite(v), "loss of layer " << l << " at keep ratio " << keep_ratios[k]
                                                         << " is not finite (" << v << ")");
        DEPTHKV_CHECK(allow_negative_loss || v >= 0.0, "loss of layer " << l << " at keep ratio "
                                                                        << keep_ratios[k] << " is negative ("
                                                                        << v << ")");
        if (loss_stderr.size() != 0) {
          const double s = loss_stderr(l, k);
          DEPTHKV_CHECK(std::isfinite(s) && s >= 0.0, "stderr of layer " << l << " at keep ratio "
                                                                          << keep_ratios[k]
                                                                          << " is NaN, infinite or negative (" << s
                                                                          << ")");
        }
      }
    }
  }

  /// The layer's measured loss curve at keep ratio `r` (not convexified): linear between the
  /// probed points and the point (1.0, 0); below the smallest probed ratio r0 it continues the
  /// first segment's slope (never rising towards r0): f(r) = f(r0) + max(0, s) (r0 - r), where s
  /// is the loss decrease per unit keep ratio from r0 to the next point.
  /// @param layer layer index in [0, n_layers())
  /// @param r keep ratio in [0, 1]
  /// @return predicted loss increase
  /// @throws Error on a layer or ratio out of range
  double loss_at(int layer, double r) const {
    DEPTHKV_CHECK(layer >= 0 && layer < n_layers(), "layer " << layer << " outside [0, " << n_layers() << ")");
    DEPTHKV_CHECK(r >= 0.0 && r <= 1.0, "keep ratio " << r << " outside [0, 1]");
    DEPTHKV_CHECK(!keep_ratios.empty() && loss.cols() == n_ratios(), "profile is empty or malformed");
    const int n = n_ratios();
    auto x = [&](int k) { return k < n ? keep_ratios[k] : 1.0; };
    auto y = [&](int k) { return k < n ? loss(layer, k) : 0.0; };
    if (r <= x(0)) {
      const double s = (y(0) - y(1)) / (x(1) - x(0));
      return y(0) + (s > 0.0 ? s : 0.0) * (x(0) - r);
    }
    for (int k = 0; k < n; ++k) {
      if (r <= x(k + 1)) {
        const double t = (r - x(k)) / (x(k + 1) - x(k));
        return y(k) + t * (y(k + 1) - y(k));
      }
    }
    return 0.0;
  }
};

/// The matrices of one profiling run of one scorer: the same probed ratios, three metrics. KL
/// and top-1 means are >= 0 by construction; the raw NLL-increase means may be negative (noise).
///
/// @code
/// depthkv::MetricProfiles mp = profiler.run(...);                 // see sensitivity_profiler.hpp
/// depthkv::SensitivityProfile p = mp.profile(depthkv::LossMetric::kKL);
/// auto budgets = depthkv::BudgetAllocator().allocate(depthkv::AllocationPolicy::kOptimal, req, &p);
/// @endcode
struct MetricProfiles {
  SensitivityProfile kl;    ///< mean KL(full || pruned) and its standard error
  SensitivityProfile dnll;  ///< mean NLL increase (raw, may be negative) and its standard error
  SensitivityProfile top1;  ///< mean top-1 disagreement in [0, 1] and its standard error
  int n_samples = 0;        ///< calibration samples each mean is taken over

  /// @return the allocator-ready profile of `metric` (a copy; for kNLLIncrease negative means
  ///         are clamped to 0: pruning one layer cannot systematically help, so a negative mean
  ///         is read as "no measurable loss")
  SensitivityProfile profile(LossMetric metric) const {
    switch (metric) {
      case LossMetric::kKL: return kl;
      case LossMetric::kTop1Disagree: return top1;
      case LossMetric::kNLLIncrease: {
        SensitivityProfile p = dnll;
        p.loss = p.loss.cwiseMax(0.0);
        return p;
      }
    }
    return kl;
  }

  /// Checks all three profiles (same ratios and shapes; kl, top1 >= 0; dnll finite).
  /// @throws Error naming the metric and what is wrong
  void validate() const {
    auto check = [&](const SensitivityProfile& p, const char* name, bool allow_negative) {
      try {
        p.validate(allow_negative);
      } catch (const Error& e) {
        DEPTHKV_FAIL("metric '" << name << "': " << e.message());
      }
      DEPTHKV_CHECK(p.keep_ratios == kl.keep_ratios && p.loss.rows() == kl.loss.rows(),
                    "metric '" << name << "' has other keep ratios or layer count than 'kl'");
    };
    check(kl, "kl", false);
    check(dnll, "dnll", true);
    check(top1, "top1", false);
    DEPTHKV_CHECK(n_samples >= 0, "negative sample count " << n_samples);
  }
};

}  // namespace depthkv
