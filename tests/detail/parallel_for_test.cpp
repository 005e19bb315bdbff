// run_eigen_serial runs on the calling thread without a team, with Eigen's products single-threaded,
// and leaves OpenMP's thread count as it found it; parallel_for runs every task once.

#include "depthkv/detail/parallel_for.hpp"

#include <catch2/catch.hpp>
#include <atomic>
#include <stdexcept>
#include <vector>

#include <Eigen/Core>

namespace {

TEST_CASE("run_eigen_serial runs on the calling thread with one Eigen thread and no team", "[parallel_for]") {
#ifdef _OPENMP
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);  // a program's own setting, which Eigen would otherwise use
  int level = -1, team = -1, eigen_threads = -1;
  depthkv::detail::run_eigen_serial([&] {
    level = omp_get_level();
    team = omp_get_num_threads();
    eigen_threads = Eigen::nbThreads();
  });
  CHECK(level == 0);  // no parallel region opened (a team of two would be level 1)
  CHECK(team == 1);
  CHECK(eigen_threads == 1);
  CHECK(omp_get_max_threads() == 3);  // restored
  CHECK_THROWS_AS(depthkv::detail::run_eigen_serial([] { throw std::runtime_error("x"); }), std::runtime_error);
  CHECK(omp_get_max_threads() == 3);  // restored on an exception too
  omp_set_num_threads(before);
#else
  int calls = 0;
  depthkv::detail::run_eigen_serial([&] { ++calls; });
  CHECK(calls == 1);
#endif
}

TEST_CASE("run_eigen_serial gives the single-threaded product's bytes", "[parallel_for]") {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(300, 1024), b = Eigen::MatrixXf::Random(1024, 300);
  Eigen::MatrixXf serial(300, 300), inside(300, 300);
  const int saved = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  serial.noalias() = a * b;
  Eigen::setNbThreads(0);  // back to OpenMP's count
  depthkv::detail::run_eigen_serial([&] { inside.noalias() = a * b; });
  CHECK((serial.array() == inside.array()).all());
  Eigen::setNbThreads(2);  // a program's Eigen setting overrides OpenMP's: the two-thread team path
  inside.setZero();
  depthkv::detail::run_eigen_serial([&] { inside.noalias() = a * b; });
  CHECK((serial.array() == inside.array()).all());
  Eigen::setNbThreads(saved);
}

TEST_CASE("parallel_for runs every task exactly once on any worker count", "[parallel_for]") {
  for (int workers : {1, 2, 5}) {
    std::vector<std::atomic<int>> hits(37);
    depthkv::detail::parallel_for(37, workers, [&](int, int t) { hits[static_cast<std::size_t>(t)].fetch_add(1); });
    for (const auto& h : hits) CHECK(h.load() == 1);
  }
}

}  // namespace
