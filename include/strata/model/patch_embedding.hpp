// SPDX-License-Identifier: Apache-2.0
#pragma once

// patch_embedding: cuts an image into square patches and maps each to a token, the input
// layer of a vision transformer.
//
//   strata::model::patch_embedding{.patch = 7, .dim = 64}   // 1 x 28 x 28 -> 1 x 16 x 64
//
// An input of channels x height x width (height and width multiples of `patch`) gives
// tokens = (height / patch) x (width / patch) rows of `dim` features: 1 x tokens x dim. Token t
// is the patch in row t / (width / patch), column t % (width / patch); its vector is the patch's
// pixels in channel, row, column order (channels x patch x patch values), mapped by
// y = v W^T + b, plus a learned position embedding of the token when .positions.
//
// Parameters, in this order: "weight" (dim x channels patch^2, Xavier uniform), "bias" (1 x
// dim, zeros), with .positions "positions" (tokens x dim, U(-1/sqrt(dim), 1/sqrt(dim)), no
// weight decay). Saved state: the patch vectors of the batch (batch x tokens x channels
// patch^2 floats), which backward reuses for the input gradient.

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/gemm.hpp"

namespace strata::model {

struct patch_embedding {
  using layer_category = layer_tag;

  std::size_t patch = 0;  // side of a square patch, at least 1
  std::size_t dim = 0;    // features per token, at least 1
  bool positions = true;  // add a learned embedding per token position

  sample_shape output_shape(const sample_shape& in) const {
    if (patch == 0 || dim == 0) {
      throw std::invalid_argument("patch_embedding: patch and dim must be at least 1, got " +
                                  std::to_string(patch) + " and " + std::to_string(dim));
    }
    if (in.height % patch != 0 || in.width % patch != 0) {
      throw std::invalid_argument("patch_embedding: input " + to_string(in) +
                                  " is not a whole number of " + std::to_string(patch) + "x" +
                                  std::to_string(patch) + " patches");
    }
    return sample_shape{.channels = 1, .height = tokens(in), .width = dim};
  }

  std::vector<param_spec> parameters(const sample_shape& in) const {
    output_shape(in);
    std::vector<param_spec> specs{{.name = "weight",
                                   .rows = dim,
                                   .cols = patch_size(in),
                                   .init = init_kind::xavier_uniform,
                                   .fan_in = patch_size(in),
                                   .fan_out = dim,
                                   .weight_decay = true},
                                  {.name = "bias",
                                   .rows = 1,
                                   .cols = dim,
                                   .init = init_kind::zeros,
                                   .fan_in = patch_size(in),
                                   .fan_out = dim,
                                   .weight_decay = false}};
    if (positions) {
      specs.push_back({.name = "positions",
                       .rows = tokens(in),
                       .cols = dim,
                       .init = init_kind::uniform_fan_in,
                       .fan_in = dim,
                       .fan_out = dim,
                       .weight_decay = false});
    }
    return specs;
  }

  std::size_t workspace_elements(const sample_shape& in, std::size_t batch) const {
    output_shape(in);
    return batch * in.elements();
  }

  layer_cost cost(const sample_shape& in) const {
    const auto products = static_cast<double>(tokens(in) * patch_size(in) * dim);
    return {.forward_flops = 2.0 * products,
            .backward_flops = 4.0 * products,
            .activation_bytes = (tokens(in) * dim + in.elements()) * sizeof(float)};
  }

  void forward(const forward_args& args) const {
    const sample_shape in = args.in_shape;
    const std::size_t t = tokens(in);
    const std::size_t k = patch_size(in);
    check(args.input.size(), args.batch * in.elements(), "input");
    check(args.output.size(), args.batch * t * dim, "output");
    check(args.workspace.size(), args.batch * in.elements(), "workspace");
    if (args.batch == 0) {
      return;
    }
    gather(in, args.batch, args.input.data(), args.workspace.data());
    gemm_bias({.transpose_b = true, .bfloat16_inputs = args.storage == dtype::bfloat16},
              args.batch * t, dim, k, args.workspace.data(), k, args.params.data(), k,
              args.params.data() + dim * k, args.output.data(), dim);
    if (positions) {
      const float* pos = args.params.data() + dim * k + dim;
      for (std::size_t b = 0; b < args.batch; ++b) {
        float* y = args.output.data() + b * t * dim;
        for (std::size_t i = 0; i < t * dim; ++i) {
          y[i] += pos[i];
        }
      }
    }
  }

  // The workspace's patch vectors give the weight gradient; then the patch vectors' gradient
  // overwrites them and is scattered back to the pixels.
  void backward(const backward_args& args) const {
    const sample_shape in = args.in_shape;
    const std::size_t t = tokens(in);
    const std::size_t k = patch_size(in);
    check(args.grad_output.size(), args.batch * t * dim, "grad_output");
    check(args.grads.size(), dim * k + dim + (positions ? t * dim : 0), "grads");
    if (args.batch == 0) {
      return;
    }
    const std::size_t n = args.batch * t;
    const float* dy = args.grad_output.data();
    float* dw = args.grads.data();
    gemm({.transpose_a = true}, dim, k, n, 1.0f, dy, dim, args.workspace.data(), k, 1.0f, dw, k);
    float* db = dw + dim * k;
    float* dpos = db + dim;
    for (std::size_t r = 0; r < n; ++r) {
      const float* row = dy + r * dim;
      float* dp = dpos + (r % t) * dim;
      for (std::size_t j = 0; j < dim; ++j) {
        db[j] += row[j];
        if (positions) {
          dp[j] += row[j];
        }
      }
    }
    if (args.grad_input.empty()) {
      return;
    }
    check(args.grad_input.size(), args.batch * in.elements(), "grad_input");
    gemm({}, n, k, dim, 1.0f, dy, dim, args.params.data(), k, 0.0f, args.workspace.data(), k);
    scatter(in, args.batch, args.workspace.data(), args.grad_input.data());
  }

  friend bool operator==(const patch_embedding&, const patch_embedding&) = default;

 private:
  std::size_t tokens(const sample_shape& in) const {
    return (in.height / patch) * (in.width / patch);
  }
  std::size_t patch_size(const sample_shape& in) const { return in.channels * patch * patch; }

  // Copies pixels into patch vectors (to = true) or back (to = false): the same walk both ways.
  template <bool ToPatches>
  void walk(const sample_shape& in, std::size_t batch, const float* from, float* to) const {
    const std::size_t across = in.width / patch;
    const std::size_t t = tokens(in);
    const std::size_t k = patch_size(in);
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t token = 0; token < t; ++token) {
        const std::size_t y0 = (token / across) * patch;
        const std::size_t x0 = (token % across) * patch;
        std::size_t v = (b * t + token) * k;
        for (std::size_t c = 0; c < in.channels; ++c) {
          for (std::size_t dy = 0; dy < patch; ++dy) {
            const std::size_t pixel =
                b * in.elements() + c * in.plane() + (y0 + dy) * in.width + x0;
            for (std::size_t dx = 0; dx < patch; ++dx, ++v) {
              if constexpr (ToPatches) {
                to[v] = from[pixel + dx];
              } else {
                to[pixel + dx] = from[v];
              }
            }
          }
        }
      }
    }
  }
  void gather(const sample_shape& in, std::size_t batch, const float* pixels,
              float* vectors) const {
    walk<true>(in, batch, pixels, vectors);
  }
  void scatter(const sample_shape& in, std::size_t batch, const float* vectors,
               float* pixels) const {
    walk<false>(in, batch, vectors, pixels);
  }

  static void check(std::size_t got, std::size_t want, const char* what) {
    if (got != want) {
      throw std::invalid_argument(std::string("patch_embedding: ") + what + " holds " +
                                  std::to_string(got) + " floats, expected " +
                                  std::to_string(want));
    }
  }
};

inline std::string to_string(const patch_embedding& l) {
  return "patch_embedding{.patch = " + std::to_string(l.patch) +
         ", .dim = " + std::to_string(l.dim) +
         ", .positions = " + (l.positions ? "true" : "false") + "}";
}

static_assert(check_layer<patch_embedding>());

}  // namespace strata::model
