#pragma once
/// @file llama/perplexity.hpp
/// @brief Perplexity of the full cache over consecutive windows of a token stream, with
/// llama.cpp's `llama-perplexity` protocol, so a model can be checked before it is profiled.
///
/// The stream is cut into `n_windows` consecutive windows of `context` tokens (window w holds
/// tokens `[w * context, (w + 1) * context)`). Each window is run from an empty cache, with its
/// first token replaced by BOS when `bos >= 0` (as llama-perplexity does for vocabularies that
/// add BOS). The logits at positions `first = context / 2 .. context - 2` are scored against the
/// next token, so every scored token has at least `context / 2` tokens of context:
/// `nll = -log softmax(logits_j)[token_{j+1}]`, `context - 1 - context / 2` tokens per window.
/// The result is the mean NLL over all scored tokens, its standard error (per-token standard
/// deviation / sqrt(count)), and `ppl = exp(mean NLL)`.
///
/// @code
/// llama::PerplexityResult r = llama::perplexity(engine, ids, 512, /*n_windows=*/0, tok.bos_id());
/// std::printf("PPL = %.4f +/- %.4f\n", r.ppl, r.ppl * r.nll_stderr);
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "depthkv/detail/parallel_for.hpp"
#include "depthkv/error.hpp"
#include "depthkv/llama/engine.hpp"

namespace depthkv {
namespace llama {

/// What `perplexity` measured.
struct PerplexityResult {
  int context = 0;                  ///< tokens per window
  int n_windows = 0;                ///< windows run
  long long n_scored = 0;           ///< tokens scored over all windows
  double nll = 0;                   ///< mean NLL per scored token (nats)
  double nll_stderr = 0;            ///< its standard error
  double ppl = 0;                   ///< exp(nll)
  std::vector<double> window_nll;   ///< mean NLL of each window
};

namespace detail {

/// Validates `perplexity`'s arguments (same meaning as there) and resolves `n_windows`.
/// @return the windows to run (`n_windows`, or every whole window of the stream when 0)
/// @throws Error as `perplexity` does for bad arguments, in its order
inline int check_perplexity_args(const LlamaConfig& c, const std::vector<int>& ids, int context, int n_windows,
                                 int bos, int chunk_size, int n_threads) {
  DEPTHKV_CHECK_AS("perplexity", context >= 4 && context <= c.seq_len,
                   "perplexity: context " << context << " is outside [4, " << c.seq_len
                                          << "] (the model's context length)");
  DEPTHKV_CHECK_AS("perplexity", n_windows >= 0, "perplexity: n_windows must be >= 0, got " << n_windows);
  DEPTHKV_CHECK_AS("perplexity", bos < c.vocab_size,
                   "perplexity: BOS id " << bos << " is outside the vocabulary of " << c.vocab_size);
  DEPTHKV_CHECK_AS("perplexity", chunk_size >= 1, "perplexity: chunk_size must be >= 1, got " << chunk_size);
  check_thread_count(n_threads, "perplexity: n_threads");
  const long long available = static_cast<long long>(ids.size()) / context;
  DEPTHKV_CHECK_AS("perplexity", available >= 1,
                   "perplexity: " << ids.size() << " tokens are fewer than one window of " << context);
  if (n_windows == 0) n_windows = static_cast<int>(std::min<long long>(available, 1 << 30));
  DEPTHKV_CHECK_AS("perplexity", n_windows <= available,
                   "perplexity: " << ids.size() << " tokens hold " << available << " windows of " << context
                                  << "; asked for " << n_windows);
  for (std::size_t i = 0; i < static_cast<std::size_t>(n_windows) * static_cast<std::size_t>(context); ++i)
    DEPTHKV_CHECK_AS(
        "perplexity", ids[i] >= 0 && ids[i] < c.vocab_size,
        "perplexity: token " << ids[i] << " at " << i << " is outside the vocabulary of " << c.vocab_size);
  return n_windows;
}

/// The NLLs (nats) of window `w` of `ids` (tokens [w * context, (w + 1) * context), the first
/// replaced by `bos` when >= 0), prefilled on a fresh cache: one per predicted token at
/// positions context / 2 .. context - 2, in order.
/// @throws Error on a non-finite NLL (naming the window and position), or from the engine
inline std::vector<double> window_nlls(const LlamaEngine& engine, const std::vector<int>& ids, int w, int context,
                                       int bos, int chunk_size) {
  const int first = context / 2;
  const int per_window = context - 1 - first;
  std::vector<int> t(ids.begin() + static_cast<std::ptrdiff_t>(w) * context,
                     ids.begin() + static_cast<std::ptrdiff_t>(w + 1) * context);
  if (bos >= 0) t[0] = bos;
  HostCache cache = engine.make_cache();
  ForwardOptions opt;
  opt.chunk_size = chunk_size;
  const RowMatrix logits = engine.prefill(t, 0, cache, opt);  // [context x vocab]
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(per_window));
  for (int j = first; j < context - 1; ++j) {
    const auto row = logits.row(j);
    const double mx = row.maxCoeff();
    double sum = 0;
    for (Eigen::Index v = 0; v < row.size(); ++v) sum += std::exp(static_cast<double>(row(v)) - mx);
    const double x = mx + std::log(sum) - row(t[static_cast<std::size_t>(j + 1)]);
    DEPTHKV_CHECK_AS("perplexity", std::isfinite(x),
                     "perplexity: the NLL of window " << w << " at position " << j
                                                      << " is not finite (inf or NaN logits)");
    out.push_back(x);
  }
  return out;
}

/// Summarises per-window NLLs: per-window means, the mean over every scored token, its
/// standard error (sample variance / n) and exp(mean).
/// @throws Error when the perplexity or the standard error is not finite
inline PerplexityResult summarize_perplexity(const std::vector<std::vector<double>>& nll, int context,
                                             int n_windows) {
  PerplexityResult r;
  r.context = context;
  r.n_windows = n_windows;
  double sum = 0, sum2 = 0;
  for (const auto& v : nll) {
    double s = 0;
    for (double x : v) {
      s += x;
      sum += x;
      sum2 += x * x;
    }
    r.window_nll.push_back(s / static_cast<double>(v.size()));
    r.n_scored += static_cast<long long>(v.size());
  }
  const double n = static_cast<double>(r.n_scored);
  r.nll = sum / n;
  const double var = n > 1 ? std::max(0.0, (sum2 - n * r.nll * r.nll) / (n - 1)) : 0.0;
  r.nll_stderr = std::sqrt(var / n);
  r.ppl = std::exp(r.nll);
  DEPTHKV_CHECK_AS(
      "perplexity", std::isfinite(r.nll_stderr) && std::isfinite(r.ppl),
      "perplexity: a mean NLL of " << r.nll << " nats overflows the perplexity exp(NLL) (a broken model)");
  return r;
}

}  // namespace detail

/// Perplexity of `ids` over consecutive windows (see the file comment).
/// @param engine the model
/// @param ids the token stream
/// @param context tokens per window (>= 4, at most the engine's context length)
/// @param n_windows windows to run; 0 = every whole window of the stream
/// @param bos the id that replaces each window's first token (-1: none)
/// @param chunk_size prefill chunk (computation only)
/// @param n_threads windows run in parallel (0: OpenMP's default, 1: serial)
/// @throws Error on a context outside [4, seq_len], a stream shorter than the windows asked for,
///   ids outside the vocabulary, a non-finite NLL (naming the window and position; the engine
///   names the layer of a non-finite activation), or a perplexity that overflows a double
inline PerplexityResult perplexity(const LlamaEngine& engine, const std::vector<int>& ids, int context, int n_windows = 0,
                                   int bos = -1, int chunk_size = 1024, int n_threads = 0) {
  n_windows = detail::check_perplexity_args(engine.config(), ids, context, n_windows, bos, chunk_size, n_threads);
  std::vector<std::vector<double>> nll(static_cast<std::size_t>(n_windows));
  depthkv::detail::omp_tasks(n_windows, n_threads, [&](int w) {
    nll[static_cast<std::size_t>(w)] = detail::window_nlls(engine, ids, w, context, bos, chunk_size);
  });
  return detail::summarize_perplexity(nll, context, n_windows);
}

}  // namespace llama
}  // namespace depthkv
