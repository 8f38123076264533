// SPDX-License-Identifier: Apache-2.0
#pragma once

// token_mean: the mean of a sample's rows (a transformer's tokens), its classifier input.
//
//   strata::model::token_mean{}   // 1 x 16 x 64 -> 1 x 1 x 64
//
// An input of channels x height x width gives 1 x 1 x width: element j is the mean over the
// channels x height rows of column j. No parameters, no saved state.

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

struct token_mean {
  using layer_category = layer_tag;

  sample_shape output_shape(const sample_shape& in) const {
    return sample_shape{.channels = 1, .height = 1, .width = in.width};
  }

  layer_cost cost(const sample_shape& in) const {
    const auto n = static_cast<double>(in.elements());
    return {.forward_flops = n, .backward_flops = n, .activation_bytes = in.width * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    const std::size_t rows = args.in_shape.channels * args.in_shape.height;
    const std::size_t w = args.in_shape.width;
    check(args.input.size(), args.batch * rows * w, "input");
    check(args.output.size(), args.batch * w, "output");
    const float inv = 1.0f / static_cast<float>(rows);
    for (std::size_t b = 0; b < args.batch; ++b) {
      float* y = args.output.data() + b * w;
      std::fill(y, y + w, 0.0f);
      for (std::size_t r = 0; r < rows; ++r) {
        const float* x = args.input.data() + (b * rows + r) * w;
        for (std::size_t j = 0; j < w; ++j) {
          y[j] += x[j];
        }
      }
      for (std::size_t j = 0; j < w; ++j) {
        y[j] *= inv;
      }
    }
  }

  void backward(const backward_args& args) const {
    if (args.grad_input.empty()) {
      return;
    }
    const std::size_t rows = args.in_shape.channels * args.in_shape.height;
    const std::size_t w = args.in_shape.width;
    check(args.grad_output.size(), args.batch * w, "grad_output");
    check(args.grad_input.size(), args.batch * rows * w, "grad_input");
    const float inv = 1.0f / static_cast<float>(rows);
    for (std::size_t b = 0; b < args.batch; ++b) {
      const float* dy = args.grad_output.data() + b * w;
      for (std::size_t r = 0; r < rows; ++r) {
        float* dx = args.grad_input.data() + (b * rows + r) * w;
        for (std::size_t j = 0; j < w; ++j) {
          dx[j] = dy[j] * inv;
        }
      }
    }
  }

  friend bool operator==(const token_mean&, const token_mean&) = default;

 private:
  static void check(std::size_t got, std::size_t want, const char* what) {
    if (got != want) {
      throw std::invalid_argument(std::string("token_mean: ") + what + " holds " +
                                  std::to_string(got) + " floats, expected " +
                                  std::to_string(want));
    }
  }
};

inline std::string to_string(const token_mean&) {
  return "token_mean{}";
}

static_assert(check_layer<token_mean>());

}  // namespace strata::model
