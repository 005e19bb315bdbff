// The one explicit instantiation of Eigen::BDCSVD<Eigen::MatrixXd> that
// cmake/eigen_svd_extern.hpp declares.
#include <Eigen/Core>
#include <Eigen/SVD>

template class Eigen::BDCSVD<Eigen::MatrixXd>;
