// SPDX-License-Identifier: Apache-2.0
#include "strata/comm/history.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

using strata::comm::op_history;
using strata::comm::op_kind;
using strata::comm::op_signature;
using strata::comm::op_status;
using namespace std::chrono_literals;

op_signature signature(std::uint64_t sequence) {
  return op_signature{.sequence = sequence,
                      .count = 1000,
                      .op = op_kind::all_reduce,
                      .type = strata::dtype::float32,
                      .reduction = strata::comm::reduce_op::sum,
                      .reduces = 1};
}

// The "(N s ago)" of the line that contains `needle`.
double age_of(const std::string& text, const std::string& needle) {
  const auto line = text.find(needle);
  REQUIRE(line != std::string::npos);
  const auto open = text.find('(', line);
  REQUIRE(open != std::string::npos);
  double seconds = -1.0;
  REQUIRE(std::sscanf(text.c_str() + open, "(%lf s ago)", &seconds) == 1);
  return seconds;
}

TEST_CASE("op_history: a start time given by the caller is the one the history prints") {
  op_history h(4);
  const auto long_ago = std::chrono::steady_clock::now() - 100s;
  const std::size_t a = h.start(signature(0), -1, -1, long_ago);
  const std::size_t b = h.start(signature(1), 3, 7);  // now
  h.finish(a, op_status::completed);
  const std::string text = h.to_string();
  CAPTURE(text);
  CHECK(text.find("all_reduce #0 float32 x 1000 op sum: completed") != std::string::npos);
  CHECK(text.find("all_reduce #1 float32 x 1000 op sum peer 3 tag 7: started") !=
        std::string::npos);
  CHECK(age_of(text, "#0 ") >= 100.0);
  CHECK(age_of(text, "#0 ") < 200.0);
  CHECK(age_of(text, "#1 ") < 50.0);
  CHECK(a != b);
}

TEST_CASE("op_history keeps the last `capacity` operations, oldest first") {
  op_history h(3);
  CHECK(h.to_string() == "  (no operations yet)\n");
  for (std::uint64_t s = 0; s < 5; ++s) {
    h.finish(h.start(signature(s)), s == 3 ? op_status::failed : op_status::completed);
  }
  CHECK(h.size() == 3);
  const std::string text = h.to_string();
  CAPTURE(text);
  CHECK(text.find("#1 ") == std::string::npos);
  const auto p2 = text.find("#2 ");
  const auto p3 = text.find("#3 ");
  const auto p4 = text.find("#4 ");
  REQUIRE(p2 != std::string::npos);
  REQUIRE(p3 != std::string::npos);
  REQUIRE(p4 != std::string::npos);
  CHECK(p2 < p3);
  CHECK(p3 < p4);
  CHECK(text.find("#3 float32 x 1000 op sum: failed") != std::string::npos);
}

}  // namespace
