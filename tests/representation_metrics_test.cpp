#include "depthkv/representation_metrics.hpp"

#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "depthkv/budget_allocator.hpp"

using Catch::Contains;

namespace {

int count_words(const std::string& s) {
  std::istringstream in(s);
  std::string w;
  int n = 0;
  while (in >> w) ++n;
  return n;
}

Eigen::MatrixXd random_unit_rows(std::mt19937& rng, int n, int dim) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Eigen::MatrixXd m(n, dim);
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < dim; ++d) m(i, d) = nd(rng);
    m.row(i).normalize();
  }
  return m;
}

}  // namespace

TEST_CASE("stage names round trip", "[metrics]") {
  for (auto s : {depthkv::RepresentationStage::kPreAttention, depthkv::RepresentationStage::kPostAttention,
                 depthkv::RepresentationStage::kPostAttentionResidual, depthkv::RepresentationStage::kPostMLP}) {
    REQUIRE(depthkv::parse_representation_stage(depthkv::to_string(s)) == s);
  }
  REQUIRE_THROWS_WITH(depthkv::parse_representation_stage("mlp"), Contains("unknown representation stage"));
}

TEST_CASE("word drop: 10% of the words, seeded, never empties a text", "[metrics]") {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "w" + std::to_string(i) + (i % 7 == 0 ? "\n" : "  ");
  const std::string a = depthkv::drop_words(text, 0.1, 42);
  REQUIRE(count_words(a) == 90);
  REQUIRE(depthkv::drop_words(text, 0.1, 42) == a);  // deterministic
  REQUIRE(depthkv::drop_words(text, 0.1, 43) != a);
  REQUIRE(depthkv::drop_words(text, 0.0, 1) == text);
  // Kept words keep their order and the whitespace before them.
  std::istringstream in(a);
  std::string w;
  int last = -1;
  while (in >> w) {
    const int k = std::stoi(w.substr(1));
    REQUIRE(k > last);
    last = k;
  }
  REQUIRE(depthkv::drop_words("", 0.1, 1).empty());
  REQUIRE(depthkv::drop_words("   \n", 0.5, 1) == "   \n");
  REQUIRE(depthkv::drop_words(" one ", 1.0, 1) == " one ");
  REQUIRE(depthkv::drop_words("a b", 1.0, 3).size() == 1);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 30)(rng);
    std::string t;
    for (int i = 0; i < n; ++i) t += (i ? " " : "") + std::string(1 + trial % 3, static_cast<char>('a' + i % 26));
    const double f = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    const std::string d = depthkv::drop_words(t, f, static_cast<std::uint64_t>(trial));
    REQUIRE(count_words(d) >= 1);
    REQUIRE(count_words(d) == n - std::min(n - 1, static_cast<int>(std::floor(f * n + 0.5))));
  }
  REQUIRE_THROWS_WITH(depthkv::drop_words("a", 1.5), Contains("fraction 1.5"));
}

TEST_CASE("pooled embedding is the normalised token mean", "[metrics]") {
  Eigen::MatrixXf h(2, 2);
  h << 1, 0, 3, 4;
  const Eigen::VectorXd z = depthkv::pooled_embedding(h);
  REQUIRE(z(0) == Approx(2.0 / std::sqrt(8.0)));
  REQUIRE(z(1) == Approx(2.0 / std::sqrt(8.0)));
  REQUIRE_THROWS_WITH(depthkv::pooled_embedding(Eigen::MatrixXd::Zero(3, 4)), Contains("is zero"));
  REQUIRE_THROWS_AS(depthkv::pooled_embedding(Eigen::MatrixXd(0, 4)), depthkv::Error);
}

TEST_CASE("InfoNCE: identical positives give the minimum, random ones about log(batch)", "[metrics]") {
  std::mt19937 rng(11);
  const int B = 16;
  // Orthonormal anchors, identical positives: loss = -log(e^{1/tau} / (e^{1/tau} + (B - 1))).
  const Eigen::MatrixXd eye = Eigen::MatrixXd::Identity(B, 32).eval();
  depthkv::InfoNCEOptions o;
  const auto l0 = depthkv::infonce_losses(eye, eye, o);
  const double expect = -std::log(std::exp(10.0) / (std::exp(10.0) + (B - 1)));
  for (double v : l0) REQUIRE(v == Approx(expect));
  // Any other positive gives a higher loss.
  const Eigen::MatrixXd other = random_unit_rows(rng, B, 32);
  const auto l1 = depthkv::infonce_losses(eye, other, o);
  for (int i = 0; i < B; ++i) REQUIRE(l1[static_cast<std::size_t>(i)] > l0[static_cast<std::size_t>(i)]);
  // Random high-dimensional representations: about log(B).
  const Eigen::MatrixXd za = random_unit_rows(rng, 64, 4096), zb = random_unit_rows(rng, 64, 4096);
  const auto lr = depthkv::infonce_losses(za, zb, o);
  double mean = 0.0;
  for (double v : lr) mean += v / lr.size();
  REQUIRE(mean == Approx(std::log(16.0)).margin(0.05));
  // Batches: 17 samples with batch 16 -> one batch of 17 (no batch of one).
  const auto l17 = depthkv::infonce_losses(za.topRows(17), za.topRows(17), o);
  const auto l16 = depthkv::infonce_losses(za.topRows(16), za.topRows(16), o);
  REQUIRE(l17[0] > l16[0]);  // one more negative
  REQUIRE(depthkv::infonce_losses(za, zb, o) == lr);  // deterministic
  REQUIRE_THROWS_WITH(depthkv::infonce_losses(za.topRows(1), zb.topRows(1)), Contains("at least 2 samples"));
  REQUIRE_THROWS_WITH(depthkv::infonce_losses(za, zb.topRows(3)), Contains("positives 3x4096"));
  o.temperature = 0.0;
  REQUIRE_THROWS_WITH(depthkv::infonce_losses(za, zb, o), Contains("temperature 0"));
}

TEST_CASE("percentile bootstrap", "[metrics]") {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(5.0, 1.0);
  std::vector<double> v;
  for (int i = 0; i < 200; ++i) v.push_back(nd(rng));
  const auto a = depthkv::bootstrap_mean_ci(v, 1000, 0.95, 7);
  REQUIRE(a.ci_low < a.mean);
  REQUIRE(a.mean < a.ci_high);
  // About mean +- 1.96 sigma / sqrt(n).
  REQUIRE(a.ci_high - a.ci_low == Approx(2 * 1.96 / std::sqrt(200.0)).epsilon(0.2));
  const auto b = depthkv::bootstrap_mean_ci(v, 1000, 0.95, 7);
  REQUIRE(a.ci_low == b.ci_low);
  REQUIRE(a.ci_high == b.ci_high);
  const auto c = depthkv::bootstrap_mean_ci({2.0, 2.0, 2.0});
  REQUIRE(c.ci_low == 2.0);
  REQUIRE(c.ci_high == 2.0);
  REQUIRE_THROWS_AS(depthkv::bootstrap_mean_ci({}), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::bootstrap_mean_ci({1.0}, 0), depthkv::Error);
  REQUIRE_THROWS_AS(depthkv::bootstrap_mean_ci({std::nan("")}), depthkv::Error);
}

TEST_CASE("effective rank and spectral entropy", "[metrics]") {
  const Eigen::MatrixXd eye = Eigen::MatrixXd::Identity(4, 6);
  REQUIRE(depthkv::effective_rank(eye) == Approx(4.0));
  REQUIRE(depthkv::spectral_entropy(eye) == Approx(std::log(4.0)));
  Eigen::MatrixXd r1(3, 2);
  r1 << 1, 2, 2, 4, 3, 6;
  REQUIRE(depthkv::effective_rank(r1) == Approx(1.0));
  REQUIRE(depthkv::spectral_entropy(r1) == Approx(0.0).margin(1e-12));
  Eigen::MatrixXd d = Eigen::MatrixXd::Zero(2, 2);
  d(0, 0) = 3.0;
  d(1, 1) = 1.0;  // p = 3/4, 1/4
  REQUIRE(depthkv::effective_rank(d) == Approx(std::exp(-(0.75 * std::log(0.75) + 0.25 * std::log(0.25)))));
  REQUIRE(depthkv::spectral_entropy(d) == Approx(-(0.9 * std::log(0.9) + 0.1 * std::log(0.1))));
  REQUIRE_THROWS_WITH(depthkv::effective_rank(Eigen::MatrixXd::Zero(2, 2)), Contains("is zero"));
}

TEST_CASE("Spearman correlation and p-values", "[metrics]") {
  auto c = depthkv::spearman({1, 2, 3, 4, 5}, {10, 20, 30, 40, 50});
  REQUIRE(c.rho == Approx(1.0));
  REQUIRE(c.exact);
  REQUIRE(c.p_value == Approx(2.0 / 120.0));
  c = depthkv::spearman({1, 2, 3, 4, 5}, {5, 4, 3, 2, 1});
  REQUIRE(c.rho == Approx(-1.0));
  // Ties get average ranks: ranks of y = 1.5, 1.5, 3, 4.
  c = depthkv::spearman({1, 2, 3, 4}, {7, 7, 8, 9});
  REQUIRE(c.rho == Approx(0.9486832981));
  REQUIRE(c.defined());
  // a constant series has no rank correlation (0/0): undefined, and which side was constant
  c = depthkv::spearman({1, 2, 3}, {4, 4, 4});
  REQUIRE_FALSE(c.defined());
  REQUIRE_FALSE(c.x_constant);
  REQUIRE(c.y_constant);
  REQUIRE(std::isnan(c.rho));
  REQUIRE(c.p_value == 1.0);
  c = depthkv::spearman({2, 2, 2, 2}, {4, 4, 4, 4});
  REQUIRE((!c.defined() && c.x_constant && c.y_constant));
  // t distribution: df = 1 is Cauchy, p = 1 - 2 atan(t) / pi; df = 2: p = 1 - t / sqrt(2 + t^2).
  const double pi = std::acos(-1.0);
  for (double t : {0.1, 0.7, 1.0, 3.0, 12.0}) {
    REQUIRE(depthkv::student_t_two_sided_p(t, 1.0) == Approx(1.0 - 2.0 * std::atan(t) / pi));
    REQUIRE(depthkv::student_t_two_sided_p(t, 2.0) == Approx(1.0 - t / std::sqrt(2.0 + t * t)));
  }
  // Large df: the normal limit, p(1.96) ~ 0.05.
  REQUIRE(depthkv::student_t_two_sided_p(1.959964, 1e6) == Approx(0.05).epsilon(1e-3));
  // n > 9: the t approximation.
  std::vector<double> x, y;
  for (int i = 0; i < 20; ++i) {
    x.push_back(i);
    y.push_back(i % 2 == 0 ? i : 40 - i);
  }
  c = depthkv::spearman(x, y);
  REQUIRE_FALSE(c.exact);
  const double t = c.rho * std::sqrt(18.0 / (1.0 - c.rho * c.rho));
  REQUIRE(c.p_value == Approx(depthkv::student_t_two_sided_p(t, 18.0)));
  REQUIRE_THROWS_WITH(depthkv::spearman({1, 2}, {1, 2}), Contains("at least 3 pairs"));
  REQUIRE_THROWS_WITH(depthkv::spearman({1, 2, 3}, {1, 2}), Contains("3 vs 2"));
}

TEST_CASE("MGA and MLMA budgets from InfoNCE scores: exact and within caps", "[metrics][allocator]") {
  std::mt19937 rng(17);
  depthkv::BudgetAllocator alloc;
  for (int trial = 0; trial < 200; ++trial) {
    depthkv::BudgetRequest req;
    const int n = std::uniform_int_distribution<int>(6, 32)(rng);
    req.lengths.assign(static_cast<std::size_t>(n), std::uniform_int_distribution<int>(64, 2048)(rng));
    req.keep_ratio = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    for (int l = 0; l < n; ++l) req.infonce.push_back(std::uniform_real_distribution<double>(0.1, 3.0)(rng));
    for (auto p : {depthkv::AllocationPolicy::kMGA, depthkv::AllocationPolicy::kMLMA2, depthkv::AllocationPolicy::kMLMA4,
                   depthkv::AllocationPolicy::kMLMA6, depthkv::AllocationPolicy::kMLP}) {
      depthkv::AllocationInfo info;
      const auto b = alloc.allocate(p, req, nullptr, &info);
      long long s = 0;
      for (std::size_t l = 0; l < b.size(); ++l) {
        REQUIRE(b[l] >= 0);
        REQUIRE(b[l] <= req.lengths[l]);
        s += b[l];
      }
      // the global budget is keep * (sum of the lengths), rounded to the nearest token
      const long long want = std::llround(
          req.keep_ratio * static_cast<double>(std::accumulate(req.lengths.begin(), req.lengths.end(), 0LL)));
      REQUIRE(s == want);
      REQUIRE(info.total == want);
      if (p == depthkv::AllocationPolicy::kMGA && !info.protected_reduced && info.prune_cap == 0.7) {
        REQUIRE(b[0] == req.lengths[0]);
        for (int x : b) REQUIRE(x >= static_cast<int>(std::ceil(0.3 * req.lengths[0] - 1e-9)));
      }
    }
  }
}
