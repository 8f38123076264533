// SPDX-License-Identifier: Apache-2.0
#pragma once

// batch::fixed: every step takes batch_size_per_gpu samples per rank and applies the update.
// The trainer's default batch policy.

#include <string_view>

#include "strata/core/policy.hpp"

namespace strata::batch {

struct fixed {
  using policy_category = batch_policy_tag;
  static constexpr std::string_view name = "fixed";
};

}  // namespace strata::batch
