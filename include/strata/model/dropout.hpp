// SPDX-License-Identifier: Apache-2.0
#pragma once

// dropout: in training, zeroes each element with probability `rate` and scales the kept ones by
// 1 / (1 - rate), so the expected output equals the input; in evaluation
// (forward_args::training == false), the identity.
//
//   strata::model::dropout{.rate = 0.1}
//
// Randomness (concepts.hpp, requirement 3): sample b draws from args.rng_for(b), one 32-bit
// word per two elements in element order (the low 16 bits for the first, the high 16 for the
// second), and keeps an element when its 16-bit draw is at least t = round(rate x 65536). The
// kept ones are scaled by 65536 / (65536 - t), the inverse of the exact keep probability, so the
// expected output equals the input (t / 65536 differs from rate by at most 2^-17). So a sample's
// mask depends only on (seed, step, layer, sample id): the same args give the same mask, on any
// rank, micro-batch or recomputation, and another step or seed gives another. Forward stores
// the mask as the factor applied to each element (0 or the scale) in the workspace, batch x
// elements floats, and backward applies the same factors to the incoming gradient. Evaluation
// sets every factor to 1, so a backward after it is the identity too.

#include <algorithm>
#include <bit>
#include <cassert>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/format.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

namespace detail {

// Each word's low 16 bits, then its high 16 bits, into `halves` (twice as long): on a
// little-endian host a copy of the bytes, elsewhere word by word.
inline void split_halves(std::span<const std::uint32_t> words, std::span<std::uint16_t> halves) {
  assert(halves.size() == 2 * words.size());
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(halves.data(), words.data(), words.size_bytes());
  } else {
    for (std::size_t p = 0; p < words.size(); ++p) {
      halves[2 * p] = static_cast<std::uint16_t>(words[p] & 0xFFFFu);
      halves[2 * p + 1] = static_cast<std::uint16_t>(words[p] >> 16);
    }
  }
}

// Elements per call of dropout_apply in the forward loop: a fixed count, which the compiler
// vectorizes at -O2 too (whole vectors of 4, 8 or 16 floats, no alias checks or remainder).
inline constexpr std::size_t dropout_block = 64;

// N elements: factor = keep_scale where the draw is at least the threshold, else 0; mask =
// factor, out = in x factor. The four ranges must not overlap.
template <std::size_t N>
inline void dropout_apply(const std::uint16_t* __restrict draws, const float* __restrict in,
                          float* __restrict mask, float* __restrict out, std::uint32_t threshold,
                          float keep_scale) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    const float factor = draws[i] >= threshold ? keep_scale : 0.0f;
    mask[i] = factor;
    out[i] = in[i] * factor;
  }
}

// The same in place and without a mask: data = data x factor.
template <std::size_t N>
inline void dropout_apply_in_place(const std::uint16_t* __restrict draws, float* __restrict data,
                                   std::uint32_t threshold, float keep_scale) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    data[i] = data[i] * (draws[i] >= threshold ? keep_scale : 0.0f);
  }
}

// The drop threshold t = round(rate x 65536) on the 16-bit draws, and the kept elements'
// scale 65536 / (65536 - t) (dropout's comment).
inline std::uint32_t dropout_threshold(double rate) noexcept {
  return static_cast<std::uint32_t>(rate * 65536.0 + 0.5);
}
inline float dropout_keep_scale(std::uint32_t threshold) noexcept {
  return static_cast<float>(65536.0 / (65536.0 - threshold));
}

// One sample's 16-bit draws, `elements` of them (rounded up to even), from `rng`: its words in
// one bulk draw (rng_stream::fill: the same words, vectorized), split into their halves in
// element order (low half first), so that the loops over them are one compare, select and
// multiply per element, which the compiler vectorizes. Per-thread scratch, valid until the
// thread's next call.
inline const std::uint16_t* dropout_draws(rng_stream rng, std::size_t elements) {
  thread_local std::vector<std::uint32_t> words;
  thread_local std::vector<std::uint16_t> draws;
  words.resize((elements + 1) / 2);
  draws.resize(2 * words.size());
  rng.fill(words);
  split_halves(words, draws);
  return draws.data();
}

// One sample's dropout in place (no mask kept): data[i] x its factor, the draws of `rng`.
inline void dropout_sample_in_place(rng_stream rng, float* data, std::size_t elements,
                                    std::uint32_t threshold, float keep_scale) {
  const std::uint16_t* draws = dropout_draws(rng, elements);
  const std::size_t whole = elements - elements % dropout_block;
  for (std::size_t i = 0; i < whole; i += dropout_block) {
    dropout_apply_in_place<dropout_block>(draws + i, data + i, threshold, keep_scale);
  }
  for (std::size_t i = whole; i < elements; ++i) {
    dropout_apply_in_place<1>(draws + i, data + i, threshold, keep_scale);
  }
}

// The shortest text that reads back as the same value ("0.1", "nan").
inline std::string dropout_number(double value) {
  return format_shortest(value);
}

}  // namespace detail

struct dropout {
  using layer_category = layer_tag;

  double rate = 0.5;  // probability of dropping an element, in [0, 1)

  sample_shape output_shape(const sample_shape& in) const {
    if (!(rate >= 0.0 && rate < 1.0)) {
      throw std::invalid_argument("dropout: rate must be in [0, 1), got " +
                                  detail::dropout_number(rate));
    }
    if (in.channels == 0 || in.height == 0 || in.width == 0) {
      throw std::invalid_argument(
          "dropout: input shape must have channels, height and width of at least 1, got " +
          to_string(in));
    }
    return in;
  }

  // The mask: one factor per element of the batch.
  std::size_t workspace_elements(const sample_shape& in, std::size_t batch) const {
    return batch * in.elements();
  }

  // One multiply per element each way; the mask is kept beside the output.
  layer_cost cost(const sample_shape& in) const {
    const auto n = static_cast<double>(in.elements());
    return {.forward_flops = n,
            .backward_flops = n,
            .activation_bytes = 2 * in.elements() * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    const std::size_t elements = args.in_shape.elements();
    [[maybe_unused]] const std::size_t n = args.batch * elements;
    assert(args.input.size() == n && args.output.size() == n &&
           "dropout: input and output must hold batch x elements floats");
    assert(args.workspace.size() == n && "dropout: workspace must hold batch x elements floats");
    assert(rate >= 0.0 && rate < 1.0 && "dropout: rate must be in [0, 1)");
    if (!args.training) {
      std::copy(args.input.begin(), args.input.end(), args.output.begin());
      std::fill(args.workspace.begin(), args.workspace.end(), 1.0f);
      return;
    }
    const std::uint32_t threshold = detail::dropout_threshold(rate);
    const float keep_scale = detail::dropout_keep_scale(threshold);
    for (std::size_t b = 0; b < args.batch; ++b) {
      const std::uint16_t* draws = detail::dropout_draws(args.rng_for(b), elements);
      const float* in = args.input.data() + b * elements;
      float* out = args.output.data() + b * elements;
      float* mask = args.workspace.data() + b * elements;
      const std::size_t whole = elements - elements % detail::dropout_block;
      for (std::size_t i = 0; i < whole; i += detail::dropout_block) {
        detail::dropout_apply<detail::dropout_block>(draws + i, in + i, mask + i, out + i,
                                                     threshold, keep_scale);
      }
      for (std::size_t i = whole; i < elements; ++i) {
        detail::dropout_apply<1>(draws + i, in + i, mask + i, out + i, threshold, keep_scale);
      }
    }
  }

  void backward(const backward_args& args) const {
    [[maybe_unused]] const std::size_t n = args.batch * args.in_shape.elements();
    assert(args.grad_output.size() == n && args.workspace.size() == n &&
           (args.grad_input.empty() || args.grad_input.size() == n) &&
           "dropout: grad_output, workspace and grad_input must hold batch x elements floats");
    if (args.grad_input.empty()) {
      return;
    }
    for (std::size_t i = 0; i < args.grad_output.size(); ++i) {
      args.grad_input[i] = args.grad_output[i] * args.workspace[i];
    }
  }

  friend bool operator==(const dropout&, const dropout&) = default;
};

inline std::string to_string(const dropout& d) {
  return "dropout{.rate = " + detail::dropout_number(d.rate) + "}";
}

static_assert(check_layer<dropout>());

}  // namespace strata::model
