// expect-error: data: a transform declares 'using transform_category
// SPDX-License-Identifier: Apache-2.0
// A transform with the right members but no opt-in tag, inside a compose.
#include <span>

#include "strata/data/transforms.hpp"

struct untagged {
  strata::data::sample_shape output_shape(const strata::data::sample_shape& in) const { return in; }
  void apply(std::span<const float>, const strata::data::sample_shape&, std::span<float>,
             const strata::data::transform_context&) const {}
};

static_assert(strata::data::check_transform<untagged>());
