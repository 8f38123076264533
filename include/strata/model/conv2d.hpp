// SPDX-License-Identifier: Apache-2.0
#pragma once

// conv2d: a 2-D convolution (cross-correlation, as in the usual frameworks) by im2col + GEMM.
//
// Per sample, the input (in_channels x H x W) is unrolled into a columns matrix of
// (in_channels * kernel * kernel) rows by (Ho * Wo) columns, row (c * kernel + ky) * kernel + kx,
// column oy * Wo + ox, holding in[c][oy * stride + ky - padding][ox * stride + kx - padding] (0
// outside the input). Then output = weight * columns (+ bias per output channel), which is
// already the out_channels x Ho x Wo layout of the sample. The products go through
// model::gemm (gemm.hpp: oneDNN, OpenBLAS or Eigen).
//
// Saved state: none (workspace 0). backward recomputes each sample's columns from args.input
// rather than keeping batch x (in_channels * kernel^2) x (Ho * Wo) floats between the passes;
// scratch for one sample is allocated per call. A 1x1 kernel with stride 1 and no padding uses
// the input as its columns directly.

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/gemm.hpp"

namespace strata::model {

namespace detail {

using conv2d_matrix =
    Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
using conv2d_const_matrix =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// The geometry of one conv2d call, all derived from the layer and the input shape.
struct conv2d_geometry {
  std::size_t channels = 0;
  std::size_t height = 0;
  std::size_t width = 0;
  std::size_t kernel = 0;
  std::size_t stride = 0;
  std::size_t padding = 0;
  std::size_t out_height = 0;
  std::size_t out_width = 0;

  std::size_t column_rows() const noexcept { return channels * kernel * kernel; }
  std::size_t column_cols() const noexcept { return out_height * out_width; }

  // The output columns ox whose input column ox * stride + kx - padding lies in [0, width).
  void valid_columns(std::size_t kx, std::size_t& first, std::size_t& last) const noexcept {
    first = 0;
    if (kx < padding) {
      first = (padding - kx + stride - 1) / stride;
    }
    last = 0;
    if (width + padding > kx) {
      last = std::min(out_width, (width - 1 + padding - kx) / stride + 1);
    }
    first = std::min(first, last);
  }
};

// Unrolls one sample x (channels x height x width) into columns (column_rows x column_cols).
inline void conv2d_im2col(const conv2d_geometry& g, const float* x, float* columns) {
  const std::size_t k = g.kernel;
  const std::size_t plane_out = g.column_cols();
  for (std::size_t c = 0; c < g.channels; ++c) {
    const float* plane = x + c * g.height * g.width;
    for (std::size_t ky = 0; ky < k; ++ky) {
      for (std::size_t kx = 0; kx < k; ++kx) {
        float* row = columns + ((c * k + ky) * k + kx) * plane_out;
        std::size_t first = 0;
        std::size_t last = 0;
        g.valid_columns(kx, first, last);
        for (std::size_t oy = 0; oy < g.out_height; ++oy) {
          float* target = row + oy * g.out_width;
          const std::size_t iy = oy * g.stride + ky;  // + padding offset
          if (iy < g.padding || iy - g.padding >= g.height) {
            std::fill(target, target + g.out_width, 0.0f);
            continue;
          }
          const float* source = plane + (iy - g.padding) * g.width;
          std::fill(target, target + first, 0.0f);
          for (std::size_t ox = first; ox < last; ++ox) {
            target[ox] = source[ox * g.stride + kx - g.padding];
          }
          std::fill(target + last, target + g.out_width, 0.0f);
        }
      }
    }
  }
}

// The adjoint of conv2d_im2col: adds columns back into dx (channels x height x width).
inline void conv2d_col2im(const conv2d_geometry& g, const float* columns, float* dx) {
  const std::size_t k = g.kernel;
  const std::size_t plane_out = g.column_cols();
  for (std::size_t c = 0; c < g.channels; ++c) {
    float* plane = dx + c * g.height * g.width;
    for (std::size_t ky = 0; ky < k; ++ky) {
      for (std::size_t kx = 0; kx < k; ++kx) {
        const float* row = columns + ((c * k + ky) * k + kx) * plane_out;
        std::size_t first = 0;
        std::size_t last = 0;
        g.valid_columns(kx, first, last);
        for (std::size_t oy = 0; oy < g.out_height; ++oy) {
          const std::size_t iy = oy * g.stride + ky;
          if (iy < g.padding || iy - g.padding >= g.height) {
            continue;
          }
          const float* source = row + oy * g.out_width;
          float* target = plane + (iy - g.padding) * g.width;
          for (std::size_t ox = first; ox < last; ++ox) {
            target[ox * g.stride + kx - g.padding] += source[ox];
          }
        }
      }
    }
  }
}

[[noreturn]] inline void conv2d_throw(const std::string& message) {
  throw std::invalid_argument("conv2d: " + message);
}

inline void conv2d_check_span(const char* name, std::size_t have, std::size_t need) {
  if (have != need) {
    conv2d_throw(std::string(name) + " must hold " + std::to_string(need) + " floats, got " +
                 std::to_string(have));
  }
}

}  // namespace detail

// A 2-D convolution over channels x height x width samples.
// Parameters: "weight" (out_channels x in_channels * kernel * kernel, row o holding the filter of
// output channel o as in_channels x kernel x kernel), then, with bias, "bias" (1 x out_channels).
struct conv2d {
  using layer_category = layer_tag;

  std::size_t in_channels = 0;   // must equal the input's channels; at least 1
  std::size_t out_channels = 0;  // at least 1
  std::size_t kernel = 3;        // square kernel side; at least 1
  std::size_t stride = 1;        // at least 1
  std::size_t padding = 1;       // zeros on each side of height and width
  bool bias = true;

  // Out: out_channels x ((H + 2 padding - kernel) / stride + 1) x (same for W).
  sample_shape output_shape(const sample_shape& in) const {
    if (in_channels == 0) {
      detail::conv2d_throw("in_channels must be at least 1, got 0");
    }
    if (out_channels == 0) {
      detail::conv2d_throw("out_channels must be at least 1, got 0");
    }
    if (kernel == 0) {
      detail::conv2d_throw("kernel must be at least 1, got 0");
    }
    if (stride == 0) {
      detail::conv2d_throw("stride must be at least 1, got 0");
    }
    if (in.channels != in_channels) {
      detail::conv2d_throw("input " + to_string(in) + " has " + std::to_string(in.channels) +
                           " channels, in_channels is " + std::to_string(in_channels));
    }
    if (in.height == 0 || in.width == 0) {
      detail::conv2d_throw("input " + to_string(in) + " has an empty plane");
    }
    if (in.height + 2 * padding < kernel || in.width + 2 * padding < kernel) {
      detail::conv2d_throw("input " + to_string(in) + " with padding " + std::to_string(padding) +
                           " is smaller than kernel " + std::to_string(kernel));
    }
    return {.channels = out_channels,
            .height = (in.height + 2 * padding - kernel) / stride + 1,
            .width = (in.width + 2 * padding - kernel) / stride + 1};
  }

  std::vector<param_spec> parameters(const sample_shape& in) const {
    output_shape(in);
    const std::size_t fan_in = in_channels * kernel * kernel;
    std::vector<param_spec> specs;
    specs.push_back({.name = "weight",
                     .rows = out_channels,
                     .cols = fan_in,
                     .init = init_kind::kaiming_uniform,
                     .fan_in = fan_in,
                     .fan_out = out_channels * kernel * kernel,
                     .weight_decay = true});
    if (bias) {
      specs.push_back({.name = "bias",
                       .rows = 1,
                       .cols = out_channels,
                       .init = init_kind::uniform_fan_in,
                       .fan_in = fan_in,
                       .fan_out = out_channels,
                       .weight_decay = false});
    }
    return specs;
  }

  // Per sample: forward one multiply-add per weight and output position (2 flops), backward
  // twice that (the weight gradient and the input gradient are each a product of that size).
  layer_cost cost(const sample_shape& in) const {
    const sample_shape out = output_shape(in);
    const double forward_flops = 2.0 * static_cast<double>(in_channels * kernel * kernel) *
                                 static_cast<double>(out.elements());
    return {.forward_flops = forward_flops,
            .backward_flops = 2.0 * forward_flops,
            .activation_bytes = out.elements() * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    const detail::conv2d_geometry g = geometry(args.in_shape, args.out_shape);
    const std::size_t in_elements = args.in_shape.elements();
    const std::size_t out_elements = args.out_shape.elements();
    detail::conv2d_check_span("input", args.input.size(), args.batch * in_elements);
    detail::conv2d_check_span("output", args.output.size(), args.batch * out_elements);
    detail::conv2d_check_span("params", args.params.size(), parameter_elements());

    const auto cols = static_cast<Eigen::Index>(g.column_cols());
    const auto outs = static_cast<Eigen::Index>(out_channels);
    const Eigen::Map<const Eigen::VectorXf> bias_vector(
        args.params.data() + out_channels * g.column_rows(), bias ? outs : 0);

    const bool bf16 = args.storage == dtype::bfloat16;
    const bool direct = is_pointwise();
    std::vector<float> scratch(direct ? 0 : g.column_rows() * g.column_cols());
    for (std::size_t b = 0; b < args.batch; ++b) {
      const float* x = args.input.data() + b * in_elements;
      if (!direct) {
        detail::conv2d_im2col(g, x, scratch.data());
      }
      // y = W columns (+ b: each channel's row starts as its bias, the product adds to it).
      float* y = args.output.data() + b * out_elements;
      if (bias) {
        detail::conv2d_matrix(y, outs, cols).colwise() = bias_vector;
      }
      gemm({.bfloat16_inputs = bf16}, out_channels, g.column_cols(), g.column_rows(), 1.0f,
           args.params.data(), g.column_rows(), direct ? x : scratch.data(), g.column_cols(),
           bias ? 1.0f : 0.0f, y, g.column_cols());
    }
  }

  void backward(const backward_args& args) const {
    const detail::conv2d_geometry g = geometry(args.in_shape, args.out_shape);
    const std::size_t in_elements = args.in_shape.elements();
    const std::size_t out_elements = args.out_shape.elements();
    detail::conv2d_check_span("input", args.input.size(), args.batch * in_elements);
    detail::conv2d_check_span("grad_output", args.grad_output.size(), args.batch * out_elements);
    detail::conv2d_check_span("params", args.params.size(), parameter_elements());
    detail::conv2d_check_span("grads", args.grads.size(), parameter_elements());
    const bool want_input = !args.grad_input.empty();
    if (want_input) {
      detail::conv2d_check_span("grad_input", args.grad_input.size(), args.batch * in_elements);
    }

    const auto cols = static_cast<Eigen::Index>(g.column_cols());
    const auto outs = static_cast<Eigen::Index>(out_channels);
    Eigen::Map<Eigen::VectorXf> grad_bias(args.grads.data() + out_channels * g.column_rows(),
                                          bias ? outs : 0);

    const bool bf16 = args.storage == dtype::bfloat16;
    const bool direct = is_pointwise();
    std::vector<float> columns_scratch(direct ? 0 : g.column_rows() * g.column_cols());
    std::vector<float> grad_columns_scratch(direct || !want_input ? 0 : columns_scratch.size());
    for (std::size_t b = 0; b < args.batch; ++b) {
      const float* x = args.input.data() + b * in_elements;
      if (!direct) {
        detail::conv2d_im2col(g, x, columns_scratch.data());
      }
      const float* columns = direct ? x : columns_scratch.data();
      const float* dy_data = args.grad_output.data() + b * out_elements;
      // dW += dy columns^T
      gemm({.transpose_b = true, .bfloat16_inputs = bf16}, out_channels, g.column_rows(),
           g.column_cols(), 1.0f, dy_data, g.column_cols(), columns, g.column_cols(), 1.0f,
           args.grads.data(), g.column_rows());
      if (bias) {
        grad_bias += detail::conv2d_const_matrix(dy_data, outs, cols).rowwise().sum();
      }
      if (!want_input) {
        continue;
      }
      float* dx = args.grad_input.data() + b * in_elements;
      // d columns = W^T dy, straight into dx for a pointwise convolution
      gemm({.transpose_a = true, .bfloat16_inputs = bf16}, g.column_rows(), g.column_cols(),
           out_channels, 1.0f, args.params.data(), g.column_rows(), dy_data, g.column_cols(), 0.0f,
           direct ? dx : grad_columns_scratch.data(), g.column_cols());
      if (direct) {
        continue;
      }
      std::fill(dx, dx + in_elements, 0.0f);
      detail::conv2d_col2im(g, grad_columns_scratch.data(), dx);
    }
  }

  friend bool operator==(const conv2d&, const conv2d&) = default;

 private:
  bool is_pointwise() const noexcept { return kernel == 1 && stride == 1 && padding == 0; }

  std::size_t parameter_elements() const noexcept {
    return out_channels * in_channels * kernel * kernel + (bias ? out_channels : 0);
  }

  detail::conv2d_geometry geometry(const sample_shape& in, const sample_shape& out) const {
    const sample_shape expected = output_shape(in);
    if (out != expected) {
      detail::conv2d_throw("out_shape " + to_string(out) + " does not match " +
                           to_string(expected) + " for input " + to_string(in));
    }
    return {.channels = in.channels,
            .height = in.height,
            .width = in.width,
            .kernel = kernel,
            .stride = stride,
            .padding = padding,
            .out_height = expected.height,
            .out_width = expected.width};
  }
};

inline std::string to_string(const conv2d& l) {
  return "conv2d{.in_channels = " + std::to_string(l.in_channels) +
         ", .out_channels = " + std::to_string(l.out_channels) +
         ", .kernel = " + std::to_string(l.kernel) + ", .stride = " + std::to_string(l.stride) +
         ", .padding = " + std::to_string(l.padding) + ", .bias = " + (l.bias ? "true" : "false") +
         "}";
}

static_assert(check_layer<conv2d>());

}  // namespace strata::model
