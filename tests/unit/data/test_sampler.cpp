// SPDX-License-Identifier: Apache-2.0
#include "strata/data/sampler.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <stdexcept>
#include <vector>

namespace sd = strata::data;

namespace {

std::vector<std::vector<std::size_t>> shares(std::size_t n, int ranks, std::uint32_t epoch,
                                             sd::remainder_policy remainder, bool shuffle = true) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < ranks; ++r) {
    sd::distributed_sampler s({.dataset_size = n,
                               .ranks = ranks,
                               .rank = r,
                               .seed = 7,
                               .shuffle = shuffle,
                               .remainder = remainder});
    s.set_epoch(epoch);
    out.push_back(s.epoch_indices());
  }
  return out;
}

}  // namespace

TEST_CASE("every rank gets the same count and the ranks cover the epoch once") {
  for (std::size_t n : {0u, 1u, 3u, 100u, 103u}) {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      CAPTURE(n);
      CAPTURE(ranks);
      const auto r = static_cast<std::size_t>(ranks);
      // pad: every sample at least once, the padding is the fewest repeats that even out.
      {
        const auto parts = shares(n, ranks, 3, sd::remainder_policy::pad);
        std::map<std::size_t, int> seen;
        for (const auto& p : parts) {
          CHECK(p.size() == parts[0].size());
          for (std::size_t i : p) {
            CHECK(i < n);
            ++seen[i];
          }
        }
        CHECK(seen.size() == n);
        const std::size_t total = parts[0].size() * r;
        CHECK(total == (n == 0 ? 0 : (n + r - 1) / r * r));
        std::size_t repeats = 0;
        for (const auto& [index, count] : seen) {
          CHECK(count >= 1);
          repeats += static_cast<std::size_t>(count - 1);
        }
        CHECK(repeats == total - n);
      }
      // drop: every sample at most once, fewer than `ranks` left out.
      {
        const auto parts = shares(n, ranks, 3, sd::remainder_policy::drop);
        std::map<std::size_t, int> seen;
        for (const auto& p : parts) {
          CHECK(p.size() == n / r);
          for (std::size_t i : p) {
            ++seen[i];
          }
        }
        CHECK(seen.size() == n / r * r);
        for (const auto& [index, count] : seen) {
          CHECK(count == 1);
        }
      }
    }
  }
}

TEST_CASE("padding positions are reported") {
  sd::distributed_sampler s({.dataset_size = 10, .ranks = 4, .rank = 3, .seed = 1});
  // 12 global positions; rank 3 has positions 3, 7, 11: only 11 is past the data.
  REQUIRE(s.samples_per_rank() == 3);
  CHECK_FALSE(s.is_padding(0));
  CHECK_FALSE(s.is_padding(1));
  CHECK(s.is_padding(2));
  // Fewer samples than ranks: the order repeats as often as needed.
  sd::distributed_sampler tiny({.dataset_size = 2, .ranks = 4, .rank = 3, .shuffle = false});
  CHECK(tiny.epoch_indices() == std::vector<std::size_t>{1});
  CHECK(tiny.is_padding(0));
}

TEST_CASE("the order is one shuffle per epoch, the same on every rank count and instance") {
  const std::size_t n = 1000;
  const auto one = shares(n, 1, 5, sd::remainder_policy::pad)[0];
  const auto again = shares(n, 1, 5, sd::remainder_policy::pad)[0];
  CHECK(one == again);
  CHECK(one != shares(n, 1, 6, sd::remainder_policy::pad)[0]);
  std::vector<std::size_t> sorted = one;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> identity(n);
  for (std::size_t i = 0; i < n; ++i) {
    identity[i] = i;
  }
  CHECK(sorted == identity);
  CHECK(one != identity);
  CHECK(shares(n, 1, 5, sd::remainder_policy::pad, false)[0] == identity);

  // Four ranks interleave the one-rank order: position p belongs to rank p % 4.
  const auto four = shares(n, 4, 5, sd::remainder_policy::pad);
  for (std::size_t p = 0; p < n; ++p) {
    CHECK(four[p % 4][p / 4] == one[p]);
  }
}

TEST_CASE("N ranks with batch b hold the one-rank batch of N x b") {
  const std::size_t n = 96;
  const std::size_t b = 4;
  const int ranks = 3;
  const auto one = shares(n, 1, 2, sd::remainder_policy::drop)[0];
  const auto parts = shares(n, ranks, 2, sd::remainder_policy::drop);
  for (std::size_t k = 0; k < n / (b * ranks); ++k) {
    std::vector<std::size_t> global(one.begin() + static_cast<long>(k * b * ranks),
                                    one.begin() + static_cast<long>((k + 1) * b * ranks));
    std::vector<std::size_t> joined;
    for (const auto& p : parts) {
      joined.insert(joined.end(), p.begin() + static_cast<long>(k * b),
                    p.begin() + static_cast<long>((k + 1) * b));
    }
    std::sort(global.begin(), global.end());
    std::sort(joined.begin(), joined.end());
    CHECK(global == joined);
  }
}

TEST_CASE("a sampler resumes from (epoch, position)") {
  sd::distributed_sampler straight({.dataset_size = 50, .ranks = 2, .rank = 1, .seed = 9});
  straight.set_epoch(4);
  std::vector<std::size_t> all;
  while (auto i = straight.next()) {
    all.push_back(*i);
  }
  CHECK(all.size() == 25);
  CHECK(straight.state() == sd::sampler_state{.epoch = 4, .position = 25});

  sd::distributed_sampler first({.dataset_size = 50, .ranks = 2, .rank = 1, .seed = 9});
  first.set_epoch(4);
  for (int i = 0; i < 11; ++i) {
    first.next();
  }
  const sd::sampler_state saved = first.state();
  CHECK(saved == sd::sampler_state{.epoch = 4, .position = 11});

  sd::distributed_sampler resumed({.dataset_size = 50, .ranks = 2, .rank = 1, .seed = 9});
  resumed.restore(saved);
  std::vector<std::size_t> tail;
  while (auto i = resumed.next()) {
    tail.push_back(*i);
  }
  CHECK(tail == std::vector<std::size_t>(all.begin() + 11, all.end()));
}

TEST_CASE("bad sampler arguments are refused with the value") {
  CHECK_THROWS_WITH_AS(sd::distributed_sampler({.dataset_size = 10, .ranks = 0}),
                       doctest::Contains("ranks must be at least 1, got 0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sd::distributed_sampler({.dataset_size = 10, .ranks = 2, .rank = 2}),
                       doctest::Contains("rank 2 is outside 0..1"), std::invalid_argument);
  sd::distributed_sampler s({.dataset_size = 10, .ranks = 2, .rank = 0});
  CHECK_THROWS_WITH_AS(s.set_epoch(0, 6), doctest::Contains("position 6 is past"),
                       std::invalid_argument);
  CHECK_THROWS_AS(s.index_at(5), std::out_of_range);
  CHECK(sd::to_string(s.config()).find(".ranks = 2") != std::string::npos);
}
