// SPDX-License-Identifier: Apache-2.0
#pragma once

// Inputs and serial reference results shared by the collective tests (the conformance suite,
// the point-to-point algorithms, NCCL): small integers, exact in every dtype and every reduction
// of up to 8 ranks, negative ones too for the signed and floating types so that min and max see
// signs, and {1, 2} for prod so that products stay exact.

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "strata/comm/reduce.hpp"
#include "strata/core/dtype.hpp"

namespace strata::conformance {

// Rank `rank`'s element i; `salt` gives independent inputs to the calls of one test.
template <class T>
T value(int rank, std::size_t i, comm::reduce_op op, int salt = 0) {
  const auto r = static_cast<std::size_t>(rank);
  const auto s = static_cast<std::size_t>(salt);
  int k = 0;
  if (op == comm::reduce_op::prod) {
    k = 1 + static_cast<int>((r + i + s) % 2);
  } else {
    k = 1 + static_cast<int>((r * 3 + i * 5 + s) % 7);
    if constexpr (!std::is_same_v<T, std::uint8_t>) {
      k -= 3;
    }
  }
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(k));
  } else {
    return static_cast<T>(k);
  }
}

// value(r, i, op, salt) reduced over ranks 0..n-1 in rank order, as every backend must return
// it (16-bit floats accumulated in float, avg divided once). n <= 64.
template <class T>
T expected(int n, std::size_t i, comm::reduce_op op, int salt = 0) {
  std::array<T, 64> inputs{};
  std::array<const T*, 64> pointers{};
  const auto count = static_cast<std::size_t>(n);
  for (std::size_t r = 0; r < count; ++r) {
    inputs[r] = value<T>(static_cast<int>(r), i, op, salt);
    pointers[r] = &inputs[r];
  }
  T out{};
  comm::reduce_many(&out, pointers.data(), count, 1, op);
  return out;
}

// expected() for every i at once: the inputs repeat with period 14 in i, so one table serves.
template <class T>
class reference {
 public:
  reference(int n, comm::reduce_op op, int salt = 0) {
    for (std::size_t j = 0; j < table_.size(); ++j) {
      table_[j] = expected<T>(n, j, op, salt);
    }
  }
  T operator()(std::size_t i) const noexcept { return table_[i % table_.size()]; }

 private:
  std::array<T, 14> table_{};
};

}  // namespace strata::conformance
