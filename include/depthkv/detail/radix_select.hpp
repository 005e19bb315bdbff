#pragma once
/// @file detail/radix_select.hpp
/// @brief O(n) top-m selection on order-preserving integer keys (CPU), emitting the selected
/// slots already in ascending slot order, with depthkv's one ranking rule (select_common.hpp):
/// a higher score first; equal scores (equal keys, so -0.0 == +0.0): the earlier position first;
/// equal positions too (only possible in rows that are not from a Layer): the lower slot first.
///
/// ## Algorithm ("select the m best of [lo, hi)", rows of at least kRadixSelectMinLength)
/// 1. Bracket: the keys of a strided sample of s ~ 8 sqrt(len) slots give, by two radix
///    selections on the sample (step 3's routine), keys lo_T <= hi_T that enclose the m-th best key with high
///    probability (sample ranks m s / len -/+ (3 sigma + 3)).
/// 2. Counting pass over the row: the number a of keys above hi_T, and the slots of the keys in
///    [lo_T, hi_T] ("candidates", ~ 6 sigma / s of the row), written branch-free in slot order.
/// 3. Exact threshold among the candidates by histogram radix select on their integer keys: one
///    histogram per digit from the top (11-bit digits, or 8-bit digits for fewer than 4096 keys),
///    each over the keys sharing the digits chosen so far, gives the threshold key T and the
///    number t of T-keyed slots to keep (to reach m - a from the candidates). The sample's two
///    ranks (step 1) are found the same way.
/// 4. Emission pass over the row: the slots keyed above T, and the first t slots keyed T (slot
///    order is position order when the ties' positions ascend, as in every Layer; otherwise the t
///    ties are chosen by (position, slot) and merged in), in slot order.
/// 5. When the bracket misses (a > m or a + c < m: probability ~ 0.3 % on random rows; adversarial
///    or periodic rows), a full histogram radix select runs instead: a 2048-bucket histogram of
///    the top 11 key bits over the row (two interleaved copies, so runs of equal keys do not
///    serialise on one counter), a pass collecting the keys of the threshold bucket, step 3 on the
///    bucket, step 4. 16-bit keys need one histogram pass over the row (5 bits remain for step 3).
/// Float rows are compared as floats in passes 2 and 4 (for non-NaN values float order is key
/// order, -0.0 == +0.0 in both), four at a time with SSE2 where available (every x86-64), storing
/// the passing slots with one 16-byte store from a 16-entry table of compacted lane offsets.
/// Cost: O(len) expected and worst case; the typical row is read twice (two streaming passes), plus
/// O(sqrt(len)) for the sample and O(sqrt(len)) candidates.
///
/// ## Crossover
/// Rows shorter than `kRadixSelectMinLength` (512) use `std::nth_element` + a sort of the m
/// selected slots instead (`select_best_nth`): below it the fixed costs of the radix path (a
/// sample of >= 256 keys, histograms of 2048 buckets) dominate. Measured with
/// benchmarks/evict_cpu_bench.cpp (BM_Select, keep 20 %, path 0 radix vs path 1 nth_element, CPU
/// time, medians of 3, float keys): n = 256: 6.6 vs 5.3 us; n = 512: 9.9 vs 10.8 us; n = 768:
/// 10.6 vs 18.0 us; n = 4096: 26 vs 99 us (16-bit keys: 6.1 vs 6.1, 7.0 vs 12.1, 9.7 vs 18.3 us).
/// See benchmarks/RESULTS.md.

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "depthkv/detail/select_common.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace depthkv {
namespace detail {

/// Rows (unprotected ranges) shorter than this use std::nth_element; see the file comment.
constexpr int kRadixSelectMinLength = 512;

/// Sample size of the bracket: kSampleFactor * sqrt(len) slots (at least 256).
#ifndef DEPTHKV_SAMPLE_FACTOR
constexpr double kSampleFactor = 8.0;
#else
constexpr double kSampleFactor = DEPTHKV_SAMPLE_FACTOR;
#endif

/// Reusable buffers of the selection (one per thread).
struct SelectWorkspace {
  std::vector<std::uint32_t> hist;
  std::vector<std::int32_t> sure;  // scratch of the tie merge
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
void select_best_nth(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m,
                     SelectWorkspace& ws, std::vector<std::int32_t>& out) {
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

/// Exact threshold of a selection: keep every key above `T`, and `t` of the slots keyed `T`
/// (the earliest by (position, slot)).
struct Threshold {
  std::uint32_t T = 0;
  std::uint32_t t = 0;
};

/// Step 3 of the file comment: the threshold of the `need` best (1 <= need <= c) of `c`
/// candidates (keys `ckey`), all of whose keys share the digits of `T` above bit `shift`, by
/// histogram radix select: 11-bit digits (2048 buckets) from the top, or 8-bit digits (256
/// buckets) when there are fewer than 4096 keys.
inline Threshold radix_threshold(const std::uint32_t* ckey, std::uint32_t c, std::uint32_t need,
                                 std::uint32_t T, int shift, SelectWorkspace& ws) {
  ws.hist.resize(2048);
  std::uint32_t* h = ws.hist.data();
  const int digit = c < 4096 ? 8 : 11;  // few keys: 256 buckets, cheaper to clear and scan
  while (shift > 0) {
    const int width = shift < digit ? shift : digit;
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
  return Threshold{T, need};
}

/// Ties at the threshold: when their positions do not ascend with their slots (never for a Layer),
/// the `th.t` kept ones are chosen by (position, slot) into ws.scratch (ascending slots) and
/// false is returned; otherwise true (the first `th.t` ties in slot order are the kept ones).
/// `cand`/`ckey`: every slot keyed th.T appears among them, in ascending slot order.
inline bool ties_in_slot_order(const std::int32_t* cand, const std::uint32_t* ckey, std::uint32_t c,
                               Threshold th, const std::int32_t* positions, SelectWorkspace& ws) {
  if (th.t == 0 || positions == nullptr) return true;
  std::uint32_t n_ties = 0;
  bool ascend = true;
  std::int32_t last = 0;
  for (std::uint32_t j = 0; j < c; ++j) {
    if (ckey[j] != th.T) continue;
    const std::int32_t p = positions[cand[j]];
    if (n_ties > 0 && p < last) ascend = false;  // equal positions: slot order is the rule
    last = p;
    ++n_ties;
  }
  if (ascend || n_ties == th.t) return true;
  std::vector<std::int32_t>& ties = ws.scratch;
  ties.clear();
  for (std::uint32_t j = 0; j < c; ++j)
    if (ckey[j] == th.T) ties.push_back(cand[j]);
  auto earlier = [&](std::int32_t x, std::int32_t y) {
    return positions[x] != positions[y] ? positions[x] < positions[y] : x < y;
  };
  std::nth_element(ties.begin(), ties.begin() + (th.t - 1), ties.end(), earlier);
  ties.resize(th.t);
  std::sort(ties.begin(), ties.end());
  return false;
}

#if defined(__SSE2__)
/// Slots of the set lanes of a 4-bit mask, compacted to the front (SSE2 stream compaction).
alignas(16) inline constexpr std::int32_t kLanes[16][4] = {
    {0, 0, 0, 0}, {0, 0, 0, 0}, {1, 0, 0, 0}, {0, 1, 0, 0}, {2, 0, 0, 0}, {0, 2, 0, 0},
    {1, 2, 0, 0}, {0, 1, 2, 0}, {3, 0, 0, 0}, {0, 3, 0, 0}, {1, 3, 0, 0}, {0, 1, 3, 0},
    {2, 3, 0, 0}, {0, 2, 3, 0}, {1, 2, 3, 0}, {0, 1, 2, 3}};
inline constexpr std::uint8_t kLaneCount[16] = {0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4};
/// Stores slot + (the set lanes of `mask`) at dst (16 bytes written); returns how many were set.
inline std::uint32_t store_lanes(std::int32_t* dst, int slot, int mask) {
  _mm_storeu_si128(
      reinterpret_cast<__m128i*>(dst),
      _mm_add_epi32(_mm_set1_epi32(slot), _mm_load_si128(reinterpret_cast<const __m128i*>(kLanes[mask]))));
  return kLaneCount[mask];
}
#endif

/// Inverse of ordered_key for keys of real (non-NaN) scores.
inline float key_to_float(std::uint32_t key) {
  const std::uint32_t u = (key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Step 2: counts the slots keyed above `hi_key` (none when !has_hi) and writes the slots keyed in
/// [lo_key, hi_key] (from -inf when !has_lo) to `cand` (room for hi - lo + 4). Float rows are
/// compared as floats (for non-NaN values float order is key order, -0.0 == +0.0 in both), four
/// at a time with SSE2.
inline void bracket_pass(const FloatKeys& keys, int lo, int hi, std::uint32_t lo_key, std::uint32_t hi_key,
                         bool has_lo, bool has_hi, std::int32_t* cand, std::uint32_t& a, std::uint32_t& c) {
  const float* s = keys.scores;
  const float lo_f = has_lo ? key_to_float(lo_key) : -std::numeric_limits<float>::infinity();
  const float hi_f = has_hi ? key_to_float(hi_key) : std::numeric_limits<float>::infinity();
  std::uint32_t na = 0, nc = 0;
  int i = lo;
#if defined(__SSE2__)
  const __m128 vlo = _mm_set1_ps(lo_f), vhi = _mm_set1_ps(hi_f);
  for (; i + 4 <= hi; i += 4) {
    const __m128 x = _mm_loadu_ps(s + i);
    na += kLaneCount[_mm_movemask_ps(_mm_cmpgt_ps(x, vhi))];
    nc += store_lanes(cand + nc, i, _mm_movemask_ps(_mm_and_ps(_mm_cmpge_ps(x, vlo), _mm_cmple_ps(x, vhi))));
  }
#endif
  for (; i < hi; ++i) {
    const float x = s[i];
    na += x > hi_f;
    cand[nc] = i;
    nc += (x >= lo_f) & (x <= hi_f);
  }
  a = na;
  c = nc;
}

/// Step 2 for generic keys (16-bit).
template <class Keys>
void bracket_pass(const Keys& keys, int lo, int hi, std::uint32_t lo_key, std::uint32_t hi_key, bool, bool,
                  std::int32_t* cand, std::uint32_t& a, std::uint32_t& c) {
  const std::uint32_t span = hi_key - lo_key;
  std::uint32_t na = 0, nc = 0;
  for (int i = lo; i < hi; ++i) {
    const std::uint32_t k = keys(i);
    na += k > hi_key;
    cand[nc] = i;
    nc += (k - lo_key) <= span;
  }
  a = na;
  c = nc;
}

/// Emission: writes to `dst` (room for hi - lo + 4) the slots of [lo, hi) keyed above th.T and,
/// when `inline_ties`, the first th.t slots keyed th.T, in slot order; returns the count.
inline std::uint32_t emit_kept(const FloatKeys& keys, int lo, int hi, Threshold th, bool inline_ties,
                               std::int32_t* dst) {
  const float* s = keys.scores;
  const float tf = key_to_float(th.T);
  std::uint32_t n = 0, taken = inline_ties ? 0 : th.t;
  int i = lo;
#if defined(__SSE2__)
  const __m128 vt = _mm_set1_ps(tf);
  for (; i + 4 <= hi; i += 4) {
    const __m128 x = _mm_loadu_ps(s + i);
    const int gt = _mm_movemask_ps(_mm_cmpgt_ps(x, vt));
    if (_mm_movemask_ps(_mm_cmpeq_ps(x, vt)) == 0 || taken == th.t) {
      n += store_lanes(dst + n, i, gt);
      continue;
    }
    for (int l = 0; l < 4; ++l) {
      const float v = s[i + l];
      const bool keep = v > tf || (v == tf && taken < th.t);
      taken += v == tf && taken < th.t;
      dst[n] = i + l;
      n += keep;
    }
  }
#endif
  for (; i < hi; ++i) {
    const float v = s[i];
    const bool keep = v > tf || (v == tf && taken < th.t);
    taken += v == tf && taken < th.t;
    dst[n] = i;
    n += keep;
  }
  return n;
}

/// Emission for generic keys (16-bit).
template <class Keys>
std::uint32_t emit_kept(const Keys& keys, int lo, int hi, Threshold th, bool inline_ties, std::int32_t* dst) {
  std::uint32_t n = 0, taken = inline_ties ? 0 : th.t;
  for (int i = lo; i < hi; ++i) {
    const std::uint32_t k = keys(i);
    const bool tie = k == th.T && taken < th.t;
    taken += tie;
    dst[n] = i;
    n += k > th.T || tie;
  }
  return n;
}

/// Appends the kept slots of [lo, hi) for threshold `th` to `out` (m of them), ascending.
template <class Keys>
void append_kept(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m, Threshold th,
                 const std::int32_t* cand, const std::uint32_t* ckey, std::uint32_t c, SelectWorkspace& ws,
                 std::vector<std::int32_t>& out) {
  const bool inline_ties = ties_in_slot_order(cand, ckey, c, th, positions, ws);
  const std::size_t base = out.size();
  out.resize(base + static_cast<std::size_t>(hi - lo) + 4);
  std::uint32_t n = emit_kept(keys, lo, hi, th, inline_ties, out.data() + base);
  if (!inline_ties) {  // merge the chosen ties (ws.scratch, ascending) in
    const std::vector<std::int32_t>& ties = ws.scratch;
    std::vector<std::int32_t>& tmp = ws.sure;
    tmp.assign(out.begin() + static_cast<std::ptrdiff_t>(base),
               out.begin() + static_cast<std::ptrdiff_t>(base + n));
    std::merge(tmp.begin(), tmp.end(), ties.begin(), ties.end(),
               out.begin() + static_cast<std::ptrdiff_t>(base));
    n += static_cast<std::uint32_t>(ties.size());
  }
  assert(n == static_cast<std::uint32_t>(m));
  (void)m;
  out.resize(base + n);
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
  ws.cand.resize(cb + 1);
  ws.cand_key.resize(cb + 1);
  std::int32_t* cand = ws.cand.data();
  std::uint32_t* ckey = ws.cand_key.data();
  std::uint32_t c = 0;
  for (i = lo; i < hi; ++i) {
    const std::uint32_t k = keys(i);
    cand[c] = i;
    ckey[c] = k;
    c += (k >> kTopShift) == b;
  }
  assert(c == cb);
  const Threshold th =
      radix_threshold(ckey, c, static_cast<std::uint32_t>(m) - above, b << kTopShift, kTopShift, ws);
  append_kept(keys, positions, lo, hi, m, th, cand, ckey, c, ws, out);
}

/// Appends to `out` the `m` best slots of [lo, hi) by (key desc, position asc, slot asc), in
/// ascending slot order: sample bracket, one counting pass, radix select of the candidates, one
/// emission pass; the full histogram select when the bracket misses (file comment). Any length.
template <class Keys>
void select_best_radix(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m,
                       SelectWorkspace& ws, std::vector<std::int32_t>& out) {
  const int len = hi - lo;
  if (m <= 0) return;
  if (m >= len) {
    for (int i = lo; i < hi; ++i) out.push_back(i);
    return;
  }
  // 1. sample bracket
  const int s =
      std::min(len, std::max(256, static_cast<int>(kSampleFactor * std::sqrt(static_cast<double>(len)))));
  ws.sample.resize(static_cast<std::size_t>(s));
  std::uint32_t* smp = ws.sample.data();
  for (int j = 0; j < s; ++j)
    smp[j] = keys(lo + static_cast<int>((static_cast<std::int64_t>(j) * len + len / 2) / s));
  const double p = static_cast<double>(m) / len;
  const int r = static_cast<int>(p * s);
  const int delta = static_cast<int>(3.0 * std::sqrt(s * p * (1.0 - p))) + 3;
  const int q_lo = r + delta, q_hi = r - delta;  // descending sample ranks
  const bool has_lo = q_lo < s, has_hi = q_hi >= 0;
  // the keys at those ranks, by radix select on the sample (branch-free, unlike nth_element)
  const std::uint32_t lo_key = has_lo ? radix_threshold(smp, s, q_lo + 1, 0u, Keys::kBits, ws).T : 0u;
  const std::uint32_t hi_key =
      has_hi ? radix_threshold(smp, s, q_hi + 1, 0u, Keys::kBits, ws).T : 0xFFFFFFFFu;

  // 2. counting pass: a slots above the bracket, c candidates inside it
  ws.cand.resize(static_cast<std::size_t>(len) + 4);
  std::int32_t* cand = ws.cand.data();
  std::uint32_t a = 0, c = 0;
  bracket_pass(keys, lo, hi, lo_key, hi_key, has_lo, has_hi, cand, a, c);
  if (a > static_cast<std::uint32_t>(m) || a + c < static_cast<std::uint32_t>(m)) {
    select_best_histogram(keys, positions, lo, hi, m, ws, out);  // 4. the bracket missed
    return;
  }

  // 3. exact threshold among the candidates, then one emission pass
  const std::uint32_t need = static_cast<std::uint32_t>(m) - a;
  ws.cand_key.resize(c + 1);
  std::uint32_t* ckey = ws.cand_key.data();
  for (std::uint32_t j = 0; j < c; ++j) ckey[j] = keys(cand[j]);
  const Threshold th = need == 0 ? Threshold{hi_key, 0} : radix_threshold(ckey, c, need, 0u, Keys::kBits, ws);
  append_kept(keys, positions, lo, hi, m, th, cand, ckey, c, ws, out);
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
