#pragma once
// Declares Eigen::BDCSVD<Eigen::MatrixXd> (used by depthkv/representation_metrics.hpp) explicitly
// instantiated elsewhere: cmake/eigen_svd_instance.cpp, compiled once per build. depthkv's own
// programs force-include this header (see depthkv_share_eigen_svd in CMakeLists.txt); instantiating
// the class and generating its code otherwise costs each translation unit that includes the
// representation metrics about 100 CPU-seconds at -O3.
#include <Eigen/Core>
#include <Eigen/SVD>

extern template class Eigen::BDCSVD<Eigen::MatrixXd>;
