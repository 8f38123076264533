// SPDX-License-Identifier: Apache-2.0
#pragma once

// zero_bubble_h1 (ZB-H1): 1F1B with the backward split into the input-gradient pass B and the
// weight-gradient pass W. B of a stage waits only for B of the next stage, so the gradient
// travels back without waiting for any W, and a stage runs its W passes where it would
// otherwise wait. Every stage holds at most p micro-batches between their forward and their W,
// the first stage's count in 1F1B, so the peak activation memory stays the first stage's of
// 1F1B (a micro-batch waiting for its W keeps only what the weight gradient reads). With equal
// F, B and W times the idle share is about (p - 1) / (3m + p - 1), a third of 1F1B's.
//
// The order is made by running the stages in unit time steps (F = B = W = 1, transfers free)
// and letting each free stage take, in this order of preference: the oldest B whose gradient
// has arrived; the next F whose input has arrived, if fewer than p micro-batches are in flight;
// the oldest W still to do. The lists replay that order; with other durations they still run
// (the order is one a run has realised, so it cannot deadlock), only the idle time changes.

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <vector>

#include "strata/core/policy.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/shape_check.hpp"

namespace strata::pipeline {

struct zero_bubble_h1 {
  using policy_category = pipeline_schedule_tag;
  static constexpr std::string_view name = "zero_bubble_h1";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = true;

  constexpr schedule_lists lists(schedule_shape shape) const {
    detail::check_shape(shape, chunks, name);
    const int p = shape.stages;
    const int m = shape.micro_batches;
    std::vector<std::vector<action>> compute(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      auto& list = compute[static_cast<std::size_t>(r)];
      const int warmup = std::min(p - r - 1, m);
      int w = 0;  // the next W
      const auto after_b = [&](int b) {
        if (b - r >= w) {
          list.push_back(backward_weight(w++));
        }
      };
      for (int i = 0; i < warmup; ++i) {
        list.push_back(forward(i));
      }
      for (int i = 0; i < m - warmup; ++i) {
        list.push_back(forward(warmup + i));
        list.push_back(backward_input(i));
        after_b(i);
      }
      for (int i = m - warmup; i < m; ++i) {
        list.push_back(backward_input(i));
        after_b(i);
      }
      while (w < m) {
        list.push_back(backward_weight(w++));
      }
    }
    return with_transfers(shape, compute);
  }
};

}  // namespace strata::pipeline
