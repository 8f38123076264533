// SPDX-License-Identifier: Apache-2.0
// A user's own dataset and transform, as docs/data.md shows them, run through the loader.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/data/concepts.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/transforms.hpp"

namespace {

// snippet-begin: dataset
// Points on two interleaved spirals; the label says which spiral.
struct spirals {
  using dataset_category = strata::data::dataset_tag;

  std::size_t points = 1000;

  std::size_t size() const { return points; }
  strata::data::sample_shape shape() const { return {.channels = 1, .height = 1, .width = 2}; }

  // Called from several loader threads at once: const, no shared mutable state.
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const auto label = static_cast<std::int32_t>(i % 2);
    const float t = 0.01f * static_cast<float>(i / 2);
    const float angle = t * 6.0f + (label == 1 ? 3.14159265f : 0.0f);
    out[0] = t * std::cos(angle);
    out[1] = t * std::sin(angle);
    return label;
  }
};
static_assert(strata::data::check_dataset<spirals>());
// snippet-end: dataset

// snippet-begin: transform
// Moves a sample by a random offset in [-radius, radius] along each coordinate.
struct jitter {
  using transform_category = strata::data::transform_tag;

  float radius = 0.05f;

  strata::data::sample_shape output_shape(const strata::data::sample_shape& in) const {
    return in;  // same shape out
  }

  void apply(std::span<const float> in, const strata::data::sample_shape&, std::span<float> out,
             const strata::data::transform_context& context) const {
    strata::rng_stream rng = context.rng();  // keyed by (seed, epoch, sample index)
    for (std::size_t e = 0; e < in.size(); ++e) {
      out[e] = in[e] + rng.uniform(-radius, radius);
    }
  }
};
static_assert(strata::data::check_transform<jitter>());
// snippet-end: transform

std::vector<float> one_epoch(std::size_t workers) {
  // snippet-begin: loader
  const spirals data{.points = 1000};
  strata::data::distributed_sampler sampler(
      {.dataset_size = data.size(), .ranks = 1, .rank = 0, .seed = 42});
  strata::data::prefetch_loader loader(
      data, strata::data::compose{jitter{.radius = 0.02f}, strata::data::normalize{}},
      std::move(sampler), {.batch_size = 100, .workers = workers, .prefetch_depth = 4, .seed = 42});

  std::vector<float> seen;
  loader.start_epoch(0);
  while (auto batch = loader.next()) {
    // batch->inputs: batch->size x 2 floats; batch->labels: batch->size labels
    seen.insert(seen.end(), batch->inputs.begin(), batch->inputs.end());
  }
  // loader.stats().wait_seconds: how long this epoch's steps waited for data
  // snippet-end: loader
  return seen;
}

}  // namespace

TEST_CASE("a user's dataset and transform run in the loader, the same with any worker count") {
  const std::vector<float> sync = one_epoch(0);
  CHECK(sync.size() == 2000);
  CHECK(one_epoch(1) == sync);
  CHECK(one_epoch(3) == sync);
}
