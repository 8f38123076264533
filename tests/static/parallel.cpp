// SPDX-License-Identifier: Apache-2.0
// The parallel family's contract (parallel/concepts.hpp) holds for every shipped policy, and a
// type that misses a requirement is not a parallel policy; compiling this file is the test.
#include <string_view>

#include "strata/config/train_config.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/single_rank.hpp"

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
static_assert(!sp::single_rank::distributed && sp::zero1::distributed && sp::data<>::distributed);

// A user's policy with every requirement of this part of the contract.
struct local_sgd {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "local_sgd";
  static constexpr bool distributed = true;
  static void check_config(const strata::config::train_config& cfg, int world, int rank) {
    sp::refuse_foreign_keys({.distributed = true, .parallel = name}, cfg, world, rank);
  }
};
static_assert(sp::parallel_policy<local_sgd>);

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

int main() {
  return 0;
}
