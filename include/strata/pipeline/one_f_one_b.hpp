// SPDX-License-Identifier: Apache-2.0
#pragma once

// one_f_one_b (1F1B, PipeDream-flush): stage r runs min(p - r - 1, m) forwards to fill the
// pipeline, then alternates one forward and one backward, then drains the backwards left. The
// bubble is GPipe's, (p - 1) / (m + p - 1), but stage r keeps at most p - r micro-batches'
// activations instead of m.

#include <algorithm>
#include <string_view>
#include <vector>

#include "strata/core/policy.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/shape_check.hpp"

namespace strata::pipeline {

struct one_f_one_b {
  using policy_category = pipeline_schedule_tag;
  static constexpr std::string_view name = "one_f_one_b";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;

  constexpr schedule_lists lists(schedule_shape shape) const {
    detail::check_shape(shape, chunks, name);
    const int p = shape.stages;
    const int m = shape.micro_batches;
    std::vector<std::vector<action>> compute(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      auto& list = compute[static_cast<std::size_t>(r)];
      const int warmup = std::min(p - r - 1, m);
      for (int i = 0; i < warmup; ++i) {
        list.push_back(forward(i));
      }
      for (int i = 0; i < m - warmup; ++i) {
        list.push_back(forward(warmup + i));
        list.push_back(backward(i));
      }
      for (int i = m - warmup; i < m; ++i) {
        list.push_back(backward(i));
      }
    }
    return with_transfers(shape, compute);
  }
};

}  // namespace strata::pipeline
