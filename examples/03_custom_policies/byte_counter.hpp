// SPDX-License-Identifier: Apache-2.0
#pragma once

// A comm wrapper written outside the library: counts the bytes each kind of operation hands to
// any backend, over the communicator and every one split from it (the copies share the counts).
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "strata/comm/observed.hpp"

// snippet-begin: byte-counter
struct byte_counts {
  std::array<std::uint64_t, 10> bytes{};  // by strata::comm::op_kind
  std::array<std::uint64_t, 10> calls{};
  std::uint64_t of(strata::comm::op_kind op) const { return bytes[static_cast<std::size_t>(op)]; }
  std::uint64_t total() const {
    std::uint64_t sum = 0;
    for (const std::uint64_t b : bytes) {
      sum += b;
    }
    return sum;
  }
};

struct count_bytes {
  std::shared_ptr<byte_counts> counts = std::make_shared<byte_counts>();
  void operator()(const strata::comm::op_event& e) {
    counts->bytes[static_cast<std::size_t>(e.op)] += e.bytes;
    counts->calls[static_cast<std::size_t>(e.op)] += 1;
  }
};

template <class Backend>
using counting = strata::comm::observed<Backend, count_bytes>;
// snippet-end: byte-counter
