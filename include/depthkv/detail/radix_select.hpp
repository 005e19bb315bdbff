#pragma once
/// @file detail/radix_select.hpp
/// @brief O(n) top-m selection on order-preserving integer keys (CPU), emitting the selected
/// slots already in ascending slot order, with depthkv's one ranking rule (select_common.hpp):
/// a higher score first; equal scores (equal keys, so -0.0 == +0.0): the earlier position first;
/// equal positions too (only possible in rows that are not from a Layer): the lower slot first.
///
/// ## Algorithm ("select the m best of [lo, hi)", rows of at least kRadixSelectMinLength)
/// 1. Bracket: the keys of a strided sample of s ~ 8 sqrt(len) slots give, by two
///    `nth_element`s on the sample, keys lo_T <= hi_T that enclose the m-th best key with high
///    probability (ranks m s / len -/+ 3 sigma + 3 of the sample).
/// 2. One branch-free pass over the row writes, in slot order, the slots above hi_T ("sure": all
///    kept) and the slots in [lo_T, hi_T] ("candidates", ~ 6 sigma / s of the row). Float rows are
///    compared as floats here (no key transform: for non-NaN values float order is key order).
/// 3. Exact selection among the candidates by histogram radix select on their integer keys: one
///    2048-bucket histogram per 11-bit digit (11 + 11 + 10 bits for float keys, 11 + 5 for 16-bit
///    keys), each restricted to the keys that share the digits chosen so far, until the exact
///    threshold key T and the number t of T-keyed candidates to keep are known; then the
///    candidates above T and the first t ties (slot order = position order when the ties'
///    positions ascend, as in every Layer; otherwise the ties are ordered by (position, slot)) are
///    kept and merged with the sure slots.
/// 4. When the sample bracket misses (probability ~ 0.3 % on random rows; adversarial or periodic
///    rows), a full histogram radix select runs instead: a 2048-bucket histogram of the top 11 bits
///    over the whole row (two interleaved copies, so runs of equal keys do not serialise on one
///    counter), a branch-free pass writing the slots above the threshold bucket and the bucket's
///    candidates, then step 3 on the bucket. 16-bit keys need just one histogram pass over the row
///    (the remaining 5 bits are resolved on the bucket).
/// Cost: O(len) expected and worst case (each step is a bounded number of linear passes); the
/// typical row is read once (step 2) plus O(sqrt(len) log) for the sample and O(len / sqrt(len))
/// for the candidates.
///
/// ## Crossover
/// Rows shorter than `kRadixSelectMinLength` use `std::nth_element` + a sort of the m selected
/// slots instead (`select_best_nth`): below it the fixed costs (sample, histograms of 2048
/// buckets) dominate. Measured with benchmarks/evict_cpu_bench.cpp (BM_Select, path 0 vs 1; see
/// benchmarks/RESULTS.md).

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "depthkv/detail/select_common.hpp"

namespace depthkv {
namespace detail {

/// Rows (unprotected ranges) shorter than this use std::nth_element; see the file comment.
constexpr int kRadixSelectMinLength = 512;

/// Reusable buffers of the selection (one per thread).
struct SelectWorkspace {
  std::vector<std::uint32_t> hist;
  std::vector<std::int32_t> sure;
  std::vector<std::int32_t> cand;
  std::vector<std::uint32_t> cand_key;
  std::vector<std::uint32_t> sample;
  std::vector<std::int32_t> scratch;
};

/// `ordered_key` without branches (vectorisable); equal to ordered_key for every bit pattern.
inline std::uint32_t ordered_key_fast(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const std::uint32_t neg = static_cast<std::uint32_t>(static_cast<std::int32_t>(u) >> 31);
  return (u ^ (neg | 0x80000000u)) + static_cast<std::uint32_t>(u == 0x80000000u);  // -0.0 -> key of +0.0
}

/// Keys of float scores (ordered_key).
struct FloatKeys {
  static constexpr int kBits = 32;
  const float* scores;
  std::uint32_t operator()(int i) const { return ordered_key_fast(scores[i]); }
};

/// Keys of 16-bit sign-magnitude float bit patterns (IEEE half or bfloat16; ordered_key16).
struct Bits16Keys {
  static constexpr int kBits = 16;
  const std::uint16_t* bits;
  std::uint32_t operator()(int i) const { return ordered_key16(bits[i]); }
};

/// Position of slot i (the slot itself when no positions are given).
inline std::int32_t position_of(const std::int32_t* positions, int i) { return positions ? positions[i] : i; }

/// Appends to `out` the `m` best slots of [lo, hi) by (key desc, position asc, slot asc) using
/// std::nth_element, in ascending slot order (the path for short rows, and a reference).
template <class Keys>
void select_best_nth(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m, SelectWorkspace& ws,
                     std::vector<std::int32_t>& out) {
  if (m <= 0) return;
  if (m >= hi - lo) {
    for (int i = lo; i < hi; ++i) out.push_back(i);
    return;
  }
  std::vector<std::int32_t>& idx = ws.scratch;
  idx.resize(static_cast<std::size_t>(hi - lo));
  for (int i = lo; i < hi; ++i) idx[static_cast<std::size_t>(i - lo)] = i;
  auto better = [&](std::int32_t a, std::int32_t b) {
    const std::uint32_t ka = keys(a), kb = keys(b);
    if (ka != kb) return ka > kb;
    const std::int32_t pa = position_of(positions, a), pb = position_of(positions, b);
    return pa != pb ? pa < pb : a < b;
  };
  std::nth_element(idx.begin(), idx.begin() + m, idx.end(), better);
  std::sort(idx.begin(), idx.begin() + m);
  out.insert(out.end(), idx.begin(), idx.begin() + m);
}

/// Step 3 of the file comment: of the `c` candidates (slots `cand`, ascending, keys `ckey`), all
/// of whose keys share the digits of `T` above bit `shift`, keeps the `need` best (1 <= need < c)
/// in place, in slot order. Returns how many were kept (== need).
template <int kBits>
std::uint32_t keep_best_candidates(std::int32_t* cand, const std::uint32_t* ckey, std::uint32_t c, std::uint32_t need,
                                   std::uint32_t T, int shift, const std::int32_t* positions, SelectWorkspace& ws) {
  ws.hist.resize(2048);
  std::uint32_t* h = ws.hist.data();
  while (shift > 0) {
    const int width = shift < 11 ? shift : 11;  // float keys: 11, 11, 10 bits; 16-bit keys: 11, 5
    const int s = shift - width;
    const std::uint32_t mask = (1u << width) - 1u;
    std::fill(h, h + (1 << width), 0u);
    const std::uint64_t prefix = static_cast<std::uint64_t>(T) >> shift;
    for (std::uint32_t j = 0; j < c; ++j)
      if ((static_cast<std::uint64_t>(ckey[j]) >> shift) == prefix) ++h[(ckey[j] >> s) & mask];
    std::uint32_t acc = 0;
    std::uint32_t d = mask;
    for (;; --d) {
      if (acc + h[d] >= need) break;
      acc += h[d];
    }
    need -= acc;
    T |= d << s;
    shift = s;
  }
  const std::uint32_t t = need;  // >= 1, <= number of candidates keyed T

  std::uint32_t n_ties = 0;
  bool ties_ascend = true;
  std::int32_t last_tie_pos = 0;
  for (std::uint32_t j = 0; j < c; ++j) {
    if (ckey[j] != T) continue;
    const std::int32_t p = position_of(positions, cand[j]);
    if (n_ties > 0 && p < last_tie_pos) ties_ascend = false;  // equal positions: slot order is the rule
    last_tie_pos = p;
    ++n_ties;
  }
  std::uint32_t w = 0;
  if (ties_ascend || t == n_ties) {
    std::uint32_t taken = 0;
    for (std::uint32_t j = 0; j < c; ++j) {
      const std::uint32_t k = ckey[j];
      const bool tie = k == T;
      const bool keep = k > T || (tie && taken < t);
      taken += tie;
      cand[w] = cand[j];
      w += keep;
    }
  } else {
    // ties whose positions do not ascend with the slots: order them by (position, slot)
    std::vector<std::int32_t>& ties = ws.scratch;
    ties.clear();
    for (std::uint32_t j = 0; j < c; ++j)
      if (ckey[j] == T) ties.push_back(cand[j]);
    auto earlier = [&](std::int32_t x, std::int32_t y) {
      const std::int32_t px = position_of(positions, x), py = position_of(positions, y);
      return px != py ? px < py : x < y;
    };
    std::nth_element(ties.begin(), ties.begin() + (t - 1), ties.end(), earlier);
    const std::int32_t last = ties[t - 1];  // the t-th earliest tie: keep the ties not after it
    for (std::uint32_t j = 0; j < c; ++j) {
      const std::uint32_t k = ckey[j];
      const bool keep = k > T || (k == T && !earlier(last, cand[j]));
      cand[w] = cand[j];
      w += keep;
    }
  }
  return w;
}

/// Merges the sure slots and the kept candidates (both ascending) into out[base, base + m).
inline void merge_kept(const std::int32_t* sure, std::uint32_t a, const std::int32_t* cand, std::uint32_t w,
                       std::vector<std::int32_t>& out, std::size_t base) {
  std::merge(sure, sure + a, cand, cand + w, out.begin() + static_cast<std::ptrdiff_t>(base));
}

/// Step 4 of the file comment (also usable on its own): full histogram radix select. Appends the
/// `m` best slots of [lo, hi), ascending. Any length.
template <class Keys>
void select_best_histogram(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m,
                           SelectWorkspace& ws, std::vector<std::int32_t>& out) {
  if (m <= 0) return;
  if (m >= hi - lo) {
    for (int i = lo; i < hi; ++i) out.push_back(i);
    return;
  }
  constexpr int kTopBits = 11;
  constexpr int kTopShift = Keys::kBits - kTopBits;
  constexpr int kBuckets = 1 << kTopBits;

  ws.hist.assign(2 * kBuckets, 0u);
  std::uint32_t* h0 = ws.hist.data();
  std::uint32_t* h1 = h0 + kBuckets;
  int i = lo;
  for (; i + 1 < hi; i += 2) {
    ++h0[keys(i) >> kTopShift];
    ++h1[keys(i + 1) >> kTopShift];
  }
  if (i < hi) ++h0[keys(i) >> kTopShift];

  std::uint32_t above = 0, cb = 0;
  std::uint32_t b = kBuckets - 1;
  for (;; --b) {
    cb = h0[b] + h1[b];
    if (above + cb >= static_cast<std::uint32_t>(m)) break;
    above += cb;
  }
  const std::uint32_t need = static_cast<std::uint32_t>(m) - above;  // in [1, cb]

  ws.sure.resize(above + 1);
  ws.cand.resize(cb + 1);
  ws.cand_key.resize(cb + 1);
  std::int32_t* sure = ws.sure.data();
  std::int32_t* cand = ws.cand.data();
  std::uint32_t* ckey = ws.cand_key.data();
  std::uint32_t a = 0, c = 0;
  for (i = lo; i < hi; ++i) {
    const std::uint32_t k = keys(i);
    const std::uint32_t d = k >> kTopShift;
    sure[a] = i;
    a += d > b;
    cand[c] = i;
    ckey[c] = k;
    c += d == b;
  }
  assert(a == above && c == cb);
  const std::size_t base = out.size();
  out.resize(base + static_cast<std::size_t>(m));
  const std::uint32_t w =
      need == c ? c : keep_best_candidates<Keys::kBits>(cand, ckey, c, need, b << kTopShift, kTopShift, positions, ws);
  assert(a + w == static_cast<std::uint32_t>(m));
  merge_kept(sure, a, cand, w, out, base);
}

/// Step 2 for float rows: float compares (no key transform); `a` sure slots, `c` candidates.
inline void bracket_pass(const FloatKeys& keys, int lo, int hi, std::uint32_t lo_key, std::uint32_t hi_key,
                         bool has_lo, bool has_hi, std::int32_t* sure, std::int32_t* cand, std::uint32_t& a, std::uint32_t& c) {
  const float* s = keys.scores;
  auto to_float = [](std::uint32_t key) {  // inverse of ordered_key (keys of real scores only)
    const std::uint32_t u = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  const float lo_f = has_lo ? to_float(lo_key) : -std::numeric_limits<float>::infinity();
  const float hi_f = has_hi ? to_float(hi_key) : std::numeric_limits<float>::infinity();
  std::uint32_t na = 0, nc = 0;
  for (int i = lo; i < hi; ++i) {
    const float x = s[i];
    sure[na] = i;
    na += x > hi_f;
    cand[nc] = i;
    nc += (x >= lo_f) & (x <= hi_f);
  }
  a = na;
  c = nc;
}

/// Step 2 for generic keys.
template <class Keys>
void bracket_pass(const Keys& keys, int lo, int hi, std::uint32_t lo_key, std::uint32_t hi_key, bool, bool,
                  std::int32_t* sure, std::int32_t* cand, std::uint32_t& a, std::uint32_t& c) {
  const std::uint32_t span = hi_key - lo_key;
  std::uint32_t na = 0, nc = 0;
  for (int i = lo; i < hi; ++i) {
    const std::uint32_t k = keys(i);
    sure[na] = i;
    na += k > hi_key;
    cand[nc] = i;
    nc += (k - lo_key) <= span;
  }
  a = na;
  c = nc;
}

/// Appends to `out` the `m` best slots of [lo, hi) by (key desc, position asc, slot asc), in
/// ascending slot order: sample bracket + one pass + radix select of the candidates, with the
/// full histogram select as the fallback (file comment). Any length.
template <class Keys>
void select_best_radix(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m, SelectWorkspace& ws,
                       std::vector<std::int32_t>& out) {
  const int len = hi - lo;
  if (m <= 0) return;
  if (m >= len) {
    for (int i = lo; i < len + lo; ++i) out.push_back(i);
    return;
  }
  // 1. sample bracket
  const int s = std::min(len, std::max(256, static_cast<int>(8.0 * std::sqrt(static_cast<double>(len)))));
  ws.sample.resize(static_cast<std::size_t>(s));
  std::uint32_t* smp = ws.sample.data();
  for (int j = 0; j < s; ++j)
    smp[j] = keys(lo + static_cast<int>((static_cast<std::int64_t>(j) * len + len / 2) / s));
  const double p = static_cast<double>(m) / len;
  const int r = static_cast<int>(p * s);
  const int delta = static_cast<int>(3.0 * std::sqrt(s * p * (1.0 - p))) + 3;
  const int q_lo = r + delta, q_hi = r - delta;  // descending sample ranks
  std::uint32_t lo_key = 0, hi_key = 0xFFFFFFFFu;
  const bool has_lo = q_lo < s, has_hi = q_hi >= 0;
  if (has_lo) {
    std::nth_element(smp, smp + q_lo, smp + s, std::greater<std::uint32_t>());
    lo_key = smp[q_lo];
  }
  if (has_hi) {
    std::nth_element(smp, smp + q_hi, smp + std::min(q_lo, s), std::greater<std::uint32_t>());
    hi_key = smp[q_hi];
  }

  // 2. one pass: sure slots and candidates
  ws.sure.resize(static_cast<std::size_t>(len) + 1);
  ws.cand.resize(static_cast<std::size_t>(len) + 1);
  std::int32_t* sure = ws.sure.data();
  std::int32_t* cand = ws.cand.data();
  std::uint32_t a = 0, c = 0;
  bracket_pass(keys, lo, hi, lo_key, hi_key, has_lo, has_hi, sure, cand, a, c);
  if (a > static_cast<std::uint32_t>(m) || a + c < static_cast<std::uint32_t>(m)) {
    select_best_histogram(keys, positions, lo, hi, m, ws, out);  // 4. the bracket missed
    return;
  }

  // 3. exact selection among the candidates
  const std::uint32_t need = static_cast<std::uint32_t>(m) - a;
  std::uint32_t w = 0;
  if (need == c) {
    w = c;
  } else if (need > 0) {
    ws.cand_key.resize(c + 1);
    std::uint32_t* ckey = ws.cand_key.data();
    for (std::uint32_t j = 0; j < c; ++j) ckey[j] = keys(cand[j]);
    w = keep_best_candidates<Keys::kBits>(cand, ckey, c, need, 0u, Keys::kBits, positions, ws);
  }
  const std::size_t base = out.size();
  out.resize(base + static_cast<std::size_t>(m));
  assert(a + w == static_cast<std::uint32_t>(m));
  merge_kept(sure, a, cand, w, out, base);
}

/// The m best slots of [lo, hi), ascending: nth_element below kRadixSelectMinLength, radix above.
template <class Keys>
void select_best(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m, SelectWorkspace& ws,
                 std::vector<std::int32_t>& out) {
  if (hi - lo < kRadixSelectMinLength)
    select_best_nth(keys, positions, lo, hi, m, ws, out);
  else
    select_best_radix(keys, positions, lo, hi, m, ws, out);
}

}  // namespace detail
}  // namespace depthkv
