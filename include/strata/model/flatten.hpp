// SPDX-License-Identifier: Apache-2.0
#pragma once

// flatten: channels x height x width -> 1 x 1 x (channels * height * width). The memory layout
// of a sample does not change, so forward and backward are copies.

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

struct flatten {
  using layer_category = layer_tag;

  sample_shape output_shape(const sample_shape& in) const {
    if (in.channels == 0 || in.height == 0 || in.width == 0) {
      throw std::invalid_argument(
          "flatten: input shape must have channels, height and width of at least 1, got " +
          to_string(in));
    }
    return sample_shape{.channels = 1, .height = 1, .width = in.elements()};
  }

  // No arithmetic; the output is a copy of the input.
  layer_cost cost(const sample_shape& in) const {
    return {.forward_flops = 0.0,
            .backward_flops = 0.0,
            .activation_bytes = in.elements() * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    assert(args.input.size() == args.batch * args.in_shape.elements() &&
           args.output.size() == args.input.size() &&
           "flatten: input and output must hold batch x elements floats");
    std::copy(args.input.begin(), args.input.end(), args.output.begin());
  }

  void backward(const backward_args& args) const {
    assert(args.grad_output.size() == args.batch * args.in_shape.elements() &&
           (args.grad_input.empty() || args.grad_input.size() == args.grad_output.size()) &&
           "flatten: grad_output and grad_input must hold batch x elements floats");
    if (args.grad_input.empty()) {
      return;
    }
    std::copy(args.grad_output.begin(), args.grad_output.end(), args.grad_input.begin());
  }

  friend bool operator==(const flatten&, const flatten&) = default;
};

inline std::string to_string(const flatten&) {
  return "flatten{}";
}

static_assert(check_layer<flatten>());

}  // namespace strata::model
