// SPDX-License-Identifier: Apache-2.0
#pragma once

// gpipe: every micro-batch forward, then every micro-batch backward. The simplest schedule: each
// stage keeps the activations of all m micro-batches until the backward phase, and idles
// (p - 1) / (m + p - 1) of the step (the bubble) with equal forward and backward times per stage.

#include <string_view>
#include <vector>

#include "strata/core/policy.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/shape_check.hpp"

namespace strata::pipeline {

struct gpipe {
  using policy_category = pipeline_schedule_tag;
  static constexpr std::string_view name = "gpipe";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;

  constexpr schedule_lists lists(schedule_shape shape) const {
    detail::check_shape(shape, chunks, name);
    std::vector<std::vector<action>> compute(static_cast<std::size_t>(shape.stages));
    for (auto& list : compute) {
      for (int i = 0; i < shape.micro_batches; ++i) {
        list.push_back(forward(i));
      }
      for (int i = 0; i < shape.micro_batches; ++i) {
        list.push_back(backward(i));
      }
    }
    return with_transfers(shape, compute);
  }
};

}  // namespace strata::pipeline
