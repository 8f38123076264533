// SPDX-License-Identifier: Apache-2.0
#include "strata/core/memory.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/error.hpp"

TEST_CASE("memory_tracker counts bytes, peak and allocations") {
  strata::memory_tracker tracker("test");
  CHECK(tracker.space() == "test");
  CHECK(tracker.stats() == strata::memory_stats{});

  tracker.reserve(100);
  tracker.reserve(50);
  CHECK(tracker.stats() ==
        strata::memory_stats{
            .in_use = 150, .peak = 150, .budget = 0, .allocations = 2, .total_allocations = 2});

  tracker.release(100);
  CHECK(tracker.stats() ==
        strata::memory_stats{
            .in_use = 50, .peak = 150, .budget = 0, .allocations = 1, .total_allocations = 2});

  tracker.reset_peak();
  CHECK(tracker.stats().peak == 50);
  tracker.reserve(10);
  CHECK(tracker.stats().peak == 60);

  tracker.release(10);
  tracker.release(50);
  const strata::memory_stats end = tracker.stats();
  CHECK(end.in_use == 0);
  CHECK(end.allocations == 0);
  CHECK(end.total_allocations == 3);
  CHECK(end.peak == 60);
}

TEST_CASE("memory_tracker accepts zero-byte reservations") {
  strata::memory_tracker tracker("test");
  tracker.set_budget(1);
  tracker.reserve(0);
  CHECK(tracker.stats().allocations == 1);
  CHECK(tracker.stats().in_use == 0);
  tracker.release(0);
  CHECK(tracker.stats().allocations == 0);
}

TEST_CASE("memory_tracker throws memory_error past the budget and keeps its state") {
  strata::memory_tracker tracker("cuda:3");
  tracker.set_budget(1000);
  tracker.reserve(600);
  const strata::memory_stats before = tracker.stats();

  bool thrown = false;
  try {
    tracker.reserve(401);
  } catch (const strata::memory_error& e) {
    thrown = true;
    CHECK(e.space() == "cuda:3");
    CHECK(e.requested() == 401);
    CHECK(e.in_use() == 600);
    CHECK(e.budget() == 1000);
    const std::string what = e.what();
    CHECK(what.find("cuda:3") != std::string::npos);
    CHECK(what.find("requested 401 bytes") != std::string::npos);
    CHECK(what.find("in use 600 bytes") != std::string::npos);
    CHECK(what.find("budget 1000 bytes") != std::string::npos);
  }
  CHECK(thrown);
  CHECK(tracker.stats() == before);

  // Exactly up to the budget is allowed.
  tracker.reserve(400);
  CHECK(tracker.stats().in_use == 1000);
  CHECK_THROWS_AS(tracker.reserve(1), strata::memory_error);
  tracker.release(400);
  tracker.release(600);
  CHECK(tracker.stats().in_use == 0);
}

TEST_CASE("memory_tracker rejects a request that would overflow") {
  strata::memory_tracker tracker("test");
  tracker.reserve(16);
  const strata::memory_stats before = tracker.stats();
  CHECK_THROWS_AS(tracker.reserve(static_cast<std::size_t>(-1)), strata::memory_error);
  CHECK(tracker.stats() == before);
  tracker.release(16);
}

TEST_CASE("memory_tracker budget below in_use refuses until enough is released") {
  strata::memory_tracker tracker("test");
  tracker.reserve(500);
  tracker.set_budget(100);
  CHECK(tracker.stats().in_use == 500);
  CHECK_THROWS_AS(tracker.reserve(1), strata::memory_error);
  tracker.release(500);
  tracker.reserve(100);
  CHECK(tracker.stats().in_use == 100);
  tracker.set_budget(0);
  tracker.reserve(1000);
  CHECK(tracker.stats().in_use == 1100);
  tracker.release(1000);
  tracker.release(100);
}

TEST_CASE("memory_tracker release past zero stops at zero") {
  strata::memory_tracker tracker("test");
  tracker.reserve(10);
  tracker.release(20);
  CHECK(tracker.stats().in_use == 0);
  CHECK(tracker.stats().allocations == 0);
  tracker.release(5);
  CHECK(tracker.stats().in_use == 0);
  CHECK(tracker.stats().allocations == 0);
}

TEST_CASE("scoped_budget sets and restores the budget") {
  strata::memory_tracker tracker("test");
  tracker.set_budget(4096);
  {
    strata::scoped_budget outer(tracker, 1024);
    CHECK(outer.previous() == 4096);
    CHECK(tracker.budget() == 1024);
    {
      strata::scoped_budget inner(tracker, 0);
      CHECK(tracker.budget() == 0);
      tracker.reserve(2048);
      tracker.release(2048);
    }
    CHECK(tracker.budget() == 1024);
    CHECK_THROWS_AS(tracker.reserve(2048), strata::memory_error);
  }
  CHECK(tracker.budget() == 4096);
}

TEST_CASE("memory_tracker from 8 threads never exceeds the budget and ends at zero") {
  constexpr std::size_t budget = 16 * 1024;
  constexpr int threads = 8;
  constexpr int rounds = 4000;
  strata::memory_tracker tracker("test");
  tracker.set_budget(budget);

  std::atomic<bool> over_budget{false};
  std::atomic<std::size_t> refused{0};
  std::atomic<std::size_t> granted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<std::size_t> held;
      std::size_t state = 0x9e3779b97f4a7c15ULL * static_cast<std::size_t>(t + 1);
      for (int i = 0; i < rounds; ++i) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const std::size_t bytes = 1 + (state >> 33) % 8192;
        if (held.size() < 4 && ((state >> 40) & 3) != 0) {
          try {
            tracker.reserve(bytes);
            held.push_back(bytes);
            granted.fetch_add(1);
          } catch (const strata::memory_error& e) {
            refused.fetch_add(1);
            if (e.budget() != budget || e.in_use() + e.requested() <= budget) {
              over_budget = true;  // refused although it fit
            }
          }
        } else if (!held.empty()) {
          tracker.release(held.back());
          held.pop_back();
        }
        if (tracker.stats().in_use > budget) {
          over_budget = true;
        }
      }
      for (std::size_t bytes : held) {
        tracker.release(bytes);
      }
    });
  }
  for (std::thread& thread : pool) {
    thread.join();
  }

  const strata::memory_stats end = tracker.stats();
  CHECK_FALSE(over_budget.load());
  CHECK(end.in_use == 0);
  CHECK(end.allocations == 0);
  CHECK(end.peak <= budget);
  CHECK(end.total_allocations == granted.load());
  CHECK(granted.load() > 0);
  // One thread alone may hold up to 4 blocks of up to 8 KiB, twice the budget.
  CHECK(refused.load() > 0);
}

TEST_CASE("memory_stats and memory_snapshot print every field") {
  const strata::memory_stats stats{
      .in_use = 1, .peak = 2, .budget = 3, .allocations = 4, .total_allocations = 5};
  CHECK(strata::to_string(stats) ==
        "memory_stats{.in_use = 1, .peak = 2, .budget = 3, .allocations = 4, "
        ".total_allocations = 5}");
  const strata::memory_snapshot snapshot{.stats = stats, .device_total = 6, .device_free = 7};
  CHECK(strata::to_string(snapshot).find(".device_total = 6, .device_free = 7}") !=
        std::string::npos);
}

TEST_CASE("a tracker with a parent reserves in both, under both budgets") {
  strata::memory_tracker parent("host");
  strata::memory_tracker child("host:rank1", &parent);
  CHECK(child.parent() == &parent);
  parent.reserve(100);  // someone else's
  child.reserve(40);
  CHECK(child.stats().in_use == 40);
  CHECK(parent.stats().in_use == 140);
  CHECK(parent.stats().allocations == 2);

  // The child's budget: the child names itself, the parent is untouched.
  child.set_budget(50);
  const strata::memory_stats child_before = child.stats();
  const strata::memory_stats parent_before = parent.stats();
  try {
    child.reserve(11);
    FAIL("reserved past the child's budget");
  } catch (const strata::memory_error& e) {
    CHECK(e.space() == "host:rank1");
    CHECK(e.budget() == 50);
    CHECK(e.in_use() == 40);
  }
  CHECK(child.stats() == child_before);
  CHECK(parent.stats() == parent_before);

  // The parent's budget: the parent names itself, and the child's reservation is undone.
  child.set_budget(0);
  parent.set_budget(150);
  const strata::memory_stats child_unlimited = child.stats();
  const strata::memory_stats parent_limited = parent.stats();
  try {
    child.reserve(11);
    FAIL("reserved past the parent's budget");
  } catch (const strata::memory_error& e) {
    CHECK(e.space() == "host");
    CHECK(e.budget() == 150);
    CHECK(e.in_use() == 140);
  }
  CHECK(child.stats() == child_unlimited);
  CHECK(parent.stats() == parent_limited);

  child.reserve(10);
  CHECK(parent.stats().in_use == 150);
  child.release(10);
  child.release(40);
  CHECK(child.stats().in_use == 0);
  CHECK(child.stats().peak == 50);
  CHECK(parent.stats().in_use == 100);
  CHECK(parent.stats().allocations == 1);

  // Releasing past zero in the child gives back to the parent only what the child held.
  child.reserve(5);
  child.release(20);
  CHECK(parent.stats().in_use == 100);
  parent.release(100);
}
