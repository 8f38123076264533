// SPDX-License-Identifier: Apache-2.0
#pragma once

// layer_norm: normalises each sample over all of its elements (or, when the sample has rows of
// `features` elements, a transformer's tokens, each row on its own),
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps),
// with the biased variance (divided by features); weight and bias are per element (affine only).
// Sums are accumulated in double.
//
// Saved state: per sample (per row), its mean and rstd, interleaved: workspace[2 b] = mean of
// row b, workspace[2 b + 1] = its rstd (2 x batch x rows floats). backward recomputes the
// normalised input from args.input and these.

#include <charconv>
#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/format.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

namespace detail {

[[noreturn]] inline void layer_norm_throw(const std::string& message) {
  throw std::invalid_argument("layer_norm: " + message);
}

inline void layer_norm_check_span(const char* name, std::size_t have, std::size_t need) {
  if (have != need) {
    layer_norm_throw(std::string(name) + " must hold " + std::to_string(need) + " floats, got " +
                     std::to_string(have));
  }
}

// The shortest text that reads back as the same float.
inline std::string layer_norm_format(float value) {
  return format_shortest(value);
}

}  // namespace detail

// Parameters (affine only): "weight" (1 x features, ones), then "bias" (1 x features, zeros),
// both without weight decay.
struct layer_norm {
  using layer_category = layer_tag;

  std::size_t features = 0;  // the input's elements(), or its width; at least 1
  float eps = 1e-5f;         // added to the variance; finite and > 0
  bool affine = true;        // learn a per-element scale and shift

  sample_shape output_shape(const sample_shape& in) const {
    if (features == 0) {
      detail::layer_norm_throw("features must be at least 1, got 0");
    }
    if (!(std::isfinite(eps) && eps > 0.0f)) {
      detail::layer_norm_throw("eps must be finite and > 0, got " + detail::layer_norm_format(eps));
    }
    if (in.elements() != features && in.width != features) {
      detail::layer_norm_throw("input " + to_string(in) + " has " + std::to_string(in.elements()) +
                               " elements and width " + std::to_string(in.width) +
                               ", features is " + std::to_string(features));
    }
    return in;
  }

  // The rows of `features` elements normalised apart in a sample of shape `in`.
  std::size_t rows_of(const sample_shape& in) const {
    return in.width == features && in.elements() != features ? in.channels * in.height : 1;
  }

  std::vector<param_spec> parameters(const sample_shape& in) const {
    output_shape(in);
    if (!affine) {
      return {};
    }
    return {{.name = "weight",
             .rows = 1,
             .cols = features,
             .init = init_kind::ones,
             .fan_in = features,
             .fan_out = features,
             .weight_decay = false},
            {.name = "bias",
             .rows = 1,
             .cols = features,
             .init = init_kind::zeros,
             .fan_in = features,
             .fan_out = features,
             .weight_decay = false}};
  }

  std::size_t workspace_elements(const sample_shape& in, std::size_t batch) const {
    output_shape(in);
    return 2 * batch * rows_of(in);
  }

  // Per sample of n elements: forward 6 n flops (mean 1, variance 3, normalise 2) plus 2 n for
  // the affine step; backward 10 n plus 4 n with affine. Saved: the output and mean and rstd.
  layer_cost cost(const sample_shape& in) const {
    const auto n = static_cast<double>(output_shape(in).elements());
    return {.forward_flops = (affine ? 8.0 : 6.0) * n,
            .backward_flops = (affine ? 14.0 : 10.0) * n,
            .activation_bytes = (features + 2) * rows_of(in) * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    check_shapes(args.in_shape, args.out_shape);
    const std::size_t n = features;
    const std::size_t units = args.batch * rows_of(args.in_shape);  // rows normalised apart
    detail::layer_norm_check_span("input", args.input.size(), units * n);
    detail::layer_norm_check_span("output", args.output.size(), units * n);
    detail::layer_norm_check_span("params", args.params.size(), affine ? 2 * n : 0);
    detail::layer_norm_check_span("workspace", args.workspace.size(), 2 * units);

    const float* weight = args.params.data();
    const float* shift = affine ? args.params.data() + n : nullptr;
    for (std::size_t b = 0; b < units; ++b) {
      const float* x = args.input.data() + b * n;
      float* y = args.output.data() + b * n;
      double sum = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        sum += x[i];
      }
      const double mean = sum / static_cast<double>(n);
      double squares = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const double d = x[i] - mean;
        squares += d * d;
      }
      const double variance = squares / static_cast<double>(n);
      const double rstd = 1.0 / std::sqrt(variance + static_cast<double>(eps));
      for (std::size_t i = 0; i < n; ++i) {
        const auto normalised = static_cast<float>((x[i] - mean) * rstd);
        y[i] = affine ? normalised * weight[i] + shift[i] : normalised;
      }
      args.workspace[2 * b] = static_cast<float>(mean);
      args.workspace[2 * b + 1] = static_cast<float>(rstd);
    }
  }

  // With g = grad_output * weight (or grad_output) and xhat the normalised input:
  //   grad_input = rstd * (g - mean(g) - xhat * mean(g * xhat)),
  //   grad weight += sum over the batch of grad_output * xhat, grad bias += sum of grad_output.
  void backward(const backward_args& args) const {
    check_shapes(args.in_shape, args.out_shape);
    const std::size_t n = features;
    const bool want_input = !args.grad_input.empty();
    const std::size_t units = args.batch * rows_of(args.in_shape);
    detail::layer_norm_check_span("input", args.input.size(), units * n);
    detail::layer_norm_check_span("grad_output", args.grad_output.size(), units * n);
    detail::layer_norm_check_span("params", args.params.size(), affine ? 2 * n : 0);
    detail::layer_norm_check_span("grads", args.grads.size(), affine ? 2 * n : 0);
    detail::layer_norm_check_span("workspace", args.workspace.size(), 2 * units);
    if (want_input) {
      detail::layer_norm_check_span("grad_input", args.grad_input.size(), units * n);
    }

    const float* weight = args.params.data();
    float* grad_weight = args.grads.data();
    float* grad_bias = affine ? args.grads.data() + n : nullptr;
    for (std::size_t b = 0; b < units; ++b) {
      const float* x = args.input.data() + b * n;
      const float* dy = args.grad_output.data() + b * n;
      const double mean = args.workspace[2 * b];
      const double rstd = args.workspace[2 * b + 1];
      double sum_g = 0.0;
      double sum_g_xhat = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const double xhat = (x[i] - mean) * rstd;
        const double g = affine ? static_cast<double>(dy[i]) * weight[i] : dy[i];
        sum_g += g;
        sum_g_xhat += g * xhat;
        if (affine) {
          grad_weight[i] += static_cast<float>(dy[i] * xhat);
          grad_bias[i] += dy[i];
        }
      }
      if (!want_input) {
        continue;
      }
      const double mean_g = sum_g / static_cast<double>(n);
      const double mean_g_xhat = sum_g_xhat / static_cast<double>(n);
      float* dx = args.grad_input.data() + b * n;
      for (std::size_t i = 0; i < n; ++i) {
        const double xhat = (x[i] - mean) * rstd;
        const double g = affine ? static_cast<double>(dy[i]) * weight[i] : dy[i];
        dx[i] = static_cast<float>(rstd * (g - mean_g - xhat * mean_g_xhat));
      }
    }
  }

  friend bool operator==(const layer_norm&, const layer_norm&) = default;

 private:
  void check_shapes(const sample_shape& in, const sample_shape& out) const {
    const sample_shape expected = output_shape(in);
    if (out != expected) {
      detail::layer_norm_throw("out_shape " + to_string(out) + " does not match " +
                               to_string(expected) + " for input " + to_string(in));
    }
  }
};

inline std::string to_string(const layer_norm& l) {
  return "layer_norm{.features = " + std::to_string(l.features) +
         ", .eps = " + detail::layer_norm_format(l.eps) +
         ", .affine = " + (l.affine ? "true" : "false") + "}";
}

static_assert(check_layer<layer_norm>());

}  // namespace strata::model
