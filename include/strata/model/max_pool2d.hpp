// SPDX-License-Identifier: Apache-2.0
#pragma once

// max_pool2d: the maximum over kernel x kernel windows of each channel, moved by stride, without
// padding (windows that would cross the bottom or right edge are dropped).
//
// Saved state: per output element, the position of its maximum within its window,
// ky * kernel + kx, stored as a float (exact: kernel is at most 4096, so the position is below
// 2^24). backward adds each output gradient to that input element; overlapping windows
// (stride < kernel) may add several into one.
//
// Ties go to the first maximum in row-major window order. A NaN wins over numbers (the first NaN
// of the window), so NaN propagates as it does in the usual frameworks.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

namespace detail {

[[noreturn]] inline void max_pool2d_throw(const std::string& message) {
  throw std::invalid_argument("max_pool2d: " + message);
}

inline void max_pool2d_check_span(const char* name, std::size_t have, std::size_t need) {
  if (have != need) {
    max_pool2d_throw(std::string(name) + " must hold " + std::to_string(need) + " floats, got " +
                     std::to_string(have));
  }
}

}  // namespace detail

struct max_pool2d {
  using layer_category = layer_tag;

  static constexpr std::size_t max_kernel = 4096;

  std::size_t kernel = 2;  // square window side; in [1, max_kernel]
  std::size_t stride = 2;  // at least 1

  // Out: channels x ((H - kernel) / stride + 1) x ((W - kernel) / stride + 1).
  sample_shape output_shape(const sample_shape& in) const {
    if (kernel == 0 || kernel > max_kernel) {
      detail::max_pool2d_throw("kernel must be in [1, " + std::to_string(max_kernel) + "], got " +
                               std::to_string(kernel));
    }
    if (stride == 0) {
      detail::max_pool2d_throw("stride must be at least 1, got 0");
    }
    if (in.channels == 0) {
      detail::max_pool2d_throw("input " + to_string(in) + " has no channels");
    }
    if (in.height < kernel || in.width < kernel) {
      detail::max_pool2d_throw("input " + to_string(in) + " is smaller than kernel " +
                               std::to_string(kernel));
    }
    return {.channels = in.channels,
            .height = (in.height - kernel) / stride + 1,
            .width = (in.width - kernel) / stride + 1};
  }

  // One float per output element: the argmax position in its window.
  std::size_t workspace_elements(const sample_shape& in, std::size_t batch) const {
    return output_shape(in).elements() * batch;
  }

  // Per sample: forward kernel^2 comparisons per output, backward one add per output; the saved
  // state is as large as the output.
  layer_cost cost(const sample_shape& in) const {
    const sample_shape out = output_shape(in);
    return {.forward_flops = static_cast<double>(out.elements() * kernel * kernel),
            .backward_flops = static_cast<double>(out.elements()),
            .activation_bytes = 2 * out.elements() * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    const sample_shape out = checked_out_shape(args.in_shape, args.out_shape);
    const sample_shape& in = args.in_shape;
    const std::size_t total_out = args.batch * out.elements();
    detail::max_pool2d_check_span("input", args.input.size(), args.batch * in.elements());
    detail::max_pool2d_check_span("output", args.output.size(), total_out);
    detail::max_pool2d_check_span("workspace", args.workspace.size(), total_out);

    const std::size_t planes = args.batch * in.channels;
    for (std::size_t p = 0; p < planes; ++p) {
      const float* plane = args.input.data() + p * in.plane();
      float* y = args.output.data() + p * out.plane();
      float* where = args.workspace.data() + p * out.plane();
      for (std::size_t oy = 0; oy < out.height; ++oy) {
        for (std::size_t ox = 0; ox < out.width; ++ox) {
          const float* corner = plane + oy * stride * in.width + ox * stride;
          float best = corner[0];
          std::size_t best_at = 0;
          for (std::size_t ky = 0; ky < kernel; ++ky) {
            const float* row = corner + ky * in.width;
            for (std::size_t kx = 0; kx < kernel; ++kx) {
              const float v = row[kx];
              if (v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                best_at = ky * kernel + kx;
              }
            }
          }
          y[oy * out.width + ox] = best;
          where[oy * out.width + ox] = static_cast<float>(best_at);
        }
      }
    }
  }

  void backward(const backward_args& args) const {
    if (args.grad_input.empty()) {
      return;
    }
    const sample_shape out = checked_out_shape(args.in_shape, args.out_shape);
    const sample_shape& in = args.in_shape;
    const std::size_t total_out = args.batch * out.elements();
    detail::max_pool2d_check_span("grad_output", args.grad_output.size(), total_out);
    detail::max_pool2d_check_span("grad_input", args.grad_input.size(), args.batch * in.elements());
    detail::max_pool2d_check_span("workspace", args.workspace.size(), total_out);

    std::fill(args.grad_input.begin(), args.grad_input.end(), 0.0f);
    const std::size_t planes = args.batch * in.channels;
    for (std::size_t p = 0; p < planes; ++p) {
      float* dx = args.grad_input.data() + p * in.plane();
      const float* dy = args.grad_output.data() + p * out.plane();
      const float* where = args.workspace.data() + p * out.plane();
      for (std::size_t oy = 0; oy < out.height; ++oy) {
        for (std::size_t ox = 0; ox < out.width; ++ox) {
          const std::size_t o = oy * out.width + ox;
          if (!(where[o] >= 0.0f && where[o] < static_cast<float>(kernel * kernel))) {
            detail::max_pool2d_throw("workspace does not hold window positions from forward");
          }
          const auto at = static_cast<std::size_t>(where[o]);
          const std::size_t iy = oy * stride + at / kernel;
          const std::size_t ix = ox * stride + at % kernel;
          dx[iy * in.width + ix] += dy[o];
        }
      }
    }
  }

  friend bool operator==(const max_pool2d&, const max_pool2d&) = default;

 private:
  sample_shape checked_out_shape(const sample_shape& in, const sample_shape& out) const {
    const sample_shape expected = output_shape(in);
    if (out != expected) {
      detail::max_pool2d_throw("out_shape " + to_string(out) + " does not match " +
                               to_string(expected) + " for input " + to_string(in));
    }
    return expected;
  }
};

inline std::string to_string(const max_pool2d& l) {
  return "max_pool2d{.kernel = " + std::to_string(l.kernel) +
         ", .stride = " + std::to_string(l.stride) + "}";
}

static_assert(check_layer<max_pool2d>());

}  // namespace strata::model
