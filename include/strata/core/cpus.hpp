// SPDX-License-Identifier: Apache-2.0
#pragma once

// How many CPUs this process may use and how many the machine has: what the trainer shares out
// among the ranks that run on them (model/blas.hpp); and the priority of the calling thread,
// which the loader's workers lower below the compute threads'.

#include <algorithm>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
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

// The calling thread's nice value (Linux: each thread has its own), or 0 where threads have
// none of their own.
inline int this_thread_nice() noexcept {
#if defined(__linux__)
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  return errno == 0 ? nice : 0;
#else
  return 0;
#endif
}

// Adds `increment` (> 0: lower priority) to the calling thread's nice value, at most 19; true
// when done. Only this thread changes (Linux). Elsewhere, or when the system refuses, false and
// nothing changes.
inline bool lower_this_thread_priority(int increment) noexcept {
#if defined(__linux__)
  if (increment <= 0) {
    return false;
  }
  const int target = std::min(19, this_thread_nice() + increment);
  return setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), target) == 0;
#else
  (void)increment;
  return false;
#endif
}

}  // namespace strata
