// SPDX-License-Identifier: Apache-2.0
#pragma once

// The tensor-parallel tests' task and model: the blobs task (blobs.hpp's four classes) as 4 x 4
// images, and a small vision transformer whose attention heads and MLP split over a
// tensor-parallel group.

#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/data/concepts.hpp"
#include "strata/model/attention.hpp"
#include "strata/model/layer_norm.hpp"
#include "strata/model/linear.hpp"
#include "strata/model/patch_embedding.hpp"
#include "strata/model/residual.hpp"
#include "strata/model/sequential.hpp"
#include "strata/model/token_mean.hpp"
#include "strata/parallel/tensor.hpp"

namespace strata::test {

// 16 values per sample, class c centred at 2 on elements c, c + 4, c + 8 and c + 12.
struct blob_images {
  using dataset_category = data::dataset_tag;
  std::size_t n = 512;
  std::uint64_t salt = 0;
  std::size_t size() const { return n; }
  sample_shape shape() const { return {.channels = 1, .height = 4, .width = 4}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const auto label = static_cast<std::int32_t>(i % 4);
    rng_stream rng = rng_stream::for_sample(77 + salt, 0, i);
    for (std::size_t e = 0; e < 16; ++e) {
      const float centre = (e % 4 == static_cast<std::size_t>(label)) ? 2.0f : 0.0f;
      out[e] = centre + 0.7f * rng.normal_float();
    }
    return label;
  }
};

// 2 x 2 patches: 4 tokens of 16 features; attention (4 heads), a parallel MLP (32 hidden),
// attention again, each behind a layer norm with a residual connection; the tokens' mean
// classified into 4.
inline auto image_vit() {
  constexpr std::size_t d = 16;
  return model::sequential(sample_shape{.channels = 1, .height = 4, .width = 4},
                           model::patch_embedding{.patch = 2, .dim = d},
                           model::residual{model::layer_norm{.features = d},
                                           model::self_attention{.dim = d, .heads = 4}},
                           model::residual{model::layer_norm{.features = d},
                                           parallel::parallel_mlp{.dim = d, .hidden = 32}},
                           model::residual{model::layer_norm{.features = d},
                                           model::self_attention{.dim = d, .heads = 4}},
                           model::layer_norm{.features = d}, model::token_mean{},
                           model::linear{.in = d, .out = 4});
}

}  // namespace strata::test
