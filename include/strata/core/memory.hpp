// SPDX-License-Identifier: Apache-2.0
#pragma once

// Memory accounting. Every execution space owns a memory_tracker (one per process for the host,
// plus one per host_account; one per device for CUDA) that counts the bytes its allocations hold,
// their peak, and an optional budget. A reservation that would exceed the budget throws
// memory_error before any memory is touched, so a caller (the adaptive batch policy, the tuner) can
// catch it and retry with less; the tracker is left exactly as it was.
//
// A tracker may have a parent: what it reserves is reserved in the parent too, under both
// budgets. strata::host_account (core/host.hpp) uses this to give each thread rank of
// comm::threads an account of its own inside the process's host tracker, as each GPU has its
// own.

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
// thread at any time. With a parent (which must outlive this tracker), every reservation is
// also one of the parent's, and fails when either budget would be exceeded.
class memory_tracker {
 public:
  explicit memory_tracker(std::string space, memory_tracker* parent = nullptr)
      : space_(std::move(space)), parent_(parent) {}

  memory_tracker(const memory_tracker&) = delete;
  memory_tracker& operator=(const memory_tracker&) = delete;

  // The space whose memory this is ("host", "cuda:0"); used in error messages.
  const std::string& space() const noexcept { return space_; }

  // The tracker this one's reservations also go to; null for none.
  memory_tracker* parent() const noexcept { return parent_; }

  // Accounts one allocation of `bytes`. Throws memory_error, leaving every counter unchanged
  // (the parent's too), when in_use + bytes would exceed the budget (or overflow) here or in a
  // parent; the error names the tracker whose budget it is.
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
    if (parent_ != nullptr) {
      try {
        parent_->reserve(bytes);
      } catch (...) {
        in_use_.fetch_sub(bytes, std::memory_order_acq_rel);
        throw;
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
    const std::size_t released = bytes < current ? bytes : current;
    std::size_t live = allocations_.load(std::memory_order_relaxed);
    while (live != 0 &&
           !allocations_.compare_exchange_weak(live, live - 1, std::memory_order_relaxed)) {
    }
    if (parent_ != nullptr) {
      parent_->release(released);  // what was counted here was counted there
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
  memory_tracker* parent_ = nullptr;
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
