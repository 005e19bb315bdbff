#pragma once
// The naive selection reference of the eviction tests: which slots a row keeps, by definition,
// with a full sort and plain comparisons (independent of the library's ranking and protection
// helpers).
//
// A slot's rank: score descending, then position ascending, then slot ascending. Scores are
// compared as floats with `>` and `!=` (IEEE: -0.0 == +0.0, +/-inf are ordinary values; NaN is
// not a valid score). Protected slots are the first n_sink and the last n_recent of the row.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace depthkv_test {

/// The m best slots of [lo, hi) by (score desc, position asc, slot asc), ascending; m is
/// clamped to [0, hi - lo]. `positions` null: a slot's position is its index.
/// S: any type with a conversion to float (float, Eigen::half, Eigen::bfloat16).
template <class S>
std::vector<std::int32_t> naive_best(const S* scores, const std::int32_t* positions, int lo, int hi, int m) {
  std::vector<std::int32_t> idx;
  for (int i = lo; i < hi; ++i) idx.push_back(i);
  const auto pos = [&](std::int32_t i) { return positions ? positions[i] : i; };
  std::sort(idx.begin(), idx.end(), [&](std::int32_t a, std::int32_t b) {
    const float sa = static_cast<float>(scores[a]), sb = static_cast<float>(scores[b]);
    if (sa != sb) return sa > sb;
    if (pos(a) != pos(b)) return pos(a) < pos(b);
    return a < b;
  });
  idx.resize(static_cast<std::size_t>(std::max(0, std::min(m, hi - lo))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

/// select_keep by definition: every slot when k >= n; else the protected slots (the first
/// n_sink and the last n_recent) and the k - (protected count) best of the others, ascending.
/// @throws std::invalid_argument when k is below the protected count or an argument is negative
template <class S>
std::vector<std::int32_t> naive_select_keep(const S* scores, const std::int32_t* positions, int n, int k,
                                            int n_sink = 0, int n_recent = 0) {
  if (n < 0 || k < 0 || n_sink < 0 || n_recent < 0)
    throw std::invalid_argument("naive_select_keep: negative argument");
  std::vector<std::int32_t> keep, rest;
  for (int i = 0; i < n; ++i) {
    if (k >= n || i < n_sink || i >= n - n_recent)
      keep.push_back(i);
    else
      rest.push_back(i);
  }
  if (k >= n) return keep;
  const int m = k - static_cast<int>(keep.size());
  if (m < 0)
    throw std::invalid_argument("naive_select_keep: k " + std::to_string(k) + " below the " +
                                std::to_string(keep.size()) + " protected slots");
  // the unprotected slots are one contiguous range
  const int lo = rest.empty() ? 0 : rest.front(), hi = rest.empty() ? 0 : rest.back() + 1;
  const std::vector<std::int32_t> best = naive_best(scores, positions, lo, hi, m);
  keep.insert(keep.end(), best.begin(), best.end());
  std::sort(keep.begin(), keep.end());
  return keep;
}

}  // namespace depthkv_test
