// SPDX-License-Identifier: Apache-2.0
#pragma once

// The pipeline_schedule contract: a schedule is a type that makes every rank's list of actions
// for one step (pipeline/schedule.hpp says what the actions mean).
//
// A schedule S, with `const S& s` and `schedule_shape shape`,
//   1. opts in with `using policy_category = strata::pipeline_schedule_tag;` and names itself
//      with `static constexpr std::string_view name` (logs, timelines, the run's identity);
//   2. says how many chunks of the model each rank holds: `static constexpr int chunks` (1, or
//      v for an interleaved schedule);
//   3. says whether it splits backward: `static constexpr bool splits_backward`. true: its lists
//      use backward_input and backward_weight, and the executor runs each layer's two passes
//      (a layer that cannot split does its whole backward in backward_input); false: backward;
//   4. is default-constructible and makes the lists: `s.lists(shape)` returns schedule_lists
//      for shape.stages ranks and shape.micro_batches micro-batches, with shape.chunks ==
//      S::chunks, and throws std::invalid_argument naming the sizes it cannot schedule. It should
//      be constexpr, so that lists for sizes known at compile time are computed there.
// The lists must be a valid step (pipeline/simulate.hpp, check_lists): every micro-batch passes
// forward and back through every stage exactly once, forward before backward, every send has
// its receive, the step comes last; and a run of them must not deadlock whatever the actions'
// durations. tests/conformance/pipeline_schedule.hpp runs those checks over p = 1..8 and
// m = 1..32 for any schedule.
//
// check_pipeline_schedule<S>() names each requirement S misses in its own static_assert.

#include <concepts>
#include <string_view>

#include "strata/core/policy.hpp"
#include "strata/pipeline/schedule.hpp"

namespace strata::pipeline {

// 1.
template <class S>
concept schedule_tagged = policy_of<S, pipeline_schedule_tag>;
template <class S>
concept schedule_named = requires {
  { S::name } -> std::convertible_to<std::string_view>;
};
// 2.
template <class S>
concept schedule_chunked = requires {
  { S::chunks } -> std::convertible_to<int>;
};
// 3.
template <class S>
concept schedule_says_split = requires {
  { S::splits_backward } -> std::convertible_to<bool>;
};
// 4.
template <class S>
concept schedule_makes_lists = std::default_initializable<S> &&
    requires(const S& s, schedule_shape shape) {
  { s.lists(shape) } -> std::same_as<schedule_lists>;
};

template <class S>
concept pipeline_schedule = schedule_tagged<S> && schedule_named<S> && schedule_chunked<S> &&
    schedule_says_split<S> && schedule_makes_lists<S>;

template <class S>
constexpr bool check_pipeline_schedule() {
  static_assert(schedule_tagged<S>,
                "PipelineSchedule: missing 'using policy_category = "
                "strata::pipeline_schedule_tag;'");
  static_assert(schedule_named<S>,
                "PipelineSchedule: missing 'static constexpr std::string_view name'");
  static_assert(schedule_chunked<S>,
                "PipelineSchedule: missing 'static constexpr int chunks' (model chunks per rank: "
                "1 unless it interleaves)");
  static_assert(schedule_says_split<S>,
                "PipelineSchedule: missing 'static constexpr bool splits_backward'");
  static_assert(schedule_makes_lists<S>,
                "PipelineSchedule: missing 'schedule_lists lists(schedule_shape) const' (and a "
                "default constructor)");
  return pipeline_schedule<S>;
}

// The shape schedule S runs for p stages and m micro-batches.
template <class S>
constexpr schedule_shape shape_for(int stages, int micro_batches) noexcept {
  return {.stages = stages, .micro_batches = micro_batches, .chunks = static_cast<int>(S::chunks)};
}

}  // namespace strata::pipeline
