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
/// (which may belong to the engine, e.g. interleaved K/V) is never written. In a token-major
/// layout (llama.cpp: token_stride = n_kv_heads * head_dim) the other heads' rows lie between a
/// head's rows: they are that padding, so each head is compacted on its own, in any order or
/// concurrently, and heads that keep different tokens never touch each other's rows. Within the
/// head the moves go in increasing i and kept[i] >= i, so a row is overwritten only after the
/// kept rows at or below it have moved (a row's bytes overlap no other row's: the layer checks
/// its strides, detail/strided_rows.hpp). A leading run already
/// in place (kept[i] == i) is skipped. Survivors are prefetched ~4 KiB ahead, and heads of at
/// least `streaming_min_bytes` (a parameter; `EvictOptions::streaming_min_bytes` per eviction) are
/// written with non-temporal (streaming) stores on x86 (both measured: benchmarks/RESULTS.md).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "depthkv/detail/simd.hpp"

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

/// Default streaming threshold: heads whose slots span at least this many bytes (per array: K or
/// V) are compacted with non-temporal stores. A compaction's destination lines are then written
/// without being read first (a plain store reads each line before writing it), and do not push the
/// cache out: worth it when the head is too large to be in the caches anyway (the layer's other
/// heads, the next layer and the attention that follows all stream through memory), a loss when it
/// is small and warm. 256 KiB: a head of 1K tokens of 128 fp16 dimensions (a layer of 8 such heads
/// holds 4 MiB of K+V); measurements at 4K and 32K tokens: benchmarks/RESULTS.md. 0 streams every
/// aligned head; SIZE_MAX never streams.
constexpr std::size_t kDefaultStreamingMinBytes = std::size_t{256} << 10;

/// Copies `bytes` (a multiple of 32) from src to dst (32-byte aligned, dst <= src or the ranges
/// disjoint) with non-temporal stores; the caller issues the store fence. Each 32- or 64-byte
/// piece is loaded before it is stored, and stores never reach the source bytes still to be read,
/// so the forward overlapping moves of a compaction are safe.
#if defined(__SSE2__)
inline void stream_copy_sse2(void* dst, const void* src, std::size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  for (std::size_t o = 0; o < bytes; o += 32) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + o));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + o + 16));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + o), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + o + 16), b);
  }
}
#endif
#if defined(DEPTHKV_AVX2_DISPATCH)
__attribute__((target("avx2"))) inline void stream_copy_avx2(void* dst, const void* src, std::size_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  std::size_t o = 0;
  for (; o + 64 <= bytes; o += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o + 32), b);
  }
  if (o < bytes)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o)));
}
#endif

/// Copies `bytes` from src to dst like a forward memmove: with streaming stores at SIMD level
/// `level` >= 1 (AVX2 at 2) when `bytes` is a multiple of 32 and dst 32-byte aligned, else with
/// memmove. After streaming copies, call stream_fence(level) before other threads read dst.
inline void stream_copy(void* dst, const void* src, std::size_t bytes, int level) {
  if (level >= 1 && bytes % 32 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 32 == 0) {
#if defined(DEPTHKV_AVX2_DISPATCH)
    if (level >= 2) return stream_copy_avx2(dst, src, bytes);
#endif
#if defined(__SSE2__)
    return stream_copy_sse2(dst, src, bytes);
#endif
  }
  std::memmove(dst, src, bytes);
}

/// Orders the streaming stores of stream_copy at `level` before later stores (they are weakly
/// ordered), so other threads see them; nothing to do at level 0 (memmove).
inline void stream_fence(int level) {
#if defined(__SSE2__)
  if (level >= 1) _mm_sfence();
#else
  (void)level;
#endif
}

/// The level of compact_runs' stores: streaming stores (`level` >= 1, at most `max_simd_level`)
/// for heads spanning at least `streaming_min_bytes` bytes whose every move is 32-byte aligned
/// (token and stride sizes multiples of 32 bytes, `base` 32-byte aligned); 0 (memmove) otherwise.
inline int streaming_level(const void* base, std::size_t tok, std::size_t stride_bytes, std::size_t span,
                           std::size_t streaming_min_bytes, int max_simd_level) {
  const bool aligned = tok % 32 == 0 && stride_bytes % 32 == 0 && reinterpret_cast<std::uintptr_t>(base) % 32 == 0;
  return span >= streaming_min_bytes && aligned ? simd_level(max_simd_level) : 0;
}

/// The moves of compact_runs from token i on: one per token when the tokens are strided, one per
/// run of consecutive source slots when dense; tokens of at least one cache line are prefetched
/// `kPrefetchBytes` ahead of the copy.
template <typename T>
void move_kept_tokens(T* base, std::ptrdiff_t token_stride, int head_dim, const std::int32_t* kept, int n_kept, int i,
                      int level) {
  constexpr std::size_t kPrefetchBytes = 4096;
  const std::size_t tok = sizeof(T) * static_cast<std::size_t>(head_dim);
  const int ahead = tok >= 64 ? static_cast<int>((kPrefetchBytes + tok - 1) / tok) : 0;  // tokens
  int p = i;  // next token to prefetch
  auto prefetch_to = [&](int end) {
    for (end = end < n_kept ? end : n_kept; p < end; ++p) prefetch_bytes(base + kept[p] * token_stride, tok);
  };
  if (token_stride != head_dim) {
    for (; i < n_kept; ++i) {
      if (ahead) prefetch_to(i + ahead);
      stream_copy(base + i * token_stride, base + kept[i] * token_stride, tok, level);
    }
  } else {
    while (i < n_kept) {
      int j = i + 1;
      while (j < n_kept && kept[j] == kept[j - 1] + 1) ++j;  // run [i, j) of consecutive source slots
      if (ahead) prefetch_to(j + ahead);
      stream_copy(base + static_cast<std::ptrdiff_t>(i) * head_dim,
                  base + static_cast<std::ptrdiff_t>(kept[i]) * head_dim,
                  tok * static_cast<std::size_t>(j - i), level);
      i = j;
    }
  }
}

/// Moves token kept[i] to token i for i in [0, n_kept), one move per run of consecutive slots
/// when the tokens are dense. `kept` must be strictly ascending and inside the head (not checked).
/// Tokens of at least one cache line are prefetched `kPrefetchBytes` ahead of the copy: scattered
/// survivors (low keep ratios) would otherwise be read at memory latency, one run at a time.
/// Heads spanning at least `streaming_min_bytes` bytes (0: every head; SIZE_MAX: none) are written
/// with streaming stores when every move is 32-byte aligned (token and stride sizes multiples of
/// 32 bytes, `base` 32-byte aligned) and the CPU has SSE2 (AVX2 where present); otherwise with
/// memmove; `max_simd_level` (the caller's `CpuOptions::max_simd_level`) caps their instruction
/// set. Single elements (positions) are moved by assignment instead of a memmove call each.
template <typename T>
void compact_runs(T* base, std::ptrdiff_t token_stride, int head_dim, const std::int32_t* kept, int n_kept,
                  std::size_t streaming_min_bytes = kDefaultStreamingMinBytes, int max_simd_level = 2) {
  static_assert(std::is_trivially_copyable<T>::value, "compact_runs moves bytes");
  int i = 0;
  while (i < n_kept && kept[i] == i) ++i;  // already in place
  if (i == n_kept) return;
  if (head_dim == 1 && token_stride == 1) {  // one element per token: plain assignments
    for (; i < n_kept; ++i) base[i] = base[kept[i]];
    return;
  }
  const std::size_t tok = sizeof(T) * static_cast<std::size_t>(head_dim);
  const std::size_t stride_bytes = sizeof(T) * static_cast<std::size_t>(token_stride);
  const std::size_t span = (static_cast<std::size_t>(kept[n_kept - 1]) + 1) * stride_bytes;
  // streaming stores for large heads when every move is 32-byte aligned (simd level 0: never)
  const int level = streaming_level(base, tok, stride_bytes, span, streaming_min_bytes, max_simd_level);
  move_kept_tokens(base, token_stride, head_dim, kept, n_kept, i, level);
  stream_fence(level);
}

}  // namespace detail
}  // namespace depthkv
