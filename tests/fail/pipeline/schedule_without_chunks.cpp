// expect-error: PipelineSchedule: missing 'static constexpr int chunks'
// SPDX-License-Identifier: Apache-2.0
// A user's schedule that does not say how many model chunks each rank holds.
#include <string_view>

#include "strata/pipeline/concepts.hpp"
#include "strata/pipeline/schedule.hpp"

struct breadth_first {
  using policy_category = strata::pipeline_schedule_tag;
  static constexpr std::string_view name = "breadth_first";
  static constexpr bool splits_backward = false;
  strata::pipeline::schedule_lists lists(strata::pipeline::schedule_shape) const { return {}; }
};

static_assert(strata::pipeline::check_pipeline_schedule<breadth_first>());

int main() {}
