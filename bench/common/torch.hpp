// SPDX-License-Identifier: Apache-2.0
#pragma once

// How the benchmarks run their PyTorch baselines so that each is at its best on the row's
// threads. Debian's PyTorch runs its float32 products on OpenBLAS's pthreads, which
// torch.set_num_threads does not size (they would take every CPU): OPENBLAS_NUM_THREADS does.
// That OpenBLAS may pick fallback kernels on a CPU it does not know: OPENBLAS_CORETYPE names
// the right ones. And PyTorch's OpenMP team spins between parallel regions on the CPUs
// OpenBLAS's threads need (on 2 cores at 2 threads: 4.3k-4.7k samples/s against 8.5k-10.2k
// sleeping), so each baseline runs twice, spinning and sleeping (OMP_WAIT_POLICY=PASSIVE),
// and the faster counts.

#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "spawn.hpp"

#include "strata/model/gemm.hpp"

namespace bench {

// "OPENBLAS_CORETYPE=..." giving OpenBLAS this CPU's widest kernels where this process's
// OpenBLAS picked narrower ones (the library's own test and advice, model/gemm.hpp), else "".
inline std::string openblas_coretype_fix(const strata::model::gemm_environment& env) {
  return env.openblas && strata::model::detail::openblas_fallback(env)
             ? strata::model::detail::openblas_fix(env.cpu)
             : std::string();
}

// `command` (the interpreter, the script and its arguments) run twice with OpenBLAS at
// `openblas_threads` threads and `coretype` (openblas_coretype_fix's assignment, when not empty):
// the faster run's JSON line (by its "samples_per_s"), with "wait_policy" added ("default":
// spinning, "passive": sleeping); nullopt when neither printed one.
inline std::optional<nlohmann::json> run_torch_best(const std::string& command,
                                                    int openblas_threads,
                                                    const std::string& coretype) {
  std::optional<nlohmann::json> best;
  for (const bool passive : {false, true}) {
    const std::string environment = "OPENBLAS_NUM_THREADS=" + std::to_string(openblas_threads) +
                                    " " + (passive ? "OMP_WAIT_POLICY=PASSIVE " : "") +
                                    (coretype.empty() ? "" : coretype + " ");
    auto run = run_json(environment + command);
    if (!run || !run->contains("samples_per_s")) {
      continue;
    }
    (*run)["wait_policy"] = passive ? "passive" : "default";
    if (!best || run->at("samples_per_s").get<double>() > best->at("samples_per_s").get<double>()) {
      best = std::move(run);
    }
  }
  return best;
}

}  // namespace bench
