// SPDX-License-Identifier: Apache-2.0
#pragma once

// batch::accumulate: each optimizer step sums the gradients of gradient_accumulation_steps
// micro-batches of batch_size_per_gpu samples, then applies one update; only that last
// micro-step communicates (on several ranks). The step's gradient is the mean over all of its
// samples, so k micro-batches of B/k give the update of one batch of B, up to the order of the
// additions.

#include <string_view>

#include "strata/core/policy.hpp"

namespace strata::batch {

struct accumulate {
  using policy_category = batch_policy_tag;
  static constexpr std::string_view name = "accumulate";
};

}  // namespace strata::batch
