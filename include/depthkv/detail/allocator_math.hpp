#pragma once
/// @file detail/allocator_math.hpp
/// @brief Internals of the budget allocator: loss curves and their lower convex hull, the
/// monotone water-filling solver, and the one rounding routine every policy ends with.

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/sensitivity_profile.hpp"

namespace depthkv {
namespace detail {

/// A piecewise-linear function on [0, 1] through points (x[i], y[i]), x strictly ascending,
/// x.front() == 0, x.back() == 1.
struct LossCurve {
  std::vector<double> x, y;

  /// Linear interpolation at r in [0, 1] (clamped).
  double eval(double r) const {
    assert(x.size() >= 2);
    if (r <= x.front()) return y.front();
    if (r >= x.back()) return y.back();
    const auto it = std::upper_bound(x.begin(), x.end(), r);
    const std::size_t k = static_cast<std::size_t>(it - x.begin());  // x[k-1] <= r < x[k]
    const double t = (r - x[k - 1]) / (x[k] - x[k - 1]);
    return y[k - 1] + t * (y[k] - y[k - 1]);
  }
};

/// The measured curve of one layer with its end points: (0, extrapolated), the probed points,
/// (1, 0). The extrapolation is `SensitivityProfile::loss_at`'s.
inline LossCurve raw_curve(const SensitivityProfile& p, int layer) {
  LossCurve c;
  c.x.push_back(0.0);
  c.y.push_back(p.loss_at(layer, 0.0));
  for (int k = 0; k < p.n_ratios(); ++k) {
    c.x.push_back(p.keep_ratios[static_cast<std::size_t>(k)]);
    c.y.push_back(p.loss(layer, k));
  }
  c.x.push_back(1.0);
  c.y.push_back(0.0);
  return c;
}

/// Lower convex hull of a curve (Andrew's monotone chain; collinear points dropped). For a curve
/// with y >= 0 ending at (1, 0) the hull is convex and non-increasing.
inline LossCurve lower_hull(const LossCurve& c) {
  LossCurve h;
  for (std::size_t i = 0; i < c.x.size(); ++i) {
    while (h.x.size() >= 2) {
      const std::size_t n = h.x.size();
      const double ox = h.x[n - 2], oy = h.y[n - 2], ax = h.x[n - 1], ay = h.y[n - 1];
      const double cross = (ax - ox) * (c.y[i] - oy) - (ay - oy) * (c.x[i] - ox);
      if (cross > 0.0) break;
      h.x.pop_back();
      h.y.pop_back();
    }
    h.x.push_back(c.x[i]);
    h.y.push_back(c.y[i]);
  }
  return h;
}

/// Solves sum_l clamp(a_l + mu d_l, lo_l, hi_l) = target for mu, with every d_l >= 0 (the sum is
/// non-decreasing and piecewise linear in mu), by locating the linear piece between sorted
/// breakpoints. The caller guarantees sum lo <= target <= sum hi (with every lo_l <= hi_l).
/// @return the values x_l = clamp(a_l + mu d_l, lo_l, hi_l); their sum equals target up to rounding
inline std::vector<double> water_fill(const std::vector<double>& a, const std::vector<double>& d,
                                      const std::vector<double>& lo, const std::vector<double>& hi,
                                      double target) {
  const std::size_t n = a.size();
  auto values = [&](double mu) {
    std::vector<double> x(n);
    for (std::size_t l = 0; l < n; ++l) x[l] = std::min(hi[l], std::max(lo[l], a[l] + mu * d[l]));
    return x;
  };
  auto total = [&](double mu) {
    double s = 0.0;
    for (double v : values(mu)) s += v;
    return s;
  };
  std::vector<double> bp;
  for (std::size_t l = 0; l < n; ++l) {
    if (d[l] > 0.0) {
      bp.push_back((lo[l] - a[l]) / d[l]);
      bp.push_back((hi[l] - a[l]) / d[l]);
    }
  }
  if (bp.empty()) return values(0.0);
  std::sort(bp.begin(), bp.end());
  bp.erase(std::unique(bp.begin(), bp.end()), bp.end());
  // total() is constant below bp.front() and above bp.back(); find the first breakpoint whose
  // total reaches the target, then interpolate linearly on the piece before it.
  std::size_t hi_idx = 0, end = bp.size();  // binary search: total() is non-decreasing
  while (hi_idx < end) {
    const std::size_t mid = hi_idx + (end - hi_idx) / 2;
    if (total(bp[mid]) < target) hi_idx = mid + 1; else end = mid;
  }
  if (hi_idx == 0) return values(bp.front());
  if (hi_idx == bp.size()) return values(bp.back());
  const double m0 = bp[hi_idx - 1], m1 = bp[hi_idx];
  const double s0 = total(m0), s1 = total(m1);
  const double mu = s1 > s0 ? m0 + (target - s0) / (s1 - s0) * (m1 - m0) : m1;
  return values(mu);
}

/// Largest-remainder rounding: integers b_l in {floor(x_l), ceil(x_l)} (clamped to
/// [floors_l, caps_l]) with sum exactly `total`. The leftover units go to the largest fractional
/// parts; equal fractional parts: the lower layer index first. The caller guarantees x within the
/// bounds and sum x == total up to floating-point rounding.
inline std::vector<int> largest_remainder(const std::vector<double>& x, const std::vector<int>& floors,
                                          const std::vector<int>& caps, long long total) {
  const std::size_t n = x.size();
  std::vector<int> b(n);
  long long sum = 0;
  for (std::size_t l = 0; l < n; ++l) {
    const double f = std::floor(x[l]);
    b[l] = static_cast<int>(std::min<double>(caps[l], std::max<double>(floors[l], f)));
    sum += b[l];
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto frac = [&](std::size_t l) { return x[l] - static_cast<double>(b[l]); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) { return frac(i) > frac(j); });
  // Normally one pass; the loops only matter when x was off by more than rounding.
  while (sum < total) {
    bool any = false;
    for (std::size_t i = 0; i < n && sum < total; ++i) {
      const std::size_t l = order[i];
      if (b[l] < caps[l]) {
        ++b[l];
        ++sum;
        any = true;
      }
    }
    DEPTHKV_CHECK(any, "internal: cannot reach budget " << total << " within the caps");
  }
  while (sum > total) {
    bool any = false;
    for (std::size_t i = n; i-- > 0 && sum > total;) {
      const std::size_t l = order[i];
      if (b[l] > floors[l]) {
        --b[l];
        --sum;
        any = true;
      }
    }
    DEPTHKV_CHECK(any, "internal: cannot reach budget " << total << " above the floors");
  }
  return b;
}

/// THE rounding routine every allocation policy ends with: real per-layer targets -> integers
/// with sum exactly `total`, floors and caps respected. Step 1 (water-filling clamp): x_l =
/// clamp(t_l + lambda, floors_l, caps_l) with the common shift lambda chosen so that sum x = total
/// (lambda = 0 when the targets already fit). Step 2: `largest_remainder`.
/// The caller has checked sum floors <= total <= sum caps and floors <= caps.
inline std::vector<int> round_to_budget(const std::vector<double>& targets, const std::vector<int>& floors,
                                        const std::vector<int>& caps, long long total) {
  const std::size_t n = targets.size();
  if (n == 0) return {};
  std::vector<double> lo(n), hi(n), one(n, 1.0);
  double s = 0.0;
  bool inside = true;
  for (std::size_t l = 0; l < n; ++l) {
    lo[l] = floors[l];
    hi[l] = caps[l];
    s += targets[l];
    inside = inside && targets[l] >= lo[l] && targets[l] <= hi[l];
  }
  std::vector<double> x = targets;
  if (!inside || std::abs(s - static_cast<double>(total)) > 1e-9 * std::max(1.0, static_cast<double>(total))) {
    x = water_fill(targets, one, lo, hi, static_cast<double>(total));
  }
  return largest_remainder(x, floors, caps, total);
}

}  // namespace detail
}  // namespace depthkv
