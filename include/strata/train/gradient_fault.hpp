// SPDX-License-Identifier: Apache-2.0
#pragma once

// Non-finite gradients on one rank, for the fault suite: a program that calls
// attach_gradient_fault(trainer) before fit() lets the environment poison one rank's gradients
// after they are reduced and before the precision policy checks them, as a bad batch or an
// overflow on that rank alone would. The other ranks' gradients stay finite, so the step is
// skipped everywhere only if the ranks vote.
//
//   STRATA_GRADIENT_FAULT="rank=<r>,step=<s>[,every]"
// On rank r at optimizer step s (counted from 0 over the whole job) every gradient becomes NaN;
// with `every`, at step s and each step after it. Read once; unset or empty: nothing happens.
// Refused (strata::error) for a rank outside the job and with dedicated parameter servers, whose
// workers check and push the gradients before this hook runs.

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "strata/core/fault_env.hpp"

namespace strata::train {

struct gradient_fault {
  int rank = 0;
  std::uint64_t step = 0;
  bool every = false;
  bool hits(int r, std::uint64_t s) const noexcept {
    return r == rank && (every ? s >= step : s == step);
  }
};

// Parses "rank=1,step=40,every"; throws strata::error naming the variable and the field.
inline gradient_fault parse_gradient_fault(std::string_view text) {
  const ::strata::detail::fault_text t("STRATA_GRADIENT_FAULT", text);
  gradient_fault out;
  bool has_rank = false;
  bool has_step = false;
  t.each_field([&](std::string_view field, std::string_view key, std::string_view value) {
    if (key == "rank") {
      const std::uint64_t r = t.number(key, value);
      if (r > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
        throw t.fail("rank " + std::string(value) + " is out of range");
      }
      out.rank = static_cast<int>(r);
      has_rank = true;
    } else if (key == "step") {
      out.step = t.number(key, value);
      has_step = true;
    } else if (field == "every") {
      out.every = true;
    } else {
      throw t.fail("unknown field '" + std::string(field) + "' (rank=R, step=S, every)");
    }
  });
  if (!has_rank || !has_step) {
    throw t.fail("rank=... and step=... are required");
  }
  return out;
}

// The fault STRATA_GRADIENT_FAULT plans, read once; nullopt when unset or empty.
inline const std::optional<gradient_fault>& planned_gradient_fault() {
  static const std::optional<gradient_fault> fault =
      ::strata::detail::parse_fault_variable("STRATA_GRADIENT_FAULT", parse_gradient_fault);
  return fault;
}

// Registers the planned fault (if any) on `t` through its on_gradients hook.
template <class Trainer>
void attach_gradient_fault(Trainer& t) {
  const std::optional<gradient_fault>& fault = planned_gradient_fault();
  if (!fault) {
    return;
  }
  if (fault->rank >= t.world_size()) {
    throw error("STRATA_GRADIENT_FAULT: rank " + std::to_string(fault->rank) +
                " is not a rank of this job (world size " + std::to_string(t.world_size()) + ")");
  }
  if constexpr (requires { Trainer::ps; }) {
    if (Trainer::ps && t.config().dedicated_parameter_servers) {
      throw error(
          "STRATA_GRADIENT_FAULT: with dedicated parameter servers the workers check and push "
          "their gradients before the on_gradients hook runs, so the fault would not be seen");
    }
  }
  const int rank = t.rank();
  t.on_gradients([f = *fault, rank](std::uint64_t step, std::span<float> grads) {
    if (f.hits(rank, step)) {
      for (float& g : grads) {
        g = std::numeric_limits<float>::quiet_NaN();
      }
    }
  });
}

}  // namespace strata::train
