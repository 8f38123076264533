// SPDX-License-Identifier: Apache-2.0
#pragma once

// Memory accounting. Every execution space owns a memory_tracker (one per process for the host,
// one per device for CUDA) that counts the bytes its allocations hold, their peak, and an
// optional budget. A reservation that would exceed the budget throws memory_error before any
// memory is touched, so a caller (the adaptive batch policy, the tuner) can catch it and retry
// with less; the tracker is left exactly as it was.

#include <atomic>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "strata/core/error.hpp"

namespace strata {

// A snapshot of a tracker. Each field is read atomically; the snapshot as a whole is not taken
// under a lock, so concurrent allocations may land between two fields.
struct memory_stats {
  std::size_t in_use = 0;             // bytes held by live allocations
  std::size_t peak = 0;               // highest in_use since construction or reset_peak()
  std::size_t budget = 0;             // the most in_use may reach; 0 = unlimited
  std::size_t allocations = 0;        // live allocations
  std::size_t total_allocations = 0;  // allocations ever made

  bool operator==(const memory_stats&) const = default;
};

inline std::string to_string(const memory_stats& s) {
  return "memory_stats{.in_use = " + std::to_string(s.in_use) +
         ", .peak = " + std::to_string(s.peak) + ", .budget = " + std::to_string(s.budget) +
         ", .allocations = " + std::to_string(s.allocations) +
         ", .total_allocations = " + std::to_string(s.total_allocations) + "}";
}

// What an execution space reports about its memory: its own accounting plus what the device
// (or the operating system, for the host) says. device_* are 0 when not known.
struct memory_snapshot {
  memory_stats stats;
  std::size_t device_total = 0;  // bytes of memory the device (machine) has
  std::size_t device_free = 0;   // bytes the device (machine) can still hand out

  bool operator==(const memory_snapshot&) const = default;
};

inline std::string to_string(const memory_snapshot& s) {
  return "memory_snapshot{.stats = " + to_string(s.stats) +
         ", .device_total = " + std::to_string(s.device_total) +
         ", .device_free = " + std::to_string(s.device_free) + "}";
}

// Thread-safe byte accounting with an optional budget. reserve() before allocating, release()
// after freeing, one reserve per allocation. Lock-free: every member may be called from any
// thread at any time.
class memory_tracker {
 public:
  explicit memory_tracker(std::string space) : space_(std::move(space)) {}

  memory_tracker(const memory_tracker&) = delete;
  memory_tracker& operator=(const memory_tracker&) = delete;

  // The space whose memory this is ("host", "cuda:0"); used in error messages.
  const std::string& space() const noexcept { return space_; }

  // Accounts one allocation of `bytes`. Throws memory_error, leaving every counter unchanged,
  // when in_use + bytes would exceed the budget (or overflow).
  void reserve(std::size_t bytes) {
    std::size_t current = in_use_.load(std::memory_order_relaxed);
    for (;;) {
      const std::size_t limit = budget_.load(std::memory_order_relaxed);
      if (bytes > std::numeric_limits<std::size_t>::max() - current) {
        throw memory_error(
            {.space = space_, .requested = bytes, .in_use = current, .budget = limit},
            "the request overflows the address space");
      }
      if (limit != 0 && current + bytes > limit) {
        throw memory_error(
            {.space = space_, .requested = bytes, .in_use = current, .budget = limit},
            "the allocation would exceed the memory budget");
      }
      if (in_use_.compare_exchange_weak(current, current + bytes, std::memory_order_acq_rel,
                                        std::memory_order_relaxed)) {
        break;
      }
    }
    raise_peak(current + bytes);
    allocations_.fetch_add(1, std::memory_order_relaxed);
    total_allocations_.fetch_add(1, std::memory_order_relaxed);
  }

  // Gives back one allocation of `bytes`. Releasing more than is in use is a bug in the caller;
  // the counters then stop at zero instead of wrapping around.
  void release(std::size_t bytes) noexcept {
    std::size_t current = in_use_.load(std::memory_order_relaxed);
    while (!in_use_.compare_exchange_weak(current, current - (bytes < current ? bytes : current),
                                          std::memory_order_acq_rel, std::memory_order_relaxed)) {
    }
    std::size_t live = allocations_.load(std::memory_order_relaxed);
    while (live != 0 &&
           !allocations_.compare_exchange_weak(live, live - 1, std::memory_order_relaxed)) {
    }
  }

  memory_stats stats() const noexcept {
    const std::size_t in_use = in_use_.load(std::memory_order_acquire);
    const std::size_t peak = peak_.load(std::memory_order_relaxed);
    return {.in_use = in_use,
            .peak = peak < in_use ? in_use : peak,
            .budget = budget_.load(std::memory_order_relaxed),
            .allocations = allocations_.load(std::memory_order_relaxed),
            .total_allocations = total_allocations_.load(std::memory_order_relaxed)};
  }

  std::size_t budget() const noexcept { return budget_.load(std::memory_order_relaxed); }

  // 0 = unlimited. A budget below what is in use is allowed: nothing is freed, and every
  // reservation fails until enough is released.
  void set_budget(std::size_t bytes) noexcept { budget_.store(bytes, std::memory_order_relaxed); }

  // Starts a new peak measurement from what is in use now.
  void reset_peak() noexcept {
    peak_.store(in_use_.load(std::memory_order_acquire), std::memory_order_relaxed);
  }

 private:
  void raise_peak(std::size_t value) noexcept {
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (peak < value && !peak_.compare_exchange_weak(peak, value, std::memory_order_relaxed)) {
    }
  }

  std::string space_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> budget_{0};
  std::atomic<std::size_t> allocations_{0};
  std::atomic<std::size_t> total_allocations_{0};
};

// Sets a tracker's budget for a scope and restores the previous one on exit.
//
//   {
//     strata::scoped_budget limit(strata::host{}.memory(), 64 << 20);
//     run_step();  // throws memory_error past 64 MiB of host allocations
//   }
class scoped_budget {
 public:
  scoped_budget(memory_tracker& tracker, std::size_t bytes) noexcept
      : tracker_(tracker), previous_(tracker.budget()) {
    tracker_.set_budget(bytes);
  }
  ~scoped_budget() { tracker_.set_budget(previous_); }

  scoped_budget(const scoped_budget&) = delete;
  scoped_budget& operator=(const scoped_budget&) = delete;

  std::size_t previous() const noexcept { return previous_; }

 private:
  memory_tracker& tracker_;
  std::size_t previous_;
};

}  // namespace strata
