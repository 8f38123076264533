// SPDX-License-Identifier: Apache-2.0
#pragma once

// The GEMM's name for logs (blas_backend) and how many threads it uses.
//
// Which provider computes the layers' products is gemm.hpp's choice. Its threads: OpenBLAS has
// one thread pool per process, sized to every CPU by default; oneDNN runs an OpenMP team per
// calling thread, also sized to every CPU. When several ranks of comm::threads call either at
// once they oversubscribe the CPUs: a 2-rank run on 2 cores ran at 12.0k samples/s instead of
// 20.8k with one BLAS thread per rank (examples/01, OpenBLAS, measured). The trainer therefore
// sets the count (config blas_threads; automatic_blas_threads() when 0) before it trains, and
// the count holds for every provider.

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

#include "strata/core/cpus.hpp"
#include "strata/model/gemm.hpp"

namespace strata::model {

// The current provider and its kernels: "onednn (avx512_core, oneDNN 2.6.3)", "openblas
// (SkylakeX)", "eigen (Eigen AVX-512)".
inline std::string blas_backend() {
  const gemm_environment env = detect_gemm_environment();
  const gemm_provider p = current_gemm();
  return describe(decide_gemm(p, env), env);
}

// Threads of the current provider's products: OpenBLAS's process-wide pool; the OpenMP team
// set for oneDNN (set_blas_threads; before any, the CPUs this process may use, as OpenMP's
// default); 1 for Eigen's own kernels (this build does not give Eigen OpenMP).
inline int blas_threads() {
  switch (current_gemm()) {
    case gemm_provider::openblas:
#if defined(STRATA_BLAS_OPENBLAS)
      return openblas_get_num_threads();
#else
      return 1;
#endif
    case gemm_provider::onednn: {
      const int n = detail::gemm_omp_threads().load();
      return n > 0 ? n : usable_cpus();
    }
    case gemm_provider::eigen:
      return 1;
  }
  return 1;
}

// Sets the GEMM's thread count for the whole process (n >= 1): OpenBLAS's pool and the OpenMP
// team of every thread that calls oneDNN. Calls from several threads at once are serialised,
// and a call that changes nothing does nothing.
inline void set_blas_threads(int n) {
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  n = std::max(1, n);
#if defined(STRATA_BLAS_OPENBLAS)
  if (openblas_get_num_threads() != n) {
    openblas_set_num_threads(n);
  }
#endif
  detail::gemm_omp_threads().store(n);
}

// Whether the environment sets the GEMM's threads (OPENBLAS_NUM_THREADS, or OMP_NUM_THREADS,
// which OpenBLAS and oneDNN's OpenMP read); the automatic choice then leaves them alone.
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
