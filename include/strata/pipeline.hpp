// SPDX-License-Identifier: Apache-2.0
#pragma once

// The pipeline family: schedules as data (each rank's list of actions for one step), their
// checks and simulation, the text timeline and the stage partitioner (docs/pipeline.md). The
// executor that replays a schedule over a communicator is parallel/pipeline.hpp.

#include "strata/pipeline/concepts.hpp"
#include "strata/pipeline/gpipe.hpp"
#include "strata/pipeline/interleaved_1f1b.hpp"
#include "strata/pipeline/one_f_one_b.hpp"
#include "strata/pipeline/partition.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/simulate.hpp"
#include "strata/pipeline/timeline.hpp"
#include "strata/pipeline/zero_bubble_h1.hpp"
