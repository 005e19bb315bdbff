#pragma once
/// @file llama/representation_probe.hpp
/// @brief The reference engine's side of the representation metrics: per-layer, per-stage metrics
/// (InfoNCE with a bootstrap confidence interval, effective rank, spectral entropy) of a model
/// on a set of texts, computed without any pruning run, and stored in a profile file's
/// `layer_metrics` (what `mga`/`mlma*` allocate from).
///
/// ## What is computed
/// For every text i (a story or any text chunk):
/// 1. The text is truncated to its longest prefix of whole whitespace-separated words whose
///    encoding (BOS + text) fits `ProbeOptions::max_tokens` (default: the model's `seq_len`), so
///    that the text and its perturbed copy cover the same words.
/// 2. The perturbed copy is `drop_words(text, drop_fraction, seed_i)` (10% of the words dropped,
///    never all), seed_i derived from `ProbeOptions::seed` and i (splitmix64), so each sample has
///    its own perturbation and the whole run is reproducible.
/// 3. Each of the two is encoded (BOS first) and prefilled on a fresh cache with the capture hook
///    on — exactly two forward passes per sample (classifier on the last token only). The hidden
///    states of every layer at the four stages are summed over tokens on the fly (nothing of
///    size [tokens x dim] is kept):
///    | stage (`RepresentationStage`) | profile key suffix | engine tensor (`CapturePoint`)                   |
///    |-------------------------------|--------------------|--------------------------------------------------|
///    | pre-attention                 | `pre_attn`         | `kAttnInput`: RMS-normed layer input (Q/K/V read it) |
///    | post-attention                | `post_attn`        | `kAttnOutput`: output projection before the residual add |
///    | post-attention residual       | `post_attn_resid`  | `kAttnResidual`: residual stream after that add  |
///    | post-MLP                      | `post_mlp`         | `kLayerOutput`: residual stream after the MLP add |
/// 4. Mean pooling over tokens, then L2 normalisation (`pooled_embedding`). The BOS position is
///    left out of the mean by default (`include_bos = false`): it is the same token at the same
///    position in every text, so its hidden state is identical across texts at every layer and
///    would only add a common offset to every representation (in larger models an attention-sink
///    vector of very large norm that dominates the mean).
/// Then, per layer and stage, over the n samples: `infonce_losses` (anchors = the texts, positives
/// = their perturbed copies, negatives = the other texts of the same batch; tau and batch size
/// from `ProbeOptions::infonce`, defaults 0.1 and 16), their mean with a percentile-bootstrap CI
/// (`bootstrap_mean_ci`, 1000 resamples, 95%, seeded), and `effective_rank` / `spectral_entropy`
/// of the [n x dim] matrix of the texts' pooled unit vectors (no CI: one value per layer).
///
/// ## Profile keys (`add_representation_metrics`)
/// `infonce/<stage>` (mean, ci_low, ci_high), `erank/<stage>` and `sentropy/<stage>` (mean only),
/// for the four stage names above; one entry per layer. An existing entry of the same key is
/// replaced; other entries are kept.
///
/// ## Cost
/// Two prefill passes per sample of at most `max_tokens` tokens each, plus per layer and stage
/// an n x n similarity matrix and an SVD of an [n x dim] matrix — negligible next to the L x R
/// pruned runs of a sensitivity profile (`ProbeResult::seconds_forward`, `seconds_metrics`).
///
/// @code
/// using namespace depthkv;
/// llama::LlamaModel model = llama::load_llama2c("stories260K.bin");
/// llama::Tokenizer tok("tok512.bin", model.config.vocab_size);
/// llama::LlamaEngine engine(model);
/// std::vector<std::string> texts = llama::split_stories(llama::read_text_file("valid.txt"));
/// texts.resize(64);
/// ProfileFile profile = load_profile("profile.json", "stories260K.bin");
/// llama::ProbeResult r = llama::add_representation_metrics(profile, engine, tok, texts);
/// // profile.layer_metrics["infonce/post_attn"].mean[l], r.seconds_total
/// save_profile(profile, "profile.json");
/// @endcode

#include <algorithm>
#include <array>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/representation_metrics.hpp"

namespace depthkv {
namespace llama {

/// The four stages in their fixed order (index = `static_cast<int>(stage)`).
inline const std::array<RepresentationStage, 4>& representation_stages() {
  static const std::array<RepresentationStage, 4> s = {
      RepresentationStage::kPreAttention, RepresentationStage::kPostAttention,
      RepresentationStage::kPostAttentionResidual, RepresentationStage::kPostMLP};
  return s;
}

/// @return the engine tensor captured for `stage` (see the table in the file comment)
inline CapturePoint capture_point_of(RepresentationStage stage) {
  switch (stage) {
    case RepresentationStage::kPreAttention: return CapturePoint::kAttnInput;
    case RepresentationStage::kPostAttention: return CapturePoint::kAttnOutput;
    case RepresentationStage::kPostAttentionResidual: return CapturePoint::kAttnResidual;
    case RepresentationStage::kPostMLP: return CapturePoint::kLayerOutput;
  }
  return CapturePoint::kLayerOutput;
}

/// Options of `probe_representations`.
struct ProbeOptions {
  double drop_fraction = 0.1;   ///< fraction of words dropped in the perturbed copy, in [0, 1]
  std::uint64_t seed = 0;       ///< perturbation seeds (per sample) and bootstrap seed
  InfoNCEOptions infonce;       ///< temperature (0.1) and batch size (16)
  int bootstrap_resamples = 1000;  ///< percentile-bootstrap resamples (>= 1)
  double confidence = 0.95;     ///< CI level in (0, 1)
  int max_tokens = 0;           ///< tokens per pass incl. BOS (>= 2); 0 = the model's seq_len
  bool include_bos = false;     ///< include the BOS position in the mean pooling
  int chunk_size = 1024;        ///< prefill chunk size (only splits the computation)
  int n_threads = 0;            ///< `ForwardOptions::n_threads`
  /// Also receives every hidden state the probe captures (the four stage points; optional):
  /// lets a caller observe the forward passes (tests count them).
  ActivationHook capture;
  EngineStats* stats = nullptr;  ///< accumulates engine timings and tokens (optional)
  /// Called after each sample with (samples done, total) (optional).
  std::function<void(int, int)> progress;
};

/// One stage's metrics, one entry per layer.
struct StageMetrics {
  std::vector<MeanCI> infonce;               ///< mean InfoNCE over samples with its bootstrap CI
  std::vector<std::vector<double>> losses;   ///< [layer][sample] per-sample InfoNCE losses
  std::vector<double> erank;                 ///< effective rank of the texts' pooled vectors
  std::vector<double> sentropy;              ///< spectral entropy (nats) of the same
};

/// What `probe_representations` measured.
struct ProbeResult {
  int n_layers = 0;
  int n_samples = 0;
  std::array<StageMetrics, 4> stages;   ///< indexed by `static_cast<int>(RepresentationStage)`
  std::vector<int> tokens;              ///< [sample] tokens of the (truncated) text incl. BOS
  std::vector<int> tokens_perturbed;    ///< [sample] tokens of its perturbed copy incl. BOS
  int truncated = 0;                    ///< samples whose text was cut to fit max_tokens
  long long forward_passes = 0;         ///< engine prefill calls (2 per sample)
  double seconds_forward = 0.0;         ///< wall time of tokenising and the forward passes
  double seconds_metrics = 0.0;         ///< wall time of InfoNCE, bootstrap, SVDs
  double seconds_total = 0.0;           ///< both
  /// @return the metrics of `stage`
  const StageMetrics& stage(RepresentationStage s) const { return stages[static_cast<std::size_t>(s)]; }
  /// @return per-layer mean InfoNCE of `stage`
  std::vector<double> infonce_mean(RepresentationStage s) const {
    std::vector<double> v;
    for (const MeanCI& m : stage(s).infonce) v.push_back(m.mean);
    return v;
  }
};

namespace detail {

/// Per-sample seed: splitmix64 of (seed, index), so neighbouring samples are unrelated.
inline std::uint64_t sample_seed(std::uint64_t seed, std::uint64_t index) {
  depthkv::detail::SplitMix64 g(seed ^ (0xD1B54A32D192ED03ULL * (index + 1)));
  return g.next();
}

/// @return the end offset of each whitespace-separated word of `text`, in order
inline std::vector<std::size_t> word_ends(const std::string& text) {
  std::vector<std::size_t> word_end;
  for (const auto& w : depthkv::detail::word_spans(text)) word_end.push_back(w.second);
  return word_end;
}

/// The longest prefix of whole words of `text` whose encoding (with BOS) has at most
/// `max_tokens` tokens (binary search on the word count; encoding length grows with the prefix).
/// Sets `cut` when the text had to be shortened.
inline std::string fit_words(const TextTokenizer& tok, const std::string& text, int max_tokens, bool& cut) {
  cut = false;
  if (static_cast<int>(tok.encode(text, true, false).size()) <= max_tokens) return text;
  cut = true;
  const std::vector<std::size_t> word_end = word_ends(text);
  std::size_t lo = 0, hi = word_end.size();  // invariant: prefix of lo words fits (0 words: BOS only)
  while (lo + 1 < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (static_cast<int>(tok.encode(text.substr(0, word_end[mid - 1]), true, false).size()) <= max_tokens)
      lo = mid;
    else
      hi = mid;
  }
  return lo == 0 ? std::string() : text.substr(0, word_end[lo - 1]);
}

/// Validates `probe_representations`' inputs.
/// @param n number of texts
/// @param opt the options
/// @param max_tokens the effective tokens per pass (`opt.max_tokens` or the model's seq_len)
/// @throws Error naming the first bad value
inline void check_probe_options(int n, const ProbeOptions& opt, int max_tokens) {
  DEPTHKV_CHECK_AS("probe_representations", n >= 2,
                   "the representation probe needs at least 2 texts (InfoNCE negatives), got " << n);
  DEPTHKV_CHECK_AS("probe_representations", opt.drop_fraction >= 0.0 && opt.drop_fraction <= 1.0,
                   "drop fraction " << opt.drop_fraction << " outside [0, 1]");
  DEPTHKV_CHECK_AS("probe_representations", max_tokens >= 2,
                   "max_tokens " << max_tokens << " must be >= 2 (BOS and one token)");
  DEPTHKV_CHECK_AS("probe_representations", opt.bootstrap_resamples >= 1,
                   "bootstrap resamples " << opt.bootstrap_resamples << " must be >= 1");
  DEPTHKV_CHECK_AS("probe_representations", opt.confidence > 0.0 && opt.confidence < 1.0,
                   "confidence " << opt.confidence << " outside (0, 1)");
  DEPTHKV_CHECK_AS("probe_representations", opt.infonce.temperature > 0.0 && opt.infonce.batch_size >= 2,
                   "InfoNCE temperature " << opt.infonce.temperature << " must be > 0 and batch size "
                                          << opt.infonce.batch_size << " >= 2");
}

/// @return the stage index (`static_cast<int>(RepresentationStage)`) whose tensor is `point`,
///         or -1 when `point` is not one of the four stage points
inline int stage_index_of(CapturePoint point) {
  int s = -1;
  for (RepresentationStage st : representation_stages())
    if (capture_point_of(st) == point) s = static_cast<int>(st);
  return s;
}

/// pooled[stage][layer]: an [n x dim] matrix, one row per sample.
using StagePools = std::array<std::vector<Eigen::MatrixXd>, 4>;

/// @return four stages of `n_layers` [n x dim] matrices (contents unset, every row is written)
inline StagePools make_stage_pools(int n_layers, int n, int dim) {
  StagePools p;
  for (std::size_t s = 0; s < 4; ++s) p[s].assign(static_cast<std::size_t>(n_layers), Eigen::MatrixXd(n, dim));
  return p;
}

/// Sums one forward pass's hidden states over tokens (from position `first_pos` on) per stage
/// and layer, then pools them into one row of a `StagePools`.
class StageTokenSums {
 public:
  /// @param n_layers layers of the model
  /// @param dim hidden size
  /// @param first_pos first position summed (0 includes BOS, 1 leaves it out)
  StageTokenSums(int n_layers, int dim, std::int32_t first_pos)
      : n_layers_(n_layers), first_pos_(first_pos),
        sums_(static_cast<std::size_t>(4 * n_layers), Eigen::VectorXd(dim)) {}

  /// Zeroes every sum (before a pass).
  void reset() {
    for (auto& v : sums_) v.setZero();
  }

  /// Adds the rows of a captured block (positions pos0..) at or after `first_pos` to the sum of
  /// `point`'s stage at `layer`; ignores points that are not stage points.
  void add(int layer, CapturePoint point, std::int32_t pos0, const RowMatrix& rows) {
    const int s = stage_index_of(point);
    if (s < 0) return;
    const Eigen::Index skip = std::max<Eigen::Index>(0, static_cast<Eigen::Index>(first_pos_) - pos0);
    if (skip >= rows.rows()) return;
    sums_[static_cast<std::size_t>(s * n_layers_ + layer)] +=
        rows.bottomRows(rows.rows() - skip).cast<double>().colwise().sum().transpose();
  }

  /// Writes `pooled_embedding(sum / count)` of every stage and layer into row `sample` of `out`.
  /// @param count tokens summed (the pass's tokens minus `first_pos`)
  /// @param sample the row (also named in the error)
  /// @param out the pools
  /// @throws Error on a non-finite sum
  void pool_into(double count, int sample, StagePools& out) const {
    for (int s = 0; s < 4; ++s) {
      for (int l = 0; l < n_layers_; ++l) {
        const Eigen::VectorXd& sum = sums_[static_cast<std::size_t>(s * n_layers_ + l)];
        DEPTHKV_CHECK_AS("probe_representations", sum.allFinite(),
                         "non-finite hidden states at layer "
                             << l << ", stage "
                             << to_string(representation_stages()[static_cast<std::size_t>(s)]) << " (sample "
                             << sample << ")");
        const Eigen::MatrixXd mean = (sum / count).transpose();  // [1 x D]
        out[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)].row(sample) = pooled_embedding(mean).transpose();
      }
    }
  }

 private:
  int n_layers_;
  std::int32_t first_pos_;
  std::vector<Eigen::VectorXd> sums_;  ///< [stage * n_layers + layer]
};

/// One sample's two token sequences: the text cut to whole words within `max_tokens` and its
/// perturbed copy (`drop_words`, seeded per sample), both BOS first.
struct ProbeSampleIds {
  std::vector<int> text;       ///< the (possibly truncated) text
  std::vector<int> perturbed;  ///< its perturbed copy, capped at max_tokens
  bool cut = false;            ///< the text was truncated to fit
};

/// Builds sample `i`'s token sequences (steps 1-2 of the file comment).
/// @throws Error when no word of the text fits in `max_tokens` tokens
inline ProbeSampleIds probe_sample_ids(const TextTokenizer& tok, const std::string& raw, int i,
                                       const ProbeOptions& opt, int max_tokens) {
  ProbeSampleIds ids;
  const std::string text = fit_words(tok, raw, max_tokens, ids.cut);
  DEPTHKV_CHECK_AS("probe_representations", text.find_first_not_of(" \t\n\r\f\v") != std::string::npos,
                   "text " << i << " has no word that fits in " << max_tokens << " tokens (nothing to pool)");
  const std::string perturbed = drop_words(text, opt.drop_fraction, sample_seed(opt.seed, static_cast<std::uint64_t>(i)));
  ids.text = tok.encode(text, /*bos=*/true, /*eos=*/false);
  ids.perturbed = tok.encode(perturbed, /*bos=*/true, /*eos=*/false);
  if (static_cast<int>(ids.perturbed.size()) > max_tokens)
    ids.perturbed.resize(static_cast<std::size_t>(max_tokens));  // BPE corner case
  const int min_len = opt.include_bos ? 1 : 2;
  DEPTHKV_CHECK_AS(
      "probe_representations",
      static_cast<int>(ids.text.size()) >= min_len && static_cast<int>(ids.perturbed.size()) >= min_len,
      "text " << i << " has no word that fits in " << max_tokens << " tokens (nothing to pool)");
  assert(static_cast<int>(ids.text.size()) <= max_tokens);
  return ids;
}

/// Fills `r.stages` from the pooled anchors and positives: per stage and layer, InfoNCE losses
/// with their bootstrap mean CI (seeded from `opt.seed ^ 0xB007B007` and stage * L + layer),
/// effective rank and spectral entropy of the anchors.
inline void compute_stage_metrics(const StagePools& anchors, const StagePools& positives, const ProbeOptions& opt,
                                  ProbeResult& r) {
  const int L = r.n_layers;
  for (int s = 0; s < 4; ++s) {
    StageMetrics& m = r.stages[static_cast<std::size_t>(s)];
    for (int l = 0; l < L; ++l) {
      const Eigen::MatrixXd& z = anchors[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)];
      const Eigen::MatrixXd& zp = positives[static_cast<std::size_t>(s)][static_cast<std::size_t>(l)];
      std::vector<double> loss = infonce_losses(z, zp, opt.infonce);
      m.infonce.push_back(bootstrap_mean_ci(loss, opt.bootstrap_resamples, opt.confidence,
                                            sample_seed(opt.seed ^ 0xB007B007ULL, static_cast<std::uint64_t>(s * L + l))));
      m.losses.push_back(std::move(loss));
      m.erank.push_back(effective_rank(z));
      m.sentropy.push_back(spectral_entropy(z));
    }
  }
}

}  // namespace detail

/// Computes the representation metrics of `engine`'s model on `texts` (see the file comment).
/// @param engine the model's engine (any thread count; one fresh cache per pass)
/// @param tok its tokenizer
/// @param texts the samples (>= 2; each must keep at least one word within `max_tokens`)
/// @param opt options
/// @return per-stage, per-layer metrics, token counts and timings
/// @throws Error on fewer than 2 texts, a text without any word that fits, bad options, or
///         non-finite hidden states
inline ProbeResult probe_representations(const LlamaEngine& engine, const TextTokenizer& tok,
                                         const std::vector<std::string>& texts, const ProbeOptions& opt = ProbeOptions()) {
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  const LlamaConfig& cfg = engine.config();
  const int L = cfg.n_layers, D = cfg.dim;
  const int n = static_cast<int>(texts.size());
  const int max_tokens = opt.max_tokens > 0 ? opt.max_tokens : cfg.seq_len;
  detail::check_probe_options(n, opt, max_tokens);

  ProbeResult r;
  r.n_layers = L;
  r.n_samples = n;
  // anchors (texts) and positives (perturbed copies)
  detail::StagePools anchors = detail::make_stage_pools(L, n, D);
  detail::StagePools positives = detail::make_stage_pools(L, n, D);

  unsigned points = 0;
  for (RepresentationStage s : representation_stages()) points |= capture_bit(capture_point_of(s));
  const std::int32_t first_pos = opt.include_bos ? 0 : 1;
  detail::StageTokenSums sums(L, D, first_pos);

  ForwardOptions fo;
  fo.chunk_size = opt.chunk_size;
  fo.all_logits = false;
  fo.capture_points = points;
  fo.stats = opt.stats;
  fo.n_threads = opt.n_threads;
  fo.capture = [&](int layer, CapturePoint point, std::int32_t pos0, const RowMatrix& rows) {
    if (opt.capture) opt.capture(layer, point, pos0, rows);
    sums.add(layer, point, pos0, rows);
  };

  auto run_pass = [&](const std::vector<int>& ids, int sample, detail::StagePools& out) {
    sums.reset();
    HostCache cache = engine.make_cache(static_cast<int>(ids.size()));
    engine.prefill(ids, 0, cache, fo);
    ++r.forward_passes;
    sums.pool_into(static_cast<double>(ids.size()) - static_cast<double>(first_pos), sample, out);
  };

  for (int i = 0; i < n; ++i) {
    const detail::ProbeSampleIds ids =
        detail::probe_sample_ids(tok, texts[static_cast<std::size_t>(i)], i, opt, max_tokens);
    if (ids.cut) ++r.truncated;
    r.tokens.push_back(static_cast<int>(ids.text.size()));
    r.tokens_perturbed.push_back(static_cast<int>(ids.perturbed.size()));
    run_pass(ids.text, i, anchors);
    run_pass(ids.perturbed, i, positives);
    if (opt.progress) opt.progress(i + 1, n);
  }
  const auto t_fwd = Clock::now();

  detail::compute_stage_metrics(anchors, positives, opt, r);
  const auto t_end = Clock::now();
  r.seconds_forward = std::chrono::duration<double>(t_fwd - t_start).count();
  r.seconds_metrics = std::chrono::duration<double>(t_end - t_fwd).count();
  r.seconds_total = std::chrono::duration<double>(t_end - t_start).count();
  return r;
}

/// Writes a probe's metrics into `f.layer_metrics` under `infonce/<stage>` (mean, ci_low,
/// ci_high), `erank/<stage>` and `sentropy/<stage>` (mean only), replacing entries of the same keys.
/// @param f the profile file (its `n_layers` must be the probe's, or 0 on an empty file, then set)
/// @param r the probe result
/// @throws Error when the layer counts differ
inline void write_layer_metrics(ProfileFile& f, const ProbeResult& r) {
  if (f.n_layers == 0 && f.scorers.empty()) f.n_layers = r.n_layers;
  DEPTHKV_CHECK(f.n_layers == r.n_layers,
                "the profile has " << f.n_layers << " layers, the representation probe " << r.n_layers);
  for (RepresentationStage st : representation_stages()) {
    const StageMetrics& m = r.stage(st);
    LayerMetric inf, er, se;
    for (const MeanCI& c : m.infonce) {
      inf.mean.push_back(c.mean);
      inf.ci_low.push_back(c.ci_low);
      inf.ci_high.push_back(c.ci_high);
    }
    er.mean = m.erank;
    se.mean = m.sentropy;
    f.layer_metrics["infonce/" + to_string(st)] = inf;
    f.layer_metrics["erank/" + to_string(st)] = er;
    f.layer_metrics["sentropy/" + to_string(st)] = se;
  }
}

/// `probe_representations` then `write_layer_metrics` (what `depthkv profile --metrics infonce` calls).
/// @param f the profile file to add the metrics to
/// @param engine, tok, texts, opt as `probe_representations`
/// @return the probe result (timings for the cost report)
/// @throws Error as `probe_representations` and `write_layer_metrics` (f is unchanged then)
inline ProbeResult add_representation_metrics(ProfileFile& f, const LlamaEngine& engine, const TextTokenizer& tok,
                                              const std::vector<std::string>& texts,
                                              const ProbeOptions& opt = ProbeOptions()) {
  ProbeResult r = probe_representations(engine, tok, texts, opt);
  write_layer_metrics(f, r);
  return r;
}

}  // namespace llama
}  // namespace depthkv
