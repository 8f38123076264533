// SPDX-License-Identifier: Apache-2.0
#pragma once

// Fingerprints of collective calls. Before a collective moves data, ranks can agree that they
// are all making the same call: each hashes (sequence, op, dtype, count, root, reduction), the
// ranks take the min and the max of the hash in one fixed-size all-reduce, and when they differ
// every rank gathers the signatures and reports a per-rank diff (comm_error, kind mismatch).
// Backends implement the two exchanges with their own primitives; this header is the common part.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"

namespace strata::comm {

// What a rank is about to do. Fixed size and trivially copyable, so it can be exchanged as bytes.
struct op_signature {
  std::uint64_t sequence = 0;  // collectives issued on this communicator before this one
  std::uint64_t count = 0;     // elements (per rank for all_gather / reduce_scatter / all_to_all)
  std::int32_t root = -1;      // broadcast / reduce root; -1 when none
  op_kind op = op_kind::barrier;
  dtype type = dtype::uint8;
  reduce_op reduction = reduce_op::sum;  // only meaningful for reducing ops
  std::uint8_t reduces = 0;              // 1 when `reduction` is part of the call

  bool operator==(const op_signature&) const = default;
};

namespace detail {

constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace detail

// The hash the ranks compare.
constexpr std::uint64_t fingerprint(const op_signature& s) noexcept {
  std::uint64_t h = detail::mix64(s.sequence);
  h = detail::mix64(h ^ s.count);
  h = detail::mix64(h ^ static_cast<std::uint64_t>(static_cast<std::uint32_t>(s.root)));
  h = detail::mix64(h ^ (static_cast<std::uint64_t>(s.op) << 8) ^
                    (static_cast<std::uint64_t>(s.type) << 16) ^
                    (s.reduces != 0 ? (static_cast<std::uint64_t>(s.reduction) << 24) | 1u : 0u));
  return h;
}

// The words of the fixed-size check: all-reduce them with max; the hashes agree exactly when
// result[0] == ~result[1] (max of h equals min of h).
struct fingerprint_words {
  std::uint64_t max_hash;
  std::uint64_t max_not_hash;  // ~h, so that max(~h) = ~min(h)
};

constexpr fingerprint_words fingerprint_check_words(const op_signature& s) noexcept {
  const std::uint64_t h = fingerprint(s);
  return {h, ~h};
}

constexpr bool fingerprints_agree(const fingerprint_words& reduced_max) noexcept {
  return reduced_max.max_hash == ~reduced_max.max_not_hash;
}

inline std::string to_string(const op_signature& s) {
  std::string out = std::string(to_string(s.op)) + " #" + std::to_string(s.sequence) + " " +
                    std::string(strata::to_string(s.type)) + " x " + std::to_string(s.count);
  if (s.root >= 0) {
    out += " root " + std::to_string(s.root);
  }
  if (s.reduces != 0) {
    out += " op " + std::string(to_string(s.reduction));
  }
  return out;
}

// "rank 0: all_reduce #3 float32 x 1000 op sum; rank 1: all_reduce #3 float32 x 1001 op sum
// (count differs)". `per_rank[r]` is rank r's signature.
inline std::string describe_mismatch(std::span<const op_signature> per_rank) {
  std::string out;
  const op_signature* first = per_rank.empty() ? nullptr : &per_rank[0];
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    const auto& s = per_rank[r];
    if (r != 0) {
      out += "; ";
    }
    out += "rank " + std::to_string(r) + ": " + to_string(s);
    if (r != 0 && first != nullptr && !(s == *first)) {
      std::string what;
      const auto add = [&what](const char* field) {
        what += what.empty() ? field : std::string(", ") + field;
      };
      if (s.op != first->op) {
        add("op");
      }
      if (s.sequence != first->sequence) {
        add("sequence");
      }
      if (s.type != first->type) {
        add("dtype");
      }
      if (s.count != first->count) {
        add("count");
      }
      if (s.root != first->root) {
        add("root");
      }
      if (s.reduces != first->reduces || s.reduction != first->reduction) {
        add("reduction");
      }
      out += " (" + what + " differs from rank 0)";
    }
  }
  return out;
}

}  // namespace strata::comm
