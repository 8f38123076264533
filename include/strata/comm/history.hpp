// SPDX-License-Identifier: Apache-2.0
#pragma once

// A per-rank ring buffer of the last operations a communicator ran, printed with any comm error
// so that a hang or mismatch shows what each rank was doing.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "strata/comm/fingerprint.hpp"

namespace strata::comm {

enum class op_status : std::uint8_t { started, completed, failed };

struct op_record {
  op_signature signature{};
  std::int32_t peer = -1;  // send / recv
  std::int32_t tag = -1;
  op_status status = op_status::started;
  std::chrono::steady_clock::time_point started_at{};
};

class op_history {
 public:
  explicit op_history(std::size_t capacity = 16) : records_(capacity == 0 ? 1 : capacity) {}

  // Records an operation as started; returns its slot for later status updates.
  std::size_t start(const op_signature& signature, int peer = -1, int tag = -1) {
    return start(signature, peer, tag, std::chrono::steady_clock::now());
  }
  // The same, with the start time the caller has already read.
  std::size_t start(const op_signature& signature, int peer, int tag,
                    std::chrono::steady_clock::time_point started_at) {
    const std::lock_guard lock(mutex_);
    const std::size_t slot = next_ % records_.size();
    records_[slot] = op_record{.signature = signature,
                               .peer = peer,
                               .tag = tag,
                               .status = op_status::started,
                               .started_at = started_at};
    ++next_;
    return slot;
  }

  void finish(std::size_t slot, op_status status) {
    const std::lock_guard lock(mutex_);
    records_[slot % records_.size()].status = status;
  }

  std::size_t size() const {
    const std::lock_guard lock(mutex_);
    return next_ < records_.size() ? next_ : records_.size();
  }

  // Oldest first, one line per operation: "#12 all_reduce float32 x 1024 op sum: completed".
  std::string to_string() const {
    const std::lock_guard lock(mutex_);
    std::string out;
    const std::size_t n = next_ < records_.size() ? next_ : records_.size();
    const auto now = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      const auto& r = records_[(next_ - n + i) % records_.size()];
      out += "  " + comm::to_string(r.signature);
      if (r.peer >= 0) {
        out += " peer " + std::to_string(r.peer) + " tag " + std::to_string(r.tag);
      }
      const char* status = r.status == op_status::started     ? "started"
                           : r.status == op_status::completed ? "completed"
                                                              : "failed";
      const auto age = std::chrono::duration<double>(now - r.started_at).count();
      out += std::string(": ") + status + " (" + std::to_string(age) + " s ago)\n";
    }
    return out.empty() ? "  (no operations yet)\n" : out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<op_record> records_;
  std::size_t next_ = 0;
};

}  // namespace strata::comm
