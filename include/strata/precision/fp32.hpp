// SPDX-License-Identifier: Apache-2.0
#pragma once

// precision::fp32: parameters, activations and gradients in float32. The trainer's default
// precision policy.

#include <string_view>

#include "strata/core/policy.hpp"

namespace strata::precision {

struct fp32 {
  using policy_category = precision_policy_tag;
  static constexpr std::string_view name = "fp32";
};

}  // namespace strata::precision
