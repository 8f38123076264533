// SPDX-License-Identifier: Apache-2.0
// batch::adaptive: the memory budget helpers, tracker_monitor, and adaptive_controller against a
// simulated memory peak(m) = base + slope x m, on one rank and on two agreeing ranks.

#include "strata/batch/adaptive.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/threads.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"
#include "strata/core/memory.hpp"

namespace {

using strata::batch::adaptive_config;
using strata::batch::adaptive_controller;
using strata::batch::adaptive_event;

static_assert(strata::policy_of<strata::batch::adaptive, strata::batch_policy_tag>);
static_assert(strata::batch::memory_monitor<strata::batch::tracker_monitor>);
static_assert(!strata::batch::memory_monitor<int>);

// The memory a step reaches: what is allocated outside the step plus slope bytes per sample.
struct simulated_memory {
  std::size_t base = 0;
  std::size_t slope = 0;
  std::size_t peak(std::size_t m) const { return base + slope * m; }
};

// The invalid_argument message of `cfg.validate()`; empty when it passes.
std::string validation_error(const adaptive_config& cfg) {
  try {
    cfg.validate();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

strata::memory_error oom(std::size_t in_use, std::size_t requested, std::size_t budget) {
  return strata::memory_error(
      {.space = "host", .requested = requested, .in_use = in_use, .budget = budget},
      "the allocation would exceed the memory budget");
}

constexpr std::size_t budget = 210000;  // target 199500: 179 samples of 1000 bytes over 20000

}  // namespace

TEST_CASE("adaptive_config: validation names the field and the value") {
  const adaptive_config good{.global_batch = 256, .min_micro = 8, .max_micro = 128};
  CHECK(validation_error(good).empty());
  CHECK(validation_error({.global_batch = 64, .max_micro = 512}).empty());

  CHECK(contains(validation_error({}), "adaptive_config.global_batch must be >= 1, got 0"));
  CHECK(contains(validation_error({.global_batch = 8, .min_micro = 0}), "min_micro"));
  const std::string above =
      validation_error({.global_batch = 256, .min_micro = 65, .max_micro = 64});
  CHECK(contains(above, "adaptive_config.min_micro"));
  CHECK(contains(above, "got 65"));
  CHECK(contains(validation_error({.global_batch = 16, .min_micro = 17}), "min_micro"));
  CHECK(contains(validation_error({.global_batch = 8, .margin = 0.5}), "adaptive_config.margin"));
  CHECK(contains(validation_error({.global_batch = 8, .margin = -0.1}), "got -0.1"));
  CHECK(contains(validation_error({.global_batch = 8, .max_growth = 1.0}), "max_growth"));
  CHECK(contains(validation_error({.global_batch = 8, .hysteresis = 1.0}), "hysteresis"));

  CHECK_THROWS_AS(adaptive_controller({.global_batch = 0}, {}, 1000, 0), std::invalid_argument);
  CHECK_THROWS_AS(adaptive_controller({.global_batch = 8}, {}, 0, 0), std::invalid_argument);

  CHECK(to_string(good) ==
        "adaptive_config{.global_batch = 256, .min_micro = 8, .max_micro = 128, "
        ".initial_micro = 0, .margin = 0.05, .max_growth = 2, .hysteresis = 0.1}");
  CHECK(good == adaptive_config{.global_batch = 256, .min_micro = 8, .max_micro = 128});
  CHECK_FALSE(good == adaptive_config{.global_batch = 256, .min_micro = 8, .max_micro = 127});
}

TEST_CASE("adaptive_controller: the first micro-batch comes from the estimate") {
  const auto estimate = [](std::size_t m) { return 1000 * m; };
  // 10000 + 1000 m <= 110000 x 0.95 = 104500  <=>  m <= 94.5
  adaptive_controller ctl({.global_batch = 256}, estimate, 110000, 10000);
  CHECK(ctl.micro_batch() == 94);
  REQUIRE(ctl.events().size() == 1);
  CHECK(ctl.events()[0] ==
        adaptive_event{
            .step = 0, .from = 0, .to = 94, .reason = "start", .peak = 104000, .budget = 110000});

  CHECK(adaptive_controller({.global_batch = 256, .max_micro = 50}, estimate, 110000, 10000)
            .micro_batch() == 50);
  CHECK(adaptive_controller({.global_batch = 64}, estimate, 110000, 10000).micro_batch() == 64);
  CHECK(adaptive_controller({.global_batch = 256, .margin = 0.0}, estimate, 110000, 10000)
            .micro_batch() == 100);
  // Nothing fits: the smallest allowed.
  CHECK(adaptive_controller({.global_batch = 256, .min_micro = 4}, estimate, 110000, 200000)
            .micro_batch() == 4);
  // An explicit start wins, clamped to [min, max].
  CHECK(adaptive_controller({.global_batch = 256, .initial_micro = 20}, estimate, 110000, 10000)
            .micro_batch() == 20);
  CHECK(adaptive_controller({.global_batch = 256, .max_micro = 16, .initial_micro = 20}, estimate,
                            110000, 10000)
            .micro_batch() == 16);
  // Without an estimate: min.
  CHECK(
      adaptive_controller({.global_batch = 256, .min_micro = 3}, {}, 110000, 10000).micro_batch() ==
      3);
}

TEST_CASE("adaptive_controller: grows at most x2 per step up to the budget, then settles") {
  const simulated_memory memory{.base = 20000, .slope = 1000};
  adaptive_controller ctl({.global_batch = 256, .initial_micro = 8}, {}, budget, memory.base);
  std::vector<std::size_t> micro;
  std::size_t peak = 0;
  for (std::uint64_t step = 1; step <= 10; ++step) {
    peak = memory.peak(ctl.micro_batch());
    CHECK(peak <= budget);
    const std::size_t proposal = ctl.propose(step, peak, budget);
    CHECK(ctl.micro_batch() == (micro.empty() ? 8 : micro.back()));  // propose changes nothing
    ctl.apply(step, proposal, peak, budget);
    micro.push_back(ctl.micro_batch());
  }
  CHECK(micro == std::vector<std::size_t>{16, 32, 64, 128, 179, 179, 179, 179, 179, 179});
  CHECK(static_cast<double>(peak) >= 0.9 * budget);
  CHECK(peak <= budget);

  const auto& events = ctl.events();
  REQUIRE(events.size() == 6);
  CHECK(events[0].reason == "start");
  for (std::size_t i = 1; i < events.size(); ++i) {
    CAPTURE(to_string(events[i]));
    CHECK(events[i].reason == "grow");
    CHECK(events[i].to > events[i].from);
    CHECK(events[i].to <= 2 * events[i].from);
    CHECK(events[i].step == i);
    CHECK(events[i].budget == budget);
    CHECK(events[i].peak == memory.peak(events[i].from));
  }
  CHECK(to_string(events[5]) == "step 5: micro-batch 128 -> 179 (grow; peak 0.1 MiB of 0.2 MiB)");
}

TEST_CASE("adaptive_event: to_string is one readable log line") {
  const adaptive_event e{.step = 12,
                         .from = 64,
                         .to = 128,
                         .reason = "grow",
                         .peak = 43201331,  // 41.2 MiB
                         .budget = 100 * 1024 * 1024};
  CHECK(to_string(e) == "step 12: micro-batch 64 -> 128 (grow; peak 41.2 MiB of 100.0 MiB)");
}

TEST_CASE("adaptive_controller: shrinks when the memory outside the step grows") {
  simulated_memory memory{.base = 20000, .slope = 1000};
  adaptive_controller ctl({.global_batch = 256, .initial_micro = 8}, {}, budget, memory.base);
  std::uint64_t step = 0;
  const auto run_step = [&] {
    ++step;
    const std::size_t peak = memory.peak(ctl.micro_batch());
    CHECK(peak <= budget);
    ctl.apply(step, ctl.propose(step, peak, budget), peak, budget);
    return peak;
  };
  for (int i = 0; i < 8; ++i) {
    run_step();
  }
  REQUIRE(ctl.micro_batch() == 179);

  memory.base += 10000;  // another allocation: 209000 > the upper band 204750
  const std::size_t pressed = run_step();
  CHECK(static_cast<double>(pressed) > budget * (1.0 - 0.05 / 2));
  CHECK(ctl.micro_batch() < 179);
  CHECK(ctl.events().back().reason == "shrink");
  for (int i = 0; i < 6; ++i) {
    const std::size_t peak = run_step();
    CHECK(static_cast<double>(peak) <= budget * (1.0 - 0.05 / 2));
  }
  CHECK(ctl.micro_batch() >= 160);
  CHECK(ctl.micro_batch() <= 170);
}

TEST_CASE("adaptive_controller: a peak that moved at the same micro-batch drops the old point") {
  simulated_memory memory{.base = 100000, .slope = 1000};
  const std::size_t big = 1000000;  // target 950000
  adaptive_controller ctl({.global_batch = 1024, .initial_micro = 100, .max_growth = 100.0}, {},
                          big, memory.base);
  CHECK(ctl.propose(1, memory.peak(100), big) == 475);  // 200000 at 100: 2000 per sample
  ctl.apply(1, 200, memory.peak(100), big);             // another rank holds it to 200
  CHECK(ctl.events().back().reason == "agree");
  CHECK(ctl.propose(2, memory.peak(200), big) == 850);  // two points: 1000 per sample
  ctl.apply(2, 200, memory.peak(200), big);
  CHECK(ctl.events().size() == 2);  // unchanged: nothing logged

  // 80000 bytes outside the step were freed. Fitting a line through (100, 200000) and
  // (200, 220000) would claim 200 bytes per sample and propose 1024, far past the budget; the
  // old point is dropped instead and the cautious peak / m = 1100 per sample gives 863.
  memory.base = 20000;
  const std::size_t proposal = ctl.propose(3, memory.peak(200), big);
  CHECK(proposal == 863);
  CHECK(memory.peak(proposal) <= big);
}

TEST_CASE("adaptive_controller: in the upper band at min it stays at min") {
  adaptive_controller ctl({.global_batch = 64, .min_micro = 8, .initial_micro = 8}, {}, 1000000, 0);
  CHECK(ctl.propose(1, 990000, 1000000) == 8);
  // One above min: shrinks to min.
  adaptive_controller nine({.global_batch = 64, .min_micro = 8, .initial_micro = 9}, {}, 1000000,
                           0);
  CHECK(nine.propose(1, 990000, 1000000) == 8);
}

TEST_CASE("adaptive_controller: hysteresis keeps the micro-batch under small fluctuations") {
  const auto settle_then_fluctuate = [](double hysteresis) {
    const simulated_memory memory{.base = 20000, .slope = 1000};
    adaptive_controller ctl({.global_batch = 256, .initial_micro = 8, .hysteresis = hysteresis}, {},
                            budget, memory.base);
    std::uint64_t step = 0;
    for (; step < 8; ++step) {
      const std::size_t peak = memory.peak(ctl.micro_batch());
      ctl.apply(step, ctl.propose(step, peak, budget), peak, budget);
    }
    const std::size_t settled = ctl.micro_batch();
    const std::size_t events = ctl.events().size();
    std::vector<std::size_t> seen;
    for (int i = 0; i < 10; ++i, ++step) {
      // +-0.5% of the budget around the true peak
      const std::size_t peak = memory.peak(ctl.micro_batch()) - 1000 + (i % 2 == 0 ? 0 : 2000);
      ctl.apply(step, ctl.propose(step, peak, budget), peak, budget);
      seen.push_back(ctl.micro_batch());
    }
    return std::make_pair(seen == std::vector<std::size_t>(10, settled),
                          ctl.events().size() == events);
  };
  const auto [steady, quiet] = settle_then_fluctuate(0.10);
  CHECK(steady);
  CHECK(quiet);
  // The same noise moves the micro-batch without the band.
  const auto [steady_without, quiet_without] = settle_then_fluctuate(0.0);
  CHECK_FALSE(steady_without);
  CHECK_FALSE(quiet_without);
}

TEST_CASE("adaptive_controller: after_oom halves, stops at min, then names the config keys") {
  const std::size_t mib64 = std::size_t{64} << 20;
  adaptive_controller ctl({.global_batch = 256, .min_micro = 8, .initial_micro = 64}, {}, mib64, 0);
  CHECK(ctl.after_oom(3, oom(mib64 - 10, 100, mib64)) == 32);
  CHECK(ctl.micro_batch() == 32);
  CHECK(ctl.events().back() ==
        adaptive_event{
            .step = 3, .from = 64, .to = 32, .reason = "oom", .peak = mib64 + 90, .budget = mib64});
  CHECK(ctl.after_oom(4, oom(1, 2, 0)) == 16);  // no budget in the error: the last one known
  CHECK(ctl.events().back().budget == mib64);
  CHECK(ctl.after_oom(5, oom(1, 2, mib64)) == 8);

  std::string message;
  try {
    ctl.after_oom(6, oom(mib64 - 1, 2, mib64));
  } catch (const strata::memory_error& e) {
    message = e.what();
    CHECK(e.budget() == mib64);
    CHECK(e.space() == "host");
  }
  CAPTURE(message);
  CHECK(contains(message, "memory_budget_mb"));
  CHECK(contains(message, "adaptive_batch_min"));
  CHECK(contains(message, "micro-batch 8"));
  CHECK(contains(message, "64.0 MiB"));
  CHECK(ctl.micro_batch() == 8);
  CHECK(ctl.events().size() == 4);  // start and three halvings; the throw records nothing

  // min 5: 11 -> 5 (not 2).
  adaptive_controller odd({.global_batch = 64, .min_micro = 5, .initial_micro = 11}, {}, 1000, 0);
  CHECK(odd.after_oom(1, oom(900, 200, 1000)) == 5);
}

TEST_CASE("adaptive_controller: after_oom also follows the model when it asks for less") {
  adaptive_controller ctl({.global_batch = 256, .initial_micro = 64}, {}, 200000, 0);
  // 100000 bytes at 64 (no estimate: 1562.5 bytes per sample, base 0) fits 121 in 200000.
  CHECK(ctl.propose(1, 100000, 200000) == 121);
  CHECK(ctl.micro_batch() == 64);
  // The budget fell to 50000: 47500 / 1562.5 = 30.4 fits, less than half of 64.
  CHECK(ctl.after_oom(2, oom(45000, 10000, 50000)) == 30);
}

TEST_CASE("adaptive_controller: split covers every sample of the step exactly once") {
  CHECK(adaptive_controller::split(256, 100) == std::vector<std::size_t>{100, 100, 56});
  CHECK(adaptive_controller::split(256, 64) == std::vector<std::size_t>{64, 64, 64, 64});
  CHECK(adaptive_controller::split(5, 8) == std::vector<std::size_t>{5});
  CHECK(adaptive_controller::split(0, 8).empty());
  CHECK_THROWS_AS(adaptive_controller::split(8, 0), std::invalid_argument);

  for (std::size_t global = 1; global <= 40; ++global) {
    const adaptive_controller ctl({.global_batch = global}, {}, 1000, 0);
    CHECK_THROWS_AS(ctl.micro_steps(0), std::invalid_argument);
    for (std::size_t m = 1; m <= global + 2; ++m) {
      CAPTURE(global);
      CAPTURE(m);
      const std::vector<std::size_t> sizes = adaptive_controller::split(global, m);
      REQUIRE(sizes.size() == ctl.micro_steps(m));
      std::vector<int> seen(global, 0);
      std::size_t offset = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        CHECK(sizes[i] >= 1);
        if (i + 1 < sizes.size()) {
          CHECK(sizes[i] == m);
        } else {
          CHECK(sizes[i] <= m);
        }
        for (std::size_t j = 0; j < sizes[i]; ++j) {
          REQUIRE(offset + j < global);
          ++seen[offset + j];
        }
        offset += sizes[i];
      }
      CHECK(offset == global);
      CHECK(std::vector<int>(global, 1) == seen);
    }
  }
}

TEST_CASE("adaptive_controller: two ranks agree on the smaller micro-batch") {
  // Rank 1 has 75000 more bytes outside the step: it fits 104 samples, rank 0 fits 179.
  const std::array<simulated_memory, 2> memory{simulated_memory{.base = 20000, .slope = 1000},
                                               simulated_memory{.base = 95000, .slope = 1000}};
  constexpr int steps = 8;
  std::array<std::vector<std::size_t>, 2> proposals;
  std::array<std::vector<std::size_t>, 2> micro;
  std::array<std::vector<std::size_t>, 2> peaks;
  std::array<std::vector<adaptive_event>, 2> events;
  strata::comm::threads::run(2, [&](strata::comm::threads& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    // Each rank's memory: `base` bytes held outside the step, and the step's on top of them.
    strata::memory_tracker tracker("rank" + std::to_string(r));
    tracker.set_budget(budget);
    tracker.reserve(memory[r].base);
    strata::batch::tracker_monitor monitor(tracker);
    adaptive_controller controller({.global_batch = 256, .initial_micro = 8}, {}, budget,
                                   memory[r].base);
    for (std::uint64_t step = 1; step <= steps; ++step) {
      monitor.reset_peak();
      const std::size_t step_bytes = memory[r].peak(controller.micro_batch()) - memory[r].base;
      tracker.reserve(step_bytes);  // the step runs
      tracker.release(step_bytes);
      // snippet-begin: agree
      const std::size_t mine = controller.propose(step, monitor.peak(), monitor.budget());
      controller.apply(step, strata::batch::agree_micro_batch(comm, mine), monitor.peak(),
                       monitor.budget());
      // snippet-end: agree
      proposals[r].push_back(mine);
      micro[r].push_back(controller.micro_batch());
      peaks[r].push_back(monitor.peak());
    }
    events[r] = controller.events();
    tracker.release(memory[r].base);
  });
  CHECK(micro[0] == micro[1]);
  CHECK(micro[0].back() == 104);
  CHECK(proposals[0] != proposals[1]);
  for (std::size_t i = 0; i < static_cast<std::size_t>(steps); ++i) {
    CHECK(micro[0][i] == std::min(proposals[0][i], proposals[1][i]));
    CHECK(peaks[0][i] <= budget);
    CHECK(peaks[1][i] <= budget);
  }
  // Rank 0 wanted 128 and took rank 1's 104; rank 1 grew to its own proposal.
  REQUIRE(!events[0].empty());
  REQUIRE(!events[1].empty());
  CHECK(events[0].back().reason == "agree");
  CHECK(events[0].back().to == 104);
  CHECK(events[1].back().reason == "grow");
  CHECK(events[1].back().to == 104);
}

TEST_CASE("tracker_monitor: budget, peak and reset_peak of a memory_tracker") {
  strata::memory_tracker tracker("test");
  strata::batch::tracker_monitor monitor(tracker, 5000);
  CHECK(monitor.budget() == 5000);  // the tracker has none: the fallback
  tracker.set_budget(1000);
  CHECK(monitor.budget() == 1000);
  CHECK(&monitor.tracker() == &tracker);

  tracker.reserve(300);
  tracker.reserve(200);
  CHECK(monitor.peak() == 500);
  tracker.release(200);
  CHECK(monitor.peak() == 500);
  monitor.reset_peak();
  CHECK(monitor.peak() == 300);
  tracker.reserve(100);
  CHECK(monitor.peak() == 400);
  tracker.release(100);
  tracker.release(300);

  const strata::batch::tracker_monitor host_monitor(strata::host{}.memory(), 12345);
  CHECK(host_monitor.budget() == (strata::host{}.memory().budget() != 0
                                      ? strata::host{}.memory().budget()
                                      : std::size_t{12345}));
}

TEST_CASE("adaptive_controller on a real tracker: an OOM, then the budget is used, never passed") {
  strata::memory_tracker tracker("sim");
  tracker.set_budget(budget);
  strata::batch::tracker_monitor monitor(tracker);
  tracker.reserve(20000);  // parameters and optimizer state
  // Starts too large: 20000 + 256 x 1000 does not fit.
  adaptive_controller ctl({.global_batch = 256, .initial_micro = 256}, {}, monitor.budget(), 20000);
  int failures = 0;
  for (std::uint64_t step = 1; step <= 10; ++step) {
    for (;;) {
      monitor.reset_peak();
      try {
        // each micro-step holds 1000 bytes per sample, then frees them
        for (const std::size_t m : adaptive_controller::split(256, ctl.micro_batch())) {
          tracker.reserve(1000 * m);
          tracker.release(1000 * m);
        }
        break;
      } catch (const strata::memory_error& e) {
        ++failures;
        ctl.after_oom(step, e);
      }
    }
    const std::size_t peak = monitor.peak();
    CHECK(peak <= budget);
    ctl.apply(step, ctl.propose(step, peak, monitor.budget()), peak, monitor.budget());
  }
  CHECK(failures == 1);
  CHECK(ctl.events()[1].reason == "oom");
  CHECK(ctl.events()[1].to == 128);
  CHECK(ctl.micro_batch() >= 170);
  CHECK(ctl.micro_batch() <= 179);
  CHECK(tracker.stats().in_use == 20000);
  tracker.release(20000);
}

TEST_CASE("memory budget: cgroup and meminfo parsing, and this machine's memory") {
  using strata::batch::parse_cgroup_limit;
  CHECK(parse_cgroup_limit("max\n") == 0);
  CHECK(parse_cgroup_limit("1073741824\n") == std::size_t{1} << 30);
  CHECK(parse_cgroup_limit("  4096 ") == 4096);
  CHECK(parse_cgroup_limit("9223372036854771712\n") == 0);  // cgroup v1 "no limit"
  CHECK(parse_cgroup_limit("") == 0);
  CHECK(parse_cgroup_limit("12ab") == 0);
  CHECK(parse_cgroup_limit("-1") == 0);
  CHECK(parse_cgroup_limit("garbage") == 0);

  using strata::batch::physical_memory_bytes;
  const std::string meminfo = "MemTotal:       16384 kB\nMemFree:  100 kB\n";
  CHECK(physical_memory_bytes(meminfo, "", "") == 16384 * 1024);
  CHECK(physical_memory_bytes(meminfo, "max\n", "") == 16384 * 1024);
  CHECK(physical_memory_bytes(meminfo, "1048576\n", "") == 1048576);
  CHECK(physical_memory_bytes(meminfo, "", "2097152\n") == 2097152);
  CHECK(physical_memory_bytes(meminfo, "", "9223372036854771712\n") == 16384 * 1024);
  CHECK(physical_memory_bytes("", "1048576", "") == 1048576);
  CHECK(physical_memory_bytes("", "max", "") == 0);

  const std::size_t total = physical_memory_bytes();
  CHECK(total > 0);
  CHECK(total <= strata::host{}.memory_info().device_total);
  const std::size_t half = strata::batch::default_memory_budget(0.5);
  CHECK(half >= total / 2 - 1);
  CHECK(half <= total / 2 + 1);
  CHECK(strata::batch::default_memory_budget() < total);
  CHECK_THROWS_AS(strata::batch::default_memory_budget(0.0), std::invalid_argument);
  CHECK_THROWS_AS(strata::batch::default_memory_budget(1.5), std::invalid_argument);
}

TEST_CASE("cgroup_v2_path finds this process's cgroup v2 directory") {
  CHECK(strata::batch::cgroup_v2_path("0::/user.slice/session-1.scope\n") ==
        "/user.slice/session-1.scope");
  CHECK(strata::batch::cgroup_v2_path("12:memory:/docker/abc\n0::/\n") == "/");
  CHECK(strata::batch::cgroup_v2_path("12:memory:/docker/abc\n").empty());
  CHECK(strata::batch::cgroup_v2_path("").empty());
}

TEST_CASE("space_monitor on the host reads the host tracker and its budget") {
  strata::batch::space_monitor<strata::host> monitor(strata::host{}, std::size_t{64} << 20);
  static_assert(strata::batch::memory_monitor<strata::batch::space_monitor<strata::host>>);
  CHECK(monitor.budget() == (std::size_t{64} << 20));
  {
    const strata::scoped_budget limit(strata::host{}.memory(), std::size_t{32} << 20);
    CHECK(monitor.budget() == (std::size_t{32} << 20));
  }
  monitor.reset_peak();
  const std::size_t before = monitor.peak();
  { strata::buffer<float> block(1 << 20); }
  CHECK(monitor.peak() >= before + (std::size_t{4} << 20));
  strata::batch::space_monitor<strata::host> machine;
  CHECK(machine.budget() > 0);  // 80% of the machine's memory
}
