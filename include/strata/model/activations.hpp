// SPDX-License-Identifier: Apache-2.0
#pragma once

// Elementwise activations over any shape: the output has the input's shape. Backward reads the
// input forward saw (args.input), so neither keeps saved state.
//
//   relu{}: y = max(x, 0); the derivative at x = 0 is taken as 0.
//   gelu{}: the tanh approximation of GELU (Hendrycks and Gimpel),
//           y = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))),
//           not the erf form; it differs from that by under 1e-3 everywhere.

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <Eigen/Core>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

namespace detail {

inline void check_activation_shape(const char* layer, const sample_shape& in) {
  if (in.channels == 0 || in.height == 0 || in.width == 0) {
    throw std::invalid_argument(std::string(layer) +
                                ": input shape must have channels, height and width of at least "
                                "1, got " +
                                to_string(in));
  }
}

inline void check_activation_args(const forward_args& args) {
  [[maybe_unused]] const std::size_t n = args.batch * args.in_shape.elements();
  assert(args.input.size() == n && args.output.size() == n &&
         "model: an activation's input and output must hold batch x elements floats");
}

inline void check_activation_args(const backward_args& args) {
  [[maybe_unused]] const std::size_t n = args.batch * args.in_shape.elements();
  assert(args.input.size() == n && args.grad_output.size() == n &&
         (args.grad_input.empty() || args.grad_input.size() == n) &&
         "model: an activation's input, grad_output and grad_input must hold batch x elements "
         "floats");
}

// out[i] = keep[i] > 0 ? v[i] : +0.0f, through a bit mask so that no optimisation level or
// instruction set turns it into a branch: a branch on the sign of activations mispredicts about
// half the time (GCC 12 without -march=native: 1.4 ms against 0.1 ms for 256 x 1024 floats).
// out may be v or keep.
inline void keep_where_positive(const float* keep, const float* v, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, v + i, sizeof bits);
    bits &= 0U - static_cast<std::uint32_t>(keep[i] > 0.0f);
    std::memcpy(out + i, &bits, sizeof bits);
  }
}

// out[i] = v[i] x scale where keep[i] > 0, else +0, branch-free as keep_where_positive. out may
// be v or keep.
inline void keep_where_positive_scaled(const float* keep, const float* v, float scale, float* out,
                                       std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float scaled = v[i] * scale;
    std::uint32_t bits = 0;
    std::memcpy(&bits, &scaled, sizeof bits);
    bits &= 0U - static_cast<std::uint32_t>(keep[i] > 0.0f);
    std::memcpy(out + i, &bits, sizeof bits);
  }
}

// sums[i] += row[i] for i < n (the two do not overlap).
inline void add_row(const float* __restrict row, float* __restrict sums, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    sums[i] += row[i];
  }
}

// The largest |x[i]| over n floats, or +inf when one of them is not finite (inf or NaN): the
// magnitude bits taken as unsigned integers order the non-negative floats, inf next, every NaN
// above it. Branch-free; 0 for n = 0.
inline float max_magnitude(const float* x, std::size_t n) noexcept {
  constexpr std::size_t lanes = 16;
  std::uint32_t most[lanes] = {};
  const std::size_t whole = n - n % lanes;
  for (std::size_t i = 0; i < whole; i += lanes) {
    for (std::size_t j = 0; j < lanes; ++j) {
      std::uint32_t bits = 0;
      std::memcpy(&bits, x + i + j, sizeof bits);
      most[j] = std::max(most[j], bits & 0x7fffffffU);
    }
  }
  std::uint32_t all = 0;
  for (std::size_t i = whole; i < n; ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, x + i, sizeof bits);
    all = std::max(all, bits & 0x7fffffffU);
  }
  for (const std::uint32_t m : most) {
    all = std::max(all, m);
  }
  if (all >= 0x7f800000U) {
    return std::numeric_limits<float>::infinity();
  }
  float magnitude = 0.0f;
  std::memcpy(&magnitude, &all, sizeof magnitude);
  return magnitude;
}

// The tanh approximation of GELU and its derivative, over spans. tanh is Eigen's vectorised one
// (a rational approximation, under Eigen's default EIGEN_FAST_MATH; GELU within 2e-6 of the
// formula through std::tanh in double, its derivative within 1e-5, tested): libm's scalar tanhf
// took half of a small vision transformer's step. The spans are worked in aligned blocks of a
// fixed size, the last one padded with zeros, so every element takes the same packet path: an
// element's value never depends on its index, the span's length or its address (a scalar tail
// would round differently).
struct gelu_tanh {
  static constexpr float scale = 0.7978845608028654f;  // sqrt(2 / pi)
  static constexpr float cubic = 0.044715f;
  static constexpr std::size_t block_size = 64;
  using block = Eigen::Array<float, block_size, 1>;

  // y[i] = gelu(x[i]); y may be x.
  static void values(const float* x, float* y, std::size_t n) {
    block in;
    for (std::size_t at = 0; at < n; at += block_size) {
      const std::size_t m = load(x + at, n - at, in);
      const block t = (scale * (in + cubic * in.cube())).tanh();
      const block out = 0.5f * in * (1.0f + t);
      std::copy_n(out.data(), m, y + at);
    }
  }

  // g[i] = dy[i] * gelu'(x[i]); g may be dy. d/dx [x/2 (1 + tanh u)] = (1 + tanh u) / 2 +
  // x/2 (1 - tanh^2 u) du/dx, du/dx = sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
  static void gradients(const float* x, const float* dy, float* g, std::size_t n) {
    block in;
    block d_out;
    for (std::size_t at = 0; at < n; at += block_size) {
      const std::size_t m = load(x + at, n - at, in);
      load(dy + at, n - at, d_out);
      const block x2 = in.square();
      const block t = (scale * (in + cubic * x2 * in)).tanh();
      const block du = scale * (1.0f + 3.0f * cubic * x2);
      const block out = d_out * (0.5f * (1.0f + t) + 0.5f * in * (1.0f - t.square()) * du);
      std::copy_n(out.data(), m, g + at);
    }
  }

  static float value(float x) {
    float y = 0.0f;
    values(&x, &y, 1);
    return y;
  }

  static float derivative(float x) {
    const float one = 1.0f;
    float g = 0.0f;
    gradients(&x, &one, &g, 1);
    return g;
  }

 private:
  // Copies up to one block from `from` (`left` floats remain there), zeros after; how many.
  static std::size_t load(const float* from, std::size_t left, block& to) {
    const std::size_t m = left < block_size ? left : block_size;
    std::copy_n(from, m, to.data());
    std::fill(to.data() + m, to.data() + block_size, 0.0f);
    return m;
  }
};

}  // namespace detail

struct relu {
  using layer_category = layer_tag;

  sample_shape output_shape(const sample_shape& in) const {
    detail::check_activation_shape("relu", in);
    return in;
  }

  // One compare per element each way.
  layer_cost cost(const sample_shape& in) const {
    const auto n = static_cast<double>(in.elements());
    return {
        .forward_flops = n, .backward_flops = n, .activation_bytes = in.elements() * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    detail::check_activation_args(args);
    detail::keep_where_positive(args.input.data(), args.input.data(), args.output.data(),
                                args.input.size());
  }

  void backward(const backward_args& args) const {
    detail::check_activation_args(args);
    if (args.grad_input.empty()) {
      return;
    }
    detail::keep_where_positive(args.input.data(), args.grad_output.data(), args.grad_input.data(),
                                args.input.size());
  }

  friend bool operator==(const relu&, const relu&) = default;
};

inline std::string to_string(const relu&) {
  return "relu{}";
}

static_assert(check_layer<relu>());

struct gelu {
  using layer_category = layer_tag;

  sample_shape output_shape(const sample_shape& in) const {
    detail::check_activation_shape("gelu", in);
    return in;
  }

  // Counting tanh as one flop: 9 per element forward, 18 backward (the derivative, which
  // recomputes tanh, and the product with the incoming gradient).
  layer_cost cost(const sample_shape& in) const {
    const auto n = static_cast<double>(in.elements());
    return {.forward_flops = 9.0 * n,
            .backward_flops = 18.0 * n,
            .activation_bytes = in.elements() * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    detail::check_activation_args(args);
    detail::gelu_tanh::values(args.input.data(), args.output.data(), args.input.size());
  }

  void backward(const backward_args& args) const {
    detail::check_activation_args(args);
    if (args.grad_input.empty()) {
      return;
    }
    detail::gelu_tanh::gradients(args.input.data(), args.grad_output.data(), args.grad_input.data(),
                                 args.input.size());
  }

  friend bool operator==(const gelu&, const gelu&) = default;
};

inline std::string to_string(const gelu&) {
  return "gelu{}";
}

static_assert(check_layer<gelu>());

}  // namespace strata::model
