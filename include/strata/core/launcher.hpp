// SPDX-License-Identifier: Apache-2.0
#pragma once

// launch_info: whether this process is one of several that a parallel launcher started, read
// from the variables the launchers set in each process's environment:
//   - Open MPI's mpiexec / mpirun: OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK;
//   - MPICH's and Intel MPI's Hydra (and other PMI launchers): PMI_SIZE and PMI_RANK.
// The trainer uses it to refuse a configuration that would not use the other processes
// (train/trainer.hpp): under `mpiexec -n 2`, world_size = 1 or communication_backend = "threads"
// would have each process train alone into the same checkpoint directory.
//
//   if (auto launch = strata::detect_launch(); launch && launch->size > 1) { ... }
//
// The environment is read through a function, so tests give made-up ones.

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace strata {

struct launch_info {
  std::string launcher;  // "Open MPI's mpiexec", ...
  std::string variable;  // the variable that gave the size: "OMPI_COMM_WORLD_SIZE"
  int size = 1;          // processes the launcher started
  int rank = 0;          // this one's index among them

  friend bool operator==(const launch_info&, const launch_info&) = default;
};

namespace detail {

// A non-negative int, or nullopt for anything else (missing, empty, trailing text).
inline std::optional<int> launch_number(const char* text) {
  if (text == nullptr) {
    return std::nullopt;
  }
  const std::string_view s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty() || value < 0) {
    return std::nullopt;
  }
  return value;
}

}  // namespace detail

// The launcher that started this process, from `getenv` (a function const char* -> const char*,
// nullptr when unset); nullopt when none of the variables above holds a number.
template <class Getenv>
std::optional<launch_info> detect_launch(Getenv&& getenv) {
  struct known {
    const char* launcher;
    const char* size;
    const char* rank;
  };
  for (const known k :
       {known{"Open MPI's mpiexec", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
        known{"a PMI launcher (MPICH or Intel MPI mpiexec)", "PMI_SIZE", "PMI_RANK"}}) {
    const std::optional<int> size = detail::launch_number(getenv(k.size));
    if (size) {
      return launch_info{.launcher = k.launcher,
                         .variable = k.size,
                         .size = *size,
                         .rank = detail::launch_number(getenv(k.rank)).value_or(0)};
    }
  }
  return std::nullopt;
}

// The same from this process's environment.
inline std::optional<launch_info> detect_launch() {
  return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace strata
