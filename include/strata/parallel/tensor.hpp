// SPDX-License-Identifier: Apache-2.0
#pragma once

// Tensor parallelism: layers whose matrices are divided over the ranks of a tensor-parallel
// group (requirement 10 of model/concepts.hpp), and the group a layer reaches through
// forward_args::tensor.
//
//   column_parallel_linear{.in = 64, .out = 256}   // rank r holds rows of W (outputs)
//   row_parallel_linear{.in = 256, .out = 64}      // rank r holds columns of W (inputs)
//   parallel_mlp{.dim = 64, .hidden = 256}         // column, GELU, row: one reduction each way
//   model::self_attention{.dim = 64, .heads = 4}   // heads split (model/attention.hpp)
//
// Every layer's input and output are whole on every rank of the group, so they sit in a
// sequential like any other layer, and with a group of one they are the unsplit layer. Inside,
// the two conjugate operators of tensor-parallel matrix products:
//   - into a column-split product: forward the identity (each rank has the whole input), backward
//     an all-reduce (the input's gradient is the sum of every rank's part);
//   - out of a row-split product: forward an all-reduce (the output is the sum of every rank's
//     partial product), backward the identity.
// column_parallel_linear alone all-gathers its outputs and row_parallel_linear alone takes its
// slice of a whole input, each one more collective than inside parallel_mlp, which keeps the
// hidden activations split from one product to the next.
//
// Initialization: every parameter is drawn as the whole tensor and each rank keeps its slice
// (param_store::initialize), so tensor_parallel_size 1, 2 and 4 start from the same model.

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/activations.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/gemm.hpp"

namespace strata::parallel {

// model::tensor_comm over a comm backend's communicator of the tensor-parallel group.
template <class Comm>
class comm_tensor_group final : public model::tensor_comm {
 public:
  explicit comm_tensor_group(Comm& group) : group_(&group) {}
  void all_reduce_sum(std::span<float> values) override {
    group_->all_reduce(values.data(), values.data(), values.size(), dtype::float32,
                       comm::reduce_op::sum);
  }
  void all_gather(std::span<const float> mine, std::span<float> all) override {
    group_->all_gather(mine.data(), all.data(), mine.size(), dtype::float32);
  }
  // The context a layer gets: this rank's place and this group.
  model::tensor_context context() {
    return {.place = {.rank = static_cast<std::size_t>(group_->rank()),
                      .size = static_cast<std::size_t>(group_->size())},
            .comm = this};
  }

 private:
  Comm* group_;
};

namespace detail {

[[noreturn]] inline void tensor_throw(const char* layer, const std::string& message) {
  throw std::invalid_argument(std::string(layer) + ": " + message);
}

inline void tensor_check(const char* layer, std::size_t got, std::size_t want, const char* what) {
  if (got != want) {
    tensor_throw(layer, std::string(what) + " holds " + std::to_string(got) + " floats, expected " +
                            std::to_string(want));
  }
}

// The part of n a group of `place.size` gives each rank; n must divide.
inline std::size_t tensor_part(const char* layer, const char* what, std::size_t n,
                               const model::tensor_place& place) {
  if (place.size == 0 || n % place.size != 0) {
    tensor_throw(layer,
                 std::string(what) + " = " + std::to_string(n) +
                     " does not split over tensor_parallel_size = " + std::to_string(place.size));
  }
  return n / place.size;
}

// Rows of a layer's product for a sample: channels x height when the width is `width` and the
// sample has more rows (tokens), else 1 (a flat vector of `width` elements).
inline std::size_t tensor_rows(const sample_shape& in, std::size_t width) {
  return in.width == width && in.elements() != width ? in.channels * in.height : 1;
}

inline sample_shape tensor_output_shape(const char* layer, const sample_shape& in, std::size_t from,
                                        std::size_t to) {
  if (from == 0 || to == 0) {
    tensor_throw(layer, "in and out must be at least 1");
  }
  if (in.elements() == from) {
    return {.channels = 1, .height = 1, .width = to};
  }
  if (in.width == from) {
    return {.channels = in.channels, .height = in.height, .width = to};
  }
  tensor_throw(layer, "input " + to_string(in) + " has neither " + std::to_string(from) +
                          " elements nor a width of " + std::to_string(from));
}

inline void add_column_sums(const float* m, std::size_t rows, std::size_t cols, float* into) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      into[c] += m[r * cols + c];
    }
  }
}

inline void add_bias(float* m, std::size_t rows, std::size_t cols, const float* bias) {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      m[r * cols + c] += bias[c];
    }
  }
}

inline model::param_spec tensor_matrix(const char* name, std::size_t rows, std::size_t cols,
                                       model::tensor_split split) {
  return {.name = name,
          .rows = rows,
          .cols = cols,
          .init = model::init_kind::kaiming_uniform,
          .fan_in = cols,
          .fan_out = rows,
          .weight_decay = true,
          .split = split};
}

inline model::param_spec tensor_bias(const char* name, std::size_t n, std::size_t fan_in,
                                     model::tensor_split split) {
  return {.name = name,
          .rows = 1,
          .cols = n,
          .init = model::init_kind::uniform_fan_in,
          .fan_in = fan_in,
          .fan_out = n,
          .weight_decay = false,
          .split = split};
}

// Copies columns [first, first + width) of an n x cols matrix into an n x width one, or back.
inline void copy_columns(const float* from, std::size_t n, std::size_t from_cols, std::size_t first,
                         std::size_t width, float* to) {
  for (std::size_t r = 0; r < n; ++r) {
    std::copy_n(from + r * from_cols + first, width, to + r * width);
  }
}

// From the group's gathered blocks (rank by rank, each n x width) to n x (size x width) rows.
inline void interleave_blocks(const float* blocks, std::size_t n, std::size_t width,
                              std::size_t size, float* out) {
  for (std::size_t k = 0; k < size; ++k) {
    for (std::size_t r = 0; r < n; ++r) {
      std::copy_n(blocks + (k * n + r) * width, width, out + r * size * width + k * width);
    }
  }
}

}  // namespace detail

// y = x W^T + b with W (out x in) split by rows over the group: rank r computes outputs
// [r out / p, (r + 1) out / p), then the group all-gathers them, so every rank has the whole y.
// Backward: each rank's part of the input gradient from its outputs' gradients, all-reduced.
// Parameters: "weight" (out x in, Kaiming uniform, split rows), with .bias "bias" (1 x out,
// split cols). Rows of a sample (tokens) map one by one, as in model::linear.
struct column_parallel_linear {
  using layer_category = model::layer_tag;
  static constexpr const char* name = "column_parallel_linear";

  std::size_t in = 0;
  std::size_t out = 0;
  bool bias = true;
  // false: no gather; rank r's outputs stay in their columns of y, the others zero (the class-
  // parallel output of parallel/class_parallel.hpp, read only by its loss).
  bool gather_output = true;

  sample_shape output_shape(const sample_shape& input) const {
    return detail::tensor_output_shape(name, input, in, out);
  }

  std::vector<model::param_spec> parameters(const sample_shape&) const {
    std::vector<model::param_spec> specs{
        detail::tensor_matrix("weight", out, in, model::tensor_split::rows)};
    if (bias) {
      specs.push_back(detail::tensor_bias("bias", out, in, model::tensor_split::cols));
    }
    return specs;
  }

  // This rank's outputs, and the gathered blocks (or their gradients) beside them.
  std::size_t workspace_elements(const sample_shape& input, std::size_t batch,
                                 const model::tensor_place& place) const {
    const std::size_t n = batch * detail::tensor_rows(input, in);
    const std::size_t part = detail::tensor_part(name, "out", out, place);
    return place.size == 1 ? 0 : n * part + (gather_output ? n * out : 0);
  }

  model::layer_cost cost(const sample_shape& input) const {
    const auto r = static_cast<double>(detail::tensor_rows(input, in));
    const auto weights = static_cast<double>(in) * static_cast<double>(out);
    return {.forward_flops = 2.0 * weights * r,
            .backward_flops = 4.0 * weights * r,
            .activation_bytes = detail::tensor_rows(input, in) * out * sizeof(float)};
  }

  void forward(const model::forward_args& args) const {
    const model::tensor_place place = args.tensor.place;
    const std::size_t n = args.batch * detail::tensor_rows(args.in_shape, in);
    const std::size_t part = detail::tensor_part(name, "out", out, place);
    detail::tensor_check(name, args.input.size(), n * in, "input");
    detail::tensor_check(name, args.output.size(), n * out, "output");
    detail::tensor_check(name, args.params.size(), part * in + (bias ? part : 0), "params");
    if (n == 0) {
      return;
    }
    const bool bf16 = args.storage == dtype::bfloat16;
    // Into its own columns of y when not gathered; else its block, gathered below.
    const bool in_place = place.size == 1 || !gather_output;
    float* mine = in_place ? args.output.data() + place.rank * part : args.workspace.data();
    const std::size_t ld = in_place ? out : part;
    if (place.size > 1 && !gather_output) {
      std::fill(args.output.begin(), args.output.end(), 0.0f);
    }
    if (bias) {
      model::gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, part, in,
                       args.input.data(), in, args.params.data(), in,
                       args.params.data() + part * in, mine, ld);
    } else {
      model::gemm({.transpose_b = true, .bfloat16_inputs = bf16}, n, part, in, 1.0f,
                  args.input.data(), in, args.params.data(), in, 0.0f, mine, ld);
    }
    if (!in_place) {
      float* blocks = args.workspace.data() + n * part;
      args.tensor.all_gather({mine, n * part}, {blocks, n * out});
      detail::interleave_blocks(blocks, n, part, place.size, args.output.data());
    }
  }

  void backward(const model::backward_args& args) const {
    const model::tensor_place place = args.tensor.place;
    const std::size_t n = args.batch * detail::tensor_rows(args.in_shape, in);
    const std::size_t part = detail::tensor_part(name, "out", out, place);
    detail::tensor_check(name, args.grad_output.size(), n * out, "grad_output");
    detail::tensor_check(name, args.grads.size(), part * in + (bias ? part : 0), "grads");
    if (n == 0) {
      return;
    }
    // This rank's columns of the output gradient.
    const float* dy = args.grad_output.data();
    if (place.size > 1) {
      detail::copy_columns(dy, n, out, place.rank * part, part, args.workspace.data());
      dy = args.workspace.data();
    }
    model::gemm({.transpose_a = true}, part, in, n, 1.0f, dy, part, args.input.data(), in, 1.0f,
                args.grads.data(), in);
    if (bias) {
      detail::add_column_sums(dy, n, part, args.grads.data() + part * in);
    }
    if (!args.grad_input.empty()) {
      detail::tensor_check(name, args.grad_input.size(), n * in, "grad_input");
      model::gemm({}, n, in, part, 1.0f, dy, part, args.params.data(), in, 0.0f,
                  args.grad_input.data(), in);
      args.tensor.all_reduce_sum(args.grad_input);
    }
  }

  friend bool operator==(const column_parallel_linear&, const column_parallel_linear&) = default;
};

// y = x W^T + b with W (out x in) split by columns over the group: rank r multiplies inputs
// [r in / p, (r + 1) in / p) of the whole x, the group all-reduces the partial products, then
// the bias (held whole) is added. Backward: every rank has the whole output gradient; its part
// of the input gradient is all-gathered into the whole. Parameters: "weight" (out x in, Kaiming
// uniform, split cols), with .bias "bias" (1 x out, whole).
struct row_parallel_linear {
  using layer_category = model::layer_tag;
  static constexpr const char* name = "row_parallel_linear";

  std::size_t in = 0;
  std::size_t out = 0;
  bool bias = true;

  sample_shape output_shape(const sample_shape& input) const {
    return detail::tensor_output_shape(name, input, in, out);
  }

  std::vector<model::param_spec> parameters(const sample_shape&) const {
    std::vector<model::param_spec> specs{
        detail::tensor_matrix("weight", out, in, model::tensor_split::cols)};
    if (bias) {
      specs.push_back(detail::tensor_bias("bias", out, in, model::tensor_split::none));
    }
    return specs;
  }

  // The input gradient's part and gathered blocks.
  std::size_t workspace_elements(const sample_shape& input, std::size_t batch,
                                 const model::tensor_place& place) const {
    const std::size_t n = batch * detail::tensor_rows(input, in);
    const std::size_t part = detail::tensor_part(name, "in", in, place);
    return place.size == 1 ? 0 : n * part + n * in;
  }

  model::layer_cost cost(const sample_shape& input) const {
    return column_parallel_linear{.in = in, .out = out, .bias = bias}.cost(input);
  }

  void forward(const model::forward_args& args) const {
    const model::tensor_place place = args.tensor.place;
    const std::size_t n = args.batch * detail::tensor_rows(args.in_shape, in);
    const std::size_t part = detail::tensor_part(name, "in", in, place);
    detail::tensor_check(name, args.input.size(), n * in, "input");
    detail::tensor_check(name, args.output.size(), n * out, "output");
    detail::tensor_check(name, args.params.size(), out * part + (bias ? out : 0), "params");
    if (n == 0) {
      return;
    }
    const bool bf16 = args.storage == dtype::bfloat16;
    const float* x = args.input.data() + place.rank * part;  // this rank's columns, stride in
    if (place.size == 1 && bias) {
      model::gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, out, part, x, in,
                       args.params.data(), part, args.params.data() + out * part,
                       args.output.data(), out);
      return;
    }
    model::gemm({.transpose_b = true, .bfloat16_inputs = bf16}, n, out, part, 1.0f, x, in,
                args.params.data(), part, 0.0f, args.output.data(), out);
    args.tensor.all_reduce_sum(args.output);
    if (bias) {
      detail::add_bias(args.output.data(), n, out, args.params.data() + out * part);
    }
  }

  void backward(const model::backward_args& args) const {
    const model::tensor_place place = args.tensor.place;
    const std::size_t n = args.batch * detail::tensor_rows(args.in_shape, in);
    const std::size_t part = detail::tensor_part(name, "in", in, place);
    detail::tensor_check(name, args.grad_output.size(), n * out, "grad_output");
    detail::tensor_check(name, args.grads.size(), out * part + (bias ? out : 0), "grads");
    if (n == 0) {
      return;
    }
    const float* dy = args.grad_output.data();
    const float* x = args.input.data() + place.rank * part;
    model::gemm({.transpose_a = true}, out, part, n, 1.0f, dy, out, x, in, 1.0f, args.grads.data(),
                part);
    if (bias) {
      detail::add_column_sums(dy, n, out, args.grads.data() + out * part);
    }
    if (!args.grad_input.empty()) {
      detail::tensor_check(name, args.grad_input.size(), n * in, "grad_input");
      float* mine = place.size == 1 ? args.grad_input.data() : args.workspace.data();
      model::gemm({}, n, part, out, 1.0f, dy, out, args.params.data(), part, 0.0f, mine, part);
      if (place.size > 1) {
        float* blocks = args.workspace.data() + n * part;
        args.tensor.all_gather({mine, n * part}, {blocks, n * in});
        detail::interleave_blocks(blocks, n, part, place.size, args.grad_input.data());
      }
    }
  }

  friend bool operator==(const row_parallel_linear&, const row_parallel_linear&) = default;
};

// A transformer's MLP: y = GELU(x U^T + c) D^T + d, U (hidden x dim) split by rows and D
// (dim x hidden) by columns, so each rank keeps its hidden / p activations from one product to
// the next and the group all-reduces once forward (D's partial products) and once backward
// (the input gradient). Parameters: "up_weight" (hidden x dim, split rows), "up_bias" (1 x
// hidden, split cols), "down_weight" (dim x hidden, split cols), "down_bias" (1 x dim, whole);
// Kaiming uniform weights. Rows of a sample (tokens) map one by one. Saved state: this rank's
// pre-activations and activations (2 x hidden / p per row) and room for their gradient.
struct parallel_mlp {
  using layer_category = model::layer_tag;
  static constexpr const char* name = "parallel_mlp";

  std::size_t dim = 0;
  std::size_t hidden = 0;

  sample_shape output_shape(const sample_shape& input) const {
    if (hidden == 0) {
      detail::tensor_throw(name, "hidden must be at least 1");
    }
    return detail::tensor_output_shape(name, input, dim, dim);
  }

  std::vector<model::param_spec> parameters(const sample_shape& input) const {
    output_shape(input);
    using enum model::tensor_split;
    return {detail::tensor_matrix("up_weight", hidden, dim, rows),
            detail::tensor_bias("up_bias", hidden, dim, cols),
            detail::tensor_matrix("down_weight", dim, hidden, cols),
            detail::tensor_bias("down_bias", dim, hidden, none)};
  }

  std::size_t workspace_elements(const sample_shape& input, std::size_t batch,
                                 const model::tensor_place& place) const {
    const std::size_t n = batch * detail::tensor_rows(input, dim);
    return 3 * n * detail::tensor_part(name, "hidden", hidden, place);
  }

  model::layer_cost cost(const sample_shape& input) const {
    const auto r = static_cast<double>(detail::tensor_rows(input, dim));
    const auto weights = 2.0 * static_cast<double>(dim) * static_cast<double>(hidden);
    return {
        .forward_flops = 2.0 * weights * r,
        .backward_flops = 4.0 * weights * r,
        .activation_bytes = detail::tensor_rows(input, dim) * (2 * hidden + dim) * sizeof(float)};
  }

  void forward(const model::forward_args& args) const {
    const model::tensor_place place = args.tensor.place;
    const std::size_t n = args.batch * detail::tensor_rows(args.in_shape, dim);
    const std::size_t h = detail::tensor_part(name, "hidden", hidden, place);
    detail::tensor_check(name, args.input.size(), n * dim, "input");
    detail::tensor_check(name, args.output.size(), n * dim, "output");
    detail::tensor_check(name, args.params.size(), 2 * h * dim + h + dim, "params");
    detail::tensor_check(name, args.workspace.size(), 3 * n * h, "workspace");
    if (n == 0) {
      return;
    }
    const bool bf16 = args.storage == dtype::bfloat16;
    const float* up = args.params.data();
    const float* down = up + h * dim + h;
    float* pre = args.workspace.data();
    float* act = pre + n * h;
    model::gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, h, dim, args.input.data(),
                     dim, up, dim, up + h * dim, pre, h);
    model::detail::gelu_tanh::values(pre, act, n * h);
    if (place.size == 1) {
      model::gemm_bias({.transpose_b = true, .bfloat16_inputs = bf16}, n, dim, h, act, h, down, h,
                       down + dim * h, args.output.data(), dim);
      return;
    }
    model::gemm({.transpose_b = true, .bfloat16_inputs = bf16}, n, dim, h, 1.0f, act, h, down, h,
                0.0f, args.output.data(), dim);
    args.tensor.all_reduce_sum(args.output);
    detail::add_bias(args.output.data(), n, dim, down + dim * h);
  }

  void backward(const model::backward_args& args) const {
    const model::tensor_place place = args.tensor.place;
    const std::size_t n = args.batch * detail::tensor_rows(args.in_shape, dim);
    const std::size_t h = detail::tensor_part(name, "hidden", hidden, place);
    detail::tensor_check(name, args.grad_output.size(), n * dim, "grad_output");
    detail::tensor_check(name, args.grads.size(), 2 * h * dim + h + dim, "grads");
    if (n == 0) {
      return;
    }
    const float* up = args.params.data();
    const float* down = up + h * dim + h;
    float* g_up = args.grads.data();
    float* g_down = g_up + h * dim + h;
    const float* pre = args.workspace.data();
    const float* act = pre + n * h;
    float* d_hidden = args.workspace.data() + 2 * n * h;
    const float* dy = args.grad_output.data();
    // Down: dD += dY^T act, dd += column sums, d act = dY D.
    model::gemm({.transpose_a = true}, dim, h, n, 1.0f, dy, dim, act, h, 1.0f, g_down, h);
    detail::add_column_sums(dy, n, dim, g_down + dim * h);
    model::gemm({}, n, h, dim, 1.0f, dy, dim, down, h, 0.0f, d_hidden, h);
    model::detail::gelu_tanh::gradients(pre, d_hidden, d_hidden, n * h);
    // Up: dU += d pre^T x, dc += column sums, dx = d pre U, summed over the group.
    model::gemm({.transpose_a = true}, h, dim, n, 1.0f, d_hidden, h, args.input.data(), dim, 1.0f,
                g_up, dim);
    detail::add_column_sums(d_hidden, n, h, g_up + h * dim);
    if (!args.grad_input.empty()) {
      detail::tensor_check(name, args.grad_input.size(), n * dim, "grad_input");
      model::gemm({}, n, dim, h, 1.0f, d_hidden, h, up, dim, 0.0f, args.grad_input.data(), dim);
      args.tensor.all_reduce_sum(args.grad_input);
    }
  }

  friend bool operator==(const parallel_mlp&, const parallel_mlp&) = default;
};

inline std::string to_string(const column_parallel_linear& l) {
  return "column_parallel_linear{.in = " + std::to_string(l.in) +
         ", .out = " + std::to_string(l.out) + ", .bias = " + (l.bias ? "true" : "false") + "}";
}
inline std::string to_string(const row_parallel_linear& l) {
  return "row_parallel_linear{.in = " + std::to_string(l.in) + ", .out = " + std::to_string(l.out) +
         ", .bias = " + (l.bias ? "true" : "false") + "}";
}
inline std::string to_string(const parallel_mlp& l) {
  return "parallel_mlp{.dim = " + std::to_string(l.dim) +
         ", .hidden = " + std::to_string(l.hidden) + "}";
}

static_assert(model::check_layer<column_parallel_linear>());
static_assert(model::check_layer<row_parallel_linear>());
static_assert(model::check_layer<parallel_mlp>());

}  // namespace strata::parallel
