// SPDX-License-Identifier: Apache-2.0
#pragma once

// The optim family: the optimizer and lr-schedule contracts, SGD and AdamW over flat parameter
// ranges, learning-rate schedules, and their runtime-chosen forms.

#include "strata/optim/adamw.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/optim/sgd.hpp"
