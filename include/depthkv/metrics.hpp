#pragma once
/// @file metrics.hpp
/// @brief The quality of a pruned run against the full run, from their logits: mean
/// KL(full || pruned), the NLL increase of the true tokens and top-1 disagreement (Eigen only,
/// engine-agnostic; what `SensitivityProfiler` aggregates per sample).
///
/// For logits `full`, `pruned` of shape [T x V] and targets t_i (-1: none):
/// - KL = 1/T sum_i sum_v p_iv (log p_iv - log q_iv), p = softmax(full_i), q = softmax(pruned_i);
/// - dNLL = 1/|I| sum_{i in I} (log p_i,t_i - log q_i,t_i), I = the rows with a target;
/// - top-1 disagreement = 1/T #{i : argmax full_i != argmax pruned_i}.
/// Log-softmax is computed in double.
///
/// @code
/// depthkv::ContinuationMetrics m = depthkv::compare_logits(full, pruned, depthkv::continuation_targets(cont));
/// double kl = m.loss.kl;
/// @endcode

#include <cmath>
#include <cstddef>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"

namespace depthkv {

/// Logits, one row per position: [T x vocab], row-major float (`llama::RowMatrix`).
using LogitRows = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Per-sample losses of a pruned run against the full run (what the SensitivityProfiler
/// aggregates).
struct SampleLoss {
  double kl = 0;             ///< mean KL(full || pruned) over the positions
  double dnll = 0;           ///< mean NLL of the true tokens, pruned minus full (may be < 0)
  double top1_disagree = 0;  ///< fraction of positions whose argmax differs from the full run's
};

/// Losses plus the raw NLLs of one window.
struct ContinuationMetrics {
  SampleLoss loss;
  double nll_full = 0;    ///< mean NLL of the true tokens, full cache
  double nll_pruned = 0;  ///< and pruned
  int n_positions = 0;    ///< rows compared (KL, top-1)
  int n_targets = 0;      ///< rows with a true next token (NLL)
};

/// Log-softmax of each row, in double.
inline Eigen::MatrixXd log_softmax_rows(const LogitRows& logits) {
  Eigen::MatrixXd out(logits.rows(), logits.cols());
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    const Eigen::RowVectorXd r = logits.row(i).cast<double>();
    const double mx = r.maxCoeff();
    const double lse = mx + std::log((r.array() - mx).exp().sum());
    out.row(i) = r.array() - lse;
  }
  return out;
}

/// `compare_logits` with the full run's log-softmax given, `full_log_softmax =
/// log_softmax_rows(full)`: for several pruned runs against one full run (the full run's rows are
/// normalised once). The same result, bit for bit.
/// @throws Error as `compare_logits`
inline ContinuationMetrics compare_log_softmax(const Eigen::MatrixXd& full_log_softmax, const LogitRows& pruned,
                                               const std::vector<int>& targets) {
  const Eigen::MatrixXd& lf = full_log_softmax;
  DEPTHKV_CHECK(lf.rows() == pruned.rows() && lf.cols() == pruned.cols() && lf.rows() >= 1,
                "logits shapes differ: [" << lf.rows() << " x " << lf.cols() << "] vs [" << pruned.rows() << " x "
                                          << pruned.cols() << "]");
  DEPTHKV_CHECK(static_cast<Eigen::Index>(targets.size()) == lf.rows(),
                targets.size() << " targets for " << lf.rows() << " rows");
  const Eigen::MatrixXd lp = log_softmax_rows(pruned);
  ContinuationMetrics m;
  m.n_positions = static_cast<int>(lf.rows());
  double kl = 0, dis = 0, nf = 0, np = 0;
  for (Eigen::Index i = 0; i < lf.rows(); ++i) {
    const double kl_i = (lf.row(i).array().exp() * (lf.row(i) - lp.row(i)).array()).sum();
    DEPTHKV_CHECK(std::isfinite(kl_i), "continuation row " << i << ": the KL of the logits is not finite (inf or NaN "
                                                               "logits, or logits so large that log-softmax overflows)");
    kl += kl_i;
    Eigen::Index af = 0, ap = 0;
    lf.row(i).maxCoeff(&af);  // the logits' argmax (log-softmax keeps the order)
    pruned.row(i).maxCoeff(&ap);
    dis += af != ap ? 1.0 : 0.0;
    const int t = targets[static_cast<std::size_t>(i)];
    if (t >= 0) {
      DEPTHKV_CHECK(t < lf.cols(), "target " << t << " outside the vocabulary of " << lf.cols());
      DEPTHKV_CHECK(std::isfinite(lf(i, t)) && std::isfinite(lp(i, t)),
                    "continuation row " << i << ": the NLL of target " << t << " is not finite");
      nf -= lf(i, t);
      np -= lp(i, t);
      ++m.n_targets;
    }
  }
  m.loss.kl = kl / m.n_positions;
  m.loss.top1_disagree = dis / m.n_positions;
  if (m.n_targets > 0) {
    m.nll_full = nf / m.n_targets;
    m.nll_pruned = np / m.n_targets;
    m.loss.dnll = m.nll_pruned - m.nll_full;
  }
  return m;
}

/// Compares the continuation logits of a pruned run with those of the full run.
/// @param full, pruned logits `[Tc x vocab]` (same shape)
/// @param targets true next token of each row, or -1 where there is none (size Tc)
/// @return mean KL(full || pruned) and top-1 disagreement over all rows, NLLs over the rows with a target
/// @throws Error on mismatched shapes, a target outside the vocabulary, or a row whose KL or
///   NLL is not finite (naming the row)
inline ContinuationMetrics compare_logits(const LogitRows& full, const LogitRows& pruned, const std::vector<int>& targets) {
  DEPTHKV_CHECK(full.rows() == pruned.rows() && full.cols() == pruned.cols() && full.rows() >= 1,
                "logits shapes differ: [" << full.rows() << " x " << full.cols() << "] vs [" << pruned.rows() << " x "
                                          << pruned.cols() << "]");
  return compare_log_softmax(log_softmax_rows(full), pruned, targets);
}

/// The targets of a teacher-forced continuation: row i predicts `continuation[i + 1]`; the last
/// row has none (-1).
inline std::vector<int> continuation_targets(const std::vector<int>& continuation) {
  std::vector<int> t(continuation.size(), -1);
  for (std::size_t i = 0; i + 1 < continuation.size(); ++i) t[i] = continuation[i + 1];
  return t;
}

}  // namespace depthkv
