// SPDX-License-Identifier: Apache-2.0
// The pipeline family's contract (pipeline/concepts.hpp) holds for every shipped schedule, a type
// that misses a requirement is not a schedule, and lists for sizes known at compile time are
// computed at compile time; compiling this file is the test.
#include <cstddef>
#include <string_view>
#include <vector>

#include "strata/pipeline.hpp"

namespace sp = strata::pipeline;

static_assert(sp::check_pipeline_schedule<sp::gpipe>());
static_assert(sp::check_pipeline_schedule<sp::one_f_one_b>());
static_assert(sp::check_pipeline_schedule<sp::interleaved_1f1b<2>>());
static_assert(sp::check_pipeline_schedule<sp::interleaved_1f1b<4>>());
static_assert(sp::check_pipeline_schedule<sp::zero_bubble_h1>());
static_assert(sp::zero_bubble_h1::splits_backward && !sp::one_f_one_b::splits_backward);
static_assert(sp::interleaved_1f1b<3>::chunks == 3 && sp::gpipe::chunks == 1);

// Lists at compile time: every rank runs to its end, and 1F1B's stage 0 of 4 with 8
// micro-batches runs 16 passes, 8 sends, 8 receives and the step.
template <class S>
constexpr bool runs_to_the_end(int p, int m) {
  const sp::schedule_lists l = S{}.lists(sp::shape_for<S>(p, m));
  const std::vector<std::size_t> reached = sp::reachable(l);
  for (std::size_t r = 0; r < l.ranks.size(); ++r) {
    if (reached[r] != l.ranks[r].size()) {
      return false;
    }
  }
  return true;
}
static_assert(runs_to_the_end<sp::gpipe>(4, 8));
static_assert(runs_to_the_end<sp::one_f_one_b>(4, 8));
static_assert(runs_to_the_end<sp::interleaved_1f1b<2>>(4, 7));
static_assert(runs_to_the_end<sp::zero_bubble_h1>(8, 3));
static_assert(sp::one_f_one_b{}.lists({.stages = 4, .micro_batches = 8}).ranks[0].size() == 33);
static_assert(sp::one_f_one_b{}.lists({.stages = 4, .micro_batches = 8}).ranks[0].back() ==
              sp::action{sp::op::step, 0, 0, -1});

// Missing requirements: not a schedule.
struct untagged {
  static constexpr std::string_view name = "untagged";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;
  sp::schedule_lists lists(sp::schedule_shape) const { return {}; }
};
struct lists_as_vectors {
  using policy_category = strata::pipeline_schedule_tag;
  static constexpr std::string_view name = "lists_as_vectors";
  static constexpr int chunks = 1;
  static constexpr bool splits_backward = false;
  std::vector<std::vector<sp::action>> lists(sp::schedule_shape) const { return {}; }
};
struct chunkless {
  using policy_category = strata::pipeline_schedule_tag;
  static constexpr std::string_view name = "chunkless";
  static constexpr bool splits_backward = false;
  sp::schedule_lists lists(sp::schedule_shape) const { return {}; }
};
static_assert(!sp::pipeline_schedule<untagged>);
static_assert(!sp::pipeline_schedule<lists_as_vectors>);
static_assert(!sp::pipeline_schedule<chunkless>);
static_assert(!sp::pipeline_schedule<int>);

int main() {}
