// SPDX-License-Identifier: Apache-2.0
#pragma once

// parallel::single_rank: the whole model and batch on one rank, no communication. The trainer's
// default parallel policy.

#include <string_view>

#include "strata/config/train_config.hpp"
#include "strata/core/policy.hpp"
#include "strata/parallel/concepts.hpp"

namespace strata::parallel {

struct single_rank {
  using policy_category = parallel_policy_tag;
  static constexpr std::string_view name = "single_rank";
  static constexpr bool distributed = false;
  using executor = local_executor;  // the whole parameters and optimizer state, no communication
  // world_size 1, and none of the data-parallel keys.
  static void check_config(const config::train_config& cfg, int world, int rank) {
    refuse_foreign_keys({.parallel = name}, cfg, world, rank);
  }
};

static_assert(check_parallel_policy<single_rank>());

}  // namespace strata::parallel
