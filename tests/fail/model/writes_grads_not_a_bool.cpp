// expect-error: model: a layer's writes_grads must be 'static constexpr bool writes_grads = true;'
// SPDX-License-Identifier: Apache-2.0
// A user's layer that declares requirement 8 as a function: read as a pointer it would say
// "true" and let the layer add into gradients nobody zeroed, so the containers refuse it by name.
#include <cstddef>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"

struct scale_by_two {
  using layer_category = strata::model::layer_tag;
  static constexpr bool writes_grads() { return true; }
  strata::sample_shape output_shape(const strata::sample_shape& in) const { return in; }
  void forward(const strata::model::forward_args& a) const {
    for (std::size_t i = 0; i < a.output.size(); ++i) {
      a.output[i] = 2.0f * a.input[i];
    }
  }
  void backward(const strata::model::backward_args& a) const {
    for (std::size_t i = 0; i < a.grad_input.size(); ++i) {
      a.grad_input[i] = 2.0f * a.grad_output[i];
    }
  }
};

int main() {
  const auto model =
      strata::model::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 4},
                                scale_by_two{}, strata::model::linear{.in = 4, .out = 2});
  auto params = model.make_params();
  auto work = model.make_workspace(1);
  const float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  const float g[2] = {1.0f, 1.0f};
  (void)model.forward(work, params, x, 1, {});
  model.backward(work, params, g);
}
