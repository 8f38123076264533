// expect-error: PipelineSchedule: missing 'schedule_lists lists\(schedule_shape\) const'
// SPDX-License-Identifier: Apache-2.0
// A user's schedule whose lists() returns bare vectors instead of schedule_lists: the family's
// check names the requirement.
#include <string_view>
#include <vector>

#include "strata/pipeline/concepts.hpp"
#include "strata/pipeline/schedule.hpp"

struct breadth_first {
  using policy_category = strata::pipeline_schedule_tag;
  static constexpr std::string_view name = "breadth_first";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;
  std::vector<std::vector<strata::pipeline::action>> lists(strata::pipeline::schedule_shape) const {
    return {};
  }
};

static_assert(strata::pipeline::check_pipeline_schedule<breadth_first>());

int main() {}
