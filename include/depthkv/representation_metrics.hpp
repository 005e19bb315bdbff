#pragma once
/// @file representation_metrics.hpp
/// @brief Per-layer representation metrics computed without any pruning run (the DepthKV
/// paper's allocation signal): InfoNCE between a text and a word-dropped copy, its percentile
/// bootstrap confidence interval, effective rank and spectral entropy, and the Spearman
/// correlation (with p-value) used to compare a metric with measured sensitivity.
/// Engine-agnostic (Eigen only): the engine hands over hidden states.
///
/// ## InfoNCE (depthkv's definition; the paper gives no tau or batch size)
/// For each sample i, z_i is the hidden states of text i at one layer and stage, mean-pooled over
/// tokens and L2-normalised (`pooled_embedding`); z'_i is the same for the perturbed copy of the
/// text (`drop_words`: 10% of its whitespace-separated words dropped). With cosine similarity
/// sim and temperature tau, over a batch of B samples:
///   loss_i = -log( exp(sim(z_i, z'_i)/tau) / (exp(sim(z_i, z'_i)/tau) + sum_{j != i} exp(sim(z_i, z_j)/tau)) )
/// i.e. the positive pair against the other texts of the batch at the same layer and stage.
/// Random, unrelated representations give about log(B); identical positives give the minimum
/// for the given negatives. Defaults: tau = 0.1 (the SimCLR/SimCSE range), batch size 16;
/// samples are split into consecutive batches of that size, and a last batch of a single sample
/// (which has no negative) is merged into the previous one. Lower InfoNCE = the layer keeps a
/// text recognisable = (per the paper) a more critical layer.
///
/// Stages per layer (`RepresentationStage`): pre-attention (the layer's input), post-attention
/// (the attention output projection, before the residual add), post-attention residual (after
/// that add), post-MLP (the layer's output). The engine decides which tensor it hands over for
/// each and documents it.
///
/// @code
/// // engine: hidden states [n_tokens x dim] of text i and its word-dropped copy, per layer/stage
/// Eigen::MatrixXd z(n, dim), zp(n, dim);
/// for (int i = 0; i < n; ++i) {
///   z.row(i) = depthkv::pooled_embedding(h_text[i]).transpose();
///   zp.row(i) = depthkv::pooled_embedding(h_dropped[i]).transpose();
/// }
/// std::vector<double> loss = depthkv::infonce_losses(z, zp);
/// depthkv::MeanCI ci = depthkv::bootstrap_mean_ci(loss);   // 1000 resamples, 95%, seeded
/// @endcode

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <Eigen/SVD>

#include "depthkv/error.hpp"

namespace depthkv {

/// Where in a transformer layer a representation is taken.
enum class RepresentationStage {
  kPreAttention,           ///< "pre_attn": the attention block's input
  kPostAttention,          ///< "post_attn": output projection, before the residual add
  kPostAttentionResidual,  ///< "post_attn_resid": after the attention residual add
  kPostMLP,                ///< "post_mlp": the layer's output (after the MLP residual add)
};

/// @return "pre_attn", "post_attn", "post_attn_resid" or "post_mlp"
inline std::string to_string(RepresentationStage s) {
  switch (s) {
    case RepresentationStage::kPreAttention: return "pre_attn";
    case RepresentationStage::kPostAttention: return "post_attn";
    case RepresentationStage::kPostAttentionResidual: return "post_attn_resid";
    case RepresentationStage::kPostMLP: return "post_mlp";
  }
  return "unknown";
}

/// @param name one of the names `to_string(RepresentationStage)` returns
/// @throws Error on an unknown name
inline RepresentationStage parse_representation_stage(const std::string& name) {
  for (auto s : {RepresentationStage::kPreAttention, RepresentationStage::kPostAttention,
                 RepresentationStage::kPostAttentionResidual, RepresentationStage::kPostMLP}) {
    if (to_string(s) == name) return s;
  }
  DEPTHKV_FAIL("unknown representation stage '" << name << "' (expected pre_attn, post_attn, post_attn_resid, post_mlp)");
}

namespace detail {
/// splitmix64: a small, fully specified generator (the same numbers on every platform, unlike
/// the standard distributions).
struct SplitMix64 {
  std::uint64_t s;
  explicit SplitMix64(std::uint64_t seed) : s(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n) by modulo (bias < n / 2^64, negligible here).
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

/// @return the [begin, end) byte spans of the whitespace-separated words of `text` (whitespace:
///         " \t\n\r\f\v"), in order
inline std::vector<std::pair<std::size_t, std::size_t>> word_spans(const std::string& text) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  std::vector<std::pair<std::size_t, std::size_t>> words;  // [begin, end)
  for (std::size_t i = 0; i < text.size();) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i >= text.size()) break;
    const std::size_t b = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    words.emplace_back(b, i);
  }
  return words;
}

/// Chooses `k` of `n` items uniformly without replacement (the first k steps of a Fisher-Yates
/// shuffle driven by SplitMix64(seed)).
/// @return [n] true for the chosen items
inline std::vector<bool> choose_without_replacement(std::size_t n, std::size_t k, std::uint64_t seed) {
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  SplitMix64 rng(seed);
  for (std::size_t i = 0; i < k; ++i) std::swap(idx[i], idx[i + static_cast<std::size_t>(rng.below(n - i))]);
  std::vector<bool> chosen(n, false);
  for (std::size_t i = 0; i < k; ++i) chosen[idx[i]] = true;
  return chosen;
}

/// `text` without its dropped words: a dropped word takes the whitespace before it along (the
/// text's leading whitespace stays before the first kept word), all other characters are kept.
/// @param words the word spans (`word_spans(text)`, not empty)
/// @param drop [words] true for the words to leave out (not all of them)
inline std::string join_kept_words(const std::string& text, const std::vector<std::pair<std::size_t, std::size_t>>& words,
                                   const std::vector<bool>& drop) {
  const std::size_t n = words.size();
  std::string out;
  out.reserve(text.size());
  bool first = true;
  for (std::size_t w = 0; w < n; ++w) {
    if (drop[w]) continue;
    const std::size_t gap_begin = w == 0 ? 0 : words[w - 1].second;  // whitespace before word w
    if (first) {
      out.append(text, 0, words[0].first);  // leading whitespace of the text
      first = false;
    } else {
      out.append(text, gap_begin, words[w].first - gap_begin);
    }
    out.append(text, words[w].first, words[w].second - words[w].first);
  }
  out.append(text, words[n - 1].second, std::string::npos);  // trailing whitespace
  return out;
}
}  // namespace detail

/// Drops a fraction of the whitespace-separated words of a text (the positive pair of InfoNCE).
/// Exactly round(fraction * n_words) words are dropped, chosen uniformly without replacement
/// (seeded; the same result on every platform), but never all of them: a text with at least one
/// word keeps at least one. A dropped word takes the whitespace before it along; all other
/// characters are kept as they were. A text without words is returned unchanged.
/// @param text the text
/// @param fraction in [0, 1] (default 0.1)
/// @param seed the random seed
/// @return the perturbed text
/// @throws Error on a fraction outside [0, 1]
inline std::string drop_words(const std::string& text, double fraction = 0.1, std::uint64_t seed = 0) {
  DEPTHKV_CHECK(fraction >= 0.0 && fraction <= 1.0, "fraction " << fraction << " outside [0, 1]");
  const std::vector<std::pair<std::size_t, std::size_t>> words = detail::word_spans(text);
  const std::size_t n = words.size();
  if (n == 0) return text;
  std::size_t k = static_cast<std::size_t>(std::floor(fraction * static_cast<double>(n) + 0.5));
  k = std::min(k, n - 1);
  return detail::join_kept_words(text, words, detail::choose_without_replacement(n, k, seed));
}

/// Mean over tokens, then L2 normalisation.
/// @param hidden [n_tokens x dim] hidden states (any Eigen matrix expression, float or double)
/// @return the unit-length pooled vector (dim)
/// @throws Error on no tokens, a non-finite value, or a zero pooled vector
template <class Derived>
Eigen::VectorXd pooled_embedding(const Eigen::MatrixBase<Derived>& hidden) {
  DEPTHKV_CHECK(hidden.rows() >= 1 && hidden.cols() >= 1, "empty hidden states (" << hidden.rows() << "x" << hidden.cols() << ")");
  const Eigen::MatrixXd h = hidden.template cast<double>();
  DEPTHKV_CHECK(h.allFinite(), "hidden states contain NaN or infinite values");
  Eigen::VectorXd m = h.colwise().mean().transpose();
  const double norm = m.norm();
  DEPTHKV_CHECK(norm > 0.0, "mean-pooled representation is zero, cannot normalise");
  return m / norm;
}

/// InfoNCE options (see the file comment).
struct InfoNCEOptions {
  double temperature = 0.1;  ///< tau > 0
  int batch_size = 16;       ///< samples per batch (>= 2); negatives come from the same batch
};

/// Per-sample InfoNCE losses (see the file comment for the formula and the batching).
/// @param anchors [n x dim] unit rows z_i (text i)
/// @param positives [n x dim] unit rows z'_i (perturbed text i)
/// @param opts temperature and batch size
/// @return n losses (each >= 0)
/// @throws Error on shape mismatch, n < 2, tau <= 0, batch size < 2, non-finite input
inline std::vector<double> infonce_losses(const Eigen::MatrixXd& anchors, const Eigen::MatrixXd& positives,
                                          const InfoNCEOptions& opts = {}) {
  DEPTHKV_CHECK(anchors.rows() == positives.rows() && anchors.cols() == positives.cols(),
                "anchors are " << anchors.rows() << "x" << anchors.cols() << ", positives " << positives.rows() << "x"
                               << positives.cols());
  DEPTHKV_CHECK(anchors.rows() >= 2, "InfoNCE needs at least 2 samples (negatives), got " << anchors.rows());
  DEPTHKV_CHECK(std::isfinite(opts.temperature) && opts.temperature > 0.0, "temperature " << opts.temperature << " must be > 0");
  DEPTHKV_CHECK(opts.batch_size >= 2, "batch size " << opts.batch_size << " must be >= 2");
  DEPTHKV_CHECK(anchors.allFinite() && positives.allFinite(), "representations contain NaN or infinite values");
  const Eigen::Index n = anchors.rows();
  std::vector<double> out(static_cast<std::size_t>(n));
  for (Eigen::Index b0 = 0; b0 < n;) {
    Eigen::Index b1 = std::min<Eigen::Index>(n, b0 + opts.batch_size);
    if (n - b1 == 1) b1 = n;  // never leave a batch of one sample
    for (Eigen::Index i = b0; i < b1; ++i) {
      // log-sum-exp over the positive and the negatives of the batch.
      std::vector<double> logits;
      const double pos = anchors.row(i).dot(positives.row(i)) / opts.temperature;
      logits.push_back(pos);
      for (Eigen::Index j = b0; j < b1; ++j) {
        if (j != i) logits.push_back(anchors.row(i).dot(anchors.row(j)) / opts.temperature);
      }
      const double mx = *std::max_element(logits.begin(), logits.end());
      double s = 0.0;
      for (double v : logits) s += std::exp(v - mx);
      out[static_cast<std::size_t>(i)] = (mx + std::log(s)) - pos;
    }
    b0 = b1;
  }
  return out;
}

/// A mean with a confidence interval.
struct MeanCI {
  double mean = 0.0;     ///< sample mean
  double ci_low = 0.0;   ///< lower bound
  double ci_high = 0.0;  ///< upper bound
};

/// Percentile bootstrap confidence interval of the mean: `resamples` resamples with
/// replacement (seeded splitmix64, the same on every platform), the interval between the
/// (1 - level)/2 and (1 + level)/2 quantiles of the resampled means (linear interpolation
/// between order statistics).
/// @param v the samples (>= 1, finite)
/// @param resamples number of resamples (default 1000)
/// @param level confidence level in (0, 1) (default 0.95)
/// @param seed the random seed
/// @return mean and interval
/// @throws Error on empty or non-finite input, resamples < 1, level outside (0, 1)
inline MeanCI bootstrap_mean_ci(const std::vector<double>& v, int resamples = 1000, double level = 0.95,
                                std::uint64_t seed = 0) {
  DEPTHKV_CHECK(!v.empty(), "bootstrap of an empty sample");
  DEPTHKV_CHECK(resamples >= 1, "resamples " << resamples << " must be >= 1");
  DEPTHKV_CHECK(level > 0.0 && level < 1.0, "level " << level << " outside (0, 1)");
  for (double x : v) DEPTHKV_CHECK(std::isfinite(x), "bootstrap sample contains a non-finite value");
  const std::size_t n = v.size();
  MeanCI r;
  r.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  detail::SplitMix64 rng(seed);
  std::vector<double> means(static_cast<std::size_t>(resamples));
  for (auto& m : means) {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += v[static_cast<std::size_t>(rng.below(n))];
    m = s / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  auto quantile = [&](double q) {
    const double pos = q * static_cast<double>(means.size() - 1);
    const auto lo = static_cast<std::size_t>(std::floor(pos));
    const std::size_t hi = std::min(lo + 1, means.size() - 1);
    return means[lo] + (pos - static_cast<double>(lo)) * (means[hi] - means[lo]);
  };
  r.ci_low = quantile((1.0 - level) / 2.0);
  r.ci_high = quantile((1.0 + level) / 2.0);
  return r;
}

/// Singular values of a representation matrix as given (rows = samples or tokens; no centring).
inline Eigen::VectorXd representation_singular_values(const Eigen::MatrixXd& x) {
  DEPTHKV_CHECK(x.rows() >= 1 && x.cols() >= 1 && x.allFinite(), "empty or non-finite representation matrix");
  return Eigen::BDCSVD<Eigen::MatrixXd>(x).singularValues();
}

/// Effective rank (Roy & Vetterli 2007): exp of the Shannon entropy (nats) of the singular
/// values normalised to sum 1. Between 1 (rank one) and min(rows, cols) (all equal).
/// @throws Error on an empty, non-finite or all-zero matrix
inline double effective_rank(const Eigen::MatrixXd& x) {
  const Eigen::VectorXd s = representation_singular_values(x);
  const double total = s.sum();
  DEPTHKV_CHECK(total > 0.0, "representation matrix is zero");
  double h = 0.0;
  for (Eigen::Index i = 0; i < s.size(); ++i) {
    const double p = s(i) / total;
    if (p > 0.0) h -= p * std::log(p);
  }
  return std::exp(h);
}

/// Spectral entropy: Shannon entropy (nats) of the eigenvalues of X^T X (squared singular values)
/// normalised to sum 1. Between 0 (rank one) and log(min(rows, cols)).
/// @throws Error on an empty, non-finite or all-zero matrix
inline double spectral_entropy(const Eigen::MatrixXd& x) {
  const Eigen::VectorXd s = representation_singular_values(x);
  const double total = s.squaredNorm();
  DEPTHKV_CHECK(total > 0.0, "representation matrix is zero");
  double h = 0.0;
  for (Eigen::Index i = 0; i < s.size(); ++i) {
    const double p = s(i) * s(i) / total;
    if (p > 0.0) h -= p * std::log(p);
  }
  return h;
}

namespace detail {

/// Ranks 1..n, ties get their average rank.
inline std::vector<double> average_ranks(const std::vector<double>& v) {
  const std::size_t n = v.size();
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> r(n);
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j + 1 < n && v[idx[j + 1]] == v[idx[i]]) ++j;
    const double avg = 0.5 * static_cast<double>(i + j) + 1.0;
    for (std::size_t k = i; k <= j; ++k) r[idx[k]] = avg;
    i = j + 1;
  }
  return r;
}

inline double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n, mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0.0, saa = 0.0, sbb = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  if (saa == 0.0 || sbb == 0.0) return std::numeric_limits<double>::quiet_NaN();
  return sab / std::sqrt(saa * sbb);
}

/// Continued fraction of the regularised incomplete beta function (modified Lentz).
inline double beta_cf(double a, double b, double x) {
  const double tiny = 1e-300, eps = 1e-15;
  double qab = a + b, qap = a + 1.0, qam = a - 1.0, c = 1.0, d = 1.0 - qab * x / qap;
  if (std::abs(d) < tiny) d = tiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double m2 = 2.0 * m;
    double aa = m * (b - m) * x / ((qam + m2) * (a + m2));
    d = 1.0 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    h *= d * c;
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
    d = 1.0 + aa * d;
    if (std::abs(d) < tiny) d = tiny;
    c = 1.0 + aa / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1.0) < eps) break;
  }
  return h;
}

/// Regularised incomplete beta I_x(a, b).
inline double incomplete_beta(double a, double b, double x) {
  if (x <= 0.0) return 0.0;
  if (x >= 1.0) return 1.0;
  const double lbt = std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x);
  if (x < (a + 1.0) / (a + b + 2.0)) return std::exp(lbt) * beta_cf(a, b, x) / a;
  return 1.0 - std::exp(lbt) * beta_cf(b, a, 1.0 - x) / b;
}

}  // namespace detail

/// Two-sided p-value of Student's t statistic with `df` degrees of freedom:
/// p = I_{df/(df+t^2)}(df/2, 1/2).
inline double student_t_two_sided_p(double t, double df) {
  DEPTHKV_CHECK(df > 0.0, "degrees of freedom " << df << " must be > 0");
  if (!std::isfinite(t)) return 0.0;
  return detail::incomplete_beta(df / 2.0, 0.5, df / (df + t * t));
}

/// A rank correlation and its two-sided p-value. The correlation of a constant series (all its
/// values equal, so all its ranks tie) is undefined (0/0): then `defined()` is false, `rho` is
/// NaN and `p_value` 1, and `x_constant` / `y_constant` say which side was constant; a caller
/// that prints or writes the result reports it as undefined with that reason (e.g.
/// "undefined (constant ...)"), never as a number.
struct Correlation {
  double rho = 0.0;     ///< Spearman's rho (Pearson on average ranks); NaN when one side is constant
  double p_value = 1.0; ///< two-sided p-value of H0: no monotone association
  bool exact = false;   ///< true: exact permutation test; false: t approximation
  bool x_constant = false;  ///< the first series has one value throughout (rho undefined)
  bool y_constant = false;  ///< the second series has one value throughout (rho undefined)

  /// false when either series is constant: rho is then undefined (NaN), not a correlation
  bool defined() const { return !x_constant && !y_constant; }
};

/// Spearman rank correlation with a two-sided p-value: for n <= 9 exact, by enumerating all n!
/// permutations of the second ranking (p = fraction with |rho_perm| >= |rho| - 1e-12); above,
/// the t approximation t = rho sqrt((n - 2) / (1 - rho^2)) with n - 2 degrees of freedom.
/// @param x, y paired values (same length >= 3, finite)
/// @return the correlation; undefined (`Correlation::defined()` false, rho NaN, p 1) when x or y
///   is constant
/// @throws Error on different lengths, n < 3 or non-finite values
inline Correlation spearman(const std::vector<double>& x, const std::vector<double>& y) {
  DEPTHKV_CHECK(x.size() == y.size(), "spearman: " << x.size() << " vs " << y.size() << " values");
  DEPTHKV_CHECK(x.size() >= 3, "spearman needs at least 3 pairs, got " << x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    DEPTHKV_CHECK(std::isfinite(x[i]) && std::isfinite(y[i]), "spearman: non-finite value at index " << i);
  }
  const std::vector<double> rx = detail::average_ranks(x), ry = detail::average_ranks(y);
  Correlation c;
  c.x_constant = std::all_of(x.begin(), x.end(), [&](double v) { return v == x.front(); });
  c.y_constant = std::all_of(y.begin(), y.end(), [&](double v) { return v == y.front(); });
  if (!c.defined()) {
    c.rho = std::numeric_limits<double>::quiet_NaN();
    c.p_value = 1.0;
    return c;
  }
  c.rho = detail::pearson(rx, ry);
  const std::size_t n = x.size();
  if (n <= 9) {
    c.exact = true;
    std::vector<double> perm = ry;
    std::sort(perm.begin(), perm.end());
    long long hits = 0, total = 0;
    do {
      ++total;
      if (std::abs(detail::pearson(rx, perm)) >= std::abs(c.rho) - 1e-12) ++hits;
    } while (std::next_permutation(perm.begin(), perm.end()));
    // With tied ranks next_permutation visits distinct arrangements only; each stands for the
    // same number of permutations, so the fraction is unchanged.
    c.p_value = static_cast<double>(hits) / static_cast<double>(total);
    return c;
  }
  const double r = std::min(1.0, std::abs(c.rho));
  const double df = static_cast<double>(n) - 2.0;
  c.p_value = r >= 1.0 ? 0.0 : student_t_two_sided_p(r * std::sqrt(df / (1.0 - r * r)), df);
  return c;
}

}  // namespace depthkv
