#pragma once
/// @file detail/radix_select.hpp
/// @brief O(n) top-m selection on order-preserving integer keys (CPU), emitting the selected
/// slots already in ascending slot order, with depthkv's one ranking rule (select_common.hpp):
/// a higher score first; equal scores (equal keys, so -0.0 == +0.0): the earlier position first;
/// equal positions too (only possible in rows that are not from a Layer): the lower slot first.
///
/// ## Algorithm ("select the m best of [lo, hi)", rows of at least kRadixSelectMinLength)
/// 1. Bracket: the keys of a strided sample of s ~ 8 sqrt(len) slots (at least 256) give keys
///    lo_T <= hi_T that enclose the m-th best key with high probability: the sample ranks
///    m s / len -/+ (3 sigma + 3), both found by one joint radix select on the sample
///    (radix_threshold2).
/// 2. Counting pass over the row: the number a of keys above hi_T, and the slots and keys of the
///    keys in [lo_T, hi_T] ("candidates", ~ 6 sigma / s of the row), written branch-free in slot
///    order.
/// 3. Exact threshold among the candidates (radix_threshold): the key bits all candidates share
///    are skipped, then one histogram per digit (11 bits, or 8 for fewer than 4096 keys; the scan
///    for the rank starts at the largest digit present), each followed by a branch-free compaction
///    of the chosen bucket (8 keys per step with AVX2), gives the threshold key T and the number t
///    of T-keyed slots to keep (to reach m - a).
/// 4. Emission pass over the row: the slots keyed above T, and the first t slots keyed T (slot
///    order is position order when the ties' positions ascend, as in every Layer; otherwise the t
///    ties are chosen by (position, slot) and merged in), in slot order.
/// 5. When the bracket misses (a > m or a + c < m, c candidates: probability ~ 0.3 % on random
///    rows; adversarial or periodic rows), a full histogram radix select runs instead: a
///    2048-bucket histogram of the top 11 key bits over the row (two interleaved copies, so runs
///    of equal keys do not serialise on one counter), a pass collecting the keys of the threshold
///    bucket, step 3 on the bucket, step 4. 16-bit keys need one histogram pass over the row (5
///    bits remain for step 3).
/// Float rows are compared as floats in passes 2 and 4 (for non-NaN values float order is key
/// order, -0.0 == +0.0 in both): 8 at a time with AVX2 (compiled with a target attribute and
/// chosen at run time, so no -mavx2 is needed), 4 with SSE2 (every x86-64), else one at a time;
/// the passing slots (and, in pass 2 with AVX2, their keys) are stored with one vector store from
/// a table of compacted lane offsets.
/// Cost: O(len) expected and worst case; the typical row is read twice (two streaming passes), plus
/// O(sqrt(len)) for the sample and O(len / len^(1/4)) candidates.
///
/// ## Crossover
/// Rows shorter than `kRadixSelectMinLength` (64) use `std::nth_element` + a sort of the m
/// selected slots instead (`select_best_nth`): the radix path is the faster one from 64 tokens on,
/// for float and 16-bit keys (`BM_Select` of benchmarks/evict_cpu_bench.cpp; figures in
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
#include "depthkv/detail/simd.hpp"

namespace depthkv {
namespace detail {

/// Rows (unprotected ranges) shorter than this use std::nth_element; see the file comment.
constexpr int kRadixSelectMinLength = 64;

/// Sample size of the bracket: kSampleFactor * sqrt(len) slots (at least 256).
#ifndef DEPTHKV_SAMPLE_FACTOR
constexpr double kSampleFactor = 8.0;
#else
constexpr double kSampleFactor = DEPTHKV_SAMPLE_FACTOR;
#endif

/// Reusable buffers of the selection (one per thread).
struct SelectWorkspace {
  std::vector<std::uint32_t> hist;
  std::vector<std::int32_t> sure;  // slots emitted by the last pass (grown, never shrunk)
  std::vector<std::int32_t> cand;
  std::vector<std::uint32_t> cand_key;
  std::vector<std::uint32_t> sample;
  std::vector<std::uint32_t> tkey;   // keys of radix_threshold's current bucket
  std::vector<std::uint32_t> tkey2;  // radix_threshold2's buckets
  std::vector<std::uint32_t> tkey3;
  std::vector<std::int32_t> scratch;
  /// The highest instruction set the passes may use (`CpuOptions::max_simd_level`: 0 scalar,
  /// 1 SSE2, 2 AVX2; the CPU's own level applies too). Every level gives the same result.
  int simd_level = 2;
};

/// `ordered_key` without branches (vectorisable); equal to ordered_key for every bit pattern.
inline std::uint32_t ordered_key_bits(std::uint32_t u) {
  const std::uint32_t neg = static_cast<std::uint32_t>(static_cast<std::int32_t>(u) >> 31);
  return (u ^ (neg | 0x80000000u)) + static_cast<std::uint32_t>(u == 0x80000000u);  // -0.0 -> key of +0.0
}
inline std::uint32_t ordered_key_fast(float f) { return ordered_key_bits(float_bits(f)); }

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

/// Key of slot i in two steps, for gathers: raw_key loads, finish_keys turns c loaded values into
/// keys in one pass (vectorised for floats; the keys themselves otherwise).
template <class Keys>
std::uint32_t raw_key(const Keys& keys, int i) {
  return keys(i);
}
inline std::uint32_t raw_key(const FloatKeys& keys, int i) { return float_bits(keys.scores[i]); }
template <class Keys>
void finish_keys(const Keys&, std::uint32_t*, int) {}
inline void finish_keys(const FloatKeys&, std::uint32_t* v, int c) {
  for (int j = 0; j < c; ++j) v[j] = ordered_key_bits(v[j]);
}

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

/// Grows a workspace buffer to at least n elements (never shrinks, so a reused workspace is not
/// zero-filled again row after row).
template <class V>
void grow(V& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

/// Exact threshold of a selection: keep every key above `T`, and `t` of the slots keyed `T`
/// (the earliest by (position, slot)).
struct Threshold {
  std::uint32_t T = 0;
  std::uint32_t t = 0;
  std::uint32_t eq = 0;  ///< keys equal to T among the selected-from keys (t <= eq)
  /// Every T-keyed slot is kept: the kept set is simply "key >= T", no tie rule needed.
  bool all_ties_kept() const { return t > 0 && t == eq; }
};

/// Number of low bits below the longest prefix all `c` keys share (0: all equal): the bit length
/// of the OR of every key XOR the first (an OR reduction, vectorised by the compiler).
inline int prefix_shift(const std::uint32_t* keys, std::uint32_t c) {
  const std::uint32_t k0 = keys[0];
  std::uint32_t diff = 0;
  for (std::uint32_t j = 1; j < c; ++j) diff |= keys[j] ^ k0;
  int shift = 0;
  while (shift < 32 && (diff >> shift) != 0) ++shift;
  return shift;
}

/// One digit of a radix select: the histogram, into h, of bits [s, s + width) (mask = 2^width - 1)
/// of the c keys; returns the largest digit present, where the scan from the top starts (keys of
/// few exponents leave most high buckets empty).
inline std::uint32_t digit_histogram(std::uint32_t* h, const std::uint32_t* keys, std::uint32_t c, int s,
                                     std::uint32_t mask) {
  std::fill(h, h + mask + 1, 0u);
  std::uint32_t top = 0;
  for (std::uint32_t j = 0; j < c; ++j) {
    const std::uint32_t d = (keys[j] >> s) & mask;
    ++h[d];
    top = d > top ? d : top;
  }
  return top;
}

#if defined(DEPTHKV_AVX2_DISPATCH)
/// Lane indices of the set bits of an 8-bit mask, packed one per byte from the low byte.
struct Lanes8 {
  std::uint64_t v[256];
};
constexpr Lanes8 make_lanes8() {
  Lanes8 t{};
  for (int m = 0; m < 256; ++m) {
    std::uint64_t packed = 0;
    int c = 0;
    for (int l = 0; l < 8; ++l)
      if ((m >> l) & 1) packed |= static_cast<std::uint64_t>(l) << (8 * c++);
    t.v[m] = packed;
  }
  return t;
}
alignas(64) inline constexpr Lanes8 kLanes8 = make_lanes8();

/// Stores base + (the set lanes of `mask`) at dst (32 bytes written; `base`: the slot of lane 0 in
/// every lane); returns how many were set.
__attribute__((target("avx2,popcnt"))) inline std::uint32_t store_lanes8(std::int32_t* dst, __m256i base,
                                                                         unsigned mask) {
  const __m256i lanes =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kLanes8.v[mask])));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_add_epi32(base, lanes));
  return static_cast<std::uint32_t>(__builtin_popcount(mask));
}

/// keep_bucket, 8 keys per step: the keys of the chosen digit are packed to the front of the 8
/// lanes (a permutation from kLanes8) and stored with one vector store. In place (dst == src) is
/// safe: the store at dst + n (n <= j) ends before src + j + 8, whose keys are already loaded.
__attribute__((target("avx2,popcnt"))) inline std::uint32_t keep_bucket_avx2(
    std::uint32_t* dst, const std::uint32_t* src, std::uint32_t c, int s, std::uint32_t mask, std::uint32_t d,
    std::uint32_t& j) {
  const __m128i shift = _mm_cvtsi32_si128(s);
  const __m256i vmask = _mm256_set1_epi32(static_cast<int>(mask)),
                vd = _mm256_set1_epi32(static_cast<int>(d));
  std::uint32_t n = 0;
  for (j = 0; j + 8 <= c; j += 8) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j));
    const __m256i hit = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_srl_epi32(k, shift), vmask), vd);
    const unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
    const __m256i lanes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kLanes8.v[bits])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n), _mm256_permutevar8x32_epi32(k, lanes));
    n += static_cast<std::uint32_t>(__builtin_popcount(bits));
  }
  return n;
}
#endif

/// Copies to dst (may be src itself) the keys whose digit (bits [s, s + width)) is d, in order and
/// branch-free (8 at a time with AVX2 when `simd_cap` allows it); returns their count.
inline std::uint32_t keep_bucket(std::uint32_t* dst, const std::uint32_t* src, std::uint32_t c, int s,
                                 std::uint32_t mask, std::uint32_t d, int simd_cap) {
  std::uint32_t n = 0, j = 0;
#if defined(DEPTHKV_AVX2_DISPATCH)
  if (simd_level(simd_cap) >= 2) n = keep_bucket_avx2(dst, src, c, s, mask, d, j);
#else
  (void)simd_cap;
#endif
  for (; j < c; ++j) {
    const std::uint32_t k = src[j];
    dst[n] = k;
    n += ((k >> s) & mask) == d;
  }
  return n;
}

/// Step 3 of the file comment: the threshold of the `need` best (1 <= need <= c) of the `c` keys
/// `ckey` (read only), by histogram radix select below their common prefix: the bits all keys
/// share are skipped, then one histogram per digit from the top (11-bit
/// digits, or 8-bit digits for fewer than 4096 keys), each followed by a branch-free compaction of
/// the keys of the chosen bucket (into ws.tkey), so every pass after the first reads only those.
/// Cost: O(c) (c + the size of the chosen buckets) plus the buckets scanned.
inline Threshold radix_threshold(const std::uint32_t* ckey, std::uint32_t c, std::uint32_t need,
                                 SelectWorkspace& ws) {
  assert(c >= 1 && need >= 1 && need <= c);
  int shift = prefix_shift(ckey, c);
  if (shift == 0) return Threshold{ckey[0], need, c};
  std::uint32_t T = shift == 32 ? 0u : (ckey[0] >> shift) << shift;
  grow(ws.hist, 2048);
  grow(ws.tkey, c);
  std::uint32_t* h = ws.hist.data();
  std::uint32_t* buf = ws.tkey.data();
  const std::uint32_t* src = ckey;
  const int digit = c < 4096 ? 8 : 11;  // few keys: 256 buckets, cheaper to clear and scan
  for (;;) {
    const int width = shift < digit ? shift : digit;
    const int s = shift - width;
    const std::uint32_t mask = (1u << width) - 1u;
    std::uint32_t d = digit_histogram(h, src, c, s, mask);
    std::uint32_t acc = 0;
    for (;; --d) {
      if (acc + h[d] >= need) break;
      acc += h[d];
    }
    need -= acc;
    T |= d << s;
    if (s == 0 || h[d] == 1) {  // exact, or a single key left: it is the threshold
      if (s != 0)
        for (std::uint32_t j = 0; j < c; ++j)
          if (((src[j] >> s) & mask) == d) T = src[j];
      return Threshold{T, need, h[d]};
    }
    c = keep_bucket(buf, src, c, s, mask, d, ws.simd_level);  // in place after the first pass
    src = buf;
    shift = s;
  }
}

/// The keys of two ranks need_a <= need_b (1 = the largest) of the `c` keys `ckey` (read only),
/// found together: one histogram and one compaction per digit over the keys whose digits lie
/// between the two answers (usually one bucket), until the answers part, then radix_threshold
/// on each of the two buckets. The sample bracket's two ranks at the cost of about one select.
inline void radix_threshold2(const std::uint32_t* ckey, std::uint32_t c, std::uint32_t need_a,
                             std::uint32_t need_b, SelectWorkspace& ws, std::uint32_t& key_a,
                             std::uint32_t& key_b) {
  assert(c >= 1 && need_a >= 1 && need_a <= need_b && need_b <= c);
  int shift = prefix_shift(ckey, c);
  if (shift == 0) {
    key_a = key_b = ckey[0];
    return;
  }
  std::uint32_t T = shift == 32 ? 0u : (ckey[0] >> shift) << shift;
  grow(ws.hist, 2048);
  grow(ws.tkey2, c);
  std::uint32_t* h = ws.hist.data();
  std::uint32_t* buf = ws.tkey2.data();
  const std::uint32_t* src = ckey;
  const int digit = c < 4096 ? 8 : 11;
  for (;;) {
    const int width = shift < digit ? shift : digit;
    const int s = shift - width;
    const std::uint32_t mask = (1u << width) - 1u;
    std::uint32_t d = digit_histogram(h, src, c, s, mask);
    std::uint32_t acc = 0;
    while (acc + h[d] < need_a) acc += h[d--];
    const std::uint32_t da = d;
    need_a -= acc;
    while (acc + h[d] < need_b) acc += h[d--];
    const std::uint32_t db = d;
    need_b -= acc;
    if (da != db || s == 0) {
      if (s == 0) {
        key_a = T | da;
        key_b = T | db;
        return;
      }
      grow(ws.tkey3, c);
      std::uint32_t* first = ws.tkey3.data();
      const std::uint32_t na = keep_bucket(first, src, c, s, mask, da, ws.simd_level);  // bucket da to tkey3
      const std::uint32_t nb = keep_bucket(buf, src, c, s, mask, db, ws.simd_level);    // bucket db to buf (in place)
      key_a = radix_threshold(first, na, need_a, ws).T;
      key_b = radix_threshold(buf, nb, need_b, ws).T;
      return;
    }
    T |= da << s;
    c = keep_bucket(buf, src, c, s, mask, da, ws.simd_level);  // in place after the first pass
    src = buf;
    shift = s;
  }
}

/// The kept ties at the threshold into ws.scratch, ascending: the `th.t` slots keyed th.T that
/// come first by (position, slot), which are the first th.t in slot order when the ties' positions
/// ascend with their slots (always in a Layer). `cand`/`ckey`: every slot keyed th.T appears among
/// them, in ascending slot order.
inline void choose_ties(const std::int32_t* cand, const std::uint32_t* ckey, std::uint32_t c, Threshold th,
                        const std::int32_t* positions, SelectWorkspace& ws) {
  std::vector<std::int32_t>& ties = ws.scratch;
  ties.clear();
  if (th.t == 0) return;
  for (std::uint32_t j = 0; j < c; ++j)
    if (ckey[j] == th.T) ties.push_back(cand[j]);
  assert(ties.size() >= th.t);
  if (ties.size() == th.t) return;
  bool ascend = true;  // equal positions: slot order is the rule
  if (positions != nullptr)
    for (std::size_t j = 1; j < ties.size() && ascend; ++j)
      ascend = positions[ties[j]] >= positions[ties[j - 1]];
  if (!ascend) {
    auto earlier = [&](std::int32_t x, std::int32_t y) {
      return positions[x] != positions[y] ? positions[x] < positions[y] : x < y;
    };
    std::nth_element(ties.begin(), ties.begin() + (th.t - 1), ties.end(), earlier);
    ties.resize(th.t);
    std::sort(ties.begin(), ties.end());
    return;
  }
  ties.resize(th.t);
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

/// Float passes of steps 2 and 4 exist once per instruction set (simd.hpp): scalar, SSE2 (4
/// scores per step), AVX2 (8 per step); every level gives the same result.

/// Room the float passes need after the last slot they can write: one SIMD store past the end.
constexpr int kEmitSlack = 8;

/// Step 2, scalar tail of the float pass from slot i (see bracket_pass).
inline void bracket_tail(const float* s, int i, int hi, float lo_f, float hi_f, std::int32_t* cand,
                         std::uint32_t& na, std::uint32_t& nc) {
  for (; i < hi; ++i) {
    const float x = s[i];
    na += x > hi_f;
    cand[nc] = i;
    nc += (x >= lo_f) & (x <= hi_f);
  }
}

/// Step 4, scalar tail of the float pass from slot i (see emit_kept): scores above tf, or at least
/// tf when kInclusive.
template <bool kInclusive>
std::uint32_t emit_tail(const float* s, int i, int hi, float tf, std::int32_t* dst, std::uint32_t n) {
  for (; i < hi; ++i) {
    dst[n] = i;
    n += kInclusive ? s[i] >= tf : s[i] > tf;
  }
  return n;
}

#if defined(DEPTHKV_AVX2_DISPATCH)
__attribute__((target("avx2,popcnt"))) inline void bracket_pass_avx2(const float* s, int lo, int hi,
                                                                     float lo_f, float hi_f,
                                                                     std::int32_t* cand, std::uint32_t& a,
                                                                     std::uint32_t& c) {
  std::uint32_t nc = 0;
  int i = lo;
  const __m256 vlo = _mm256_set1_ps(lo_f), vhi = _mm256_set1_ps(hi_f);
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i base = _mm256_set1_epi32(lo);
  __m256i above = _mm256_setzero_si256();  // per lane: minus the count of scores above hi_f
  for (; i + 8 <= hi; i += 8) {
    const __m256 x = _mm256_loadu_ps(s + i);
    above = _mm256_add_epi32(above, _mm256_castps_si256(_mm256_cmp_ps(x, vhi, _CMP_GT_OQ)));
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, vlo, _CMP_GE_OQ), _mm256_cmp_ps(x, vhi, _CMP_LE_OQ));
    nc += store_lanes8(cand + nc, base, static_cast<unsigned>(_mm256_movemask_ps(in)));
    base = _mm256_add_epi32(base, eight);
  }
  alignas(32) std::int32_t lane_counts[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_counts), above);
  std::uint32_t na = 0;
  for (std::int32_t v : lane_counts) na -= static_cast<std::uint32_t>(v);
  bracket_tail(s, i, hi, lo_f, hi_f, cand, na, nc);
  a = na;
  c = nc;
}

template <bool kInclusive>
__attribute__((target("avx2,popcnt"))) std::uint32_t emit_kept_avx2(const float* s, int lo, int hi, float tf,
                                                                    std::int32_t* dst) {
  std::uint32_t n = 0;
  int i = lo;
  const __m256 vt = _mm256_set1_ps(tf);
  const __m256i eight = _mm256_set1_epi32(8);
  __m256i base = _mm256_set1_epi32(lo);
  for (; i + 8 <= hi; i += 8) {
    const __m256 x = _mm256_loadu_ps(s + i);
    const __m256 pass = kInclusive ? _mm256_cmp_ps(x, vt, _CMP_GE_OQ) : _mm256_cmp_ps(x, vt, _CMP_GT_OQ);
    n += store_lanes8(dst + n, base, static_cast<unsigned>(_mm256_movemask_ps(pass)));
    base = _mm256_add_epi32(base, eight);
  }
  return emit_tail<kInclusive>(s, i, hi, tf, dst, n);
}
#endif

/// Step 2: counts the slots keyed above `hi_key` (none when !has_hi) and writes the slots keyed in
/// [lo_key, hi_key] (from -inf when !has_lo) to `cand` and their keys to `ckey` (both with room for
/// hi - lo + kEmitSlack). Float rows are compared as floats (for non-NaN values float order is key
/// order, -0.0 == +0.0 in both), 8 (AVX2) or 4 (SSE2) at a time, the passing slots stored with one
/// vector store from a table of compacted lane offsets; then the candidates' keys are read.
inline void bracket_pass(const FloatKeys& keys, int lo, int hi, std::uint32_t lo_key, std::uint32_t hi_key,
                         bool has_lo, bool has_hi, std::int32_t* cand, std::uint32_t* ckey, std::uint32_t& a,
                         std::uint32_t& c, int simd_cap) {
  const float* s = keys.scores;
  const float lo_f = has_lo ? key_to_float(lo_key) : -std::numeric_limits<float>::infinity();
  const float hi_f = has_hi ? key_to_float(hi_key) : std::numeric_limits<float>::infinity();
  const int level = simd_level(simd_cap);
  std::uint32_t na = 0, nc = 0;
  int i = lo;
#if defined(DEPTHKV_AVX2_DISPATCH)
  if (level >= 2) {
    bracket_pass_avx2(s, lo, hi, lo_f, hi_f, cand, na, nc);
    i = hi;
  }
#endif
#if defined(__SSE2__)
  if (level == 1) {
    const __m128 vlo = _mm_set1_ps(lo_f), vhi = _mm_set1_ps(hi_f);
    for (; i + 4 <= hi; i += 4) {
      const __m128 x = _mm_loadu_ps(s + i);
      na += kLaneCount[_mm_movemask_ps(_mm_cmpgt_ps(x, vhi))];
      nc +=
          store_lanes(cand + nc, i, _mm_movemask_ps(_mm_and_ps(_mm_cmpge_ps(x, vlo), _mm_cmple_ps(x, vhi))));
    }
  }
#endif
  (void)level;
  bracket_tail(s, i, hi, lo_f, hi_f, cand, na, nc);
  for (std::uint32_t j = 0; j < nc; ++j) ckey[j] = keys(cand[j]);
  a = na;
  c = nc;
}

/// Step 2 for generic keys (16-bit).
template <class Keys>
void bracket_pass(const Keys& keys, int lo, int hi, std::uint32_t lo_key, std::uint32_t hi_key, bool, bool,
                  std::int32_t* cand, std::uint32_t* ckey, std::uint32_t& a, std::uint32_t& c, int) {
  const std::uint32_t span = hi_key - lo_key;
  std::uint32_t na = 0, nc = 0;
  for (int i = lo; i < hi; ++i) {
    const std::uint32_t k = keys(i);
    na += k > hi_key;
    cand[nc] = i;
    ckey[nc] = k;
    nc += (k - lo_key) <= span;
  }
  a = na;
  c = nc;
}

/// Emission, float rows, one instruction set and comparison (see emit_kept).
template <bool kInclusive>
std::uint32_t emit_kept_float(const float* s, int lo, int hi, float tf, std::int32_t* dst, int simd_cap) {
  const int level = simd_level(simd_cap);
#if defined(DEPTHKV_AVX2_DISPATCH)
  if (level >= 2) return emit_kept_avx2<kInclusive>(s, lo, hi, tf, dst);
#endif
  std::uint32_t n = 0;
  int i = lo;
#if defined(__SSE2__)
  if (level >= 1) {
    const __m128 vt = _mm_set1_ps(tf);
    for (; i + 4 <= hi; i += 4) {
      const __m128 x = _mm_loadu_ps(s + i);
      n += store_lanes(dst + n, i, _mm_movemask_ps(kInclusive ? _mm_cmpge_ps(x, vt) : _mm_cmpgt_ps(x, vt)));
    }
  }
#endif
  (void)level;
  return emit_tail<kInclusive>(s, i, hi, tf, dst, n);
}

/// Emission: writes to `dst` (room for hi - lo + kEmitSlack) the slots of [lo, hi) keyed above
/// th.T, or at least th.T when every T-keyed slot is kept (th.all_ties_kept()), in slot order;
/// returns the count. (Otherwise the kept ties are merged in afterwards: finish_kept.)
inline std::uint32_t emit_kept(const FloatKeys& keys, int lo, int hi, Threshold th, std::int32_t* dst, int simd_cap) {
  const float tf = key_to_float(th.T);
  return th.all_ties_kept() ? emit_kept_float<true>(keys.scores, lo, hi, tf, dst, simd_cap)
                            : emit_kept_float<false>(keys.scores, lo, hi, tf, dst, simd_cap);
}

/// Emission for generic keys (16-bit).
template <class Keys>
std::uint32_t emit_kept(const Keys& keys, int lo, int hi, Threshold th, std::int32_t* dst, int) {
  const std::uint32_t floor = th.all_ties_kept() ? th.T : th.T + 1;  // keys >= floor (th.T < 2^16 here)
  std::uint32_t n = 0;
  for (int i = lo; i < hi; ++i) {
    dst[n] = i;
    n += keys(i) >= floor;
  }
  return n;
}

/// Appends the `n` emitted slots (ascending) to `out` with the kept ties (ws.scratch, ascending)
/// merged in (only when the tie rule dropped some T-keyed slots; otherwise ws.scratch is empty).
inline void finish_kept(const std::int32_t* emitted, std::uint32_t n, const SelectWorkspace& ws,
                        std::vector<std::int32_t>& out) {
  const std::vector<std::int32_t>& ties = ws.scratch;
  if (ties.empty()) {  // a copy into the reserved room (resize would zero-fill it first)
    out.insert(out.end(), emitted, emitted + n);
    return;
  }
  const std::size_t base = out.size();
  out.resize(base + n + ties.size());
  std::merge(emitted, emitted + n, ties.begin(), ties.end(), out.begin() + static_cast<std::ptrdiff_t>(base));
}

/// Appends the kept slots of [lo, hi) for threshold `th` to `out` (m of them), ascending: the
/// emission pass over the row (keys above T, or from T on when all T-keyed slots are kept), then
/// the kept ties merged in (only when some T-keyed slots are dropped: the tie rule decides which).
template <class Keys>
void append_kept(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m, Threshold th,
                 const std::int32_t* cand, const std::uint32_t* ckey, std::uint32_t c, SelectWorkspace& ws,
                 std::vector<std::int32_t>& out) {
  if (th.all_ties_kept())
    ws.scratch.clear();  // the emission takes them
  else
    choose_ties(cand, ckey, c, th, positions, ws);
  grow(ws.sure, static_cast<std::size_t>(hi - lo) + kEmitSlack);
  const std::uint32_t n = emit_kept(keys, lo, hi, th, ws.sure.data(), ws.simd_level);
  assert(n + ws.scratch.size() == static_cast<std::size_t>(m));
  (void)m;
  finish_kept(ws.sure.data(), n, ws, out);
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
  grow(ws.cand, cb + 1);
  grow(ws.cand_key, cb + 1);
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
  const Threshold th = radix_threshold(ckey, c, static_cast<std::uint32_t>(m) - above, ws);
  append_kept(keys, positions, lo, hi, m, th, cand, ckey, c, ws, out);
}

/// The bracket's sample: the keys of slots lo + (j len + len / 2) / s, j = 0..s-1 (evenly spread
/// single slots, not blocks: scores are often correlated with their neighbours, and a sample of
/// blocks misses the bracket far more often on such rows; benchmarks/RESULTS.md), into smp. Quotient
/// and remainder are updated without a division or a branch per sample (the carry is unpredictable); float
/// rows copy the raw bits first and turn them into keys in one vectorised pass.
template <class Keys>
void sample_keys(const Keys& keys, int lo, int len, int s, std::uint32_t* smp) {
  const int step_q = len / s, step_r = len % s;
  int q = (len / 2) / s, r = (len / 2) % s;
  for (int j = 0; j < s; ++j) {
    smp[j] = raw_key(keys, lo + q);
    r += step_r;
    const int carry = static_cast<int>(r >= s);
    q += step_q + carry;
    r -= s & -carry;
  }
  finish_keys(keys, smp, s);
}

/// Steps 2-4 of the file comment: bracket pass, threshold of the candidates, emission pass.
template <class Keys>
void select_bracketed(const Keys& keys, const std::int32_t* positions, int lo, int hi, int m,
                      std::uint32_t lo_key, std::uint32_t hi_key, bool has_lo, bool has_hi,
                      SelectWorkspace& ws, std::vector<std::int32_t>& out) {
  const std::size_t len = static_cast<std::size_t>(hi - lo);
  grow(ws.cand, len + kEmitSlack);
  grow(ws.cand_key, len + kEmitSlack);
  std::int32_t* cand = ws.cand.data();
  std::uint32_t* ckey = ws.cand_key.data();
  std::uint32_t a = 0, c = 0;
  bracket_pass(keys, lo, hi, lo_key, hi_key, has_lo, has_hi, cand, ckey, a, c, ws.simd_level);
  if (a > static_cast<std::uint32_t>(m) || a + c < static_cast<std::uint32_t>(m)) {
    select_best_histogram(keys, positions, lo, hi, m, ws, out);  // 5. the bracket missed
    return;
  }
  const std::uint32_t need = static_cast<std::uint32_t>(m) - a;
  const Threshold th = need == 0 ? Threshold{hi_key, 0} : radix_threshold(ckey, c, need, ws);
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
  grow(ws.sample, static_cast<std::size_t>(s));
  std::uint32_t* smp = ws.sample.data();
  sample_keys(keys, lo, len, s, smp);
  const double p = static_cast<double>(m) / len;
  const int r = static_cast<int>(p * s);
  const int delta = static_cast<int>(3.0 * std::sqrt(s * p * (1.0 - p))) + 3;
  const int q_lo = r + delta, q_hi = r - delta;  // descending sample ranks
  const bool has_lo = q_lo < s, has_hi = q_hi >= 0;
  // the keys at those ranks, by radix select on the sample (branch-free, unlike nth_element)
  std::uint32_t lo_key = 0u, hi_key = 0xFFFFFFFFu;
  const std::uint32_t us = static_cast<std::uint32_t>(s);
  if (has_lo && has_hi)
    radix_threshold2(smp, us, static_cast<std::uint32_t>(q_hi) + 1, static_cast<std::uint32_t>(q_lo) + 1, ws,
                     hi_key, lo_key);
  else if (has_lo)
    lo_key = radix_threshold(smp, us, static_cast<std::uint32_t>(q_lo) + 1, ws).T;
  else if (has_hi)
    hi_key = radix_threshold(smp, us, static_cast<std::uint32_t>(q_hi) + 1, ws).T;

  select_bracketed(keys, positions, lo, hi, m, lo_key, hi_key, has_lo, has_hi, ws, out);
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
