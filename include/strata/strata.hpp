// SPDX-License-Identifier: Apache-2.0
#pragma once

// Everything of strata that compiles with a plain C++20 compiler and no backend library.
// Backends are separate headers with their own CMake targets: strata/comm/mpi.hpp (strata::mpi),
// strata/comm/nccl.hpp (strata::nccl), strata/core/*.cuh (strata::cuda).

#include "strata/config.hpp"
#include "strata/core.hpp"
#include "strata/data.hpp"
#include "strata/pipeline.hpp"
