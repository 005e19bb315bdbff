#include "depthkv/sensitivity_profile.hpp"

#include <cmath>

#include <catch2/catch.hpp>

using Catch::Contains;
using depthkv::SensitivityProfile;

namespace {
SensitivityProfile two_layers() {
  SensitivityProfile p;
  p.keep_ratios = {0.2, 0.5};
  p.loss.resize(2, 2);
  p.loss << 0.9, 0.3,  // decreasing: extrapolated below 0.2 with slope 2 per unit ratio
      0.1, 0.4;         // rising towards 0.2: extrapolated flat
  p.loss_stderr = Eigen::MatrixXd::Constant(2, 2, 0.01);
  return p;
}
}  // namespace

TEST_CASE("loss_at interpolates, ends at (1, 0) and extrapolates below the smallest ratio", "[profile]") {
  const SensitivityProfile p = two_layers();
  REQUIRE_NOTHROW(p.validate());
  REQUIRE(p.n_layers() == 2);
  REQUIRE(p.n_ratios() == 2);
  REQUIRE(p.loss_at(0, 0.2) == Approx(0.9));
  REQUIRE(p.loss_at(0, 0.35) == Approx(0.6));
  REQUIRE(p.loss_at(0, 0.75) == Approx(0.15));
  REQUIRE(p.loss_at(0, 1.0) == Approx(0.0));
  REQUIRE(p.loss_at(0, 0.0) == Approx(0.9 + 2.0 * 0.2));
  REQUIRE(p.loss_at(1, 0.0) == Approx(0.1));
  REQUIRE(p.loss_at(1, 0.1) == Approx(0.1));
  REQUIRE_THROWS_AS(p.loss_at(2, 0.5), depthkv::Error);
  REQUIRE_THROWS_AS(p.loss_at(0, 1.5), depthkv::Error);
  SensitivityProfile one;
  one.keep_ratios = {0.5};
  one.loss = Eigen::MatrixXd::Constant(1, 1, 0.5);
  REQUIRE(one.loss_at(0, 0.0) == Approx(1.0));  // slope of the segment to (1, 0)
  REQUIRE(one.loss_at(0, 0.75) == Approx(0.25));
}

TEST_CASE("validate names what is wrong", "[profile]") {
  SensitivityProfile p = two_layers();
  p.keep_ratios = {};
  REQUIRE_THROWS_WITH(p.validate(), Contains("no keep ratios"));
  p = two_layers();
  p.keep_ratios = {0.5, 0.2};
  REQUIRE_THROWS_WITH(p.validate(), Contains("not strictly ascending"));
  p.keep_ratios = {0.2, 0.2};
  REQUIRE_THROWS_WITH(p.validate(), Contains("not strictly ascending"));
  p.keep_ratios = {0.2, 1.0};
  REQUIRE_THROWS_WITH(p.validate(), Contains("outside (0, 1)"));
  p.keep_ratios = {0.0, 0.5};
  REQUIRE_THROWS_WITH(p.validate(), Contains("outside (0, 1)"));
  p = two_layers();
  p.keep_ratios = {0.2, 0.5, 0.7};
  REQUIRE_THROWS_WITH(p.validate(), Contains("shape mismatch"));
  p = two_layers();
  p.loss_stderr = Eigen::MatrixXd::Zero(3, 2);
  REQUIRE_THROWS_WITH(p.validate(), Contains("stderr matrix is 3x2"));
  p = two_layers();
  p.loss(1, 1) = std::nan("");
  REQUIRE_THROWS_WITH(p.validate(), Contains("layer 1 at keep ratio 0.5 is not finite"));
  p = two_layers();
  p.loss(0, 1) = -0.1;
  REQUIRE_THROWS_WITH(p.validate(), Contains("layer 0 at keep ratio 0.5 is negative"));
  REQUIRE_NOTHROW(p.validate(/*allow_negative_loss=*/true));
  p = two_layers();
  p.loss_stderr(0, 0) = -1.0;
  REQUIRE_THROWS_WITH(p.validate(), Contains("stderr of layer 0"));
  p = two_layers();
  p.loss_stderr.resize(0, 0);
  REQUIRE_NOTHROW(p.validate());
}

TEST_CASE("metric names and MetricProfiles", "[profile]") {
  for (auto m : {depthkv::LossMetric::kKL, depthkv::LossMetric::kNLLIncrease, depthkv::LossMetric::kTop1Disagree}) {
    REQUIRE(depthkv::parse_loss_metric(depthkv::to_string(m)) == m);
  }
  REQUIRE_THROWS_WITH(depthkv::parse_loss_metric("ppl"), Contains("unknown loss metric 'ppl'"));
  depthkv::MetricProfiles mp;
  mp.kl = mp.top1 = mp.dnll = two_layers();
  mp.dnll.loss(0, 0) = -0.2;
  mp.n_samples = 4;
  REQUIRE_NOTHROW(mp.validate());
  REQUIRE(mp.profile(depthkv::LossMetric::kNLLIncrease).loss(0, 0) == 0.0);
  REQUIRE(mp.profile(depthkv::LossMetric::kKL).loss(0, 0) == Approx(0.9));
  mp.top1.loss(0, 0) = -0.2;
  REQUIRE_THROWS_WITH(mp.validate(), Contains("metric 'top1'"));
  mp.top1 = two_layers();
  mp.top1.keep_ratios = {0.3, 0.5};
  REQUIRE_THROWS_WITH(mp.validate(), Contains("other keep ratios"));
}
