// SPDX-License-Identifier: Apache-2.0
// The stage partitioner: the exact optimum on synthetic costs (against every split), a memory
// cap that forces a worse-balanced split, a model that cannot fit, the user's own split.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "strata/core/rng.hpp"
#include "strata/pipeline/partition.hpp"

namespace sp = strata::pipeline;

namespace {

// The slowest stage of the best split within the cap, trying every split; infinity when none
// fits.
double brute_force(const sp::partition_problem& pb) {
  const std::size_t n = pb.layer_seconds.size();
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::size_t> b{0};
  std::function<void(std::size_t)> place = [&](std::size_t r) {
    if (r + 1 == static_cast<std::size_t>(pb.stages)) {
      b.push_back(n);
      double worst = 0.0;
      bool fits = true;
      for (std::size_t s = 0; s + 1 < b.size(); ++s) {
        double t = 0.0;
        std::size_t fixed = 0;
        std::size_t act = 0;
        for (std::size_t i = b[s]; i < b[s + 1]; ++i) {
          t += pb.layer_seconds[i];
          fixed += pb.layer_fixed_bytes[i];
          act += pb.layer_activation_bytes[i];
        }
        const std::size_t flight = pb.in_flight.empty() ? 1 : pb.in_flight[s];
        fits = fits && (pb.memory_cap == 0 || fixed + act * flight <= pb.memory_cap);
        worst = std::max(worst, t);
      }
      if (fits) {
        best = std::min(best, worst);
      }
      b.pop_back();
      return;
    }
    for (std::size_t next = b.back() + 1; next + (pb.stages - 1 - r) <= n; ++next) {
      b.push_back(next);
      place(r + 1);
      b.pop_back();
    }
  };
  place(0);
  return best;
}

}  // namespace

TEST_CASE("balance finds the exact optimum on synthetic costs, with and without a cap") {
  strata::rng_stream rng(2026);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng.next_u64() % 9;
    const int p = 1 + static_cast<int>(rng.next_u64() % std::min<std::size_t>(n, 4));
    sp::partition_problem pb{.stages = p};
    for (std::size_t i = 0; i < n; ++i) {
      pb.layer_seconds.push_back(static_cast<double>(1 + rng.next_u64() % 20));
      pb.layer_fixed_bytes.push_back(rng.next_u64() % 100);
      pb.layer_activation_bytes.push_back(rng.next_u64() % 50);
    }
    for (int r = 0; r < p; ++r) {
      pb.in_flight.push_back(static_cast<std::size_t>(p - r));
    }
    pb.memory_cap = trial % 2 == 0 ? 0 : 150 + rng.next_u64() % 300;
    INFO("trial " << trial << " n " << n << " p " << p << " cap " << pb.memory_cap);
    const double best = brute_force(pb);
    if (best == std::numeric_limits<double>::infinity()) {
      CHECK_THROWS_AS(sp::balance(pb), std::invalid_argument);
      continue;
    }
    const sp::partition got = sp::balance(pb);
    CHECK(got.slowest() == best);
    REQUIRE(got.boundaries.size() == static_cast<std::size_t>(p) + 1);
    CHECK(got.boundaries.front() == 0);
    CHECK(got.boundaries.back() == n);
    for (int r = 0; r < p; ++r) {
      CHECK(got.layers(r) >= 1);
      CHECK((pb.memory_cap == 0 || got.stage_bytes[static_cast<std::size_t>(r)] <= pb.memory_cap));
    }
  }
}

TEST_CASE("a known optimum, and a cap that forces a worse-balanced split") {
  sp::partition_problem pb{.stages = 3,
                           .layer_seconds = {1, 1, 1, 1, 4},
                           .layer_fixed_bytes = {0, 0, 0, 0, 0},
                           .layer_activation_bytes = {10, 10, 10, 10, 10},
                           .in_flight = {3, 2, 1}};  // 1F1B over 3 stages
  const sp::partition free = sp::balance(pb);
  CHECK(free.slowest() == 4.0);
  CHECK(free.boundaries.back() == 5);
  CHECK(free.layers(2) == 1);  // the heavy layer alone
  // 45 bytes: stage 0 holds one layer (3 x 10), stage 1 at most two, so the heavy layer shares.
  pb.memory_cap = 45;
  const sp::partition capped = sp::balance(pb);
  CHECK(capped.slowest() == 5.0);
  CHECK(capped.boundaries == std::vector<std::size_t>{0, 1, 3, 5});
  CHECK(capped.stage_bytes == std::vector<std::size_t>{30, 40, 20});
}

TEST_CASE("a model that cannot fit names the stage and its bytes") {
  sp::partition_problem pb{.stages = 2,
                           .layer_seconds = {1, 1, 1},
                           .layer_fixed_bytes = {100, 5, 5},
                           .layer_activation_bytes = {1, 1, 1},
                           .in_flight = {2, 1},
                           .memory_cap = 90};
  try {
    (void)sp::balance(pb);
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) ==
          "pipeline partition: the model does not fit 2 stages of at most 90 bytes: in the split "
          "with the least memory (stage 0: layers 0..0, stage 1: layers 1..2), stage 0 needs 102 "
          "bytes");
  }
  pb.layer_seconds = {1};
  pb.layer_fixed_bytes = {1};
  pb.layer_activation_bytes = {1};
  CHECK_THROWS_WITH(sp::balance(pb),
                    "pipeline partition: 1 layers cannot fill 2 stages (each needs a layer)");
}

TEST_CASE("the user's split is checked and measured") {
  const sp::partition_problem pb{.stages = 2,
                                 .layer_seconds = {1, 2, 3, 4},
                                 .layer_fixed_bytes = {10, 20, 30, 40},
                                 .layer_activation_bytes = {0, 0, 0, 0},
                                 .in_flight = {},
                                 .memory_cap = 60};
  const sp::partition p = sp::check_split(pb, {3, 1});
  CHECK(p.boundaries == std::vector<std::size_t>{0, 3, 4});
  CHECK(p.stage_seconds == std::vector<double>{6, 4});
  CHECK(p.stage_bytes == std::vector<std::size_t>{60, 40});
  CHECK_THROWS_WITH(sp::check_split(pb, {1, 3}),
                    "pipeline partition: stage 1 (layers 1..3) needs 90 bytes, over the cap of 60");
  CHECK_THROWS_WITH(sp::check_split(pb, {4, 0}),
                    "pipeline partition: stage 1 of the split has no layer");
  CHECK_THROWS_WITH(sp::check_split(pb, {2, 1}),
                    "pipeline partition: the split holds 3 layers, the model has 4");
  CHECK_THROWS_WITH(sp::check_split(pb, {4}),
                    "pipeline partition: a split of 1 stages for 2 stages");
}
