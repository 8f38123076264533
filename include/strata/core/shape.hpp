// SPDX-License-Identifier: Apache-2.0
#pragma once

// sample_shape: the shape of one sample's tensor, shared by the data family (what a dataset
// gives and a transform makes) and the model family (what a layer takes and gives).

#include <cstddef>
#include <string>

namespace strata {

// channels x height x width, row-major; a feature vector is 1 x 1 x n. A batch of b samples is
// b x elements() values, sample-major.
struct sample_shape {
  std::size_t channels = 1;
  std::size_t height = 1;
  std::size_t width = 1;

  constexpr std::size_t elements() const noexcept { return channels * height * width; }
  constexpr std::size_t plane() const noexcept { return height * width; }
  friend constexpr bool operator==(const sample_shape&, const sample_shape&) = default;
};

inline std::string to_string(const sample_shape& s) {
  return std::to_string(s.channels) + "x" + std::to_string(s.height) + "x" +
         std::to_string(s.width);
}

}  // namespace strata
