// SPDX-License-Identifier: Apache-2.0
#pragma once

// The core vocabulary: errors, dtypes, RNG, execution spaces and memory accounting, policy lists.
// (CUDA pieces are in core/*.cuh and need nvcc.)

#include "strata/core/deadline.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/execution_space.hpp"
#include "strata/core/format.hpp"
#include "strata/core/host.hpp"
#include "strata/core/macros.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/policy.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
