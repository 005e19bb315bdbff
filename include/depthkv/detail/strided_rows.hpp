#pragma once
/// @file detail/strided_rows.hpp
/// @brief Proof that the (head, slot) rows of a strided key/value layout do not overlap, for any
/// non-negative strides (no CUDA headers: shared by the host layers of kv_cache.hpp and the
/// device layers of cuda/device_layer.cuh).
///
/// A strided layer holds, per array (keys or values), one row of `head_dim` contiguous elements
/// per (head, slot), at element offset `h * head_stride + slot * token_stride`. Every layout in
/// which a row is contiguous is of this form:
/// - head-major (HF, per sequence): `[n_kv_heads][capacity][head_dim]`, head_stride =
///   capacity * head_dim, token_stride = head_dim;
/// - token-major interleaved (llama.cpp): `[capacity][n_kv_heads * head_dim]`, head_stride =
///   head_dim, token_stride = n_kv_heads * head_dim;
/// - either with padding (larger strides), or K and V interleaved in one buffer (the value rows
///   between the key rows: `check_kv_rows_disjoint`).
///
/// Rows (h1, s1) and (h2, s2) start `dh * head_stride + ds * token_stride` elements apart
/// (dh = h2 - h1, ds = s2 - s1) and overlap iff that distance is below `head_dim` in absolute
/// value. For each dh the distances over ds in (-capacity, capacity) form an arithmetic
/// progression, so the one closest to zero is found by a division: O(n_kv_heads) per check.

#include <cstddef>
#include <cstdint>

#include "depthkv/error.hpp"

namespace depthkv {
namespace detail {

/// Floor of a / b (b > 0).
inline long long floor_div(long long a, long long b) {
  long long q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}

/// The b in [lo, hi] (lo <= hi) that minimises |off + b * step| (step >= 0), and that minimum.
inline long long nearest_multiple(long long off, long long step, long long lo, long long hi, long long& best_abs) {
  auto clamp = [&](long long b) { return b < lo ? lo : (b > hi ? hi : b); };
  auto mag = [&](long long b) {
    const long long x = off + b * step;
    return x < 0 ? -x : x;
  };
  if (step == 0) {
    best_abs = mag(lo);
    return lo;
  }
  const long long q = floor_div(-off, step);  // off + q*step <= 0 < off + (q+1)*step
  const long long b0 = clamp(q), b1 = clamp(q + 1);
  const long long m0 = mag(b0), m1 = mag(b1);
  best_abs = m0 <= m1 ? m0 : m1;
  return m0 <= m1 ? b0 : b1;
}

/// Checks that no two (head, slot) rows of a strided layout overlap (file comment).
/// @throws Error naming the stride at fault: a negative stride, `token_stride` < `head_dim` (two
///   slots of one head overlap) or a `head_stride` that puts a row of one head on a row of another
inline void check_row_strides(int n_kv_heads, int head_dim, int capacity, std::ptrdiff_t head_stride,
                              std::ptrdiff_t token_stride) {
  DEPTHKV_CHECK(head_stride >= 0, "head_stride " << head_stride << " is negative");
  DEPTHKV_CHECK(token_stride >= 0, "token_stride " << token_stride << " is negative");
  if (capacity == 0) return;
  DEPTHKV_CHECK(capacity == 1 || token_stride >= head_dim,
                "token_stride " << token_stride << " < head_dim " << head_dim
                                << ": consecutive slots of a head overlap");
  const long long hd = head_dim, hs = head_stride, ts = token_stride;
  for (long long a = 1; a < n_kv_heads; ++a) {
    long long dist = 0;
    const long long b = nearest_multiple(a * hs, ts, -(capacity - 1LL), capacity - 1LL, dist);
    // rows (head a, slot s1) and (head 0, slot s1 - b) lie `dist` elements apart
    const long long s1 = b < 0 ? 0 : b, s0 = s1 - b;
    DEPTHKV_CHECK(dist >= hd, "head_stride " << head_stride << " (token_stride " << token_stride << ", head_dim "
                                             << head_dim << ", capacity " << capacity << "): row (head " << a
                                             << ", slot " << s1 << ") overlaps row (head 0, slot " << s0 << ")");
  }
}

/// Checks that no key row overlaps a value row when keys and values share memory (e.g. K and V
/// interleaved in one buffer); the strides must already have passed `check_row_strides`.
/// @throws Error naming the two rows that overlap
template <typename T>
void check_kv_rows_disjoint(const T* keys, const T* values, int n_kv_heads, int head_dim, int capacity,
                            std::ptrdiff_t head_stride, std::ptrdiff_t token_stride) {
  if (capacity == 0) return;
  const long long e = static_cast<long long>(sizeof(T));
  const long long k0 = static_cast<long long>(reinterpret_cast<std::uintptr_t>(keys));
  const long long v0 = static_cast<long long>(reinterpret_cast<std::uintptr_t>(values));
  const long long extent =
      e * ((n_kv_heads - 1LL) * head_stride + (capacity - 1LL) * token_stride + head_dim);  // bytes of one array
  if (v0 >= k0 + extent || k0 >= v0 + extent) return;  // disjoint spans
  const long long D = v0 - k0, row = e * head_dim;
  for (long long dh = -(n_kv_heads - 1LL); dh < n_kv_heads; ++dh) {
    // key (h1, s1) at k0 + e*(h1*hs + s1*ts), value (h1 + dh, s1 + ds): D + e*(dh*hs + ds*ts) apart
    long long dist = 0;
    const long long ds = nearest_multiple(D + e * dh * head_stride, e * token_stride, -(capacity - 1LL),
                                          capacity - 1LL, dist);
    const long long h1 = dh < 0 ? -dh : 0, s1 = ds < 0 ? -ds : 0;
    DEPTHKV_CHECK(dist >= row, "keys and values overlap (head_stride " << head_stride << ", token_stride "
                                                                       << token_stride << "): key row (head " << h1
                                                                       << ", slot " << s1 << ") and value row (head "
                                                                       << h1 + dh << ", slot " << s1 + ds << ")");
  }
}

}  // namespace detail
}  // namespace depthkv
