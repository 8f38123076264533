// SPDX-License-Identifier: Apache-2.0
#pragma once

// Vocabulary of the comm family: reduction operators, operation kinds, the per-communicator
// configuration (deadline, fingerprint checks, history length).

#include <cstdint>
#include <string>
#include <string_view>

namespace strata::comm {

enum class reduce_op : std::uint8_t { sum, avg, min, max, prod };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::avg:
      return "avg";
    case reduce_op::min:
      return "min";
    case reduce_op::max:
      return "max";
    case reduce_op::prod:
      return "prod";
  }
  return "unknown";
}

// Every operation a communicator performs; the names are those of the member functions.
enum class op_kind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all,
  send,
  recv,
  barrier,
  split,
};

constexpr std::string_view to_string(op_kind op) noexcept {
  switch (op) {
    case op_kind::all_reduce:
      return "all_reduce";
    case op_kind::reduce_scatter:
      return "reduce_scatter";
    case op_kind::all_gather:
      return "all_gather";
    case op_kind::broadcast:
      return "broadcast";
    case op_kind::reduce:
      return "reduce";
    case op_kind::all_to_all:
      return "all_to_all";
    case op_kind::send:
      return "send";
    case op_kind::recv:
      return "recv";
    case op_kind::barrier:
      return "barrier";
    case op_kind::split:
      return "split";
  }
  return "unknown";
}

// Whether ranks compare a fingerprint of each collective before running it.
//   always   every collective: a mismatch is a comm_error (mismatch) on every rank before data
//            moves. The default: on the MPI backend it costs one 16-byte all-reduce per call,
//            overlapped with the calls before it (about 1-2 us at 2 ranks, docs/reliability.md).
//   sampled  the first `sample_first` collectives, then every `sample_every`-th. A mismatch in
//            an unchecked call reaches the backend: where MPI notices it (counts) the job ends
//            with the error, where it cannot (same size, other op) results are wrong.
//   off      no check.
// The threads backend compares signatures on every call whatever the mode.
enum class fingerprint_mode : std::uint8_t {
  always,
  sampled,
  off,
};

struct comm_config {
  // Seconds any wait may take; past it the wait becomes a comm_error (timeout) on this rank and
  // the communicator is aborted so that every other rank fails too.
  double timeout = 300.0;
  fingerprint_mode fingerprint = fingerprint_mode::always;
  std::uint64_t sample_first = 64;
  std::uint64_t sample_every = 256;
  // Collectives remembered per rank and printed with any comm error.
  std::uint32_t history_length = 16;

  bool operator==(const comm_config&) const = default;
};

inline std::string to_string(const comm_config& c) {
  const char* mode = c.fingerprint == fingerprint_mode::always    ? "always"
                     : c.fingerprint == fingerprint_mode::sampled ? "sampled"
                                                                  : "off";
  return "comm_config{.timeout = " + std::to_string(c.timeout) + ", .fingerprint = " + mode +
         ", .sample_first = " + std::to_string(c.sample_first) +
         ", .sample_every = " + std::to_string(c.sample_every) +
         ", .history_length = " + std::to_string(c.history_length) + "}";
}

// Whether collective number `sequence` (0-based) is fingerprinted under `c`.
constexpr bool should_fingerprint(const comm_config& c, std::uint64_t sequence) noexcept {
  switch (c.fingerprint) {
    case fingerprint_mode::always:
      return true;
    case fingerprint_mode::off:
      return false;
    case fingerprint_mode::sampled:
      return sequence < c.sample_first ||
             (c.sample_every != 0 && (sequence - c.sample_first) % c.sample_every == 0);
  }
  return true;
}

}  // namespace strata::comm
