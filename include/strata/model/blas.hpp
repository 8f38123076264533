// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which GEMM the layers' Eigen matrix products (linear, ...) run on: OpenBLAS when the build
// defines EIGEN_USE_BLAS and STRATA_BLAS_OPENBLAS (the strata_core target does both under
// STRATA_USE_BLAS), otherwise Eigen's own kernels. For logs and benchmark reports.

#include <string_view>

namespace strata::model {

inline std::string_view blas_backend() {
#if defined(STRATA_BLAS_OPENBLAS)
  return "OpenBLAS (EIGEN_USE_BLAS)";
#else
  return "Eigen (built-in GEMM)";
#endif
}

}  // namespace strata::model
