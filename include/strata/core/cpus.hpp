// SPDX-License-Identifier: Apache-2.0
#pragma once

// How many CPUs this process may use and how many the machine has: what the trainer shares out
// among the ranks that run on them (model/blas.hpp).

#include <algorithm>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace strata {

// CPUs of the machine that are online (std::thread::hardware_concurrency), at least 1.
inline int machine_cpus() noexcept {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// CPUs this process may run on: its affinity mask on Linux (mpiexec binds ranks to cores), else
// machine_cpus(); at least 1.
inline int usable_cpus() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
#endif
  return machine_cpus();
}

// Whether the process is bound to part of the machine (its affinity mask is narrower).
inline bool cpus_bound() noexcept {
  return usable_cpus() < machine_cpus();
}

}  // namespace strata
