// SPDX-License-Identifier: Apache-2.0
#pragma once

// What a conformance suite found: every failed check (the first 50), and how many checks ran, so
// that one run lists all of a policy's failures instead of stopping at the first.

#include <cstddef>
#include <string>
#include <vector>

namespace strata::conformance {

struct findings {
  std::vector<std::string> failures{};
  std::size_t checks = 0;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok && failures.size() < 50) {
      failures.push_back(what);
    }
  }
  bool ok() const noexcept { return failures.empty(); }
};

}  // namespace strata::conformance
