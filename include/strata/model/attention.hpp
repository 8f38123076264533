// SPDX-License-Identifier: Apache-2.0
#pragma once

// self_attention: multi-head self-attention over a sample's tokens (a vision transformer's
// mixing layer).
//
//   strata::model::self_attention{.dim = 64, .heads = 4}   // 1 x 16 x 64 -> 1 x 16 x 64
//
// The input's rows (channels x height) are the tokens, its width the features (`dim`). Per
// sample X (tokens x dim): Q = X Wq^T + bq, K and V alike; head h takes columns
// [h d, (h + 1) d) of each, d = dim / heads, and gives softmax(Q_h K_h^T / sqrt(d)) V_h; the
// heads' outputs side by side (tokens x dim) are mapped by Wo, bo. No mask: every token sees
// every token.
//
// Parameters, in this order: "q_weight", "k_weight", "v_weight" (dim x dim each, Xavier
// uniform), "q_bias", "k_bias", "v_bias" (1 x dim, zeros), "out_weight" (dim x dim), "out_bias"
// (1 x dim). Laid out together the three projection weights are one 3 dim x dim matrix and
// their biases one vector, so Q, K and V come from one product. The projections go through
// model::gemm; the per-head products (tokens x tokens, small) are Eigen's.
//
// Tensor-parallel (requirement 10 of model/concepts.hpp): rank r of a group of p runs heads
// [r heads / p, (r + 1) heads / p): it holds those rows of the Q, K and V weights and biases and
// those columns of the output weight (the output bias whole), and all-reduces the output
// projection's partial sums forward and the input gradient's backward: one reduction each way.
//
// Saved state per sample: Q, K, V (tokens x 3 dim), the attention weights (heads x tokens^2),
// the heads' outputs (tokens x dim); and scratch for backward (tokens x 4 dim per sample, one
// tokens^2 block); under tensor parallelism, of this rank's heads only.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
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

// The heads of one sample, given its Q | K | V rows (tokens x 3 width, head h at columns h d of
// each third) and where to put its attention weights and outputs (tokens x width). width =
// heads x d. The tensor-parallel attention runs it on the heads a rank holds.
struct attention_heads {
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using view = Eigen::Map<matrix, 0, Eigen::OuterStride<>>;
  using const_view = Eigen::Map<const matrix, 0, Eigen::OuterStride<>>;
  using index = Eigen::Index;

  std::size_t tokens = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;

  std::size_t width() const noexcept { return heads * head_dim; }
  float scale() const noexcept { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }

  const_view q(const float* qkv, std::size_t h) const { return part(qkv, h, 0); }
  const_view k(const float* qkv, std::size_t h) const { return part(qkv, h, 1); }
  const_view v(const float* qkv, std::size_t h) const { return part(qkv, h, 2); }

  // probs: heads x tokens x tokens; out: tokens x width.
  void forward(const float* qkv, float* probs, float* out) const {
    const auto t = static_cast<index>(tokens);
    for (std::size_t h = 0; h < heads; ++h) {
      view p(probs + h * tokens * tokens, t, t, Eigen::OuterStride<>(t));
      p.noalias() = q(qkv, h) * k(qkv, h).transpose();
      for (index r = 0; r < t; ++r) {
        auto row = p.row(r);
        row *= scale();
        const float top = row.maxCoeff();
        row = (row.array() - top).exp();
        row /= row.sum();
      }
      out_view(out, h).noalias() = p * v(qkv, h);
    }
  }

  // From the gradient of the outputs (tokens x width) to that of Q | K | V (tokens x 3 width),
  // with `scratch` tokens^2 floats.
  void backward(const float* qkv, const float* probs, const float* grad_out, float* grad_qkv,
                float* scratch) const {
    const auto t = static_cast<index>(tokens);
    for (std::size_t h = 0; h < heads; ++h) {
      const const_view p(probs + h * tokens * tokens, t, t, Eigen::OuterStride<>(t));
      const const_view dout(grad_out + h * head_dim, t, static_cast<index>(head_dim),
                            Eigen::OuterStride<>(static_cast<index>(width())));
      view ds(scratch, t, t, Eigen::OuterStride<>(t));
      ds.noalias() = dout * v(qkv, h).transpose();  // d probs
      grad_part(grad_qkv, h, 2).noalias() = p.transpose() * dout;
      for (index r = 0; r < t; ++r) {
        const float dot = ds.row(r).dot(p.row(r));
        ds.row(r) = p.row(r).cwiseProduct((ds.row(r).array() - dot).matrix());
      }
      grad_part(grad_qkv, h, 0).noalias() = (ds * k(qkv, h)) * scale();
      grad_part(grad_qkv, h, 1).noalias() = (ds.transpose() * q(qkv, h)) * scale();
    }
  }

 private:
  const_view part(const float* qkv, std::size_t h, std::size_t which) const {
    return {qkv + which * width() + h * head_dim, static_cast<index>(tokens),
            static_cast<index>(head_dim), Eigen::OuterStride<>(static_cast<index>(3 * width()))};
  }
  view grad_part(float* qkv, std::size_t h, std::size_t which) const {
    return {qkv + which * width() + h * head_dim, static_cast<index>(tokens),
            static_cast<index>(head_dim), Eigen::OuterStride<>(static_cast<index>(3 * width()))};
  }
  view out_view(float* out, std::size_t h) const {
    return {out + h * head_dim, static_cast<index>(tokens), static_cast<index>(head_dim),
            Eigen::OuterStride<>(static_cast<index>(width()))};
  }
};

}  // namespace detail

struct self_attention {
  using layer_category = layer_tag;

  std::size_t dim = 0;    // features per token
  std::size_t heads = 1;  // must divide dim

  sample_shape output_shape(const sample_shape& in) const {
    if (dim == 0 || heads == 0 || dim % heads != 0) {
      throw std::invalid_argument("self_attention: dim (" + std::to_string(dim) +
                                  ") must be a positive multiple of heads (" +
                                  std::to_string(heads) + ")");
    }
    if (in.width != dim) {
      throw std::invalid_argument(
          "self_attention: input " + to_string(in) + " has width " + std::to_string(in.width) +
          ", expected dim = " + std::to_string(dim) + " features per token");
    }
    return in;
  }

  std::vector<param_spec> parameters(const sample_shape& in) const {
    output_shape(in);
    // Requirement 10: a tensor-parallel group splits the heads: the Q, K and V projections by
    // rows (their outputs), the output projection by columns (its inputs).
    const auto matrix = [&](const char* name, tensor_split split) {
      return param_spec{.name = name,
                        .rows = dim,
                        .cols = dim,
                        .init = init_kind::xavier_uniform,
                        .fan_in = dim,
                        .fan_out = dim,
                        .weight_decay = true,
                        .split = split};
    };
    const auto vector = [&](const char* name, tensor_split split) {
      return param_spec{.name = name,
                        .rows = 1,
                        .cols = dim,
                        .init = init_kind::zeros,
                        .fan_in = dim,
                        .fan_out = dim,
                        .weight_decay = false,
                        .split = split};
    };
    using enum tensor_split;
    return {matrix("q_weight", rows),   matrix("k_weight", rows), matrix("v_weight", rows),
            vector("q_bias", cols),     vector("k_bias", cols),   vector("v_bias", cols),
            matrix("out_weight", cols), vector("out_bias", none)};
  }

  // Per tensor-parallel rank: Q | K | V, weights and outputs of its heads, their gradients, and
  // one tokens^2 block.
  std::size_t workspace_elements(const sample_shape& in, std::size_t batch,
                                 const tensor_place& place) const {
    output_shape(in);
    const std::size_t t = in.channels * in.height;
    const std::size_t e = local_width(place);
    return batch * (8 * t * e + heads / place.size * t * t) + t * t;
  }

  // Per sample: the four projections (8 dim^2 flops per token) and the heads' two products
  // (4 tokens^2 dim) forward, twice that backward.
  layer_cost cost(const sample_shape& in) const {
    const auto t = static_cast<double>(in.channels * in.height);
    const auto d = static_cast<double>(dim);
    const double forward = 8.0 * t * d * d + 4.0 * t * t * d;
    return {
        .forward_flops = forward,
        .backward_flops = 2.0 * forward,
        .activation_bytes = static_cast<std::size_t>(t * 5.0 * d + heads * t * t) * sizeof(float)};
  }

  // Under a tensor-parallel group of p, a rank runs heads / p heads (e = dim / p features) and
  // its output projection gives a partial sum, all-reduced over the group before the bias.
  void forward(const forward_args& args) const {
    const std::size_t t = args.in_shape.channels * args.in_shape.height;
    const std::size_t n = args.batch * t;
    const tensor_place place = args.tensor.place;
    const std::size_t e = local_width(place);
    check(args.input.size(), n * dim, "input");
    check(args.output.size(), n * dim, "output");
    check(args.params.size(), local_parameters(place), "params");
    check(args.workspace.size(), workspace_elements(args.in_shape, args.batch, place), "workspace");
    if (n == 0) {
      return;
    }
    const parts w = layout(t, args.batch, e, place, args.workspace.data());
    const float* p = args.params.data();
    const bool bf16 = args.storage == dtype::bfloat16;
    // Q | K | V of every token in one product.
    gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, 3 * e, dim, args.input.data(), dim,
              p, dim, p + 3 * e * dim, w.qkv, 3 * e);
    const detail::attention_heads h{
        .tokens = t, .heads = heads / place.size, .head_dim = dim / heads};
    for (std::size_t b = 0; b < args.batch; ++b) {
      h.forward(w.qkv + b * t * 3 * e, w.probs + b * h.heads * t * t, w.heads + b * t * e);
    }
    const float* wo = p + 3 * e * dim + 3 * e;
    const float* bo = wo + dim * e;
    if (place.size == 1) {
      gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, dim, e, w.heads, e, wo, e, bo,
                args.output.data(), dim);
      return;
    }
    gemm({.transpose_b = true, .bfloat16_inputs = bf16}, n, dim, e, 1.0f, w.heads, e, wo, e, 0.0f,
         args.output.data(), dim);
    args.tensor.all_reduce_sum(args.output);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t c = 0; c < dim; ++c) {
        args.output[r * dim + c] += bo[c];
      }
    }
  }

  void backward(const backward_args& args) const {
    const std::size_t t = args.in_shape.channels * args.in_shape.height;
    const std::size_t n = args.batch * t;
    const tensor_place place = args.tensor.place;
    const std::size_t e = local_width(place);
    check(args.grad_output.size(), n * dim, "grad_output");
    check(args.grads.size(), local_parameters(place), "grads");
    if (n == 0) {
      return;
    }
    const parts w = layout(t, args.batch, e, place, args.workspace.data());
    const float* p = args.params.data();
    const float* wo = p + 3 * e * dim + 3 * e;
    float* g = args.grads.data();
    float* g_wo = g + 3 * e * dim + 3 * e;
    const float* dy = args.grad_output.data();
    // The output projection (dim x e): dWo += dY^T heads, dbo += column sums, d heads = dY Wo.
    gemm({.transpose_a = true}, dim, e, n, 1.0f, dy, dim, w.heads, e, 1.0f, g_wo, e);
    add_column_sums(dy, n, dim, g_wo + dim * e);
    gemm({}, n, e, dim, 1.0f, dy, dim, wo, e, 0.0f, w.grad_heads, e);
    const detail::attention_heads h{
        .tokens = t, .heads = heads / place.size, .head_dim = dim / heads};
    for (std::size_t b = 0; b < args.batch; ++b) {
      h.backward(w.qkv + b * t * 3 * e, w.probs + b * h.heads * t * t, w.grad_heads + b * t * e,
                 w.grad_qkv + b * t * 3 * e, w.scratch);
    }
    // The projections (3 e x dim): dW += dQKV^T X, db += column sums, dX = dQKV W, summed over
    // the group's heads.
    gemm({.transpose_a = true}, 3 * e, dim, n, 1.0f, w.grad_qkv, 3 * e, args.input.data(), dim,
         1.0f, g, dim);
    add_column_sums(w.grad_qkv, n, 3 * e, g + 3 * e * dim);
    if (!args.grad_input.empty()) {
      check(args.grad_input.size(), n * dim, "grad_input");
      gemm({}, n, dim, 3 * e, 1.0f, w.grad_qkv, 3 * e, p, dim, 0.0f, args.grad_input.data(), dim);
      args.tensor.all_reduce_sum(args.grad_input);
    }
  }

  friend bool operator==(const self_attention&, const self_attention&) = default;

 private:
  struct parts {
    float* qkv;
    float* probs;
    float* heads;
    float* grad_heads;
    float* grad_qkv;
    float* scratch;
  };

  // Features of the heads one rank of a tensor-parallel group runs; the group's size must
  // divide heads.
  std::size_t local_width(const tensor_place& place) const {
    if (place.size == 0 || heads % place.size != 0) {
      throw std::invalid_argument(
          "self_attention: " + std::to_string(heads) +
          " heads do not split over tensor_parallel_size = " + std::to_string(place.size));
    }
    return dim / place.size;
  }
  std::size_t local_parameters(const tensor_place& place) const {
    const std::size_t e = local_width(place);
    return 3 * e * dim + 3 * e + dim * e + dim;
  }

  parts layout(std::size_t t, std::size_t batch, std::size_t e, const tensor_place& place,
               float* w) const {
    parts out{};
    out.qkv = w;
    out.probs = out.qkv + batch * t * 3 * e;
    out.heads = out.probs + batch * (heads / place.size) * t * t;
    out.grad_heads = out.heads + batch * t * e;
    out.grad_qkv = out.grad_heads + batch * t * e;
    out.scratch = out.grad_qkv + batch * t * 3 * e;
    return out;
  }

  static void add_column_sums(const float* m, std::size_t rows, std::size_t cols, float* into) {
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < cols; ++c) {
        into[c] += m[r * cols + c];
      }
    }
  }

  static void check(std::size_t got, std::size_t want, const char* what) {
    if (got != want) {
      throw std::invalid_argument(std::string("self_attention: ") + what + " holds " +
                                  std::to_string(got) + " floats, expected " +
                                  std::to_string(want));
    }
  }
};

inline std::string to_string(const self_attention& l) {
  return "self_attention{.dim = " + std::to_string(l.dim) +
         ", .heads = " + std::to_string(l.heads) + "}";
}

static_assert(check_layer<self_attention>());

}  // namespace strata::model
