// SPDX-License-Identifier: Apache-2.0
#include "strata/core/deadline.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <limits>

namespace {

using strata::deadline;
using namespace std::chrono_literals;

TEST_CASE("deadline::after(seconds, from) counts from the given time") {
  const auto from = deadline::clock::now() - 10s;
  const deadline d = deadline::after(2.5, from);
  CHECK(d.at() == from + std::chrono::duration_cast<deadline::clock::duration>(2500ms));
  CHECK(d.expired());  // 7.5 s ago
  CHECK(d.remaining() == 0.0);

  const auto soon = deadline::clock::now();
  const deadline later = deadline::after(60.0, soon);
  CHECK(later.at() == soon + std::chrono::duration_cast<deadline::clock::duration>(60s));
  CHECK_FALSE(later.expired());
  CHECK(later.remaining() > 59.0);
  CHECK(later.remaining() <= 60.0);
}

TEST_CASE(
    "deadline::after: non-positive, NaN and huge values never expire, with or without a "
    "start time") {
  const auto from = deadline::clock::now() - 100s;
  for (const double s : {0.0, -1.0, 1e9, 1e300, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(s);
    CHECK(deadline::after(s).is_never());
    CHECK(deadline::after(s, from).is_never());
    CHECK_FALSE(deadline::after(s, from).expired());
  }
}

TEST_CASE("deadline::after(seconds) starts now") {
  const auto before = deadline::clock::now();
  const deadline d = deadline::after(30.0);
  const auto after = deadline::clock::now();
  CHECK(d.at() >= before + 30s);
  CHECK(d.at() <= after + 30s);
}

}  // namespace
