#pragma once
/// @file detail/compact_runs.hpp
/// @brief In-place compaction of one head's tokens with one move per run of consecutive kept slots
/// (instead of one per token), for any trivially copyable element type (float, Eigen::half,
/// Eigen::bfloat16, positions).
///
/// Token t of the head occupies elements `[t * token_stride, t * token_stride + head_dim)` of
/// `base`. After the call, token i holds what token kept[i] held (kept strictly ascending, so
/// kept[i] >= i and the moves only go towards the front). When tokens are dense
/// (`token_stride == head_dim`) a run of r consecutive kept tokens is one move of
/// `r * head_dim` elements; with padding between tokens each token is moved alone, so the padding
/// (which may belong to the engine, e.g. interleaved K/V) is never written. A leading run already
/// in place (kept[i] == i) is skipped. Survivors are prefetched ~4 KiB ahead (measured:
/// benchmarks/RESULTS.md).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace depthkv {
namespace detail {

/// Hint that the `bytes` at `p` are read soon (no effect where the compiler has no prefetch).
inline void prefetch_bytes(const void* p, std::size_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = static_cast<const char*>(p);
  for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 0);
#else
  (void)p;
  (void)bytes;
#endif
}

/// Moves token kept[i] to token i for i in [0, n_kept), one move per run of consecutive slots
/// when the tokens are dense. `kept` must be strictly ascending and inside the head (not checked).
/// Tokens of at least one cache line are prefetched `kPrefetchBytes` ahead of the copy: scattered
/// survivors (low keep ratios) would otherwise be read at memory latency, one run at a time.
/// Single elements (positions) are moved by assignment instead of a memmove call each. (An inline
/// copy in 64-byte chunks instead of memmove for larger tokens was measured slower.)
template <typename T>
void compact_runs(T* base, std::ptrdiff_t token_stride, int head_dim, const std::int32_t* kept, int n_kept) {
  static_assert(std::is_trivially_copyable<T>::value, "compact_runs moves bytes");
  constexpr std::size_t kPrefetchBytes = 4096;
  const std::size_t tok = sizeof(T) * static_cast<std::size_t>(head_dim);
  int i = 0;
  while (i < n_kept && kept[i] == i) ++i;    // already in place
  if (head_dim == 1 && token_stride == 1) {  // one element per token: plain assignments
    for (; i < n_kept; ++i) base[i] = base[kept[i]];
    return;
  }
  const int ahead = tok >= 64 ? static_cast<int>((kPrefetchBytes + tok - 1) / tok) : 0;  // tokens
  int p = i;  // next token to prefetch
  auto prefetch_to = [&](int end) {
    for (end = end < n_kept ? end : n_kept; p < end; ++p) prefetch_bytes(base + kept[p] * token_stride, tok);
  };
  if (token_stride != head_dim) {
    for (; i < n_kept; ++i) {
      if (ahead) prefetch_to(i + ahead);
      std::memmove(base + i * token_stride, base + kept[i] * token_stride, tok);
    }
    return;
  }
  while (i < n_kept) {
    int j = i + 1;
    while (j < n_kept && kept[j] == kept[j - 1] + 1) ++j;  // run [i, j) of consecutive source slots
    if (ahead) prefetch_to(j + ahead);
    std::memmove(base + static_cast<std::ptrdiff_t>(i) * head_dim,
                 base + static_cast<std::ptrdiff_t>(kept[i]) * head_dim,
                 tok * static_cast<std::size_t>(j - i));
    i = j;
  }
}

}  // namespace detail
}  // namespace depthkv
