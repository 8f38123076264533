// SPDX-License-Identifier: Apache-2.0
#pragma once

// The communicator settings a training configuration asks for: comm_timeout and
// comm_fingerprint as a comm::comm_config, for the communicator a program hands its trainer.
//
//   auto world = strata::comm::mpi::world(strata::train::comm_config_of(cfg));

#include "strata/comm/types.hpp"
#include "strata/config/train_config.hpp"

namespace strata::train {

inline comm::comm_config comm_config_of(const config::train_config& cfg) {
  comm::comm_config out{.timeout = cfg.comm_timeout};
  switch (cfg.comm_fingerprint) {
    case config::comm_fingerprint_kind::always:
      out.fingerprint = comm::fingerprint_mode::always;
      break;
    case config::comm_fingerprint_kind::sampled:
      out.fingerprint = comm::fingerprint_mode::sampled;
      break;
    case config::comm_fingerprint_kind::off:
      out.fingerprint = comm::fingerprint_mode::off;
      break;
  }
  return out;
}

}  // namespace strata::train
