// SPDX-License-Identifier: Apache-2.0
#pragma once

// Which GEMM the layers' Eigen matrix products (linear, ...) run on: OpenBLAS when the build
// defines EIGEN_USE_BLAS and STRATA_BLAS_OPENBLAS (the strata_core target does both under
// STRATA_USE_BLAS), otherwise Eigen's own kernels. For logs and benchmark reports.
//
// And how many threads that GEMM uses. OpenBLAS has one thread pool per process, sized to every
// CPU by default; when several ranks of comm::threads call it at once they queue for that pool,
// and a 2-rank run on 2 cores ran at 12.0k samples/s instead of 20.8k with one BLAS thread per
// rank (examples/01, measured). The trainer therefore sets the count (config blas_threads;
// automatic_blas_threads() when 0) before it trains.

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "strata/core/cpus.hpp"

#if defined(STRATA_BLAS_OPENBLAS)
extern "C" void openblas_set_num_threads(int);
extern "C" int openblas_get_num_threads(void);
#endif

namespace strata::model {

inline std::string_view blas_backend() {
#if defined(STRATA_BLAS_OPENBLAS)
  return "OpenBLAS (EIGEN_USE_BLAS)";
#else
  return "Eigen (built-in GEMM)";
#endif
}

// Threads of the GEMM: OpenBLAS's process-wide count; 1 for Eigen's own kernels (this build
// does not give Eigen OpenMP).
inline int blas_threads() noexcept {
#if defined(STRATA_BLAS_OPENBLAS)
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

// Sets the GEMM's thread count for the whole process (n >= 1); calls from several threads at
// once are serialised, and a call that changes nothing does nothing. No effect without OpenBLAS.
inline void set_blas_threads(int n) {
#if defined(STRATA_BLAS_OPENBLAS)
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  n = std::max(1, n);
  if (openblas_get_num_threads() != n) {
    openblas_set_num_threads(n);
  }
#else
  (void)n;
#endif
}

// Whether the environment sets the BLAS's threads (OPENBLAS_NUM_THREADS, or OMP_NUM_THREADS,
// which OpenBLAS also reads); the automatic choice then leaves them alone.
inline bool blas_threads_from_environment() noexcept {
  const auto set = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0';
  };
  return set("OPENBLAS_NUM_THREADS") || set("OMP_NUM_THREADS");
}

// The automatic count when `sharing` ranks run on this process's usable CPUs (comm::
// ranks_sharing_cpus: all ranks of comm::threads; under mpiexec the process alone when bound to
// its cores, else the node's ranks): those CPUs shared out, at least 1 per rank.
inline int automatic_blas_threads(int sharing) noexcept {
  return std::max(1, usable_cpus() / std::max(1, sharing));
}

}  // namespace strata::model
