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

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"

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
  const std::string all(text);
  const auto fail = [&](const std::string& why) {
    return error("STRATA_GRADIENT_FAULT='" + all + "': " + why);
  };
  const auto number = [&](std::string_view key, std::string_view value) {
    std::uint64_t n = 0;
    if (value.empty()) {
      throw fail(std::string(key) + " needs a value");
    }
    for (const char c : value) {
      if (c < '0' || c > '9' || n > (std::uint64_t{1} << 40)) {
        throw fail(std::string(key) + " must be a non-negative integer, not '" +
                   std::string(value) + "'");
      }
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    return n;
  };
  gradient_fault out;
  bool has_rank = false;
  bool has_step = false;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view field = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const std::size_t eq = field.find('=');
    const std::string_view key = field.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : field.substr(eq + 1);
    if (key == "rank") {
      const std::uint64_t r = number(key, value);
      if (r > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
        throw fail("rank " + std::string(value) + " is out of range");
      }
      out.rank = static_cast<int>(r);
      has_rank = true;
    } else if (key == "step") {
      out.step = number(key, value);
      has_step = true;
    } else if (field == "every") {
      out.every = true;
    } else {
      throw fail("unknown field '" + std::string(field) + "' (rank=R, step=S, every)");
    }
  }
  if (!has_rank || !has_step) {
    throw fail("rank=... and step=... are required");
  }
  return out;
}

// The fault STRATA_GRADIENT_FAULT plans, read once; nullopt when unset or empty.
inline const std::optional<gradient_fault>& planned_gradient_fault() {
  static const std::optional<gradient_fault> fault = []() -> std::optional<gradient_fault> {
    const char* env = std::getenv("STRATA_GRADIENT_FAULT");
    if (env == nullptr || *env == '\0') {
      return std::nullopt;
    }
    return parse_gradient_fault(env);
  }();
  return fault;
}

// Registers the planned fault (if any) on `t` through its on_gradients hook.
template <class Trainer>
void attach_gradient_fault(Trainer& t) {
  const std::optional<gradient_fault>& fault = planned_gradient_fault();
  if (!fault) {
    return;
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
