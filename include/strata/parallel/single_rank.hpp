// SPDX-License-Identifier: Apache-2.0
#pragma once

// parallel::single_rank: the whole model and batch on one rank, no communication. The trainer's
// default parallel policy.

#include <string_view>

#include "strata/core/policy.hpp"

namespace strata::parallel {

struct single_rank {
  using policy_category = parallel_policy_tag;
  static constexpr std::string_view name = "single_rank";
};

}  // namespace strata::parallel
