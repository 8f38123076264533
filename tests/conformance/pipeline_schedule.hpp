// SPDX-License-Identifier: Apache-2.0
#pragma once

// The pipeline_schedule conformance suite: one body run on every schedule, shipped or a user's
// (pipeline/concepts.hpp). For every p in 1..max_stages and m in 1..max_micro_batches it checks
// that
//   - lists(shape) gives the same lists twice and lists for that shape;
//   - the lists are a valid step (check_lists: every micro-batch through every stage once,
//     forward before backward, every send received from the right peer, the step last);
//   - the backward passes are what splits_backward says (whole backward, or B and W);
//   - a run never deadlocks: with unit times, and with unequal ones (B twice F, transfers that
//     take time, stages of different speeds);
//   - a run keeps at least the work of the step busy, and no rank is busy for longer than the
//     makespan;
// and that shapes it cannot run (no stages, no micro-batches, a chunk count other than its own)
// are refused with std::invalid_argument.

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

#include "conformance/findings.hpp"
#include "strata/pipeline/concepts.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/simulate.hpp"

namespace strata::conformance {

struct schedule_suite_config {
  int max_stages = 8;
  int max_micro_batches = 32;
};

template <class S>
findings run_schedule_suite(const schedule_suite_config& config = {}) {
  static_assert(pipeline::check_pipeline_schedule<S>());
  using namespace strata::pipeline;
  findings f;
  const S schedule{};
  const action_times unequal{.forward = 1.0,
                             .backward_input = 1.25,
                             .backward_weight = 0.75,
                             .transfer = 0.3,
                             .stage_scale = {1.0, 1.7, 0.6, 1.3, 2.0, 0.9, 1.1, 0.5, 1.4, 0.8, 1.2,
                                             1.9, 0.7, 1.5, 1.0, 0.6}};
  for (int p = 1; p <= config.max_stages; ++p) {
    for (int m = 1; m <= config.max_micro_batches; ++m) {
      const schedule_shape shape = shape_for<S>(p, m);
      const std::string at =
          std::string(S::name) + " p " + std::to_string(p) + " m " + std::to_string(m) + ": ";
      schedule_lists lists;
      try {
        lists = schedule.lists(shape);
      } catch (const std::exception& e) {
        f.expect(false, at + "lists() threw: " + e.what());
        continue;
      }
      f.expect(lists == schedule.lists(shape), at + "two calls give different lists");
      f.expect(lists.shape == shape, at + "the lists are for " + to_string(lists.shape));
      const auto problems = check_lists(lists);
      f.expect(problems.empty(), at + (problems.empty() ? "" : problems.front()));
      if (!problems.empty()) {
        continue;
      }
      bool whole = false;
      bool split = false;
      for (const auto& list : lists.ranks) {
        for (const action& a : list) {
          whole = whole || a.kind == op::backward;
          split = split || a.kind == op::backward_input;
        }
      }
      f.expect(S::splits_backward ? split && !whole : whole && !split,
               at + "its backward passes do not match splits_backward = " +
                   (S::splits_backward ? "true" : "false"));
      double work = 0.0;
      for (const action_times& times : {action_times{}, unequal}) {
        const simulation run = simulate(lists, times);
        f.expect(!run.deadlocked, at + "deadlocks: " + run.stuck);
        if (run.deadlocked) {
          break;
        }
        work = 0.0;
        for (int s = 0; s < shape.virtual_stages(); ++s) {
          work += m * (times.of(op::forward, s) + times.of(op::backward, s));
        }
        double busy = 0.0;
        for (double b : run.busy) {
          busy += b;
          f.expect(b <= run.makespan + 1e-9, at + "a rank busy for longer than the makespan");
        }
        f.expect(
            busy > work - 1e-6 && busy < work + 1e-6,
            at + "busy " + std::to_string(busy) + ", the step's work is " + std::to_string(work));
      }
    }
  }
  for (const schedule_shape bad :
       {schedule_shape{.stages = 0, .micro_batches = 4, .chunks = S::chunks},
        schedule_shape{.stages = 2, .micro_batches = 0, .chunks = S::chunks},
        schedule_shape{.stages = 2, .micro_batches = 4, .chunks = S::chunks + 1}}) {
    bool refused = false;
    try {
      (void)schedule.lists(bad);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    f.expect(refused, std::string(S::name) + ": " + to_string(bad) + " is not refused");
  }
  return f;
}

}  // namespace strata::conformance
