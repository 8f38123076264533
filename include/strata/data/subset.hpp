// SPDX-License-Identifier: Apache-2.0
#pragma once

// subset: the first `count` samples of a dataset, as a dataset (a view; the dataset must outlive
// it).

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "strata/data/concepts.hpp"

namespace strata::data {

template <class Dataset>
class subset {
  static_assert(check_dataset<Dataset>());

 public:
  using dataset_category = dataset_tag;

  // count 0 or beyond the dataset's size means all of it.
  subset(const Dataset& data, std::size_t count) : data_(&data) {
    const std::size_t n = dataset_traits<Dataset>::size(data);
    count_ = count == 0 || count > n ? n : count;
  }

  std::size_t size() const noexcept { return count_; }
  sample_shape shape() const { return dataset_traits<Dataset>::shape(*data_); }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    if (i >= count_) {
      throw std::out_of_range("subset: sample " + std::to_string(i) + " of " +
                              std::to_string(count_));
    }
    return dataset_traits<Dataset>::read(*data_, i, out);
  }
  const Dataset& base() const noexcept { return *data_; }

 private:
  const Dataset* data_;
  std::size_t count_ = 0;
};

}  // namespace strata::data
