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
// Saved state per sample: Q, K, V (tokens x 3 dim), the attention weights (heads x tokens^2),
// the heads' outputs (tokens x dim); and scratch for backward (tokens x 4 dim per sample, one
// tokens^2 block).

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
    const auto matrix = [&](const char* name) {
      return param_spec{.name = name,
                        .rows = dim,
                        .cols = dim,
                        .init = init_kind::xavier_uniform,
                        .fan_in = dim,
                        .fan_out = dim,
                        .weight_decay = true};
    };
    const auto vector = [&](const char* name) {
      return param_spec{.name = name,
                        .rows = 1,
                        .cols = dim,
                        .init = init_kind::zeros,
                        .fan_in = dim,
                        .fan_out = dim,
                        .weight_decay = false};
    };
    return {matrix("q_weight"), matrix("k_weight"), matrix("v_weight"),   vector("q_bias"),
            vector("k_bias"),   vector("v_bias"),   matrix("out_weight"), vector("out_bias")};
  }

  std::size_t workspace_elements(const sample_shape& in, std::size_t batch) const {
    output_shape(in);
    const std::size_t t = in.channels * in.height;
    // Q | K | V, weights, heads' outputs; their gradients (3 dim + dim); one tokens^2 block.
    return batch * (8 * t * dim + heads * t * t) + t * t;
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

  void forward(const forward_args& args) const {
    const std::size_t t = args.in_shape.channels * args.in_shape.height;
    const std::size_t n = args.batch * t;
    check(args.input.size(), n * dim, "input");
    check(args.output.size(), n * dim, "output");
    check(args.workspace.size(), workspace_elements(args.in_shape, args.batch), "workspace");
    if (n == 0) {
      return;
    }
    const parts w = layout(t, args.batch, args.workspace.data());
    const float* p = args.params.data();
    const bool bf16 = args.storage == dtype::bfloat16;
    // Q | K | V of every token in one product.
    gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, 3 * dim, dim, args.input.data(),
              dim, p, dim, p + 3 * dim * dim, w.qkv, 3 * dim);
    const detail::attention_heads h{.tokens = t, .heads = heads, .head_dim = dim / heads};
    for (std::size_t b = 0; b < args.batch; ++b) {
      h.forward(w.qkv + b * t * 3 * dim, w.probs + b * heads * t * t, w.heads + b * t * dim);
    }
    const float* wo = p + 3 * dim * dim + 3 * dim;
    gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, dim, dim, w.heads, dim, wo, dim,
              wo + dim * dim, args.output.data(), dim);
  }

  void backward(const backward_args& args) const {
    const std::size_t t = args.in_shape.channels * args.in_shape.height;
    const std::size_t n = args.batch * t;
    check(args.grad_output.size(), n * dim, "grad_output");
    check(args.grads.size(), 4 * dim * dim + 4 * dim, "grads");
    if (n == 0) {
      return;
    }
    const parts w = layout(t, args.batch, args.workspace.data());
    const float* p = args.params.data();
    const float* wo = p + 3 * dim * dim + 3 * dim;
    float* g = args.grads.data();
    float* g_wo = g + 3 * dim * dim + 3 * dim;
    const float* dy = args.grad_output.data();
    // The output projection: dWo += dY^T heads, dbo += column sums, d heads = dY Wo.
    gemm({.transpose_a = true}, dim, dim, n, 1.0f, dy, dim, w.heads, dim, 1.0f, g_wo, dim);
    add_column_sums(dy, n, dim, g_wo + dim * dim);
    gemm({}, n, dim, dim, 1.0f, dy, dim, wo, dim, 0.0f, w.grad_heads, dim);
    const detail::attention_heads h{.tokens = t, .heads = heads, .head_dim = dim / heads};
    for (std::size_t b = 0; b < args.batch; ++b) {
      h.backward(w.qkv + b * t * 3 * dim, w.probs + b * heads * t * t, w.grad_heads + b * t * dim,
                 w.grad_qkv + b * t * 3 * dim, w.scratch);
    }
    // The projections: dW += dQKV^T X, db += column sums, dX = dQKV W.
    gemm({.transpose_a = true}, 3 * dim, dim, n, 1.0f, w.grad_qkv, 3 * dim, args.input.data(), dim,
         1.0f, g, dim);
    add_column_sums(w.grad_qkv, n, 3 * dim, g + 3 * dim * dim);
    if (!args.grad_input.empty()) {
      check(args.grad_input.size(), n * dim, "grad_input");
      gemm({}, n, dim, 3 * dim, 1.0f, w.grad_qkv, 3 * dim, p, dim, 0.0f, args.grad_input.data(),
           dim);
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

  parts layout(std::size_t t, std::size_t batch, float* w) const {
    parts out{};
    out.qkv = w;
    out.probs = out.qkv + batch * t * 3 * dim;
    out.heads = out.probs + batch * heads * t * t;
    out.grad_heads = out.heads + batch * t * dim;
    out.grad_qkv = out.grad_heads + batch * t * dim;
    out.scratch = out.grad_qkv + batch * t * 3 * dim;
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
