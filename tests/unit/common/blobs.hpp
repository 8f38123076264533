// SPDX-License-Identifier: Apache-2.0
#pragma once

// The small classification task the trainer tests share: four Gaussian blobs in 8 dimensions,
// one per class (class c is centred at 2 on dimensions c and c + 4), sample i fixed by (salt, i),
// and a small MLP with dropout that learns it in a few epochs.

#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/data/concepts.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"

namespace strata::test {

struct blobs {
  using dataset_category = data::dataset_tag;
  std::size_t n = 512;
  std::uint64_t salt = 0;
  std::size_t size() const { return n; }
  sample_shape shape() const { return {.channels = 1, .height = 1, .width = 8}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const auto label = static_cast<std::int32_t>(i % 4);
    rng_stream rng = rng_stream::for_sample(99 + salt, 0, i);
    for (std::size_t e = 0; e < 8; ++e) {
      const float centre = (e % 4 == static_cast<std::size_t>(label)) ? 2.0f : 0.0f;
      out[e] = centre + 0.7f * rng.normal_float();
    }
    return label;
  }
};

// 8 -> 32 (ReLU, dropout 0.1) -> 4.
inline auto blobs_mlp() {
  return model::sequential(sample_shape{.channels = 1, .height = 1, .width = 8},
                           model::linear{.in = 8, .out = 32}, model::relu{},
                           model::dropout{.rate = 0.1}, model::linear{.in = 32, .out = 4});
}

}  // namespace strata::test
