// SPDX-License-Identifier: Apache-2.0
#pragma once

// The trainer's check of the launch: under a launcher of several processes (core/launcher.hpp),
// a trainer that would not use them is refused before anything is written (docs/parallel.md).

#include <optional>
#include <string>

#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/launcher.hpp"

namespace strata::train::detail {

// Throws config_error when `launch` started several processes and this trainer would not use
// them: a one-rank trainer (key world_size), or ranks as threads of this process (key
// communication_backend). Nothing has been written when it throws.
inline void refuse_launch_mismatch(bool distributed, const config::train_config& cfg,
                                   const std::optional<launch_info>& launch) {
  if (!launch || launch->size <= 1) {
    return;
  }
  const std::string where = "this process is rank " + std::to_string(launch->rank) + " of " +
                            std::to_string(launch->size) + " started by " + launch->launcher +
                            " (" + launch->variable + "=" + std::to_string(launch->size) + ")";
  const std::string fix = "; set world_size = " + std::to_string(launch->size) +
                          " and communication_backend = \"mpi\", or start one process";
  if (!distributed || cfg.world_size == 1) {
    throw config_error({.key = "world_size", .file = {}, .line = 0, .column = 0},
                       where + ", but world_size is " + std::to_string(cfg.world_size) +
                           ": every process would train alone, into the same checkpoint "
                           "directory" +
                           fix);
  }
  if (cfg.communication_backend == config::comm_backend_kind::threads) {
    throw config_error({.key = "communication_backend", .file = {}, .line = 0, .column = 0},
                       where + ", but communication_backend = \"threads\" runs the " +
                           std::to_string(cfg.world_size) +
                           " ranks as threads of each process: every process would train its "
                           "own copy, into the same checkpoint directory" +
                           fix);
  }
}

}  // namespace strata::train::detail
