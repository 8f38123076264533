// expect-error: PipelineSchedule: missing 'using policy_category = strata::pipeline_schedule_tag;'
// SPDX-License-Identifier: Apache-2.0
// A pipeline given something that is not a schedule (here a batch policy): the schedule family's
// check names the first requirement it misses.
#include "strata/batch/fixed.hpp"
#include "strata/parallel/pipeline.hpp"

int main() {
  using policy = strata::parallel::pipeline<strata::batch::fixed>;
  static_assert(sizeof(policy) > 0);
}
