// SPDX-License-Identifier: Apache-2.0
// The loader on a GPU: batches staged in pinned memory and copied to the device on a side
// stream arrive on the device equal to the host loader's batches, in order, every epoch.
#include "strata/data/device_prefetcher.cuh"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/core/cuda.cuh"
#include "strata/data/prefetch_loader.hpp"

namespace {

struct ramp {
  using dataset_category = strata::data::dataset_tag;
  std::size_t n = 0;
  std::size_t size() const { return n; }
  strata::data::sample_shape shape() const { return {.channels = 1, .height = 4, .width = 4}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    for (std::size_t e = 0; e < out.size(); ++e) {
      out[e] = static_cast<float>(i * 100 + e);
    }
    return static_cast<std::int32_t>(i % 7);
  }
};

// Adds the sample's own random offset, so the check covers the transform context too.
struct jitter {
  using transform_category = strata::data::transform_tag;
  strata::data::sample_shape output_shape(const strata::data::sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const strata::data::sample_shape&, std::span<float> out,
             const strata::data::transform_context& context) const {
    strata::rng_stream rng = context.rng();
    const float offset = rng.uniform(0.0f, 1.0f);
    for (std::size_t e = 0; e < in.size(); ++e) {
      out[e] = in[e] + offset;
    }
  }
};

}  // namespace

TEST_CASE("device batches equal the host loader's batches") {
  const ramp data{.n = 333};
  const strata::data::loader_config config{.batch_size = 32, .workers = 2, .seed = 3};
  strata::data::prefetch_loader<ramp, jitter> reference(
      data, jitter{}, strata::data::distributed_sampler({.dataset_size = 333, .seed = 9}), config);
  strata::data::prefetch_loader<ramp, jitter, strata::cuda_pinned> staged(
      data, jitter{}, strata::data::distributed_sampler({.dataset_size = 333, .seed = 9}), config);
  strata::cuda_stream compute(0);
  strata::data::device_prefetcher gpu(staged, {.device = 0, .compute_stream = compute.get()});

  for (std::uint32_t epoch = 0; epoch < 2; ++epoch) {
    reference.start_epoch(epoch);
    gpu.start_epoch(epoch);
    std::size_t batches = 0;
    while (auto expected = reference.next()) {
      auto got = gpu.next();
      REQUIRE(got);
      CHECK(got->step == expected->step);
      CHECK(got->size == expected->size);
      std::vector<float> inputs(got->size * got->shape.elements());
      std::vector<std::int32_t> labels(got->size);
      strata::cuda_check(cudaMemcpyAsync(inputs.data(), got->inputs, inputs.size() * sizeof(float),
                                         cudaMemcpyDeviceToHost, compute.get()),
                         "cudaMemcpyAsync");
      strata::cuda_check(
          cudaMemcpyAsync(labels.data(), got->labels, labels.size() * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, compute.get()),
          "cudaMemcpyAsync");
      compute.synchronize();
      CHECK(inputs == std::vector<float>(expected->inputs.begin(), expected->inputs.end()));
      CHECK(labels == std::vector<std::int32_t>(expected->labels.begin(), expected->labels.end()));
      CHECK(std::vector<std::size_t>(got->indices.begin(), got->indices.end()) ==
            std::vector<std::size_t>(expected->indices.begin(), expected->indices.end()));
      ++batches;
    }
    CHECK_FALSE(gpu.next());
    CHECK(batches == 11);
  }
}
