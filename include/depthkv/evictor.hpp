#pragma once
/// @file evictor.hpp
/// @brief Physical eviction: per (layer, KV head) top-k selection with a deterministic tie rule,
/// then in-place compaction that keeps the survivors in their original order.
///
/// ## Selection rule (one rule for the CPU and CUDA paths, detail/select_common.hpp)
/// In a row of n tokens the protected slots (the first `n_sink` and the last `n_recent`,
/// `Protection`) are always kept and count inside the budget k. The remaining k - protected
/// tokens are the best of the unprotected ones by (score descending, position ascending):
/// **equal scores: the earlier position stays** (-0.0 and +0.0 are equal; +inf and -inf are
/// ordinary scores; NaN is rejected). Should two tokens of a row share a position (impossible
/// for a Layer, whose positions ascend), the lower slot stays. k >= n keeps every token. The kept
/// slots are returned in ascending slot order (= position order).
///
/// ## Cost
/// Selection is O(n) per row, no full sort (detail/radix_select.hpp): for rows of at least
/// `detail::kRadixSelectMinLength` (64) unprotected tokens, a sample bracket, a counting pass,
/// a histogram radix select on the integer keys of the few candidates and an emission pass that
/// writes the kept slots already in order (a full histogram radix select when the bracket
/// misses); `std::nth_element` below 64. Compaction moves each kept token once
/// (`Layer::compact`: one move per run of consecutive kept tokens, the next ~4 KiB of survivors
/// prefetched, non-temporal stores on heads of >= 256 KiB; detail/compact_runs.hpp). Figures:
/// benchmarks/RESULTS.md.
///
/// ## Atomicity
/// `evict_layer` and `evict` validate every layer and head (shapes, NaN scores, keep ranges)
/// before any memory is touched: when they throw, the cache is unchanged.
///
/// ## Options
/// `EvictOptions` (the last argument, by value) holds what a call may tune: `shrink` (release the
/// freed capacity), `streaming_min_bytes` (the non-temporal store threshold of the compaction),
/// and, as a `CpuOptions` (cpu_options.hpp), `n_threads` and `max_simd_level` (the instruction-set
/// cap of the NaN checks and the selection; the compaction, `Layer::compact`, picks its own). No
/// option changes the result; there is no process-wide setting.
///
/// ## Threads
/// `EvictOptions::n_threads` (default 1: the calling thread only) spreads the (layer, KV head)
/// rows over up to `n_threads` std::threads for the call (0 = all cores); results are
/// identical for every thread count. The library keeps no threads between calls. With
/// n_threads != 1, `Layer::compact` on different heads of a layer must be safe to run
/// concurrently (true for HostLayer and LayerView, in every layout) and `shrink_to_fit` on
/// different layers likewise.
///
/// @code
/// std::vector<depthkv::TokenScorer> scorers;                    // one per layer
/// // ... observe attention rows, then:
/// std::vector<depthkv::LayerScores> scores = ...;               // scorers[l].scores(cache.layer(l))
/// std::vector<int> keep = allocator.allocate(...);              // tokens per layer
/// depthkv::EvictOptions opt;
/// opt.n_threads = 4;                                            // optional: same result, 4 threads
/// auto ev = depthkv::evict(cache, scores, keep, {/*n_sink=*/4, /*n_recent=*/32}, opt);
/// // ev[l].kept_slots[h]: surviving old slots; ev[l].kept_positions[h]: their positions.
/// // The scorers must follow the new slots before they score again:
/// for (int l = 0; l < n_layers; ++l)
///   for (int h = 0; h < n_kv_heads; ++h)
///     scorers[l].compact(h, ev[l].kept_slots[h].data(), static_cast<int>(ev[l].kept_slots[h].size()));
/// @endcode

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <vector>

#include "depthkv/cpu_options.hpp"
#include "depthkv/detail/parallel_for.hpp"
#include "depthkv/detail/radix_select.hpp"
#include "depthkv/detail/select_common.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/selection.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace depthkv {

/// Result of evicting one layer: for each KV head h, the old slots that survived (ascending; they
/// are now slots 0..size-1) and their original sequence positions.
struct LayerEviction {
  std::vector<std::vector<std::int32_t>> kept_slots;      ///< [head][i]
  std::vector<std::vector<std::int32_t>> kept_positions;  ///< [head][i]
};

/// Options of one `evict` / `evict_layer` call (passed by value; the defaults suit most calls).
/// No option changes which tokens are kept.
/// An EvictOptions is a CpuOptions: `n_threads` (here 1 by default: the calling thread only; 0 all
/// cores, n > 1 up to n std::threads, see the file comment) and `max_simd_level` (the instruction
/// set of the NaN checks and the selection).
struct EvictOptions : CpuOptions {
  EvictOptions() : CpuOptions{1, 2} {}
  /// Release the freed capacity after compaction (`Layer::shrink_to_fit`: HostLayer reallocates
  /// to its largest head, LayerView does nothing).
  bool shrink = true;
  /// Heads whose slots span at least this many bytes (per array: K or V) are compacted with
  /// non-temporal stores (x86, 32-byte aligned tokens; detail/compact_runs.hpp for the reason
  /// behind the 256 KiB default). 0 streams every aligned head, SIZE_MAX none.
  std::size_t streaming_min_bytes = detail::kDefaultStreamingMinBytes;
};

namespace detail {

#if defined(DEPTHKV_AVX2_DISPATCH)
/// True when scores[0..n32) (n32 a multiple of 32) hold a NaN: first_nan's vector part with AVX2.
__attribute__((target("avx2"))) inline bool any_nan_avx2(const float* s, int n32) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  __m256i acc = _mm256_setzero_si256();
  for (int i = 0; i < n32; i += 32)
    for (int j = 0; j < 32; j += 8) {
      const __m256i x =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + j)), abs_mask);
      acc = _mm256_or_si256(acc, _mm256_cmpgt_epi32(x, inf));
    }
  return _mm256_movemask_epi8(acc) != 0;
}
#endif

/// Index of the first NaN in scores[0..n), or -1 (bit test: safe under -ffast-math). One
/// branch-free pass (32 scores per step with AVX2, 16 with SSE2, at most `simd_cap`), then a scalar
/// search only when a NaN exists.
inline int first_nan(const float* s, int n, int simd_cap) {
  auto is_nan = [&](int i) { return (float_bits(s[i]) & 0x7FFFFFFFu) > 0x7F800000u; };
  bool bad = false;
  int i = 0;
  const int level = simd_level(simd_cap);
#if defined(DEPTHKV_AVX2_DISPATCH)
  if (level >= 2) {
    i = n / 32 * 32;
    bad = any_nan_avx2(s, i);
  }
#endif
#if defined(__SSE2__)
  if (level == 1) {
    // |bits| as int32 is in [0, 0x7FFFFFFF], so the signed compare is the unsigned one
    const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF), inf = _mm_set1_epi32(0x7F800000);
    __m128i acc = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16)
      for (int j = 0; j < 16; j += 4) {
        const __m128i x = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + j)), abs_mask);
        acc = _mm_or_si128(acc, _mm_cmpgt_epi32(x, inf));
      }
    bad = _mm_movemask_epi8(acc) != 0;
  }
#endif
  (void)level;
  for (; i < n; ++i) bad |= is_nan(i);
  if (!bad) return -1;
  for (i = 0; i < n; ++i)
    if (is_nan(i)) return i;
  return -1;
}

/// Index of the first NaN of 16-bit float bit patterns whose infinity pattern is `inf_bits`
/// (kHalfInfBits or kBFloat16InfBits, select_common.hpp), or -1.
inline int first_nan16(const std::uint16_t* s, int n, std::uint16_t inf_bits) {
  for (int i = 0; i < n; ++i)
    if (is_nan16(s[i], inf_bits)) return i;
  return -1;
}

/// Checks the arguments of one row other than the scores.
inline void check_row_args(int n, int k, Protection prot) {
  DEPTHKV_CHECK(n >= 0, "row length must be >= 0, got " << n);
  DEPTHKV_CHECK(k >= 0, "keep count must be >= 0, got " << k);
  DEPTHKV_CHECK(prot.n_sink >= 0 && prot.n_recent >= 0,
                "protection must be >= 0, got n_sink " << prot.n_sink << ", n_recent " << prot.n_recent);
  const int p = protected_count(n, prot.n_sink, prot.n_recent);
  DEPTHKV_CHECK(k >= n || k >= p, "keep " << k << " < " << p << " protected tokens (of " << n << ")");
}

/// Selection of a validated row into `out` (cleared): protected sinks, the best of the middle,
/// protected recent tokens; ascending.
template <class Keys>
void select_row(const Keys& keys, const std::int32_t* positions, int n, int k, Protection prot,
                SelectWorkspace& ws, std::vector<std::int32_t>& out) {
  out.clear();
  if (k >= n) {
    out.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
    return;
  }
  out.reserve(static_cast<std::size_t>(k));
  const int lo = std::min(prot.n_sink, n);
  const int hi = std::max(lo, n - std::min(prot.n_recent, n));
  for (int i = 0; i < lo; ++i) out.push_back(i);
  select_best(keys, positions, lo, hi, k - lo - (n - hi), ws, out);
  for (int i = hi; i < n; ++i) out.push_back(i);
}

template <class T16>
std::vector<std::int32_t> select_keep16(const T16* scores, const std::int32_t* positions, int n, int k,
                                        Protection prot, std::uint16_t inf_bits, const CpuOptions& cpu) {
  static_assert(sizeof(T16) == 2, "16-bit scores");
  cpu.validate();
  check_row_args(n, k, prot);
  DEPTHKV_CHECK(n == 0 || scores != nullptr, "null scores");
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(bits.data(), scores, sizeof(std::uint16_t) * static_cast<std::size_t>(n));
  const int bad = first_nan16(bits.data(), n, inf_bits);
  DEPTHKV_CHECK(bad < 0, "NaN score at slot " << bad);
  // the 16-bit order-preserving key, as a float (an integer below 2^16: exact), ranks exactly as the
  // score does, so the vectorised float path selects (no half/bfloat16 arithmetic, no FTZ/DAZ issue)
  std::vector<float> key(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    key[static_cast<std::size_t>(i)] = static_cast<float>(ordered_key16(bits[static_cast<std::size_t>(i)]));
  SelectWorkspace ws;
  ws.simd_level = cpu.max_simd_level;
  std::vector<std::int32_t> out;
  select_row(FloatKeys{key.data()}, positions, n, k, prot, ws, out);
  return out;
}

}  // namespace detail

/// Kept slots (ascending) of one row: protected slots always, then the best by (score desc,
/// position asc) until k. k >= n keeps all. See the file comment for the tie rule.
/// @param scores n scores (no NaN; +/-inf allowed)
/// @param positions n original positions (ties: the earlier position stays); nullptr means the
///   slot order (positions 0..n-1)
/// @param k tokens to keep, protected ones included
/// @param cpu instruction-set cap of the passes (`max_simd_level`; one thread)
/// @throws Error on NaN scores, n < 0, k < 0, negative protection, k < the protected count, or an
///   invalid `cpu`
inline std::vector<std::int32_t> select_keep(const float* scores, const std::int32_t* positions, int n, int k,
                                             Protection prot, const CpuOptions& cpu = CpuOptions()) {
  cpu.validate();
  detail::check_row_args(n, k, prot);
  DEPTHKV_CHECK(n == 0 || scores != nullptr, "null scores");
  const int bad = detail::first_nan(scores, n, cpu.max_simd_level);
  DEPTHKV_CHECK(bad < 0, "NaN score at slot " << bad);
  detail::SelectWorkspace ws;
  ws.simd_level = cpu.max_simd_level;
  std::vector<std::int32_t> out;
  detail::select_row(detail::FloatKeys{scores}, positions, n, k, prot, ws, out);
  return out;
}

/// `select_keep` on 16-bit scores (`Eigen::half` or `Eigen::bfloat16`): the same rule; each score's
/// 16-bit order-preserving key is converted (exactly) to a float and the float path selects. A
/// template, so `select_keep(nullptr, ...)` still means the float overload.
template <class T16,
          std::enable_if_t<std::is_same<T16, Eigen::half>::value || std::is_same<T16, Eigen::bfloat16>::value,
                           int> = 0>
std::vector<std::int32_t> select_keep(const T16* scores, const std::int32_t* positions, int n, int k,
                                      Protection prot, const CpuOptions& cpu = CpuOptions()) {
  return detail::select_keep16(
      scores, positions, n, k, prot,
      std::is_same<T16, Eigen::half>::value ? detail::kHalfInfBits : detail::kBFloat16InfBits, cpu);
}

namespace detail {

/// Step 1 of evict_layers: checks the shapes and keep ranges of every layer and head (nothing is
/// touched); a non-empty `labels` names layer l "layer labels[l]" in messages.
/// @return the first row (layer, KV head) of each layer, and the row count last
template <class Layer>
std::vector<int> check_layers(const std::vector<Layer*>& layers, const std::vector<const LayerScores*>& scores,
                              const std::vector<std::vector<int>>& keep, Protection prot, const std::vector<int>& labels) {
  const int n_layers = static_cast<int>(layers.size());
  std::vector<int> row0(static_cast<std::size_t>(n_layers) + 1, 0);
  for (int l = 0; l < n_layers; ++l) {
    const Layer& L = *layers[static_cast<std::size_t>(l)];
    const LayerScores& S = *scores[static_cast<std::size_t>(l)];
    const std::vector<int>& K = keep[static_cast<std::size_t>(l)];
    const int nh = L.n_kv_heads();
    auto where = [&](int h) {  // "layer l head h: ", "head h: ", "layer l: " or ""
      std::ostringstream os;
      if (!labels.empty()) os << "layer " << labels[static_cast<std::size_t>(l)] << (h >= 0 ? " " : ": ");
      if (h >= 0) os << "head " << h << ": ";
      return os.str();
    };
    DEPTHKV_CHECK(static_cast<int>(S.size()) == nh,
                  where(-1) << "scores have " << S.size() << " heads, layer " << nh);
    DEPTHKV_CHECK(static_cast<int>(K.size()) == nh, where(-1)
                                                        << "keep has " << K.size() << " heads, layer " << nh);
    for (int h = 0; h < nh; ++h) {
      const int n = L.size(h);
      const int k = K[static_cast<std::size_t>(h)];
      DEPTHKV_CHECK(static_cast<int>(S[static_cast<std::size_t>(h)].size()) == n,
                    where(h) << S[static_cast<std::size_t>(h)].size() << " scores for " << n << " tokens");
      DEPTHKV_CHECK(k >= 0, where(h) << "keep count must be >= 0, got " << k);
      const int p = protected_count(n, prot.n_sink, prot.n_recent);
      DEPTHKV_CHECK(k >= n || k >= p,
                    where(h) << "keep " << k << " < " << p << " protected tokens (of " << n << ")");
    }
    row0[static_cast<std::size_t>(l) + 1] = row0[static_cast<std::size_t>(l)] + nh;
  }
  return row0;
}

/// Step 2 of evict_layers for head `h` of layer `l` (`L`, scored by `s`): checks the scores for
/// NaN, then selects the `k` slots to keep and their positions into `E` (reads only); a non-empty
/// `labels` names layer l "layer labels[l]" in messages.
template <class Layer>
void select_head(const Layer& L, int l, int h, const std::vector<float>& s, int k, Protection prot,
                 const EvictOptions& opt, const std::vector<int>& labels, SelectWorkspace& ws,
                 LayerEviction& E) {
  const int n = L.size(h);
  const int bad = first_nan(s.data(), n, opt.max_simd_level);
  if (bad >= 0) {
    if (!labels.empty())
      DEPTHKV_FAIL("layer " << labels[static_cast<std::size_t>(l)] << " head " << h << ": NaN score at slot " << bad);
    DEPTHKV_FAIL("head " << h << ": NaN score at slot " << bad);
  }
  std::vector<std::int32_t>& kept = E.kept_slots[static_cast<std::size_t>(h)];
  const std::int32_t* pos = L.positions(h);
  select_row(FloatKeys{s.data()}, pos, n, k, prot, ws, kept);
  std::vector<std::int32_t>& kp = E.kept_positions[static_cast<std::size_t>(h)];
  kp.resize(kept.size());
  for (std::size_t i = 0; i < kept.size(); ++i) kp[i] = pos[kept[i]];
}

/// Evicts `layers[l]` to `keep[l][h]` tokens per head; a non-empty `labels` names layer l
/// "layer labels[l]" in messages.
template <class Layer>
std::vector<LayerEviction> evict_layers(const std::vector<Layer*>& layers,
                                        const std::vector<const LayerScores*>& scores,
                                        const std::vector<std::vector<int>>& keep, Protection prot,
                                        const EvictOptions& opt, const std::vector<int>& labels) {
  DEPTHKV_CHECK(prot.n_sink >= 0 && prot.n_recent >= 0,
                "protection must be >= 0, got n_sink " << prot.n_sink << ", n_recent " << prot.n_recent);
  opt.validate();
  const int n_layers = static_cast<int>(layers.size());
  // 1. shapes and keep ranges, every layer and head, before anything else
  const std::vector<int> row0 = check_layers(layers, scores, keep, prot, labels);
  const int n_rows = row0.back();
  std::vector<LayerEviction> result(static_cast<std::size_t>(n_layers));
  for (int l = 0; l < n_layers; ++l) {
    const std::size_t nh = static_cast<std::size_t>(layers[static_cast<std::size_t>(l)]->n_kv_heads());
    result[static_cast<std::size_t>(l)].kept_slots.resize(nh);
    result[static_cast<std::size_t>(l)].kept_positions.resize(nh);
  }
  auto row_of = [&](int r, int& l, int& h) {
    l = static_cast<int>(std::upper_bound(row0.begin(), row0.end(), r) - row0.begin()) - 1;
    h = r - row0[static_cast<std::size_t>(l)];
  };
  const int workers = resolve_threads(opt.n_threads, n_rows);
  std::vector<SelectWorkspace> ws(static_cast<std::size_t>(workers));
  for (SelectWorkspace& w : ws) w.simd_level = opt.max_simd_level;

  // 2. NaN checks and selection (reads only): an error here leaves everything unchanged
  parallel_for(n_rows, workers, [&](int worker, int r) {
    int l, h;
    row_of(r, l, h);
    select_head(*layers[static_cast<std::size_t>(l)], l, h,
                (*scores[static_cast<std::size_t>(l)])[static_cast<std::size_t>(h)],
                keep[static_cast<std::size_t>(l)][static_cast<std::size_t>(h)], prot, opt, labels,
                ws[static_cast<std::size_t>(worker)], result[static_cast<std::size_t>(l)]);
  });

  // 3. compaction, then 4. release of unused capacity
  parallel_for(n_rows, workers, [&](int, int r) {
    int l, h;
    row_of(r, l, h);
    const std::vector<std::int32_t>& kept =
        result[static_cast<std::size_t>(l)].kept_slots[static_cast<std::size_t>(h)];
    Layer& L = *layers[static_cast<std::size_t>(l)];
    if (static_cast<int>(kept.size()) != L.size(h))
      L.compact(h, kept.data(), static_cast<int>(kept.size()), opt.streaming_min_bytes);
  });
  if (opt.shrink)
    parallel_for(n_layers, resolve_threads(opt.n_threads, n_layers),
                 [&](int, int l) { layers[static_cast<std::size_t>(l)]->shrink_to_fit(); });
  return result;
}

}  // namespace detail

/// Evicts one layer: head h keeps `keep_per_head[h]` tokens (protected ones included; more than
/// it holds keeps all), compacted in place in position order.
/// @param scores scores[h][slot], row h of length layer.size(h) (e.g. TokenScorer::scores)
/// @param opt shrinking, threads and streaming threshold (`EvictOptions`)
/// @return kept old slots and their positions, per head
/// @throws Error on shape mismatch, NaN scores, negative keep, keep below the protected count or
///   negative `opt.n_threads`; the layer is unchanged then
template <class Layer>
LayerEviction evict_layer(Layer& layer, const LayerScores& scores, const std::vector<int>& keep_per_head,
                          Protection prot, EvictOptions opt = {}) {
  std::vector<LayerEviction> r =
      detail::evict_layers<Layer>({&layer}, {&scores}, {keep_per_head}, prot, opt, {});
  return std::move(r.front());
}

/// Evicts every layer: every head of layer l keeps `keep_per_layer[l]` tokens. All layers are
/// validated before any is touched.
/// @throws Error as evict_layer, or when the layer counts differ; the cache is unchanged then
template <class Layer>
std::vector<LayerEviction> evict(KVCache<Layer>& cache, const std::vector<LayerScores>& scores,
                                 const std::vector<int>& keep_per_layer, Protection prot,
                                 EvictOptions opt = {}) {
  DEPTHKV_CHECK(static_cast<int>(keep_per_layer.size()) == cache.n_layers(),
                "keep has " << keep_per_layer.size() << " layers, cache " << cache.n_layers());
  std::vector<std::vector<int>> keep(keep_per_layer.size());
  for (int l = 0; l < cache.n_layers(); ++l)
    keep[static_cast<std::size_t>(l)].assign(static_cast<std::size_t>(cache.layer(l).n_kv_heads()),
                                             keep_per_layer[static_cast<std::size_t>(l)]);
  return evict(cache, scores, keep, prot, opt);
}

/// Evicts every layer with per-head budgets: head h of layer l keeps `keep_per_head[l][h]` tokens.
/// All layers and heads are validated before any is touched.
/// @throws Error as evict_layer, or when the layer counts differ; the cache is unchanged then
template <class Layer>
std::vector<LayerEviction> evict(KVCache<Layer>& cache, const std::vector<LayerScores>& scores,
                                 const std::vector<std::vector<int>>& keep_per_head, Protection prot,
                                 EvictOptions opt = {}) {
  DEPTHKV_CHECK(static_cast<int>(scores.size()) == cache.n_layers(),
                "scores have " << scores.size() << " layers, cache " << cache.n_layers());
  DEPTHKV_CHECK(static_cast<int>(keep_per_head.size()) == cache.n_layers(),
                "keep has " << keep_per_head.size() << " layers, cache " << cache.n_layers());
  std::vector<Layer*> layers;
  std::vector<const LayerScores*> s;
  std::vector<int> labels;
  for (int l = 0; l < cache.n_layers(); ++l) {
    layers.push_back(&cache.layer(l));
    s.push_back(&scores[static_cast<std::size_t>(l)]);
    labels.push_back(l);
  }
  return detail::evict_layers(layers, s, keep_per_head, prot, opt, labels);
}

}  // namespace depthkv
