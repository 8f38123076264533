// SPDX-License-Identifier: Apache-2.0
#pragma once

// Waiting helpers shared by the backends that poll (mpi, nccl) and the text of a timeout.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace strata::comm::detail {

// "2", "0.5", "300": a timeout in seconds as it reads in an error message.
inline std::string seconds_text(double seconds) {
  char text[32] = {};
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

// The pause between two polls of an operation that a library progresses only when asked (MPI,
// NCCL): poll at once for the first 2 ms, then yield the core between polls until 20 ms (ranks
// that share a core still run), then sleep, from 10 us growing to 200 us. restart() when the
// operation moves on, so that its next phase is polled eagerly again.
class poll_backoff {
 public:
  void pause() {
    const auto now = std::chrono::steady_clock::now();
    if (start_ == std::chrono::steady_clock::time_point{}) {
      start_ = now;  // the clock starts at the first pause: an operation done at once reads none
      return;
    }
    const auto waited = now - start_;
    if (waited < std::chrono::milliseconds(2)) {
      return;
    }
    if (waited < std::chrono::milliseconds(20)) {
      std::this_thread::yield();
      return;
    }
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(200));
    std::this_thread::sleep_for(sleep_);
  }

  void restart() {
    start_ = {};
    sleep_ = std::chrono::microseconds(5);
  }

 private:
  std::chrono::steady_clock::time_point start_{};
  std::chrono::microseconds sleep_{5};
};

}  // namespace strata::comm::detail
