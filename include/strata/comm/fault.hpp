// SPDX-License-Identifier: Apache-2.0
#pragma once

// Fault injection for tests: make a given rank die, throw, hang or pass a wrong count at a given
// operation and sequence number, so that the no-hang guarantees can be tested.
//
// Through the API:  strata::comm::fault_injector::global().add({.rank = 1, .op =
//                   op_kind::all_reduce, .sequence = 3, .action = fault_action::hang});
// Through the environment (read once, at first use):
//                   STRATA_COMM_FAULT="rank=1,op=all_reduce,seq=3,action=hang[;...]"
// Backends call `fault_injector::global().at(rank, op, sequence)` before each operation.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/types.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

enum class fault_action : std::uint8_t {
  kill,         // the rank dies without a word (MPI: the process exits; threads: the rank stops)
  throw_error,  // the rank throws strata::error from the operation
  hang,         // the rank stops answering (until its communicator is aborted)
  wrong_count,  // the rank passes count + 1 elements
};

constexpr std::string_view to_string(fault_action a) noexcept {
  switch (a) {
    case fault_action::kill:
      return "kill";
    case fault_action::throw_error:
      return "throw";
    case fault_action::hang:
      return "hang";
    case fault_action::wrong_count:
      return "wrong_count";
  }
  return "unknown";
}

struct fault_spec {
  int rank = 0;
  op_kind op = op_kind::all_reduce;
  std::uint64_t sequence = 0;  // the op's sequence number on its communicator
  fault_action action = fault_action::throw_error;
  bool operator==(const fault_spec&) const = default;
};

// Parses "rank=1,op=all_reduce,seq=3,action=hang;rank=0,..."; throws strata::error naming the
// offending field.
inline std::vector<fault_spec> parse_fault_specs(std::string_view text) {
  std::vector<fault_spec> out;
  const auto fail = [&](const std::string& why) {
    return error("STRATA_COMM_FAULT: " + why + " in '" + std::string(text) + "'");
  };
  while (!text.empty()) {
    const auto end = text.find(';');
    std::string_view item = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (item.empty()) {
      continue;
    }
    fault_spec spec;
    bool has_rank = false;
    bool has_op = false;
    bool has_seq = false;
    bool has_action = false;
    while (!item.empty()) {
      const auto comma = item.find(',');
      const std::string_view field = item.substr(0, comma);
      item = comma == std::string_view::npos ? std::string_view{} : item.substr(comma + 1);
      const auto eq = field.find('=');
      if (eq == std::string_view::npos) {
        throw fail("field '" + std::string(field) + "' is not key=value");
      }
      const std::string key(field.substr(0, eq));
      const std::string value(field.substr(eq + 1));
      if (key == "rank") {
        spec.rank = std::atoi(value.c_str());
        has_rank = true;
      } else if (key == "seq") {
        spec.sequence = std::strtoull(value.c_str(), nullptr, 10);
        has_seq = true;
      } else if (key == "op") {
        bool found = false;
        for (int k = 0; k <= static_cast<int>(op_kind::split); ++k) {
          if (to_string(static_cast<op_kind>(k)) == value) {
            spec.op = static_cast<op_kind>(k);
            found = true;
          }
        }
        if (!found) {
          throw fail("unknown op '" + value + "'");
        }
        has_op = true;
      } else if (key == "action") {
        if (value == "kill") {
          spec.action = fault_action::kill;
        } else if (value == "throw") {
          spec.action = fault_action::throw_error;
        } else if (value == "hang") {
          spec.action = fault_action::hang;
        } else if (value == "wrong_count") {
          spec.action = fault_action::wrong_count;
        } else {
          throw fail("unknown action '" + value + "' (kill | throw | hang | wrong_count)");
        }
        has_action = true;
      } else {
        throw fail("unknown field '" + key + "' (rank, op, seq, action)");
      }
    }
    if (!(has_rank && has_op && has_seq && has_action)) {
      throw fail("each fault needs rank, op, seq and action");
    }
    out.push_back(spec);
  }
  return out;
}

class fault_injector {
 public:
  // The process-wide injector; reads STRATA_COMM_FAULT on first use.
  static fault_injector& global() {
    static fault_injector instance = [] {
      fault_injector f;
      if (const char* env = std::getenv("STRATA_COMM_FAULT"); env != nullptr && *env != '\0') {
        for (const auto& spec : parse_fault_specs(env)) {
          f.add(spec);
        }
      }
      return f;
    }();
    return instance;
  }

  fault_injector() = default;
  fault_injector(fault_injector&& other) noexcept
      : specs_(std::move(other.specs_)), armed_(!specs_.empty()) {}

  void add(const fault_spec& spec) {
    const std::lock_guard lock(mutex_);
    specs_.push_back(spec);
    armed_.store(true, std::memory_order_release);
  }

  void clear() {
    const std::lock_guard lock(mutex_);
    specs_.clear();
    armed_.store(false, std::memory_order_release);
  }

  // The fault planned for this (rank, op, sequence), if any. Cheap when none is planned.
  std::optional<fault_action> at(int rank, op_kind op, std::uint64_t sequence) const {
    if (!armed_.load(std::memory_order_acquire)) {
      return std::nullopt;
    }
    const std::lock_guard lock(mutex_);
    for (const auto& s : specs_) {
      if (s.rank == rank && s.op == op && s.sequence == sequence) {
        return s.action;
      }
    }
    return std::nullopt;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<fault_spec> specs_;
  std::atomic<bool> armed_{false};
};

// RAII: plans faults for one scope (tests).
class scoped_faults {
 public:
  explicit scoped_faults(std::initializer_list<fault_spec> specs) {
    for (const auto& s : specs) {
      fault_injector::global().add(s);
    }
  }
  ~scoped_faults() { fault_injector::global().clear(); }
  scoped_faults(const scoped_faults&) = delete;
  scoped_faults& operator=(const scoped_faults&) = delete;
};

}  // namespace strata::comm
