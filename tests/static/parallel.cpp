// SPDX-License-Identifier: Apache-2.0
// The parallel family's contract (parallel/concepts.hpp) holds for every shipped policy, and a
// type that misses a requirement is not a parallel policy; compiling this file is the test.
#include <string_view>
#include <type_traits>

#include "strata/config/train_config.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/data_executor.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/parallel/single_rank.hpp"
#include "strata/pipeline.hpp"

namespace sp = strata::parallel;

static_assert(sp::check_parallel_policy<sp::single_rank>());
static_assert(sp::check_parallel_policy<sp::data<>>());
static_assert(
    sp::check_parallel_policy<sp::data<sp::all_reduce, sp::compress::cast<strata::float16>>>());
static_assert(
    sp::check_parallel_policy<sp::data<sp::all_reduce, sp::compress::cast<strata::bfloat16>>>());
static_assert(sp::check_parallel_policy<sp::data<sp::hierarchical>>());
static_assert(
    sp::check_parallel_policy<sp::data<sp::hierarchical, sp::compress::cast<strata::float16>>>());
static_assert(sp::check_parallel_policy<sp::data<sp::all_gather, sp::compress::topk>>());
static_assert(sp::check_parallel_policy<sp::data<sp::parameter_server>>());
static_assert(sp::check_parallel_policy<sp::data<sp::parameter_server, sp::compress::topk>>());
static_assert(sp::check_parallel_policy<sp::zero1>());
static_assert(sp::check_parallel_policy<sp::pipeline<strata::pipeline::one_f_one_b>>());
static_assert(sp::check_parallel_policy<sp::pipeline<strata::pipeline::interleaved_1f1b<2>>>());
static_assert(sp::check_parallel_policy<sp::pipeline<strata::pipeline::zero_bubble_h1>>());
static_assert(sp::pipeline<strata::pipeline::interleaved_1f1b<2>>::name ==
              "pipeline<interleaved_1f1b v=2>");
static_assert(sp::pipeline<strata::pipeline::gpipe>::name == "pipeline<gpipe>");
static_assert(!sp::single_rank::distributed && sp::zero1::distributed && sp::data<>::distributed);

// A user's policy with every requirement: its executor is the one-rank behaviour, each rank
// stepping alone.
struct local_sgd {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "local_sgd";
  static constexpr bool distributed = true;
  static void check_config(const strata::config::train_config& cfg, int world, int rank) {
    sp::refuse_foreign_keys({.distributed = true, .parallel = name}, cfg, world, rank);
  }
  using executor = sp::local_executor;
};
static_assert(sp::parallel_policy<local_sgd>);
static_assert(sp::step_executor<sp::local_executor>);
static_assert(sp::step_executor<sp::all_reduce_executor<sp::zero1>>);
static_assert(sp::step_executor<sp::all_reduce_executor<sp::data<>>>);
static_assert(sp::step_executor<sp::hierarchical_executor<sp::data<sp::hierarchical>>>);
static_assert(
    sp::step_executor<sp::topk_gather_executor<sp::data<sp::all_gather, sp::compress::topk>>>);
static_assert(
    sp::step_executor<sp::ps_executor<sp::data<sp::parameter_server, sp::compress::topk>>>);
// Each shipped policy names its own executor type.
static_assert(std::is_same_v<sp::data<sp::hierarchical>::executor,
                             sp::hierarchical_executor<sp::data<sp::hierarchical>>>);
static_assert(std::is_same_v<sp::data<sp::parameter_server>::executor,
                             sp::ps_executor<sp::data<sp::parameter_server>>>);

// Each requirement missing in turn.
struct untagged {
  static constexpr std::string_view name = "untagged";
  static constexpr bool distributed = false;
  static void check_config(const strata::config::train_config&, int, int) {}
};
struct unnamed {
  using policy_category = strata::parallel_policy_tag;
  static constexpr bool distributed = false;
  static void check_config(const strata::config::train_config&, int, int) {}
};
struct undescribed {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "undescribed";
  static void check_config(const strata::config::train_config&, int, int) {}
};
struct unchecked {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "unchecked";
  static constexpr bool distributed = false;
};
static_assert(!sp::parallel_policy_tagged<untagged> && !sp::parallel_policy<untagged>);
static_assert(!sp::parallel_policy_named<unnamed> && !sp::parallel_policy<unnamed>);
static_assert(!sp::parallel_policy_describes<undescribed> && !sp::parallel_policy<undescribed>);
static_assert(!sp::parallel_policy_configured<unchecked> && !sp::parallel_policy<unchecked>);
struct unexecuted {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "unexecuted";
  static constexpr bool distributed = false;
  static void check_config(const strata::config::train_config&, int, int) {}
};
static_assert(!sp::parallel_policy_executes<unexecuted> && !sp::parallel_policy<unexecuted>);

// An executor that only constructs: each later requirement fails on its own.
struct constructs_only {
  explicit constructs_only(const sp::step_context&) {}
};
static_assert(sp::executor_constructible<constructs_only>);
static_assert(!sp::executor_lays_out<constructs_only> && !sp::executor_has_roles<constructs_only> &&
              !sp::executor_synchronizes<constructs_only> &&
              !sp::executor_updates<constructs_only> &&
              !sp::executor_checkpoints<constructs_only> && !sp::step_executor<constructs_only>);
// One that derives from local_executor but updates with the wrong signature still meets the
// rest: the base's update is hidden, so executor_updates fails alone.
struct hides_update : sp::local_executor {
  using local_executor::local_executor;
  void update() {}
};
static_assert(sp::executor_synchronizes<hides_update> && !sp::executor_updates<hides_update> &&
              !sp::step_executor<hides_update>);

int main() {
  return 0;
}
