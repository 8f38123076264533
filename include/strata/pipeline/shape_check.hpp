// SPDX-License-Identifier: Apache-2.0
#pragma once

// The sizes every shipped schedule accepts (not API).

#include <stdexcept>
#include <string>
#include <string_view>

#include "strata/pipeline/schedule.hpp"

namespace strata::pipeline::detail {

// Throws std::invalid_argument naming the schedule and the size it cannot run.
constexpr void check_shape(const schedule_shape& shape, int chunks, std::string_view name) {
  if (shape.stages < 1 || shape.micro_batches < 1 || shape.chunks != chunks) {
    throw std::invalid_argument(
        std::string("pipeline schedule ") + std::string(name) + ": cannot schedule " +
        to_string(shape) +
        " (it needs stages >= 1, micro_batches >= 1 and chunks = " + std::to_string(chunks) + ")");
  }
}

}  // namespace strata::pipeline::detail
