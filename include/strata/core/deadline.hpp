// SPDX-License-Identifier: Apache-2.0
#pragma once

// A point in time after which a wait gives up. Every blocking wait in strata (collectives, the
// loader's queue) takes one, so that nothing waits forever.

#include <chrono>
#include <limits>

namespace strata {

class deadline {
 public:
  using clock = std::chrono::steady_clock;

  // A deadline `seconds` from now; a non-positive or infinite value never expires.
  static deadline after(double seconds) noexcept { return after(seconds, clock::now()); }
  // A deadline `seconds` from `from` (a time the caller has just read, to save a clock read).
  static deadline after(double seconds, clock::time_point from) noexcept {
    if (!(seconds > 0.0) || seconds >= 1e9) {
      return never();
    }
    return deadline(
        from + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds)));
  }
  static deadline never() noexcept { return deadline(clock::time_point::max()); }

  bool expired() const noexcept { return at_ != clock::time_point::max() && clock::now() >= at_; }
  bool is_never() const noexcept { return at_ == clock::time_point::max(); }
  clock::time_point at() const noexcept { return at_; }

  // Seconds left (0 when expired, a huge value for never()).
  double remaining() const noexcept {
    if (is_never()) {
      return std::numeric_limits<double>::max();
    }
    const auto left = std::chrono::duration<double>(at_ - clock::now()).count();
    return left > 0.0 ? left : 0.0;
  }

 private:
  explicit deadline(clock::time_point at) noexcept : at_(at) {}
  clock::time_point at_;
};

}  // namespace strata
