// SPDX-License-Identifier: Apache-2.0
#pragma once

// linear: the fully connected layer y = x W^T + b over a batch of feature vectors.
//
//   strata::model::linear{.in = 784, .out = 128}
//
// The input may have any channels x height x width whose elements() is `in` (it is read as a
// flat vector, so a flatten in front is optional); the output is 1 x 1 x out. An input whose
// width is `in` and which has more rows (channels x height: a transformer's tokens) is mapped
// row by row with the same weights: the output is channels x height x out. Parameters, in
// this order: "weight", out x in, row-major (row o holds the weights of output o), then, with
// .bias, "bias", 1 x out. The products go through model::gemm (gemm.hpp: oneDNN, OpenBLAS
// or Eigen); the bias joins the forward product in one pass where the provider can (gemm_bias:
// oneDNN), else it is the output's starting value, which the product adds to. No saved
// state: backward reads args.input. Asked for parts (backward_args::progress), backward computes
// the weight gradient in blocks of rows (at least min_part_rows) and reports each; the bias
// gradient comes last, final when backward returns. It writes its gradients rather than adding
// when asked (backward_args::write_grads). Its backward splits (requirement 9): backward_input
// is dx = dy W, backward_weight the weight and bias gradients.
//
// With .activation = fused_activation::relu the output is max(x W^T + b, 0): the layer equals
// linear followed by relu{}, with the ReLU applied by the product itself where the provider
// can (oneDNN's post-op: no pass of its own). Backward then reads args.output (the derivative
// is 1 where the output is positive, else 0, as relu's) and forms the masked output gradient in
// its workspace (batch x rows x out floats, what a separate relu's output would take);
// backward_weight and backward_input each form it, so either may run first or alone.
//
// With a fused ReLU, .dropout = rate drops the output in training as a dropout{.rate = rate}
// after the layer would, the same draws from the layer's own streams (dropout.hpp: the 16-bit
// draws of args.rng_for(sample), the kept elements scaled by 65536 / (65536 - t)), in place
// on the output: no mask is stored and no pass of its own runs backward, because an element
// was kept and positive exactly when the output is positive. The workspace's last float holds
// the scale forward applied (1 in evaluation). Without the ReLU .dropout is refused (a kept
// element whose product is 0 could not be told from a dropped one): use a dropout layer.

#include <Eigen/Core>
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/shape.hpp"
#include "strata/model/activations.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/dropout.hpp"
#include "strata/model/gemm.hpp"

namespace strata::model {

// An activation linear applies to its own output (fused into the product where it can).
enum class fused_activation { none, relu };

struct linear {
  using layer_category = layer_tag;
  // Requirement 8: after param_store::discard_grads the weight gradient's product overwrites
  // (beta = 0) and the bias gradient is assigned, so no pass zeroes them first.
  static constexpr bool writes_grads = true;
  // Requirement 9: backward = backward_weight, then backward_input.
  static constexpr bool splits_backward = true;

  std::size_t in = 0;                                    // input features, at least 1
  std::size_t out = 0;                                   // output features, at least 1
  bool bias = true;                                      // add a learned bias
  fused_activation activation = fused_activation::none;  // applied to the output
  double dropout = 0.0;  // with activation = relu: the output's dropout rate in training, [0, 1)

  sample_shape output_shape(const sample_shape& input) const {
    if (in == 0) {
      throw std::invalid_argument("linear: in must be at least 1, got 0");
    }
    if (out == 0) {
      throw std::invalid_argument("linear: out must be at least 1, got 0");
    }
    if (!(dropout >= 0.0 && dropout < 1.0)) {
      throw std::invalid_argument("linear: dropout must be in [0, 1), got " +
                                  detail::dropout_number(dropout));
    }
    if (dropout > 0.0 && activation != fused_activation::relu) {
      throw std::invalid_argument(
          "linear: .dropout = " + detail::dropout_number(dropout) +
          " needs .activation = fused_activation::relu (backward tells the kept elements by "
          "the output's sign); put a dropout layer after the linear instead");
    }
    if (input.elements() == in) {
      return sample_shape{.channels = 1, .height = 1, .width = out};
    }
    if (input.width == in) {  // row by row
      return sample_shape{.channels = input.channels, .height = input.height, .width = out};
    }
    throw std::invalid_argument(
        "linear: input shape " + to_string(input) + " has " + std::to_string(input.elements()) +
        " elements and width " + std::to_string(input.width) +
        ", expected in = " + std::to_string(in) + " elements or a width of in");
  }

  std::vector<param_spec> parameters(const sample_shape&) const {
    std::vector<param_spec> specs;
    specs.push_back(param_spec{.name = "weight",
                               .rows = out,
                               .cols = in,
                               .init = init_kind::kaiming_uniform,
                               .fan_in = in,
                               .fan_out = out,
                               .weight_decay = true});
    if (bias) {
      specs.push_back(param_spec{.name = "bias",
                                 .rows = 1,
                                 .cols = out,
                                 .init = init_kind::uniform_fan_in,
                                 .fan_in = in,
                                 .fan_out = out,
                                 .weight_decay = false});
    }
    return specs;
  }

  // Per sample and row: a multiply and an add per weight forward; dx and dW each as much
  // backward; a fused ReLU one compare per output each way, a fused dropout one multiply.
  layer_cost cost(const sample_shape& input) const {
    const auto r = static_cast<double>(rows_of(input));
    const auto weights = static_cast<double>(in) * static_cast<double>(out);
    const double relu = activation == fused_activation::relu ? static_cast<double>(out) * r : 0.0;
    const double drop = dropout > 0.0 ? static_cast<double>(out) * r : 0.0;
    return {.forward_flops = 2.0 * weights * r + relu + drop,
            .backward_flops = 4.0 * weights * r + relu + drop,
            .activation_bytes = rows_of(input) * out * sizeof(float)};
  }

  // With a fused ReLU, the masked output gradient backward forms (batch x rows x out floats);
  // with a fused dropout one more, the scale forward applied.
  std::size_t workspace_elements(const sample_shape& input, std::size_t batch) const {
    if (activation != fused_activation::relu) {
      return 0;
    }
    return batch * rows_of(input) * out + (dropout > 0.0 ? 1 : 0);
  }

  // The rows a sample of shape `input` is mapped as: channels x height for rows of width `in`,
  // else 1 (a flat vector of `in` elements).
  std::size_t rows_of(const sample_shape& input) const {
    return input.width == in && input.elements() != in ? input.channels * input.height : 1;
  }

  void forward(const forward_args& args) const {
    const std::size_t n = args.batch * rows_of(args.in_shape);  // rows of the product
    assert(args.input.size() == n * in && "linear: input must hold batch x in floats");
    assert(args.output.size() == n * out && "linear: output must hold batch x out floats");
    assert(args.params.size() == parameter_elements() && "linear: params size mismatch");
    if (n == 0) {
      return;
    }
    // y = x W^T (+ b, and the ReLU, in the same pass where the provider can: gemm_bias).
    const bool bf16 = args.storage == dtype::bfloat16;
    const bool relu = activation == fused_activation::relu;
    if (bias) {
      gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, out, in, args.input.data(), in,
                args.params.data(), in, args.params.data() + out * in, args.output.data(), out,
                relu ? gemm_epilogue::relu : gemm_epilogue::none);
    } else {
      gemm({.transpose_b = true, .bfloat16_inputs = bf16}, n, out, in, 1.0f, args.input.data(), in,
           args.params.data(), in, 0.0f, args.output.data(), out);
      apply_gemm_epilogue(relu ? gemm_epilogue::relu : gemm_epilogue::none, n, out,
                          args.output.data(), out);
    }
    if (dropout > 0.0) {
      assert(args.workspace.size() == n * out + 1 &&
             "linear: workspace must hold batch x out floats and the dropout scale");
      float scale = 1.0f;
      if (args.training) {
        const std::uint32_t threshold = detail::dropout_threshold(dropout);
        scale = detail::dropout_keep_scale(threshold);
        const std::size_t per_sample = n / args.batch * out;
        for (std::size_t b = 0; b < args.batch; ++b) {
          detail::dropout_sample_in_place(args.rng_for(b), args.output.data() + b * per_sample,
                                          per_sample, threshold, scale);
        }
      }
      args.workspace[n * out] = scale;
    }
  }

  void backward(const backward_args& args) const {
    float* sums = bias_sums();
    const std::span<const float> dy = output_gradient(args, sums);
    weight_gradient(args, dy, sums);
    input_gradient(args, dy);
  }

  // The weight and bias gradients of backward.
  void backward_weight(const backward_args& args) const {
    float* sums = bias_sums();
    const std::span<const float> dy = output_gradient(args, sums);
    weight_gradient(args, dy, sums);
  }

  // The input gradient of backward: dx = dy W (nothing when args.grad_input is empty).
  void backward_input(const backward_args& args) const {
    if (args.grad_input.empty()) {
      return;
    }
    input_gradient(args, output_gradient(args, nullptr));
  }

  // The fewest rows of the weight gradient computed at once when asked for parts.
  static constexpr std::size_t min_part_rows = 16;

  friend bool operator==(const linear&, const linear&) = default;

 private:
  // Where the bias gradient's column sums of the masked output gradient are formed in the same
  // pass (a fused ReLU with a bias: `out` floats per thread), else null.
  float* bias_sums() const {
    if (activation != fused_activation::relu || !bias) {
      return nullptr;
    }
    thread_local std::vector<float> sums;
    sums.resize(out);
    return sums.data();
  }

  // The gradient of the product's output: args.grad_output, or with a fused ReLU that gradient
  // where the output is positive (else 0; with a fused dropout times the scale forward applied),
  // formed in the workspace row by row. With `sums` (out floats), each column's sum over the
  // rows is written there too, added row after row while the row is in cache (the bias
  // gradient, in batch order).
  std::span<const float> output_gradient(const backward_args& args, float* sums) const {
    if (activation != fused_activation::relu) {
      return args.grad_output;
    }
    const std::size_t rows = args.batch * rows_of(args.in_shape);
    const std::size_t n = rows * out;
    assert(args.output.size() == n && args.grad_output.size() == n &&
           args.workspace.size() == n + (dropout > 0.0 ? 1 : 0) &&
           "linear: output, grad_output and workspace must hold batch x out floats");
    const float scale = dropout > 0.0 ? args.workspace[n] : 1.0f;
    if (sums != nullptr) {
      std::fill(sums, sums + out, 0.0f);
    }
    for (std::size_t r = 0; r < rows; ++r) {
      const float* keep = args.output.data() + r * out;
      const float* g = args.grad_output.data() + r * out;
      float* masked = args.workspace.data() + r * out;
      if (dropout > 0.0) {  // kept and positive: the output is positive; times forward's scale
        detail::keep_where_positive_scaled(keep, g, scale, masked, out);
      } else {
        detail::keep_where_positive(keep, g, masked, out);
      }
      if (sums != nullptr) {
        detail::add_row(masked, sums, out);
      }
    }
    return {args.workspace.data(), n};
  }

  // `column_sums`: the bias gradient's sums when output_gradient formed them, else null (then
  // they are summed here).
  void weight_gradient(const backward_args& args, std::span<const float> grad_output,
                       const float* column_sums) const {
    const std::size_t n = args.batch * rows_of(args.in_shape);
    assert(args.input.size() == n * in && "linear: input must hold batch x in floats");
    assert(grad_output.size() == n * out && "linear: grad_output must hold batch x out floats");
    assert(args.params.size() == parameter_elements() && "linear: params size mismatch");
    assert(args.grads.size() == parameter_elements() && "linear: grads size mismatch");
    if (n == 0) {
      if (args.write_grads) {  // requirement 8: every element written, here the zero sum
        std::fill(args.grads.begin(), args.grads.end(), 0.0f);
      }
      if (args.grad_bound != nullptr) {
        *args.grad_bound = 0.0;
      }
      return;
    }
    const bool bf16 = args.storage == dtype::bfloat16;
    const float* x = args.input.data();
    const float* dy = grad_output.data();
    // Requirement 11, from the factors where they are fewer than the gradients (a batch smaller
    // than the layer; read just before the product reads them again): each element of dW moves
    // by a sum of n products x dy, each of the bias by a sum of n dy, so by at most
    // n max|dy| max(max|x|, 1). Three times that covers the sums' rounding (at most 2^23 terms:
    // a factor below 2) and the factors' rounding to bfloat16 where the product takes them so.
    // Else the gradients are read after the product, unless they were reported final in parts
    // (whoever hears a part, data parallelism, may already be reducing it in place): then
    // nothing is known.
    const std::size_t chunk = args.progress.chunk;
    const bool in_parts = chunk > 0 && chunk < out * in;
    const bool bound_from_factors = args.grad_bound != nullptr && n <= (std::size_t{1} << 23) &&
                                    n * (in + out) < args.grads.size();
    if (bound_from_factors) {
      const double x_max = detail::max_magnitude(x, n * in);
      const double dy_max = detail::max_magnitude(dy, n * out);
      const double inf = std::numeric_limits<double>::infinity();
      *args.grad_bound = std::isinf(x_max) || std::isinf(dy_max)
                             ? inf
                             : 3.0 * static_cast<double>(n) * dy_max * std::max(x_max, 1.0);
    }
    float* dw = args.grads.data();
    // Adding into dW, or writing it (write_grads: the products overwrite what is there).
    const float dw_beta = args.write_grads ? 0.0f : 1.0f;
    if (in_parts) {
      // In parts of whole rows of dW of at least `chunk` floats, each reported final: data
      // parallelism sends one part while this computes the next. At least min_part_rows rows,
      // so that a wide input does not turn the product into one matrix-vector pass per row.
      const std::size_t part = std::max((chunk + in - 1) / in, min_part_rows);
      for (std::size_t r = 0; r < out; r += part) {
        // dW[r:r+n] += dy[:, r:r+n]^T x
        const std::size_t k = std::min(part, out - r);
        gemm({.transpose_a = true, .bfloat16_inputs = bf16}, k, in, n, 1.0f, dy + r, out, x, in,
             dw_beta, dw + r * in, in);
        args.progress((r + k) * in);
      }
    } else {
      gemm({.transpose_a = true, .bfloat16_inputs = bf16}, out, in, n, 1.0f, dy, out, x, in,
           dw_beta, dw, in);
    }
    if (bias) {
      row db(args.grads.data() + out * in, cols(out));
      if (column_sums != nullptr) {
        const Eigen::Map<const Eigen::RowVectorXf> sums(column_sums, cols(out));
        if (args.write_grads) {
          db = sums;
        } else {
          db += sums;
        }
      } else {
        const const_matrix dy_rows(dy, rows(n), cols(out));
        if (args.write_grads) {
          db = dy_rows.colwise().sum();
        } else {
          db += dy_rows.colwise().sum();
        }
      }
    }
    if (args.grad_bound != nullptr && !bound_from_factors && !in_parts) {
      *args.grad_bound = detail::max_magnitude(args.grads.data(), args.grads.size());
    }
  }

  void input_gradient(const backward_args& args, std::span<const float> grad_output) const {
    const std::size_t n = args.batch * rows_of(args.in_shape);
    assert(grad_output.size() == n * out && "linear: grad_output must hold batch x out floats");
    assert((args.grad_input.empty() || args.grad_input.size() == n * in) &&
           "linear: grad_input must be empty or hold batch x in floats");
    if (n == 0 || args.grad_input.empty()) {
      return;
    }
    const bool bf16 = args.storage == dtype::bfloat16;
    gemm({.bfloat16_inputs = bf16}, n, in, out, 1.0f, grad_output.data(), out, args.params.data(),
         in, 0.0f, args.grad_input.data(), in);
  }

  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using const_matrix = Eigen::Map<const row_major>;
  using row = Eigen::Map<Eigen::RowVectorXf>;

  static Eigen::Index rows(std::size_t n) { return static_cast<Eigen::Index>(n); }
  static Eigen::Index cols(std::size_t n) { return static_cast<Eigen::Index>(n); }

  std::size_t parameter_elements() const { return out * in + (bias ? out : 0); }
};

inline std::string to_string(const linear& l) {
  return "linear{.in = " + std::to_string(l.in) + ", .out = " + std::to_string(l.out) +
         ", .bias = " + (l.bias ? "true" : "false") +
         (l.activation == fused_activation::relu ? ", .activation = relu" : "") +
         (l.dropout != 0.0 ? ", .dropout = " + detail::dropout_number(l.dropout) : "") + "}";
}

static_assert(check_layer<linear>());

}  // namespace strata::model
