// SPDX-License-Identifier: Apache-2.0
#pragma once

// Test cases that need a unit this CPU or build may lack (bfloat16 products, AVX-512, a GEMM
// provider): where it is missing the case is not run, doctest counts it as skipped (never as
// passed), and the executable's output names it and says why (tests/unit/main.cpp prints the
// cases of the files it ran).
//
//   STRATA_TEST_CASE_NEEDING("gemm: bfloat16 products", sm::bf16_products_supported(),
//                            "oneDNN has no bfloat16 matmul on this CPU") { ... }
//
// The condition is evaluated when the case is registered, before main: it must not depend on
// anything a test sets.

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace strata::test {

struct lacking_case {
  std::string file;
  std::string name;
  std::string why;
};

inline std::vector<lacking_case>& lacking_cases() {
  static std::vector<lacking_case> cases;
  return cases;
}

// Records the case when `have` is false; returns whether it is to be skipped.
inline bool lacks(const char* file, const char* name, bool have, const std::string& why) {
  if (!have) {
    lacking_cases().push_back({file, name, why});
  }
  return !have;
}

}  // namespace strata::test

// `why` is evaluated only where the unit is missing.
#define STRATA_TEST_CASE_NEEDING(name, have, why)                                 \
  TEST_CASE(name* doctest::skip([] {                                              \
    const bool strata_have = (have);                                              \
    return ::strata::test::lacks(__FILE__, name, strata_have,                     \
                                 strata_have ? std::string() : std::string(why)); \
  }()))
