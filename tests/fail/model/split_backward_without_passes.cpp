// expect-error: model: a layer with splits_backward = true needs 'void backward_input\(const
// strata::model::backward_args&\) const' SPDX-License-Identifier: Apache-2.0 A user's layer that
// says its backward splits but has no separate passes: the layer check names requirement 9.
#include "strata/model/concepts.hpp"

struct scale {
  using layer_category = strata::model::layer_tag;
  static constexpr bool splits_backward = true;
  strata::sample_shape output_shape(const strata::sample_shape& in) const { return in; }
  void forward(const strata::model::forward_args&) const {}
  void backward(const strata::model::backward_args&) const {}
};

static_assert(strata::model::check_layer<scale>());

int main() {}
