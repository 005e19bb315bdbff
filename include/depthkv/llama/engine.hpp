#pragma once
/// @file llama/engine.hpp
/// @brief `LlamaEngine`: the reference Llama forward pass (Eigen) over a depthkv `KVCache`:
/// RMSNorm, RoPE, grouped-query attention against per-layer, per-KV-head caches that may hold
/// different numbers of tokens, SwiGLU or GeGLU, optional post-attention/post-FFN norms and
/// sliding-window layers (Gemma 3: a local layer's query at position p attends to the held keys at
/// positions p - window + 1 .. p, by stored position, so pruned caches mask right; without an
/// observer a local layer's slots outside its window are freed as the sequence moves on,
/// `drop_outside_window`); batched and chunked prefill with attention-probability
/// capture (for the token scorers) and a hook after each chunk (for scoring and eviction), decode,
/// teacher forcing, and hidden-state capture. Attention is a tiled online-softmax kernel
/// (detail/flash_attention.hpp) that never forms a `T x n` score matrix; only the query rows an
/// observer receives (`ForwardOptions::observe_from`) have their probabilities formed. Keys and
/// values are stored as float32 (`HostCache`) or F16 (`HostCacheF16`, `KvType`) and read as
/// float. Strided layers (`HostLayer`, `LayerView`) are read
/// in place; a `PagedLayer` (paged_cache.hpp) is gathered head by head for each attention call,
/// and a forward pass whose tokens need more blocks than a layer's pool has free throws ("pool
/// exhausted") before any layer is touched.
///
/// ## Conventions
/// - Every forward call processes `n` tokens at consecutive sequence positions
///   `pos0, pos0 + 1, ...`; the caller owns the position counter (after an eviction the cache no
///   longer tells the sequence length). RoPE uses each token's original position: cached keys are
///   stored rotated with theirs, new tokens rotate with their true position.
/// - `forward`, `prefill` and `teacher_force` take (tokens, first position, cache, options) in
///   that order; `decode` takes (token, position, cache, stats).
/// - Each layer's K/V of the new tokens are appended to the cache before attention; query `i` of
///   the call (position `pos0 + i`) attends, in KV head `h`, to the slots
///   `[0, size_before(h) + i]` (everything held before the call plus the causal part of the call).
/// - Attention probabilities handed to the observer cover the slots of the KV head *after* the
///   append, in slot order; masked (future) entries are 0. Observing does not change the output:
///   the logits with and without an observer are the same bytes.
/// - Matrices are row-major: activations `[tokens x dim]`, logits `[tokens x vocab]`.
///
/// @code
/// depthkv::llama::LlamaModel model = depthkv::llama::load_llama2c("stories260K.bin");
/// depthkv::llama::LlamaEngine engine(model);
/// auto cache = engine.make_cache();
/// depthkv::llama::RowMatrix logits = engine.prefill(prompt, /*pos0=*/0, cache);  // [prompt.size() x vocab]
/// Eigen::VectorXf next = engine.decode(token, /*pos=*/static_cast<int>(prompt.size()), cache);
/// @endcode

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "depthkv/cpu_options.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/llama/detail/flash_attention.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/quant/dequantize.hpp"
#include "depthkv/llama/quant/products.hpp"
#include "depthkv/thread_pool.hpp"

namespace depthkv {
namespace llama {

/// A host KV cache of float32 keys and values: per layer `[n_kv_heads][capacity][head_dim]` floats
/// (what `LlamaEngine::make_cache()` returns; the quality protocol, eval.hpp, runs on it).
using HostCache = KVCache<HostLayer<float>>;
/// A host KV cache of F16 keys and values (`LlamaEngine::make_cache<Eigen::half>()`), half the
/// bytes of `HostCache`: keys and values are rounded to F16 when appended, read back as float.
using HostCacheF16 = KVCache<HostLayer<Eigen::half>>;

/// The element type of an engine cache's keys and values: F16 (`HostCacheF16`, half the bytes,
/// llama.cpp's default) or float32 (`HostCache`). Which one a run uses is a static choice (the
/// cache's type); this names it for options and command lines (`depthkv generate --kv-type`).
enum class KvType {
  kF16,  ///< Eigen::half: keys and values rounded to F16 when appended
  kF32,  ///< float
};

/// The KV type of generation and the benchmarks unless told otherwise (the quality protocol,
/// eval.hpp, runs on float32 caches).
inline constexpr KvType kDefaultKvType = KvType::kF16;

/// @return "f16" or "f32"
inline const char* kv_type_name(KvType t) { return t == KvType::kF16 ? "f16" : "f32"; }

/// @param name "f16" or "f32"
/// @throws depthkv::Error naming the accepted names otherwise
inline KvType parse_kv_type(const std::string& name) {
  if (name == "f16") return KvType::kF16;
  DEPTHKV_CHECK(name == "f32", "KV type must be f16 or f32, got '" << name << "'");
  return KvType::kF32;
}

/// Points of a layer at which hidden states can be captured (rows = the tokens of the call).
enum class CapturePoint {
  kLayerInput,     ///< residual stream entering the layer `[T x dim]`
  kAttnInput,      ///< RMS-normed layer input (what the Q/K/V projections read), pre-attention
  kAttnOutput,     ///< attention output projection (`wo`) before the residual add
  kAttnResidual,   ///< residual stream after the attention add (input of the MLP block)
  kMlpOutput,      ///< MLP down projection before the residual add
  kLayerOutput,    ///< residual stream after the MLP add (= next layer's input), post-MLP
};

/// Called with `(layer, point, pos0, rows)`: `rows` is `[T x dim]`, row `i` belongs to sequence
/// position `pos0 + i`. Only valid during the call (copy what you keep).
using ActivationHook = std::function<void(int layer, CapturePoint point, std::int32_t pos0, const RowMatrix& rows)>;

/// Called with `(layer, q_head, q_pos0, n_queries, probs, ld, n)`: attention probabilities of
/// query head `q_head` for `n_queries` consecutive positions starting at `q_pos0`, row-major with
/// leading dimension `ld`, each row covering the `n` slots its KV head holds (after the append);
/// masked entries are 0. This is exactly `TokenScorer::observe_block`'s argument list after the
/// layer index.
using AttentionObserver =
    std::function<void(int layer, int q_head, std::int32_t q_pos0, int n_queries, const float* probs, int ld, int n)>;

/// The most OpenMP threads any call of this library accepts (`ForwardOptions::n_threads`,
/// `EvalConfig::n_threads`, `perplexity`'s `n_threads`): far more than any machine's cores, and
/// far below what makes libgomp overflow a stack or run out of memory (100,000 and 2^31-1 did).
inline constexpr int kMaxThreads = kMaxCpuThreads;

/// @param what the setting's name, for the message ("n_threads", "--threads")
/// @throws depthkv::Error when `n` is outside [0, kMaxThreads] (0: OpenMP's default)
inline void check_thread_count(int n, const char* what = "n_threads") {
  DEPTHKV_CHECK(n >= 0 && n <= kMaxThreads, what << " must be in [0, " << kMaxThreads << "] (0: OpenMP's default), got " << n);
}

/// Wall-clock seconds spent in the parts of the forward pass (accumulated over calls).
struct EngineStats {
  double matmul_s = 0;     ///< Q/K/V/O projections, MLP and classifier GEMMs
  double attention_s = 0;  ///< scores, softmax, observer calls, weighted sum of values
  double other_s = 0;      ///< embedding, norms, RoPE, cache appends, hooks
  long long tokens = 0;    ///< tokens processed
  double total() const { return matmul_s + attention_s + other_s; }
  void reset() { *this = EngineStats{}; }
};

namespace detail {

/// Whether `Layer` has `token_stride()`, i.e. holds each head as one strided matrix (HostLayer,
/// LayerView); a layer without it (PagedLayer) is read row by row.
template <class Layer, class = void>
struct HasTokenStride : std::false_type {};
template <class Layer>
struct HasTokenStride<Layer, std::void_t<decltype(std::declval<const Layer&>().token_stride())>> : std::true_type {};

/// Charges wall-clock time (steady clock) to the phases of an `EngineStats`: the time from the
/// construction, or from the last `to`, until the next `to` or the end of the scope goes to the
/// current phase. Does nothing when `stats` is null.
///
/// @code
/// detail::PhaseTimer timer(stats, &EngineStats::other_s);   // norms ...
/// timer.to(&EngineStats::matmul_s);                          // ... then products, to the scope's end
/// @endcode
class PhaseTimer {
 public:
  using Phase = double EngineStats::*;
  PhaseTimer(EngineStats* stats, Phase phase) : stats_(stats), phase_(phase) {
    if (stats_) t0_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() { charge(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  /// Ends the current phase and starts `phase`.
  void to(Phase phase) {
    charge();
    phase_ = phase;
  }

 private:
  void charge() {
    if (!stats_) return;
    const auto t = std::chrono::steady_clock::now();
    stats_->*phase_ += std::chrono::duration<double>(t - t0_).count();
    t0_ = t;
  }

  EngineStats* stats_;
  Phase phase_;
  std::chrono::steady_clock::time_point t0_{};
};

/// Whether `T` is a KV element type the engine reads (float, Eigen::half, Eigen::bfloat16).
template <class T>
struct IsKvScalar
    : std::bool_constant<std::is_same<T, float>::value || std::is_same<T, Eigen::half>::value ||
                         std::is_same<T, Eigen::bfloat16>::value> {};

/// Whether a layer type takes its rows from a block pool (`blocks_for_tokens(n)` and `pool()`
/// with `num_free()`, as `PagedLayer` does).
template <class L, class = void>
struct HasBlockPool : std::false_type {};
template <class L>
struct HasBlockPool<L, std::void_t<decltype(std::declval<const L&>().blocks_for_tokens(1)),
                                   decltype(std::declval<const L&>().pool().num_free())>> : std::true_type {};

/// Whether a layer type has a fixed number of slots per head (`capacity()` and no `reserve(int)`
/// to grow it, as `LayerView` over engine-owned memory).
template <class L, class = void>
struct Grows : std::false_type {};
template <class L>
struct Grows<L, std::void_t<decltype(std::declval<L&>().reserve(1))>> : std::true_type {};
template <class L, class = void>
struct HasFixedCapacity : std::false_type {};
template <class L>
struct HasFixedCapacity<L, std::void_t<decltype(std::declval<const L&>().capacity())>>
    : std::bool_constant<!Grows<L>::value> {};

}  // namespace detail

/// Options of one forward call (prefill, teacher forcing, decode). A ForwardOptions is a
/// `CpuOptions`: `n_threads` (threads of this call's products and attention heads: 0 = all cores,
/// 1 = the calling thread; the quantized products, the attention and the observer's probability
/// rows run on `pool`, or the engine's own `ThreadPool` when it is null, the float products on
/// OpenMP teams by `num_threads` clauses; products below
/// `LlamaEngine::kParallelGemmWork` multiply-adds (one-row products: `kParallelGemvWork`) and
/// attention below `LlamaEngine::kParallelWork` always run single-threaded, a fork-join costs more
/// than it saves there) and `max_simd_level`
/// (the quantized products' instruction set). Every thread count and level gives the same bytes.
struct ForwardOptions : CpuOptions {
  /// Tokens per chunk: the call is processed in chunks of at most this many tokens, each chunk
  /// through all layers before the next starts (>= 1; the DepthKV paper uses 1024).
  int chunk_size = 1024;
  /// Return the logits of every token (true) or only of the last one (false: a 1-row matrix).
  bool all_logits = true;
  /// Receives the attention probabilities of every layer and query head (optional).
  AttentionObserver observer;
  /// The observer receives only the query rows at positions >= this (0: every row), e.g. a
  /// SnapKV observation window, the last w positions of a prompt: the other rows' attention is
  /// computed without forming their probabilities.
  std::int32_t observe_from = 0;
  /// Called after each chunk with the number of tokens of this call processed so far and the
  /// next sequence position, e.g. to score and evict (optional). The cache may be modified.
  std::function<void(int tokens_done, std::int32_t next_pos)> after_chunk;
  /// Receives hidden states (optional); `capture_points` selects which (bit i = CapturePoint i).
  ActivationHook capture;
  unsigned capture_points = ~0u;
  /// Accumulates timings (optional).
  EngineStats* stats = nullptr;
};

/// Bit of `point` for `ForwardOptions::capture_points`.
inline unsigned capture_bit(CapturePoint point) { return 1u << static_cast<unsigned>(point); }

/// The reference Llama forward pass over a depthkv KV cache. Holds a reference to the model
/// (which must outlive it) and a `ThreadPool` for its quantized products and attention (workers
/// started by the first call that needs them, asleep between calls; copies share it), and no
/// other state: one engine can serve several caches, and const calls on different caches may run
/// concurrently (a call that finds the pool busy with another call's loop runs that loop on its
/// own thread).
///
/// @code
/// LlamaEngine engine(model);
/// HostCache cache = engine.make_cache();
/// ForwardOptions opt;
/// opt.observer = [&](int l, int q, std::int32_t p0, int nq, const float* pr, int ld, int n) {
///   scorers[l].observe_block(q, p0, nq, pr, ld, n);
/// };
/// RowMatrix logits = engine.prefill(context, 0, cache, opt);
/// // ... score, allocate, evict ...
/// RowMatrix cont_logits = engine.teacher_force(continuation, static_cast<int>(context.size()), cache);
/// @endcode
class LlamaEngine {
 public:
  /// @param model weights (not copied; must outlive the engine)
  /// @throws Error when the weight shapes do not match the configuration
  explicit LlamaEngine(const LlamaModel& model) : model_(model) { validate(model); }
  /// The engine references the model: a temporary would dangle.
  explicit LlamaEngine(LlamaModel&&) = delete;

  const LlamaModel& model() const { return model_; }
  const LlamaConfig& config() const { return model_.config; }

  /// An empty cache with one `HostLayer<T>` per layer (`make_cache()`: float32 keys and values,
  /// `make_cache<Eigen::half>()`: F16, as llama.cpp's default cache holds them; see `KvType`).
  /// @tparam T float, Eigen::half or Eigen::bfloat16
  /// @param capacity initial slots per head (grown on demand)
  template <class T = float>
  KVCache<HostLayer<T>> make_cache(int capacity = 0) const {
    static_assert(detail::IsKvScalar<T>::value, "KV elements are float, Eigen::half or Eigen::bfloat16");
    KVCache<HostLayer<T>> cache;
    for (int l = 0; l < config().n_layers; ++l)
      cache.add_layer(HostLayer<T>(config().n_kv_heads, config().head_dim, capacity));
    return cache;
  }

  /// Runs `n` tokens at positions `pos0..pos0+n-1` through the model, appending their keys and
  /// values to `cache`, in chunks of `opt.chunk_size`.
  /// @param tokens token ids in `[0, vocab_size)`
  /// @param n number of tokens (>= 1)
  /// @param pos0 sequence position of `tokens[0]` (must exceed every position held)
  /// @param cache one layer per model layer with the model's KV-head count and head size
  /// @return logits `[n x vocab]`, or `[1 x vocab]` of the last token when `!opt.all_logits`
  /// @throws Error on bad token ids, positions, options or a cache of the wrong shape, or when a
  ///   layer's residual stream or the logits hold an inf or NaN (the message names the layer and
  ///   the position); on any error (also from `opt`'s observer or hook) the slots this call
  ///   appended are removed again, so `cache` holds what it held before (less what `after_chunk`
  ///   evicted)
  template <class Layer>
  RowMatrix forward(const int* tokens, int n, std::int32_t pos0, KVCache<Layer>& cache,
                    const ForwardOptions& opt = ForwardOptions()) const {
    DEPTHKV_CHECK(n >= 1, "need at least one token, got " << n);
    DEPTHKV_CHECK(pos0 >= 0, "pos0 must be >= 0, got " << pos0);
    DEPTHKV_CHECK(opt.chunk_size >= 1, "chunk_size must be >= 1, got " << opt.chunk_size);
    opt.validate();
    DEPTHKV_CHECK(static_cast<std::int64_t>(pos0) + n - 1 <= std::numeric_limits<std::int32_t>::max(),
                  "positions " << pos0 << " + " << n << " overflow int32");
    check_cache(cache);
    // Validate everything before the cache is touched.
    for (int i = 0; i < n; ++i)
      DEPTHKV_CHECK(tokens[i] >= 0 && tokens[i] < config().vocab_size,
                    "token " << tokens[i] << " at index " << i << " outside [0, " << config().vocab_size << ")");
    check_step(tokens[0], pos0, cache);
    check_room(cache, tokens_held(n, opt.chunk_size));
    const int vocab = config().vocab_size;
    RowMatrix out(opt.all_logits ? n : 1, vocab);
    try {
      for (int c0 = 0; c0 < n; c0 += opt.chunk_size) {
        const int t = std::min(opt.chunk_size, n - c0);
        const std::int32_t p0 = pos0 + c0;
        if (!opt.observer) drop_outside_window(cache, p0, pos0);  // this call's slots no query from p0 on sees
        RowMatrix x = embed(tokens + c0, t, opt.stats);
        for (int l = 0; l < config().n_layers; ++l) forward_layer(l, x, p0, cache.layer(l), opt);
        if (opt.all_logits) {
          out.middleRows(c0, t) = logits(x, opt.stats, p0, opt);
          check_finite(out.middleRows(c0, t), p0, "the logits");
        } else if (c0 + t == n) {
          RowMatrix last = x.bottomRows(1);
          out = logits(last, opt.stats, p0 + t - 1, opt);
          check_finite(out, p0 + t - 1, "the logits");
        }
        if (opt.stats) opt.stats->tokens += t;
        if (opt.after_chunk) opt.after_chunk(c0 + t, p0 + t);
      }
    } catch (...) {
      drop_from(cache, pos0);
      throw;
    }
    if (!opt.observer) drop_outside_window(cache, pos0 + n, std::numeric_limits<std::int32_t>::min());
    return out;
  }

  /// Frees the slots (a paged layer: and the blocks) of every sliding-window layer
  /// (`LlamaConfig::window`) that no query at a position >= `next_pos` can see (positions <=
  /// next_pos - window), of those at positions >= `from` (older slots are kept). A no-op for
  /// global layers. Without an observer, `forward` calls it before each chunk for the call's own
  /// slots and after the call for all, so between calls a local layer holds at most window - 1
  /// slots per head, and during a call at most window - 1 + the chunk (plus the window - 1 held
  /// before the call, freed when it returns: on an error the cache is as before the call). With
  /// an observer the slots stay: whoever observes keeps per-slot state (a `TokenScorer`) that
  /// must shrink with the layer, so it frees them itself (`drop_outside_windows`,
  /// eviction_schedule.hpp, which `EvictionSchedule` and `score_and_evict` call); attention
  /// applies the window by stored positions either way.
  template <class Layer>
  void drop_outside_window(KVCache<Layer>& cache, std::int64_t next_pos, std::int32_t from) const {
    std::vector<std::int32_t> kept;
    for (int l = 0; l < cache.n_layers(); ++l) {
      const int w = config().window(l);
      if (w <= 0) continue;
      Layer& L = cache.layer(l);
      for (int h = 0; h < L.n_kv_heads(); ++h) drop_positions(L, h, from, next_pos - w, kept);
      if constexpr (detail::HasBlockPool<Layer>::value) L.shrink_to_fit();  // the freed blocks go back to the pool
    }
  }

  /// Requires every value of `rows` (rows of positions `pos0, pos0 + 1, ...`) to be finite.
  /// @param what what the rows are, e.g. "layer 3: the residual stream"
  /// @throws Error naming `what` and the first position holding an inf or NaN (e.g. weights that
  ///   are finite but so large that the products overflow float)
  template <class Derived>
  static void check_finite(const Eigen::MatrixBase<Derived>& rows, std::int64_t pos0, const std::string& what) {
    if (rows.allFinite()) return;
    Eigen::Index r = 0;
    while (r + 1 < rows.rows() && rows.row(r).allFinite()) ++r;
    DEPTHKV_FAIL(what << " at position " << pos0 + r
                      << ": inf or NaN (the model's weights or activations overflow float)");
  }

  /// `forward` over a vector of tokens.
  template <class Layer>
  RowMatrix forward(const std::vector<int>& tokens, std::int32_t pos0, KVCache<Layer>& cache,
                    const ForwardOptions& opt = ForwardOptions()) const {
    DEPTHKV_CHECK(!tokens.empty(), "no tokens");
    return forward(tokens.data(), static_cast<int>(tokens.size()), pos0, cache, opt);
  }

  /// Prefill: the prompt at positions `pos0..pos0+n-1` (0 for a new sequence) into an empty (or
  /// continued) cache, as batched matrix products in chunks, with optional attention observation
  /// and per-chunk hook. The arguments are in the order of `forward` and `teacher_force`.
  /// @return logits `[n x vocab]` (or of the last token only, see `ForwardOptions::all_logits`)
  /// @throws Error as `forward`
  template <class Layer>
  RowMatrix prefill(const std::vector<int>& prompt, std::int32_t pos0, KVCache<Layer>& cache,
                    const ForwardOptions& opt = ForwardOptions()) const {
    return forward(prompt, pos0, cache, opt);
  }

  /// One decode step: `token` at position `pos`, appended to the cache.
  /// @param cpu threads and instruction-set cap of the step
  /// @return the next-token logits `[vocab]`
  /// @throws Error as `forward`
  template <class Layer>
  Eigen::VectorXf decode(int token, std::int32_t pos, KVCache<Layer>& cache, EngineStats* stats = nullptr,
                         const CpuOptions& cpu = CpuOptions()) const {
    ForwardOptions opt;
    static_cast<CpuOptions&>(opt) = cpu;
    opt.stats = stats;
    RowMatrix l = forward(&token, 1, pos, cache, opt);
    return l.row(0).transpose();
  }

  /// Teacher forcing: runs `tokens` (e.g. a continuation) at positions `pos0, pos0+1, ...` over
  /// the (possibly pruned) cache, appending them, and returns the logits of every position
  /// (row i predicts the token after `tokens[i]`).
  /// @throws Error as `forward`
  template <class Layer>
  RowMatrix teacher_force(const std::vector<int>& tokens, std::int32_t pos0, KVCache<Layer>& cache,
                          ForwardOptions opt = ForwardOptions()) const {
    opt.all_logits = true;
    return forward(tokens, pos0, cache, opt);
  }

  /// One decode step of S sequences at once: `tokens[s]` at position `positions[s]` appended to
  /// `*caches[s]`, each sequence at its own position. The products run once over the S rows (the
  /// step reads each weight matrix once for all), the attention per sequence on its own cache
  /// (`forward_layer_batch`). `per_seq` (empty, or one per sequence) gives sequence s's
  /// `observer` and `observe_from`; `opt` the threads, SIMD cap and stats (its observer, capture,
  /// chunking and hook are not read). Row s equals `forward` of that token alone on its cache up
  /// to the rounding of products over more rows. A sliding-window layer of a sequence without an
  /// observer frees the slots that left its window, as `forward` does.
  /// @return logits `[S x vocab]`, row s of sequence s
  /// @throws Error on no sequence, sizes that differ, a cache given twice, or what `forward`
  ///   refuses for any sequence (caches sharing a pool need their blocks together); on any error
  ///   every cache holds what it held before
  template <class Layer>
  RowMatrix decode_batch(const std::vector<int>& tokens, const std::vector<std::int32_t>& positions,
                         const std::vector<KVCache<Layer>*>& caches, const ForwardOptions& opt = ForwardOptions(),
                         const std::vector<ForwardOptions>& per_seq = {}) const {
    const int S = static_cast<int>(caches.size());
    check_decode_batch(tokens, positions, caches, per_seq);
    opt.validate();
    const std::vector<const KVCache<Layer>*> held(caches.begin(), caches.end());
    check_room(held, tokens_held(1, 1));
    RowMatrix x = embed(tokens.data(), S, opt.stats);
    std::vector<Layer*> kvs(caches.size());
    try {
      for (int l = 0; l < config().n_layers; ++l) {
        for (int s = 0; s < S; ++s) kvs[static_cast<std::size_t>(s)] = &caches[static_cast<std::size_t>(s)]->layer(l);
        forward_layer_batch(l, x, positions, kvs, opt, per_seq);
      }
      x = logits(x, opt.stats, positions.front(), opt);
      for (int s = 0; s < S; ++s) check_finite(x.row(s), positions[static_cast<std::size_t>(s)], "the logits of sequence " + std::to_string(s));
    } catch (...) {
      for (int s = 0; s < S; ++s) drop_from(*caches[static_cast<std::size_t>(s)], positions[static_cast<std::size_t>(s)]);
      throw;
    }
    for (int s = 0; s < S; ++s)
      if (per_seq.empty() || !per_seq[static_cast<std::size_t>(s)].observer)
        drop_outside_window(*caches[static_cast<std::size_t>(s)], positions[static_cast<std::size_t>(s)] + 1,
                            std::numeric_limits<std::int32_t>::min());
    if (opt.stats) opt.stats->tokens += S;
    return x;
  }

  // ---- building blocks (used by the evaluation helpers; usable for custom pipelines) ----

  /// Embedding rows of `n` tokens `[n x dim]`.
  /// @throws Error on a token id outside `[0, vocab_size)`
  RowMatrix embed(const int* tokens, int n, EngineStats* stats = nullptr) const {
    detail::PhaseTimer timer(stats, &EngineStats::other_s);
    RowMatrix x(n, config().dim);
    for (int i = 0; i < n; ++i) {
      DEPTHKV_CHECK(tokens[i] >= 0 && tokens[i] < config().vocab_size,
                    "token " << tokens[i] << " at index " << i << " outside [0, " << config().vocab_size << ")");
      if (model_.token_embedding_quant.empty()) {
        x.row(i) = model_.token_embedding.row(tokens[i]);
      } else {
        const QuantWeight& e = model_.token_embedding_quant;
        dequantize_row(e.type, e.data + static_cast<std::size_t>(tokens[i]) * e.row_bytes, x.row(i).data(), e.cols);
      }
    }
    if (config().embedding_scale != 1.0f) x *= config().embedding_scale;
    return x;
  }

  /// Final RMSNorm and classifier of residual-stream rows `x` `[T x dim]`.
  /// @param pos0 the position of the first row (for errors)
  /// @param cpu threads and instruction-set cap of the classifier product
  /// @return logits `[T x vocab]`
  /// @throws Error when a row overflows float in the norm (`rmsnorm`)
  RowMatrix logits(const RowMatrix& x, EngineStats* stats = nullptr, std::int64_t pos0 = 0,
                   const CpuOptions& cpu = CpuOptions()) const {
    detail::PhaseTimer timer(stats, &EngineStats::other_s);
    RowMatrix xn = rmsnorm(x, model_.final_norm, pos0);
    timer.to(&EngineStats::matmul_s);
    RowMatrix out(x.rows(), config().vocab_size);
    linear(model_.classifier, model_.classifier_quant, xn, out, cpu);
    return out;
  }

  /// Runs layer `l` on residual-stream rows `x` `[T x dim]` (in place) for positions
  /// `pos0..pos0+T-1`, appending their K/V to `kv` (that layer's storage) and attending to all
  /// slots it holds. `opt.observer`, `opt.capture` and `opt.stats` are used; the chunking and
  /// the hook are not (the caller chunks).
  /// @throws Error on a layer storage of the wrong shape or non-increasing positions, or when its
  ///   output holds an inf or NaN (naming the layer and position; the K/V it appended are removed)
  template <class Layer>
  void forward_layer(int l, RowMatrix& x, std::int32_t pos0, Layer& kv, const ForwardOptions& opt = ForwardOptions()) const {
    forward_layer_batch(l, x, pos0, std::vector<Layer*>{&kv}, opt);
  }

  /// `forward_layer` for S = `kvs.size()` sequences at once: `x` `[S*T x dim]` holds S blocks
  /// of T rows, block s the rows of the sequence whose layer-`l` storage is `*kvs[s]`, every
  /// sequence at positions `pos0..pos0+T-1`. The products run once over all S*T rows (one pass
  /// over each weight matrix), the attention per sequence. Each block's result is what
  /// `forward_layer` gives for it alone, up to the rounding of products over more rows.
  /// `opt.observer` and `opt.capture` are used only with one sequence.
  /// @throws Error on no sequence, a row count that is not a multiple of S, a storage given
  ///   twice, an observer or capture with several sequences, or `forward_layer`'s errors; on any
  ///   error every storage holds what it held before
  template <class Layer>
  void forward_layer_batch(int l, RowMatrix& x, std::int32_t pos0, const std::vector<Layer*>& kvs,
                           const ForwardOptions& opt = ForwardOptions()) const {
    forward_layer_batch(l, x, std::vector<std::int32_t>(kvs.size(), pos0), kvs, opt);
  }
  /// `forward_layer_batch` with each sequence at its own positions: block s at `pos0[s]..pos0[s]+T-1`,
  /// and (when `per_seq` is not empty, one entry per sequence) observed by `per_seq[s].observer`
  /// from `per_seq[s].observe_from` on (only those two fields are read).
  /// @throws Error as above, or on `pos0` or `per_seq` of another size than `kvs`
  template <class Layer>
  void forward_layer_batch(int l, RowMatrix& x, const std::vector<std::int32_t>& pos0, const std::vector<Layer*>& kvs,
                           const ForwardOptions& opt, const std::vector<ForwardOptions>& per_seq = {}) const {
    static_assert(detail::IsKvScalar<typename Layer::Scalar>::value,
                  "LlamaEngine stores keys and values as float, Eigen::half or Eigen::bfloat16");
    check_batch(l, x, kvs, opt, pos0.size(), per_seq.size());
    const LlamaConfig& c = config();
    const int S = static_cast<int>(kvs.size());
    const LlamaLayerWeights& w = model_.layers[static_cast<std::size_t>(l)];
    const int N = static_cast<int>(x.rows()), T = N / S;
    const int hd = c.head_dim;
    const int q_dim = c.n_heads * hd;
    const int kv_dim = c.n_kv_heads * hd;
    auto cap = [&](CapturePoint p, const RowMatrix& m) {
      if (opt.capture && (opt.capture_points & capture_bit(p))) opt.capture(l, p, pos0.front(), m);
    };
    detail::PhaseTimer timer(opt.stats, &EngineStats::other_s);

    cap(CapturePoint::kLayerInput, x);
    RowMatrix xn = rmsnorm(x, w.attn_norm, pos0.front(), l);
    cap(CapturePoint::kAttnInput, xn);

    timer.to(&EngineStats::matmul_s);
    RowMatrix q(N, q_dim), k(N, kv_dim), v(N, kv_dim);
    linear_many({{&w.wq, &w.wq_quant, &q}, {&w.wk, &w.wk_quant, &k}, {&w.wv, &w.wv_quant, &v}}, xn, opt);

    timer.to(&EngineStats::other_s);
    if (w.bq.size()) q.rowwise() += w.bq.transpose();
    if (w.bk.size()) k.rowwise() += w.bk.transpose();
    if (w.bv.size()) v.rowwise() += w.bv.transpose();
    if (w.q_norm.size()) head_rmsnorm(q, c.n_heads, w.q_norm);
    if (w.k_norm.size()) head_rmsnorm(k, c.n_kv_heads, w.k_norm);
    apply_rope(q, c.n_heads, pos0, T, l);
    apply_rope(k, c.n_kv_heads, pos0, T, l);
    std::vector<std::vector<int>> size_before(static_cast<std::size_t>(S));
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < c.n_kv_heads; ++h)
        size_before[static_cast<std::size_t>(s)].push_back(kvs[static_cast<std::size_t>(s)]->size(h));
    try {
      for (int s = 0; s < S; ++s)
        for (int i = 0; i < T; ++i)
          kvs[static_cast<std::size_t>(s)]->append(k.row(s * T + i).data(), v.row(s * T + i).data(),
                                                   pos0[static_cast<std::size_t>(s)] + i);
      attend_and_mlp(l, x, q, pos0, kvs, size_before, opt, per_seq, timer);
    } catch (...) {  // e.g. activations that overflow: the K/V appended above are removed again
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < c.n_kv_heads; ++h)
          keep_prefix(*kvs[static_cast<std::size_t>(s)], h,
                      size_before[static_cast<std::size_t>(s)][static_cast<std::size_t>(h)]);
      throw;
    }
  }

 private:
  // `decode_batch`'s checks of its arguments, before any cache is touched.
  template <class Layer>
  void check_decode_batch(const std::vector<int>& tokens, const std::vector<std::int32_t>& positions,
                          const std::vector<KVCache<Layer>*>& caches, const std::vector<ForwardOptions>& per_seq) const {
    const std::size_t S = caches.size();
    DEPTHKV_CHECK(S >= 1 && tokens.size() == S && positions.size() == S && (per_seq.empty() || per_seq.size() == S),
                  "decode_batch: " << S << " caches, " << tokens.size() << " tokens, " << positions.size()
                                   << " positions and " << per_seq.size() << " observers");
    for (std::size_t s = 0; s < S; ++s) {
      DEPTHKV_CHECK(caches[s] != nullptr, "decode_batch: sequence " << s << " has no cache");
      for (std::size_t u = 0; u < s; ++u)
        DEPTHKV_CHECK(caches[u] != caches[s], "decode_batch: sequences " << u << " and " << s << " share a cache");
      check_cache(*caches[s]);
      check_step(tokens[s], positions[s], *caches[s]);
    }
  }

  // A token appended at `pos0` (the first of a call) to `cache`: a valid id, and `pos0` after every
  // position the cache holds.
  template <class Layer>
  void check_step(int token, std::int32_t pos0, const KVCache<Layer>& cache) const {
    DEPTHKV_CHECK(pos0 >= 0, "pos0 must be >= 0, got " << pos0);
    DEPTHKV_CHECK(token >= 0 && token < config().vocab_size,
                  "token " << token << " outside [0, " << config().vocab_size << ")");
    for (int l = 0; l < cache.n_layers(); ++l)
      for (int h = 0; h < config().n_kv_heads; ++h) {
        const Layer& L = cache.layer(l);
        const int sz = L.size(h);
        DEPTHKV_CHECK(sz == 0 || L.positions(h)[sz - 1] < pos0,
                      "layer " << l << " head " << h << " already holds position " << L.positions(h)[sz - 1]
                               << ", new tokens start at " << pos0);
      }
  }

  // `forward_layer_batch`'s checks of its arguments.
  template <class Layer>
  void check_batch(int l, const RowMatrix& x, const std::vector<Layer*>& kvs, const ForwardOptions& opt,
                   std::size_t n_pos0, std::size_t n_per_seq) const {
    const LlamaConfig& c = config();
    const int S = static_cast<int>(kvs.size());
    DEPTHKV_CHECK(n_pos0 == kvs.size() && (n_per_seq == 0 || n_per_seq == kvs.size()),
                  kvs.size() << " sequences with " << n_pos0 << " positions and " << n_per_seq << " observers");
    DEPTHKV_CHECK(l >= 0 && l < c.n_layers, "layer " << l << " outside [0, " << c.n_layers << ")");
    DEPTHKV_CHECK(x.cols() == c.dim, "activations have " << x.cols() << " columns, model dim is " << c.dim);
    DEPTHKV_CHECK(S >= 1 && x.rows() % S == 0,
                  x.rows() << " activation rows do not split into " << S << " sequences of equal length");
    DEPTHKV_CHECK(S == 1 || (!opt.observer && !opt.capture), "an observer or capture hook takes one sequence, got " << S);
    for (int s = 0; s < S; ++s) {
      const Layer* kv = kvs[static_cast<std::size_t>(s)];
      DEPTHKV_CHECK(kv != nullptr, "sequence " << s << " has no layer storage");
      DEPTHKV_CHECK(kv->n_kv_heads() == c.n_kv_heads && kv->head_dim() == c.head_dim,
                    "layer " << l << " storage is [" << kv->n_kv_heads() << " heads][" << kv->head_dim()
                             << "], model needs [" << c.n_kv_heads << "][" << c.head_dim << "]");
      for (int u = 0; u < s; ++u)
        DEPTHKV_CHECK(kvs[static_cast<std::size_t>(u)] != kv, "sequences " << u << " and " << s << " share a storage");
    }
  }

  // The rest of `forward_layer_batch` after its K/V were appended.
  template <class Layer>
  void attend_and_mlp(int l, RowMatrix& x, const RowMatrix& q, const std::vector<std::int32_t>& pos0,
                      const std::vector<Layer*>& kvs, const std::vector<std::vector<int>>& size_before,
                      const ForwardOptions& opt, const std::vector<ForwardOptions>& per_seq,
                      detail::PhaseTimer& timer) const {
    const LlamaConfig& c = config();
    const LlamaLayerWeights& w = model_.layers[static_cast<std::size_t>(l)];
    const int S = static_cast<int>(kvs.size()), N = static_cast<int>(x.rows()), T = N / S;
    const int q_dim = c.n_heads * c.head_dim;
    auto cap = [&](CapturePoint p, const RowMatrix& m) {
      if (opt.capture && (opt.capture_points & capture_bit(p))) opt.capture(l, p, pos0.front(), m);
    };
    timer.to(&EngineStats::attention_s);
    RowMatrix att(N, q_dim);
    std::optional<ForwardOptions> seq_opt;  // sequence s's observer (`per_seq`)
    if (!per_seq.empty()) seq_opt = opt;
    RowMatrix qs, as;  // S > 1 only
    for (int s = 0; s < S; ++s) {  // one sequence's rows at a time: each reads its own cache
      const std::size_t u = static_cast<std::size_t>(s);
      if (seq_opt) {
        seq_opt->observer = per_seq[u].observer;
        seq_opt->observe_from = per_seq[u].observe_from;
      }
      const ForwardOptions& o = seq_opt ? *seq_opt : opt;
      if (S == 1) {
        attention(l, q, *kvs.front(), size_before.front(), pos0.front(), att, o);
        break;
      }
      qs = q.middleRows(static_cast<Eigen::Index>(s) * T, T);
      as.resize(T, q_dim);
      attention(l, qs, *kvs[u], size_before[u], pos0[u], as, o);
      att.middleRows(static_cast<Eigen::Index>(s) * T, T) = as;
    }

    timer.to(&EngineStats::matmul_s);
    RowMatrix o(N, c.dim);
    linear(w.wo, w.wo_quant, att, o, opt);

    timer.to(&EngineStats::other_s);
    if (w.attn_post_norm.size()) o = rmsnorm(o, w.attn_post_norm, pos0.front(), l);
    cap(CapturePoint::kAttnOutput, o);
    x += o;
    cap(CapturePoint::kAttnResidual, x);
    RowMatrix xn = rmsnorm(x, w.ffn_norm, pos0.front(), l);

    timer.to(&EngineStats::matmul_s);
    RowMatrix h1(N, c.hidden_dim), h3(N, c.hidden_dim);
    linear_many({{&w.w1, &w.w1_quant, &h1}, {&w.w3, &w.w3_quant, &h3}}, xn, opt);
    gate(h1, h3);
    linear(w.w2, w.w2_quant, h1, o, opt);

    timer.to(&EngineStats::other_s);
    if (w.ffn_post_norm.size()) o = rmsnorm(o, w.ffn_post_norm, pos0.front(), l);
    cap(CapturePoint::kMlpOutput, o);
    x += o;
    for (int s = 0; s < S; ++s)
      check_finite(x.middleRows(static_cast<Eigen::Index>(s) * T, T), pos0[static_cast<std::size_t>(s)],
                   "layer " + std::to_string(l) + ": the residual stream" +
                       (S > 1 ? " of sequence " + std::to_string(s) : std::string()));
    cap(CapturePoint::kLayerOutput, x);
  }

  // h1 = act(h1) * h3 elementwise, act the model's FFN activation.
  void gate(RowMatrix& h1, const RowMatrix& h3) const {
    if (config().ffn_activation == FfnActivation::kGeluTanh) {  // Eigen's vectorized tanh (rational approximation)
      const float c = std::sqrt(2.0f / 3.14159265358979f);
      const auto g = h1.array();
      h1.array() = 0.5f * g * (1.0f + (c * (g + 0.044715f * g.cube())).tanh()) * h3.array();
      return;
    }
    for (Eigen::Index i = 0; i < h1.size(); ++i) {
      float g = h1.data()[i];
      g *= 1.0f / (1.0f + std::exp(-g));
      h1.data()[i] = g * h3.data()[i];
    }
  }

 public:
  /// RMSNorm of each row: `w * x / sqrt(mean(x^2) + eps)` (as llama2.c computes it).
  /// @param pos0, layer where the rows are, for the error (layer -1: the final norm)
  /// @throws Error naming the layer and position when a row's sum of squares overflows float
  ///   (finite values so large that the norm would silently make them 0)
  RowMatrix rmsnorm(const RowMatrix& x, const Eigen::VectorXf& weight, std::int64_t pos0 = 0, int layer = -1) const {
    RowMatrix out(x.rows(), x.cols());
    const float eps = config().rms_eps;
    for (Eigen::Index i = 0; i < x.rows(); ++i) {
      float ss = x.row(i).squaredNorm();
      DEPTHKV_CHECK(std::isfinite(ss), (layer >= 0 ? "layer " + std::to_string(layer) : std::string("the final norm"))
                                           << ": the residual stream at position " << pos0 + i
                                           << " overflows float in RMSNorm (its sum of squares is not finite): the "
                                              "model's weights or activations are too large");
      ss /= static_cast<float>(x.cols());
      ss += eps;
      ss = 1.0f / std::sqrt(ss);
      out.row(i) = weight.transpose().cwiseProduct(ss * x.row(i));
    }
    return out;
  }

  /// RMSNorm of each of the `n_heads` head segments of every row of `m` `[T x n_heads*head_dim]`:
  /// `v * w / sqrt(mean(v^2) + rms_eps)` per segment (qwen3's q/k norms).
  void head_rmsnorm(RowMatrix& m, int n_heads, const Eigen::VectorXf& w) const {
    const int hd = config().head_dim;
    for (Eigen::Index r = 0; r < m.rows(); ++r)
      for (int h = 0; h < n_heads; ++h) {
        auto seg = m.row(r).segment(static_cast<Eigen::Index>(h) * hd, hd);
        const float inv = 1.0f / std::sqrt(seg.squaredNorm() / static_cast<float>(hd) + config().rms_eps);
        seg = (seg.array() * w.transpose().array() * inv).matrix();
      }
  }

  /// Rotates the `n_heads` head segments of each row of `m` `[T x n_heads*head_dim]` by RoPE
  /// for positions `pos0 + row` (`pos0 + row % period` with a `period` > 0: blocks of `period`
  /// rows of several sequences at the same positions): llama2.c pairing (2i, 2i+1) or NeoX halves (i, i + head_dim/2)
  /// when `config().rope_neox`; angle `pos * rope_freq_scale * theta^(-2i/head_dim)`, divided by
  /// `rope_freq_factors[i]` when the model has them. Layer `layer`'s base and scale: a local
  /// layer (`LlamaConfig::is_local`) uses `rope_theta_local` and `rope_freq_scale_local`.
  void apply_rope(RowMatrix& m, int n_heads, std::int32_t pos0, int period = 0, int layer = -1) const {
    const int p = period > 0 ? period : static_cast<int>(std::max<Eigen::Index>(1, m.rows()));
    apply_rope(m, n_heads, std::vector<std::int32_t>(static_cast<std::size_t>((m.rows() + p - 1) / p), pos0),
               p, layer);
  }
  /// `apply_rope` for blocks of `period` rows each at its own first position: row r at position
  /// `pos0[r / period] + r % period` (several sequences, each at its own position).
  void apply_rope(RowMatrix& m, int n_heads, const std::vector<std::int32_t>& pos0, int period,
                  int layer) const {
    const LlamaConfig& c = config();
    const int hd = c.head_dim;
    const int half = hd / 2;
    const bool local = c.is_local(layer);
    const float theta = local ? c.rope_theta_local : c.rope_theta;
    const float fscale = local ? c.rope_freq_scale_local : c.rope_freq_scale;
    std::vector<float> freq(static_cast<std::size_t>(half));
    for (int i = 0; i < half; ++i) {
      float f = fscale / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hd));
      if (model_.rope_freq_factors.size()) f /= model_.rope_freq_factors[i];
      freq[static_cast<std::size_t>(i)] = f;
    }
    std::vector<float> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
    for (Eigen::Index r = 0; r < m.rows(); ++r) {
      const float pos = static_cast<float>(pos0[static_cast<std::size_t>(r / period)] +
                                           static_cast<std::int32_t>(r % period));
      for (int i = 0; i < half; ++i) {
        const float val = pos * freq[static_cast<std::size_t>(i)];
        cs[static_cast<std::size_t>(i)] = std::cos(val);
        sn[static_cast<std::size_t>(i)] = std::sin(val);
      }
      float* row = m.row(r).data();
      for (int h = 0; h < n_heads; ++h) {
        float* v = row + static_cast<std::ptrdiff_t>(h) * hd;
        for (int i = 0; i < half; ++i) {
          const int a = c.rope_neox ? i : 2 * i;
          const int b = c.rope_neox ? i + half : 2 * i + 1;
          const float v0 = v[a], v1 = v[b];
          const float fc = cs[static_cast<std::size_t>(i)], fs = sn[static_cast<std::size_t>(i)];
          v[a] = v0 * fc - v1 * fs;
          v[b] = v0 * fs + v1 * fc;
        }
      }
    }
  }

  /// Paged layers (a `blocks_for_tokens(n)` and a `pool()`): every pool must have the free
  /// blocks that its layers take to append `n` tokens, checked before any layer is touched (an
  /// append that found its pool short half-way through the layers would leave the sequence's
  /// layers at different lengths). Layers of a fixed capacity (`LayerView`): every head must have
  /// `n` free slots. Growing layers (`HostLayer`): nothing to check. Pools shared with sequences
  /// that other threads run at the same time can still run short between this check and the
  /// appends: the caller's admission must then reserve the blocks.
  /// @throws Error ("pool exhausted", or a full head) naming what is needed and free; the cache
  ///   is unchanged
  template <class Layer>
  static void check_room(const KVCache<Layer>& cache, int n) {
    check_room(cache, std::vector<int>(static_cast<std::size_t>(cache.n_layers()), n));
  }

  /// The most slots a `forward` of `n` tokens in chunks of `chunk` adds to each layer at once:
  /// `n`, or for a sliding-window layer at most window - 1 + chunk (it frees the call's slots
  /// that leave the window before each chunk).
  std::vector<int> tokens_held(int n, int chunk) const {
    std::vector<int> out(static_cast<std::size_t>(config().n_layers), n);
    for (int l = 0; l < config().n_layers; ++l)
      if (config().is_local(l))
        out[static_cast<std::size_t>(l)] =
            static_cast<int>(std::min<std::int64_t>(n, static_cast<std::int64_t>(config().window(l)) - 1 + chunk));
    return out;
  }

  /// `check_room` with a count per layer (`tokens_held`).
  template <class Layer>
  static void check_room(const KVCache<Layer>& cache, const std::vector<int>& per_layer) {
    check_room(std::vector<const KVCache<Layer>*>{&cache}, per_layer);
  }
  /// `check_room` for several caches appended at once (a batched step): caches that share a pool
  /// need the sum of their blocks.
  template <class Layer>
  static void check_room(const std::vector<const KVCache<Layer>*>& caches, const std::vector<int>& per_layer) {
    for (const KVCache<Layer>* cache : caches)
      DEPTHKV_CHECK(static_cast<int>(per_layer.size()) == cache->n_layers(),
                    per_layer.size() << " token counts for " << cache->n_layers() << " layers");
    if constexpr (detail::HasBlockPool<Layer>::value) {
      using Pool = std::remove_reference_t<decltype(std::declval<const Layer&>().pool())>;
      std::vector<std::pair<const Pool*, long long>> need;  // per distinct pool
      for (const KVCache<Layer>* cache : caches)
      for (int l = 0; l < cache->n_layers(); ++l) {
        const Layer& L = cache->layer(l);
        const int n = per_layer[static_cast<std::size_t>(l)];
        const int b = L.blocks_for_tokens(n);
        if (b == 0) continue;
        const Pool* p = &L.pool();
        auto it = std::find_if(need.begin(), need.end(), [p](const auto& e) { return e.first == p; });
        if (it == need.end()) need.emplace_back(p, b);
        else it->second += b;
      }
      for (const auto& e : need) {
        const int free_blocks = e.first->num_free();
        const int n = *std::max_element(per_layer.begin(), per_layer.end());
        DEPTHKV_CHECK(e.second <= free_blocks, "pool exhausted: " << n << " tokens need " << e.second
                                                                  << " blocks of the layers' pool, " << free_blocks
                                                                  << " of " << e.first->num_blocks()
                                                                  << " free; nothing was appended");
      }
    } else if constexpr (detail::HasFixedCapacity<Layer>::value) {
      for (const KVCache<Layer>* cache : caches)
      for (int l = 0; l < cache->n_layers(); ++l)
        for (int h = 0; h < cache->layer(l).n_kv_heads(); ++h) {
          const Layer& L = cache->layer(l);
          const int n = per_layer[static_cast<std::size_t>(l)];
          DEPTHKV_CHECK(static_cast<long long>(L.size(h)) + n <= L.capacity(),
                        "layer " << l << " head " << h << " holds " << L.size(h) << " of its " << L.capacity()
                                 << " slots: " << n << " more tokens do not fit; nothing was appended");
        }
    } else {
      (void)caches;
    }
  }

  /// Checks that `cache` has the model's layer count, KV-head count and head size.
  /// @throws Error otherwise
  template <class Layer>
  void check_cache(const KVCache<Layer>& cache) const {
    DEPTHKV_CHECK(cache.n_layers() == config().n_layers,
                  "cache has " << cache.n_layers() << " layers, model has " << config().n_layers);
    for (int l = 0; l < cache.n_layers(); ++l) {
      const Layer& L = cache.layer(l);
      DEPTHKV_CHECK(L.n_kv_heads() == config().n_kv_heads && L.head_dim() == config().head_dim,
                    "cache layer " << l << " is [" << L.n_kv_heads() << " heads][" << L.head_dim()
                                   << "], model needs [" << config().n_kv_heads << "][" << config().head_dim << "]");
    }
  }

  /// Model weights' validation (shapes against the configuration).
  /// @throws Error naming the first inconsistent tensor
  static void validate(const LlamaModel& m) {
    validate_dimensions(m.config);
    validate_windows_and_scales(m.config);
    validate_weights(m);
  }

 private:
  /// Checks the configuration's dimensions and its global RoPE parameters.
  /// @throws Error naming the first bad value
  static void validate_dimensions(const LlamaConfig& c) {
    DEPTHKV_CHECK(c.dim > 0 && c.hidden_dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 &&
                      c.vocab_size > 0 && c.head_dim > 0,
                  "non-positive dimension in the model configuration");
    DEPTHKV_CHECK(c.n_heads % c.n_kv_heads == 0,
                  "n_heads " << c.n_heads << " is not a multiple of n_kv_heads " << c.n_kv_heads);
    DEPTHKV_CHECK(c.head_dim % 2 == 0, "head_dim " << c.head_dim << " is odd (RoPE needs pairs)");
    DEPTHKV_CHECK(c.rope_theta > 0 && c.rms_eps >= 0, "bad rope_theta " << c.rope_theta << " or rms_eps " << c.rms_eps);
    DEPTHKV_CHECK(std::isfinite(c.rope_freq_scale) && c.rope_freq_scale > 0,
                  "bad rope_freq_scale " << c.rope_freq_scale);
  }

  /// Checks the configuration's layer windows, its local RoPE parameters and its embedding and
  /// attention scales.
  /// @throws Error naming the first bad value
  static void validate_windows_and_scales(const LlamaConfig& c) {
    DEPTHKV_CHECK(c.layer_window.empty() || static_cast<int>(c.layer_window.size()) == c.n_layers,
                  "layer_window has " << c.layer_window.size() << " entries for " << c.n_layers << " layers");
    for (std::size_t l = 0; l < c.layer_window.size(); ++l)
      DEPTHKV_CHECK(c.layer_window[l] >= 0, "layer " << l << " has window " << c.layer_window[l] << " (must be >= 0)");
    DEPTHKV_CHECK(!c.has_local_layers() || (c.rope_theta_local > 0 && std::isfinite(c.rope_freq_scale_local) &&
                                            c.rope_freq_scale_local > 0),
                  "bad local RoPE base " << c.rope_theta_local << " or scale " << c.rope_freq_scale_local);
    DEPTHKV_CHECK(std::isfinite(c.embedding_scale) && std::isfinite(c.attention_scale) && c.attention_scale >= 0,
                  "bad embedding_scale " << c.embedding_scale << " or attention_scale " << c.attention_scale);
  }

  /// Checks that matrix `what` of layer `l` is [r x cols], either as float (`w`) or quantized
  /// (`q`, `w` empty).
  /// @throws Error otherwise
  static void check_matrix_shape(const char* what, int l, const RowMatrix& w, const QuantWeight& q,
                                 Eigen::Index r, Eigen::Index cols) {
    if (q.empty()) {
      DEPTHKV_CHECK(w.rows() == r && w.cols() == cols, what << " of layer " << l << " is [" << w.rows() << " x "
                                                          << w.cols() << "], expected [" << r << " x " << cols << "]");
      return;
    }
    DEPTHKV_CHECK(w.size() == 0, what << " of layer " << l << " has both a float and a quantized form");
    DEPTHKV_CHECK(q.rows == r && q.cols == cols, what << " of layer " << l << " (" << ggml_type_name(q.type) << ") is ["
                                                      << q.rows << " x " << q.cols << "], expected [" << r << " x "
                                                      << cols << "]");
    DEPTHKV_CHECK(q.row_bytes == ggml_row_bytes(q.type, q.cols),
                  what << " of layer " << l << " has rows of " << q.row_bytes << " bytes, "
                       << ggml_type_name(q.type) << " needs " << ggml_row_bytes(q.type, q.cols));
  }

  /// Checks that vector `what` of layer `l` has `n` entries (or none, when `optional`).
  /// @throws Error otherwise
  static void check_vector_size(const char* what, int l, const Eigen::VectorXf& v, Eigen::Index n,
                                bool optional) {
    DEPTHKV_CHECK(v.size() == n || (optional && v.size() == 0),
                  what << " of layer " << l << " has " << v.size() << " entries, expected " << n);
  }

  /// Checks the shapes of the global and per-layer weights against `m.config`.
  /// @throws Error naming the first inconsistent tensor
  static void validate_weights(const LlamaModel& m) {
    const LlamaConfig& c = m.config;
    const Eigen::Index qd = static_cast<Eigen::Index>(c.n_heads) * c.head_dim;
    const Eigen::Index kd = static_cast<Eigen::Index>(c.n_kv_heads) * c.head_dim;
    DEPTHKV_CHECK(static_cast<int>(m.layers.size()) == c.n_layers,
                  m.layers.size() << " layer weight sets for " << c.n_layers << " layers");
    check_matrix_shape("token_embedding", -1, m.token_embedding, m.token_embedding_quant, c.vocab_size,
                       c.dim);
    check_matrix_shape("classifier", -1, m.classifier, m.classifier_quant, c.vocab_size, c.dim);
    check_vector_size("final_norm", -1, m.final_norm, c.dim, false);
    check_vector_size("rope_freq_factors", -1, m.rope_freq_factors, c.head_dim / 2, true);
    for (int l = 0; l < c.n_layers; ++l) {
      const LlamaLayerWeights& w = m.layers[static_cast<std::size_t>(l)];
      check_vector_size("attn_norm", l, w.attn_norm, c.dim, false);
      check_vector_size("ffn_norm", l, w.ffn_norm, c.dim, false);
      check_vector_size("attn_post_norm", l, w.attn_post_norm, c.dim, true);
      check_vector_size("ffn_post_norm", l, w.ffn_post_norm, c.dim, true);
      check_matrix_shape("wq", l, w.wq, w.wq_quant, qd, c.dim);
      check_matrix_shape("wk", l, w.wk, w.wk_quant, kd, c.dim);
      check_matrix_shape("wv", l, w.wv, w.wv_quant, kd, c.dim);
      check_matrix_shape("wo", l, w.wo, w.wo_quant, c.dim, qd);
      check_matrix_shape("w1", l, w.w1, w.w1_quant, c.hidden_dim, c.dim);
      check_matrix_shape("w3", l, w.w3, w.w3_quant, c.hidden_dim, c.dim);
      check_matrix_shape("w2", l, w.w2, w.w2_quant, c.dim, c.hidden_dim);
      check_vector_size("bq", l, w.bq, qd, true);
      check_vector_size("bk", l, w.bk, kd, true);
      check_vector_size("bv", l, w.bv, kd, true);
      check_vector_size("q_norm", l, w.q_norm, c.head_dim, true);
      check_vector_size("k_norm", l, w.k_norm, c.head_dim, true);
    }
  }

  /// Keeps the first `n` slots of head `h` of `kv` (drops the ones appended after them).
  template <class Layer>
  static void keep_prefix(Layer& kv, int h, int n) {
    if (kv.size(h) <= n) return;
    std::vector<std::int32_t> prefix(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) prefix[static_cast<std::size_t>(i)] = i;
    kv.compact(h, prefix.data(), n);
  }

  /// Drops every slot at position >= `pos0` (slots are held in position order): what a failed
  /// `forward` from `pos0` appended.
  template <class Layer>
  static void drop_from(KVCache<Layer>& cache, std::int32_t pos0) {
    for (int l = 0; l < cache.n_layers(); ++l) {
      Layer& L = cache.layer(l);
      for (int h = 0; h < L.n_kv_heads(); ++h) {
        int n = L.size(h);
        while (n > 0 && L.positions(h)[n - 1] >= pos0) --n;
        keep_prefix(L, h, n);
      }
    }
  }

  /// y = x W^T for every row of x (`W` is `[out x in]` row-major); a GEMV for one row. With a
  /// stored form `Q` (then `W` is empty) the stored rows are multiplied instead: `quant_matvec`
  /// for one row, `quant_matmul` for several (int8 activations for block types, F16/BF16
  /// converted in registers; quant/products.hpp). Products below kParallelGemmWork multiply-adds
  /// (kParallelGemvWork for one row) run on one thread, larger ones on `cpu.n_threads`; the bytes
  /// are the same for every count.
  void linear(const RowMatrix& W, const QuantWeight& Q, const RowMatrix& x, RowMatrix& y, const CpuOptions& cpu) const {
    const double out = Q.empty() ? static_cast<double>(W.rows()) : static_cast<double>(Q.rows);
    const double in = Q.empty() ? static_cast<double>(W.cols()) : static_cast<double>(Q.cols);
    const double limit = x.rows() == 1 ? kParallelGemvWork : kParallelGemmWork;
    const int threads = static_cast<double>(x.rows()) * out * in < limit ? 1 : thread_count(cpu.n_threads);
    if (!Q.empty()) {
      const QuantProductOptions qopt(CpuOptions{threads, cpu.max_simd_level, pool_for(cpu)}, QuantKernel::kAuto);
      if (x.rows() == 1) {
        quant_matvec(Q.type, Q.data, Q.rows, Q.cols, x.data(), y.data(), qopt);
      } else {
        quant_matmul(Q.type, Q.data, Q.rows, Q.cols, x.data(), x.rows(), y.data(), qopt);
      }
    } else if (x.rows() == 1) {
      y.row(0).transpose().noalias() = W * x.row(0).transpose();  // a GEMV: Eigen runs it on one thread
    } else {
      gemm(W, x, y, threads);
    }
  }

  /// One product of linear_many: y = x W^T (stored form Q, or W when Q is empty).
  struct LinearTarget {
    const RowMatrix* W;
    const QuantWeight* Q;
    RowMatrix* y;
  };

  /// `linear` for several products of the same x: for one row and stored forms only, one
  /// `quant_matvec_many` (x quantized once, one fork-join; threads by the summed work), else one
  /// `linear` each. The bytes of `linear` on each.
  void linear_many(std::initializer_list<LinearTarget> targets, const RowMatrix& x, const CpuOptions& cpu) const {
    bool stored = x.rows() == 1;
    double work = 0;
    for (const LinearTarget& t : targets) {
      stored = stored && !t.Q->empty() && t.Q->cols == targets.begin()->Q->cols;
      work += static_cast<double>(t.Q->rows) * static_cast<double>(t.Q->cols);
    }
    if (!stored) {
      for (const LinearTarget& t : targets) linear(*t.W, *t.Q, x, *t.y, cpu);
      return;
    }
    std::vector<QuantMatvecTarget> m;
    for (const LinearTarget& t : targets) m.push_back({t.Q->type, t.Q->data, t.Q->rows, t.y->data()});
    const int threads = work < kParallelGemvWork ? 1 : thread_count(cpu.n_threads);
    quant_matvec_many(m.data(), static_cast<int>(m.size()), targets.begin()->Q->cols, x.data(),
                      QuantProductOptions(CpuOptions{threads, cpu.max_simd_level, pool_for(cpu)}, QuantKernel::kAuto));
  }

  /// y = x W^T (x with several rows) on `threads` threads: the rows of W are split into slices of
  /// a multiple of kGemmSliceRows rows, one single-threaded Eigen product per slice, so every
  /// thread count gives the bytes of Eigen's single-threaded product (Eigen's own multi-threaded
  /// product blocks the depth differently and differs in the last bits). One slice runs on the
  /// calling thread (run_eigen_serial: no team); several run on a team of one thread per slice.
  /// Inside an active OpenMP region the product is Eigen's, on the calling thread.
  static void gemm(const RowMatrix& W, const RowMatrix& x, RowMatrix& y, int threads) {
#ifdef _OPENMP
    if (omp_get_active_level() == 0) {
      const Eigen::Index out = W.rows();
      Eigen::Index per = (out + threads - 1) / threads;
      per = std::max<Eigen::Index>(1, (per + kGemmSliceRows - 1) / kGemmSliceRows) * kGemmSliceRows;
      const int slices = static_cast<int>((out + per - 1) / per);
      const auto slice = [&](int i) {
        const Eigen::Index r0 = i * per, nr = std::min(out, r0 + per) - r0;
        y.middleCols(r0, nr).noalias() = x * W.middleRows(r0, nr).transpose();
      };
      if (slices <= 1) {
        depthkv::detail::run_eigen_serial([&] { slice(0); });
        return;
      }
      std::vector<std::exception_ptr> errors(static_cast<std::size_t>(slices));
#pragma omp parallel for schedule(static, 1) num_threads(slices)
      for (int i = 0; i < slices; ++i) {
        try {
          slice(i);
        } catch (...) {
          errors[static_cast<std::size_t>(i)] = std::current_exception();
        }
      }
      for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
      return;
    }
#endif
    (void)threads;
    y.noalias() = x * W.transpose();
  }

  /// Runs fn(i) for i in [0, n): with threads > 1 on `pool` when set (Eigen's products in its
  /// tasks are single-threaded), else on an OpenMP team of that many threads (Eigen's
  /// products inside a team are single-threaded), else on the calling thread with Eigen's
  /// products single-threaded too (run_eigen_serial). Inside an active OpenMP region the loop is
  /// a nested region (one thread), as Eigen's products there expect.
  template <class Fn>
  static void heads_in_parallel(int n, int threads, Fn&& fn, ThreadPool* pool) {
    if (pool != nullptr && threads > 1) {
      pool->run(n, threads, fn);
      return;
    }
#ifdef _OPENMP
    if (threads > 1 || omp_get_active_level() > 0) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
      for (int i = 0; i < n; ++i) fn(i);
      return;
    }
#else
    (void)threads;
#endif
    depthkv::detail::run_eigen_serial([&] {
      for (int i = 0; i < n; ++i) fn(i);
    });
  }

  /// Grouped-query attention of the T new queries `q` `[T x n_heads*hd]` (already rotated)
  /// against everything layer `kv` holds (the new keys already appended): the tiled online-softmax
  /// kernel (detail/flash_attention.hpp) for every output, then, with an observer, the
  /// probability rows it observes (`observe`).
  template <class Layer>
  void attention(int l, const RowMatrix& q, const Layer& kv, const std::vector<int>& size_before, std::int32_t pos0,
                 RowMatrix& att, const ForwardOptions& opt) const {
    using Scalar = typename Layer::Scalar;
    const LlamaConfig& c = config();
    const int T = static_cast<int>(q.rows());
    std::vector<detail::FlashHead<Scalar>> heads(static_cast<std::size_t>(c.n_kv_heads));
    std::vector<std::vector<Scalar>> gathered(static_cast<std::size_t>(c.n_kv_heads));  // paged layers' rows
    std::vector<std::vector<int>> begins(static_cast<std::size_t>(c.n_kv_heads));  // local layers' window starts
    int max_n = 0;
    for (int h = 0; h < c.n_kv_heads; ++h) {
      heads[static_cast<std::size_t>(h)] =
          head_rows(kv, h, size_before[static_cast<std::size_t>(h)], gathered[static_cast<std::size_t>(h)]);
      if (c.is_local(l)) {
        window_begins(kv.positions(h), kv.size(h), pos0, T, c.window(l), begins[static_cast<std::size_t>(h)]);
        heads[static_cast<std::size_t>(h)].vis_begin = begins[static_cast<std::size_t>(h)].data();
      }
      max_n = std::max(max_n, kv.size(h));
    }
    // Several threads when the work is large enough; Eigen's products inside stay single-threaded.
    const double work = static_cast<double>(T) * max_n * c.head_dim * c.n_heads;
    const int threads = work >= kParallelWork ? thread_count(opt.n_threads) : 1;
    detail::flash_attention(heads.data(), detail::FlashShape{T, c.n_heads, c.n_kv_heads, c.head_dim, c.attention_scale},
                            q.data(), q.cols(), att.data(), att.cols(), threads,
                            depthkv::detail::simd_level(opt.max_simd_level), pool_for(opt));
    if (opt.observer) observe(l, q, heads, pos0, opt, threads);
  }

  /// The first slot each of the T query rows at positions `pos0 + i` sees in a layer of window
  /// `w` whose n slots hold positions `pos` (ascending): the first position > pos0 + i - w.
  static void window_begins(const std::int32_t* pos, int n, std::int32_t pos0, int T, int w, std::vector<int>& out) {
    out.resize(static_cast<std::size_t>(T));
    int j = 0;
    for (int i = 0; i < T; ++i) {
      const std::int64_t oldest = static_cast<std::int64_t>(pos0) + i - w + 1;
      while (j < n && pos[j] < oldest) ++j;
      out[static_cast<std::size_t>(i)] = j;
    }
  }

  /// The key and value rows of KV head `h` of `kv`: in place for a strided layer, else (a paged
  /// layer) copied into `buf` (keys, then values, `[n][head_dim]` each).
  template <class Layer>
  static detail::FlashHead<typename Layer::Scalar> head_rows(const Layer& kv, int h, int n_old,
                                                             std::vector<typename Layer::Scalar>& buf) {
    detail::FlashHead<typename Layer::Scalar> r;
    r.n = kv.size(h);
    r.n_old = n_old;
    if constexpr (detail::HasTokenStride<Layer>::value) {
      r.k = kv.key(h, 0);
      r.v = kv.value(h, 0);
      r.ld = kv.token_stride();
    } else {
      const std::size_t hd = static_cast<std::size_t>(kv.head_dim()), n = static_cast<std::size_t>(r.n);
      buf.resize(2 * n * hd);
      for (std::size_t i = 0; i < n; ++i) {
        std::copy_n(kv.key(h, static_cast<int>(i)), hd, buf.data() + i * hd);
        std::copy_n(kv.value(h, static_cast<int>(i)), hd, buf.data() + (n + i) * hd);
      }
      r.k = buf.data();
      r.v = buf.data() + n * hd;
      r.ld = static_cast<std::ptrdiff_t>(hd);
    }
    return r;
  }

  /// Hands the observer the attention probabilities of the rows at positions >= `opt.observe_from`,
  /// per query head in head order: each KV head's keys read as float once (F16 layers: converted
  /// once for the G query heads of its group), heads computed in parallel batches (probabilities
  /// of a batch held at most kObserverBatchBytes), then observed serially.
  template <class Scalar>
  void observe(int l, const RowMatrix& q, const std::vector<detail::FlashHead<Scalar>>& heads, std::int32_t pos0,
               const ForwardOptions& opt, int threads) const {
    const LlamaConfig& c = config();
    const int T = static_cast<int>(q.rows());
    const int first = static_cast<int>(std::clamp<std::int64_t>(static_cast<std::int64_t>(opt.observe_from) - pos0, 0, T));
    if (first == T) return;
    const int G = c.n_heads / c.n_kv_heads;
    if (observe_decode_f16(l, q, heads, pos0, opt, T)) return;
    int max_n = 0;
    for (const auto& h : heads) max_n = std::max(max_n, h.n);
    const std::size_t per_head = static_cast<std::size_t>(T - first) * static_cast<std::size_t>(max_n) * sizeof(float);
    const int batch = static_cast<int>(std::max<std::size_t>(
        1, std::min<std::size_t>(static_cast<std::size_t>(c.n_heads), kObserverBatchBytes / std::max<std::size_t>(per_head, 1))));
    std::vector<detail::FlashState::Rows> kbuf(heads.size());  // F16 layers' keys as float
    std::vector<KeyRows> keys;
    keys.reserve(heads.size());
    for (std::size_t h = 0; h < heads.size(); ++h)
      keys.push_back(detail::flash_tile(heads[h].k, heads[h].ld, heads[h].n, c.head_dim, kbuf[h], depthkv::detail::simd_level(opt.max_simd_level)));
    std::vector<RowMatrix> probs(static_cast<std::size_t>(batch));
    for (int b0 = 0; b0 < c.n_heads; b0 += batch) {
      const int nb = std::min(batch, c.n_heads - b0);
      heads_in_parallel(
          nb, nb > 1 ? threads : 1,
          [&](int i) {
            const std::size_t kv = static_cast<std::size_t>((b0 + i) / G);
            head_probabilities(b0 + i, q, keys[kv], heads[kv].n_old, first, probs[static_cast<std::size_t>(i)],
                               heads[kv].vis_begin);
          },
          pool_for(opt));
      for (int i = 0; i < nb; ++i) {
        const RowMatrix& p = probs[static_cast<std::size_t>(i)];
        const int n = static_cast<int>(p.cols());
        opt.observer(l, b0 + i, pos0 + first, T - first, p.data(), n, n);
      }
    }
  }

  /// `observe` for one decode row on F16 keys from SIMD level 2 (head size a multiple of 8): each KV
  /// head's G query heads scored together over its F16 keys in registers (`detail::DecodeTile`: no
  /// float copy of the keys), then scaled, windowed and normalized as `head_probabilities`; the same
  /// probabilities up to float rounding. Returns false (nothing observed) elsewhere.
  template <class Scalar>
  bool observe_decode_f16(int l, const RowMatrix& q, const std::vector<detail::FlashHead<Scalar>>& heads,
                          std::int32_t pos0, const ForwardOptions& opt, int T) const {
#if defined(DEPTHKV_AVX2_DISPATCH)
    if constexpr (std::is_same<Scalar, Eigen::half>::value) {
      const LlamaConfig& c = config();
      const int G = c.n_heads / c.n_kv_heads, hd = c.head_dim;
      if (T != 1 || hd % 8 != 0 || G > detail::kFlashDecodeVectors ||
          depthkv::detail::simd_level(opt.max_simd_level) < 2)
        return false;
      const float scale = detail::FlashShape{1, 1, 1, hd, c.attention_scale}.score_scale();
      RowMatrix p;
      for (int kv = 0; kv < c.n_kv_heads; ++kv) {
        const auto& h = heads[static_cast<std::size_t>(kv)];
        p.resize(G, h.n);
        detail::DecodeTile::scores(q.data() + static_cast<std::ptrdiff_t>(kv) * G * hd, G, hd, h.k, h.ld, h.n, p.data());
        const int b = h.vis_begin ? h.vis_begin[0] : 0;
        for (int g = 0; g < G; ++g) {
          float* row = p.row(g).data();
          std::fill(row, row + b, 0.0f);
          Eigen::Map<Eigen::ArrayXf>(row + b, h.n - b) *= scale;
          softmax_prefix(row + b, h.n - b);
          opt.observer(l, kv * G + g, pos0, 1, row, h.n, h.n);
        }
      }
      return true;
    }
#endif
    (void)l, (void)q, (void)heads, (void)pos0, (void)opt, (void)T;
    return false;
  }

  /// A KV head's keys as float rows `[n x head_dim]` (`detail::flash_tile`).
  using KeyRows = Eigen::Map<const detail::FlashState::Rows, 0, Eigen::OuterStride<>>;

  /// Attention probabilities of query head `qh` for the query rows [first, T) into `s`
  /// `[T - first x n]` (`K`: the n keys of its KV head, `n_old` of them held before this call;
  /// masked entries 0), computed in causal tiles of kTileRows rows: rows [r0, r0 + rows) need only
  /// the slots [0, n_old + r0 + rows). `begin` (optional, a local layer's): row i sees only the
  /// slots from `begin[i]` on, the others are 0.
  void head_probabilities(int qh, const RowMatrix& q, const KeyRows& K, int n_old, int first, RowMatrix& s,
                          const int* begin = nullptr) const {
    const int T = static_cast<int>(q.rows());
    const int hd = config().head_dim;
    const float scale = detail::FlashShape{T, 1, 1, hd, config().attention_scale}.score_scale();
    const int n = static_cast<int>(K.rows());
    auto Q = q.middleCols(static_cast<Eigen::Index>(qh) * hd, hd);
    s.resize(T - first, n);
    if (T == 1) {
      s.row(0).transpose().noalias() = K * Q.row(0).transpose();
      const int b = begin ? begin[0] : 0;
      std::fill(s.data(), s.data() + b, 0.0f);
      Eigen::Map<Eigen::ArrayXf>(s.data() + b, n - b) *= scale;
      softmax_prefix(s.data() + b, n - b);
      return;
    }
    for (int r0 = first; r0 < T; r0 += kTileRows) {
      const int rows = std::min(kTileRows, T - r0);
      const int m = n_old + r0 + rows;
      s.block(r0 - first, 0, rows, m).noalias() = Q.middleRows(r0, rows) * K.topRows(m).transpose();
      for (int i = 0; i < rows; ++i) {
        float* row = s.row(r0 - first + i).data();
        const int visible = n_old + r0 + i + 1;
        const int b = begin ? begin[r0 + i] : 0;
        std::fill(row, row + b, 0.0f);
        Eigen::Map<Eigen::ArrayXf>(row + b, visible - b) *= scale;
        softmax_prefix(row + b, visible - b);
        std::fill(row + visible, row + m, 0.0f);
      }
      if (m < n) s.block(r0 - first, m, rows, n - m).setZero();
    }
  }

  /// Multiply-adds below which a projection of several rows runs single-threaded.
  static constexpr double kParallelGemmWork = 1 << 23;
  /// Multiply-adds below which a one-row product (decode) runs single-threaded: a matvec reads
  /// each weight once, so from about a MiB of weights the split over threads pays for its
  /// fork-join (a higher threshold left most of a 0.5B-1B model's decode products on one thread).
  static constexpr double kParallelGemvWork = 1 << 18;
  /// Rows of W per slice of a multi-threaded float projection come in multiples of this (a
  /// multiple of Eigen's register-block rows for SSE, AVX and AVX-512 floats: 12, 24, 48), so each
  /// row of the product takes the same kernel path as in one single-threaded product.
  static constexpr Eigen::Index kGemmSliceRows = 48;
  /// Multiply-adds (T x slots x head_dim x heads) from which attention heads run in parallel.
  static constexpr double kParallelWork = 1 << 20;
  /// Most bytes of attention probabilities held for the observer at once (one head at least).
  static constexpr std::size_t kObserverBatchBytes = std::size_t(64) << 20;

  /// Query rows per causal attention tile in prefill.
  static constexpr int kTileRows = 64;

  /// In-place softmax of x[0..n) (max-subtracted, as llama2.c; SIMD exp and sums).
  static void softmax_prefix(float* x, int n) {
    Eigen::Map<Eigen::ArrayXf> a(x, n);
    const float mx = a.maxCoeff();
    a = (a - mx).exp();  // Eigen's vectorised exp
    a /= a.sum();
  }

  /// The workers of a call's quantized products and attention: the call's own `cpu.pool`, else
  /// the engine's (outside an active OpenMP region; inside one, the calling thread alone).
  ThreadPool* pool_for(const CpuOptions& cpu) const {
    if (cpu.pool != nullptr) return cpu.pool;
#ifdef _OPENMP
    if (omp_get_active_level() > 0) return nullptr;
#endif
    return pool_.get();
  }

  const LlamaModel& model_;
  std::shared_ptr<ThreadPool> pool_ = std::make_shared<ThreadPool>();  // shared by copies
};

}  // namespace llama
}  // namespace depthkv
