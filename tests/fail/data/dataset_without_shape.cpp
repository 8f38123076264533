// expect-error: data: a dataset needs 'shape\(\)' returning strata::data::sample_shape
// SPDX-License-Identifier: Apache-2.0
// A dataset that forgot shape(), handed to the loader.
#include <cstdint>
#include <span>

#include "strata/data/prefetch_loader.hpp"

struct shapeless {
  using dataset_category = strata::data::dataset_tag;
  std::size_t size() const { return 1; }
  std::int32_t read(std::size_t, std::span<float>) const { return 0; }
};

void use(const shapeless& data) {
  strata::data::prefetch_loader loader(data, strata::data::no_transform{},
                                       strata::data::distributed_sampler({.dataset_size = 1}),
                                       {.batch_size = 1});
}
