// SPDX-License-Identifier: Apache-2.0
#pragma once

// The model family's contract: a layer maps a batch of samples of one shape to a batch of
// another, over views of memory it does not own. Parameters live in the model's param_store
// (model/param_store.hpp), activations and the layer's saved state in buffers its container
// (sequential, a pipeline stage) allocates from the sizes the layer declares. So a layer is a
// const value: the same layer object serves every thread, micro-batch and recomputation.
//
// A layer L, with `const L& l`, `sample_shape in` and `std::size_t batch`, must:
//   1. opt in with `using layer_category = strata::model::layer_tag;`;
//   2. declare its output: `l.output_shape(in)` returns sample_shape, throwing
//      std::invalid_argument (naming the layer and the number) for inputs it cannot take;
//   3. run forward: `l.forward(args)` with `const forward_args& args`: read args.input
//      (batch x in), args.params; write all of args.output (batch x out) and whatever it needs
//      later into args.workspace. Deterministic: the same args give the same bits (randomness,
//      as in dropout, only from args.rng_for(sample));
//   4. run backward: `l.backward(args)` with `const backward_args& args`: ADD the parameter
//      gradients into args.grads (so micro-batches accumulate), and write all of
//      args.grad_input (batch x in) unless it is empty (the first layer's is not needed).
//      It may compute its parameter gradients in parts of at least args.progress.chunk
//      elements (when that is not 0; the last part may be smaller), calling args.progress(n)
//      once elements [0, n) are final;
// and may (the traits supply the defaults):
//   5. declare parameters: `l.parameters(in)` returns std::vector<param_spec>, laid out in that
//      order, contiguously, in args.params / args.grads (default: none);
//   6. declare saved state: `l.workspace_elements(in, batch)` floats kept from forward to
//      backward (default: 0);
//   7. estimate its cost per sample: `l.cost(in)` returns layer_cost (default: no flops, the
//      output's bytes), for the pipeline partitioner and the tuner;
//   8. write its parameter gradients instead of adding: `L::writes_grads` is a constant true
//      when backward honours args.write_grads: then args.grads hold nothing of this step yet
//      (any bits, NaN included) and backward writes every element of them, giving what adding
//      into zeros would (the same bits, but that a zero may be -0: a product whose terms are
//      all zero keeps their sign). It saves a pass over the gradients per step (param_store::
//      discard_grads). Default: false, and the container zeroes the layer's gradients first.
//   9. split its backward in two, for pipeline schedules that run the weight gradients later
//      (pipeline::zero_bubble_h1): `L::splits_backward` is a constant true when
//      `l.backward_input(args)` writes only args.grad_input and `l.backward_weight(args)` only
//      the parameter gradients (adding, or writing under write_grads; progress as backward),
//      each exactly as backward would. backward_weight comes after backward_input with the same
//      input and grad_output. Default: false, and the container runs the whole backward where
//      the input-gradient pass goes (a layer without parameters needs nothing more).
//  10. run tensor-parallel: a parameter whose param_spec::split is rows or cols is held in
//      slices by the ranks of a tensor-parallel group (rank r of p: rows, or columns,
//      [r n / p, (r + 1) n / p)); args.params and args.grads then hold this rank's slices
//      (local_spec), and args.tensor says the rank's place and reaches the group (all-reduce,
//      all-gather). The layer's input and output are whole on every rank of the group; what it
//      keeps between them may depend on the place: `l.workspace_elements(in, batch, place)`
//      taking a tensor_place is used where declared. Parameters with split none are held whole
//      by every rank of the group, which compute them alike.
//  11. bound its parameter gradients: where args.grad_bound is not null, store there a number
//      B such that every element of args.grads after the call is within B of the magnitude
//      bound it had before (a layer that adds products of finite, bounded factors knows one
//      from the factors); infinity whenever anything it read was not finite. Left as it is
//      (infinity), nothing is known: the trainer then checks the gradients for NaN and inf
//      itself (param_store::grad_bound, precision::fp32).
//
// Tier 2: a type that cannot be changed takes part by specializing enable_layer to true and
// layer_traits to adapt it; containers reach every layer only through layer_traits.
//
// A model M (sequential<...> is one; a pipeline stage will be another), with `const M& m`,
// must:
//   1. name its input and output: `m.input_shape()`, `m.output_shape()` return sample_shape;
//   2. make its parameters: `m.make_params()` returns a param_store-like object P (the flat
//      store of model/param_store.hpp);
//   3. make its activation memory: `m.make_workspace(capacity)` returns M::workspace_type, and
//      `m.workspace_floats(batch)` says how much that is before allocating;
//   4. run: `m.forward(w, p, input, batch, options)` returns std::span<const float> (the
//      output, valid until the next forward), and `m.backward(w, p, grad_output)` adds the
//      parameter gradients of the last forward into p's gradients. It may also take
//      `m.backward(w, p, grad_output, layer_done, part_done, chunk)`, calling layer_done(i)
//      once layer i's gradients (parameter group i) are complete, in decreasing i, and
//      part_done(i, n) when layer i reports its first n gradient elements final (grads_progress
//      with chunk), so that data parallelism can start communicating early;
//   5. estimate its cost: `m.costs()` returns one layer_cost per layer.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"

namespace strata::model {

struct layer_tag {};

// How a parameter starts (param_store::initialize).
enum class init_kind {
  zeros,
  ones,
  kaiming_uniform,  // U(-b, b), b = sqrt(6 / fan_in): for layers followed by ReLU
  kaiming_normal,   // N(0, 2 / fan_in)
  xavier_uniform,   // U(-b, b), b = sqrt(6 / (fan_in + fan_out))
  xavier_normal,    // N(0, 2 / (fan_in + fan_out))
  uniform_fan_in,   // U(-b, b), b = 1 / sqrt(fan_in): the usual bias init
};

inline std::string to_string(init_kind k) {
  switch (k) {
    case init_kind::zeros:
      return "zeros";
    case init_kind::ones:
      return "ones";
    case init_kind::kaiming_uniform:
      return "kaiming_uniform";
    case init_kind::kaiming_normal:
      return "kaiming_normal";
    case init_kind::xavier_uniform:
      return "xavier_uniform";
    case init_kind::xavier_normal:
      return "xavier_normal";
    case init_kind::uniform_fan_in:
      return "uniform_fan_in";
  }
  return "?";
}

// How a tensor-parallel group divides a parameter (requirement 10).
enum class tensor_split : std::uint8_t {
  none,  // every rank holds it whole
  rows,  // rank r of p holds rows [r rows / p, (r + 1) rows / p)
  cols,  // ... or those columns
};

inline std::string to_string(tensor_split s) {
  switch (s) {
    case tensor_split::none:
      return "none";
    case tensor_split::rows:
      return "rows";
    case tensor_split::cols:
      return "cols";
  }
  return "?";
}

// A rank's place in its tensor-parallel group.
struct tensor_place {
  std::size_t rank = 0;
  std::size_t size = 1;

  friend constexpr bool operator==(const tensor_place&, const tensor_place&) = default;
};

// What a layer reaches its tensor-parallel group through (parallel/tensor.hpp adapts any comm
// backend). Collective: every rank of the group calls it in the same order.
class tensor_comm {
 public:
  virtual ~tensor_comm() = default;
  // In place: every rank gets the element-wise sum of every rank's values.
  virtual void all_reduce_sum(std::span<float> values) = 0;
  // `all` (size x mine.size()) gets every rank's `mine`, rank 0's first.
  virtual void all_gather(std::span<const float> mine, std::span<float> all) = 0;
};

// A layer's view of its tensor-parallel group during forward and backward.
struct tensor_context {
  tensor_place place{};
  tensor_comm* comm = nullptr;  // null when place.size is 1

  void all_reduce_sum(std::span<float> values) const {
    if (place.size > 1) {
      comm->all_reduce_sum(values);
    }
  }
  void all_gather(std::span<const float> mine, std::span<float> all) const {
    if (place.size > 1) {
      comm->all_gather(mine, all);
    } else {
      std::copy(mine.begin(), mine.end(), all.begin());
    }
  }
};

// One parameter tensor of a layer.
struct param_spec {
  std::string name{};    // within the layer: "weight", "bias", ...
  std::size_t rows = 0;  // elements = rows x cols (a vector has rows = 1)
  std::size_t cols = 0;
  init_kind init = init_kind::zeros;
  std::size_t fan_in = 0;
  std::size_t fan_out = 0;
  bool weight_decay = true;                 // false for biases and normalisation scales
  tensor_split split = tensor_split::none;  // requirement 10

  std::size_t elements() const noexcept { return rows * cols; }
  friend bool operator==(const param_spec&, const param_spec&) = default;
};

// The slice of `spec` that rank place.rank holds (requirement 10): the whole spec for split none
// or a group of one. Throws std::invalid_argument, naming the tensor, when the split dimension is
// not a multiple of the group's size.
inline param_spec local_spec(const param_spec& spec, const tensor_place& place) {
  if (spec.split == tensor_split::none || place.size == 1) {
    return spec;
  }
  const std::size_t n = spec.split == tensor_split::rows ? spec.rows : spec.cols;
  if (place.size == 0 || n % place.size != 0) {
    throw std::invalid_argument(
        "tensor parallelism: parameter '" + spec.name + "' has " + std::to_string(n) + " " +
        to_string(spec.split) +
        ", not a multiple of tensor_parallel_size = " + std::to_string(place.size));
  }
  param_spec out = spec;
  (spec.split == tensor_split::rows ? out.rows : out.cols) = n / place.size;
  return out;
}

// The first row (split rows) or column (split cols) of that slice in the whole tensor; 0 for a
// tensor held whole.
inline std::size_t slice_first(const param_spec& spec, const tensor_place& place) {
  if (spec.split == tensor_split::none || place.size <= 1) {
    return 0;
  }
  const std::size_t n = spec.split == tensor_split::rows ? spec.rows : spec.cols;
  return place.rank * (n / place.size);
}

// The cost of one sample through a layer.
struct layer_cost {
  double forward_flops = 0.0;
  double backward_flops = 0.0;
  std::size_t activation_bytes = 0;  // output + saved state kept for backward, per sample

  friend bool operator==(const layer_cost&, const layer_cost&) = default;
  layer_cost& operator+=(const layer_cost& o) noexcept {
    forward_flops += o.forward_flops;
    backward_flops += o.backward_flops;
    activation_bytes += o.activation_bytes;
    return *this;
  }
};

// Where a layer's randomness comes from: one stream per (seed, step, sample, layer), so that a
// sample's dropout mask is the same whichever rank, micro-batch or recomputation runs it.
struct layer_rng_key {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;   // the optimizer step (low 32 bits)
  std::uint32_t layer = 0;  // the layer's index in its model (< 2^16)

  rng_stream stream(std::uint64_t sample_id) const noexcept {
    return rng_stream::for_sample(seed ^ 0xD1B54A32D192ED03ull, step,
                                  sample_id & rng_stream::max_sample_index,
                                  layer & rng_stream::max_substream);
  }
};

struct forward_args {
  std::size_t batch = 0;
  sample_shape in_shape{};
  sample_shape out_shape{};
  std::span<const float> input{};   // batch x in_shape.elements()
  std::span<float> output{};        // batch x out_shape.elements()
  std::span<const float> params{};  // the layer's parameters, in parameters() order
  std::span<float> workspace{};     // workspace_elements(in_shape, batch) floats
  bool training = true;             // false: evaluation (dropout off, ...)
  layer_rng_key rng{};
  std::span<const std::uint64_t> sample_ids{};  // per sample; empty: the position in the batch
  // run_options::storage: the type the model's activations and (mixed precision) parameters are
  // rounded through. A layer may hand it to its products (model::gemm's bfloat16_inputs).
  dtype storage = dtype::float32;
  tensor_context tensor{};  // requirement 10: this rank's tensor-parallel group

  // The stream of sample b of this batch.
  rng_stream rng_for(std::size_t b) const noexcept {
    return rng.stream(b < sample_ids.size() ? sample_ids[b] : b);
  }
};

// How a model's workspace keeps activations (a model may offer make_workspace(capacity, config)).
struct workspace_config {
  // 0: keep every layer's output and saved state from forward to backward. k > 0: activation
  // checkpointing in segments of k layers: keep only each segment's last output; backward
  // recomputes a segment's forward (the same deterministic inputs, so the same bits) just
  // before going back through it.
  std::size_t checkpoint_every = 0;
  // Keep what a separate weight-gradient pass needs (requirement 9): backward() then runs the
  // input-gradient pass of the layers that split their backward (the whole backward of the
  // others) and backward_weight() their weight pass. Not with checkpoint_every.
  bool split_backward = false;
  // The rank's place in its tensor-parallel group: tensor-parallel layers keep their slices'
  // activations (requirement 10).
  tensor_place tensor{};

  friend bool operator==(const workspace_config&, const workspace_config&) = default;
};

inline std::string to_string(const workspace_config& c) {
  return "workspace_config{.checkpoint_every = " + std::to_string(c.checkpoint_every) +
         ", .split_backward = " + (c.split_backward ? "true" : "false") +
         ", .tensor = " + std::to_string(c.tensor.rank) + " of " + std::to_string(c.tensor.size) +
         "}";
}

// Consecutive layers [first, last) of a model: what one pipeline stage (or one chunk of an
// interleaved stage) runs.
struct layer_range {
  std::size_t first = 0;
  std::size_t last = 0;

  constexpr std::size_t size() const noexcept { return last - first; }
  friend constexpr bool operator==(const layer_range&, const layer_range&) = default;
};

inline std::string to_string(const layer_range& r) {
  return "layers " + std::to_string(r.first) + ".." + std::to_string(r.last - 1);
}

// How one forward pass of a model runs.
struct run_options {
  bool training = true;
  std::uint64_t seed = 0;  // with step, keys the layers' randomness (dropout)
  std::uint32_t step = 0;
  std::span<const std::uint64_t> sample_ids{};  // per sample (dataset indices); empty: positions
  // The type activations are stored in: every layer output (forward) and input gradient
  // (backward) is rounded through it (core/round.hpp). float32: no rounding. Mixed precision
  // on the host sets float16 or bfloat16.
  dtype storage = dtype::float32;
  // The rank's tensor-parallel group, handed to every layer (requirement 10).
  tensor_context tensor{};
};

// Lets a layer say, during its backward, that a leading part of its parameter gradients is
// final before the rest is. Data parallelism sets it on the step's last backward to start
// reducing part of a large layer's gradients while the layer is still computing the rest; a
// layer may ignore it (the model reports every layer whole once its backward returns).
struct grads_progress {
  // Called with n: elements [0, n) of backward_args::grads hold their final values for this
  // backward. n does not decrease within one backward.
  void (*report)(void* context, std::size_t n) = nullptr;
  void* context = nullptr;
  // The part size the receiver is after, in elements: a layer that can compute its parameter
  // gradients in parts computes parts of at least this many and reports after each. 0: compute
  // them whole, nobody is listening.
  std::size_t chunk = 0;

  void operator()(std::size_t n) const {
    if (report != nullptr) {
      report(context, n);
    }
  }
};

struct backward_args {
  std::size_t batch = 0;
  sample_shape in_shape{};
  sample_shape out_shape{};
  std::span<const float> input{};        // as forward saw it
  std::span<const float> output{};       // as forward left it
  std::span<const float> grad_output{};  // batch x out_shape.elements()
  std::span<float> grad_input{};         // batch x in_shape.elements(); empty: not wanted
  std::span<const float> params{};
  std::span<float> grads{};        // same layout as params; ADD into it (but see write_grads)
  std::span<float> workspace{};    // as forward left it
  grads_progress progress{};       // optional reports of final leading parts of grads
  dtype storage = dtype::float32;  // as forward_args::storage
  // True only for layers whose traits say writes_grads() (requirement 8): grads hold no
  // contribution yet (any bits); WRITE every element instead of adding.
  bool write_grads = false;
  tensor_context tensor{};  // as forward_args::tensor
  // Requirement 11 (may be null): where the layer says by how much its call could have moved
  // any gradient's magnitude; the container sets it to infinity before the call.
  double* grad_bound = nullptr;
};

// The primary traits forward to the members; the optional ones fall back to the defaults.
template <class L>
struct layer_traits {
  // Requirement 8: whether backward honours backward_args::write_grads.
  static constexpr bool writes_grads() {
    if constexpr (requires { L::writes_grads; }) {
      // Anything else by that name (a function, an int) would read as true and let the layer
      // add into memory nobody zeroed.
      static_assert(std::is_same_v<std::remove_cv_t<decltype(L::writes_grads)>, bool>,
                    "model: a layer's writes_grads must be 'static constexpr bool writes_grads = "
                    "true;' (requirement 8)");
      return L::writes_grads;
    } else {
      return false;
    }
  }

  static sample_shape output_shape(const L& l, const sample_shape& in) requires requires {
    { l.output_shape(in) } -> std::convertible_to<sample_shape>;
  }
  { return l.output_shape(in); }

  static void forward(const L& l, const forward_args& a) requires requires { l.forward(a); }
  { l.forward(a); }

  static void backward(const L& l, const backward_args& a) requires requires { l.backward(a); }
  { l.backward(a); }

  // Requirement 9: whether backward splits into backward_input and backward_weight.
  static constexpr bool splits_backward() {
    if constexpr (requires { L::splits_backward; }) {
      static_assert(std::is_same_v<std::remove_cv_t<decltype(L::splits_backward)>, bool>,
                    "model: a layer's splits_backward must be 'static constexpr bool "
                    "splits_backward = true;' (requirement 9)");
      static_assert(
          !L::splits_backward ||
              requires(const L& l, const backward_args& a) {
                l.backward_input(a);
                l.backward_weight(a);
              },
          "model: a layer with splits_backward = true needs 'void backward_input(const "
          "strata::model::backward_args&) const' and 'void backward_weight(const "
          "strata::model::backward_args&) const' (requirement 9)");
      return L::splits_backward;
    } else {
      return false;
    }
  }
  static void backward_input(const L& l, const backward_args& a) requires requires {
    l.backward_input(a);
  }
  { l.backward_input(a); }
  static void backward_weight(const L& l, const backward_args& a) requires requires {
    l.backward_weight(a);
  }
  { l.backward_weight(a); }

  static std::vector<param_spec> parameters(const L& l, const sample_shape& in) {
    if constexpr (requires {
                    { l.parameters(in) } -> std::convertible_to<std::vector<param_spec>>;
                  }) {
      return l.parameters(in);
    } else {
      return {};
    }
  }

  // Requirement 10: the form taking the rank's place in its tensor-parallel group, where declared.
  static std::size_t workspace_elements(const L& l, const sample_shape& in, std::size_t batch,
                                        const tensor_place& place) {
    if constexpr (requires {
                    { l.workspace_elements(in, batch, place) } -> std::convertible_to<std::size_t>;
                  }) {
      return l.workspace_elements(in, batch, place);
    } else {
      return workspace_elements(l, in, batch);
    }
  }

  static std::size_t workspace_elements(const L& l, const sample_shape& in, std::size_t batch) {
    if constexpr (requires {
                    { l.workspace_elements(in, batch) } -> std::convertible_to<std::size_t>;
                  }) {
      return l.workspace_elements(in, batch);
    } else if constexpr (requires(const tensor_place& place) {
                           {
                             l.workspace_elements(in, batch, place)
                             } -> std::convertible_to<std::size_t>;
                         }) {
      return l.workspace_elements(in, batch, tensor_place{});
    } else {
      return 0;
    }
  }

  static layer_cost cost(const L& l, const sample_shape& in) {
    if constexpr (requires {
                    { l.cost(in) } -> std::convertible_to<layer_cost>;
                  }) {
      return l.cost(in);
    } else {
      return {.forward_flops = 0.0,
              .backward_flops = 0.0,
              .activation_bytes = output_shape(l, in).elements() * sizeof(float)};
    }
  }
};

// Requirement 8 as containers ask it: false also for traits specialized without it (tier 2).
template <class L>
constexpr bool layer_writes_grads() {
  if constexpr (requires {
                  { layer_traits<L>::writes_grads() } -> std::convertible_to<bool>;
                }) {
    return layer_traits<L>::writes_grads();
  } else {
    return false;
  }
}

// Requirement 9 as containers ask it: false also for traits specialized without it (tier 2).
template <class L>
constexpr bool layer_splits_backward() {
  if constexpr (requires {
                  { layer_traits<L>::splits_backward() } -> std::convertible_to<bool>;
                }) {
    return layer_traits<L>::splits_backward();
  } else {
    return false;
  }
}

// 1.
template <class L>
concept declares_layer_tag = requires {
  typename L::layer_category;
  requires std::same_as<typename L::layer_category, layer_tag>;
};
template <class L>
inline constexpr bool enable_layer = declares_layer_tag<L>;

template <class L>
concept layer_tagged = enable_layer<std::remove_cvref_t<L>>;

// 2.
template <class L>
concept layer_shapes = requires(const L& l, const sample_shape& in) {
  { layer_traits<L>::output_shape(l, in) } -> std::same_as<sample_shape>;
};

// 3.
template <class L>
concept layer_forwards = requires(const L& l, const forward_args& a) {
  layer_traits<L>::forward(l, a);
};

// 4.
template <class L>
concept layer_backwards = requires(const L& l, const backward_args& a) {
  layer_traits<L>::backward(l, a);
};

template <class L>
concept layer = layer_tagged<L> && layer_shapes<L> && layer_forwards<L> && layer_backwards<L>;

// Model 1-5.
template <class M>
concept model_shaped = requires(const M& m) {
  { m.input_shape() } -> std::same_as<sample_shape>;
  { m.output_shape() } -> std::same_as<sample_shape>;
};
template <class M>
concept model_has_params = requires(const M& m) {
  m.make_params();
};
template <class M>
concept model_has_workspace = requires(const M& m, std::size_t n) {
  typename M::workspace_type;
  { m.make_workspace(n) } -> std::same_as<typename M::workspace_type>;
  { m.workspace_floats(n) } -> std::convertible_to<std::size_t>;
};
template <class M>
concept model_runs = model_has_params<M> && model_has_workspace<M> &&
    requires(const M& m, typename M::workspace_type& w,
             std::remove_cvref_t<decltype(std::declval<const M&>().make_params())>& p,
             std::span<const float> x, std::size_t n, const run_options& o) {
  { m.forward(w, p, x, n, o) } -> std::same_as<std::span<const float>>;
  m.backward(w, p, x);
};
template <class M>
concept model_costs = requires(const M& m) {
  { m.costs() } -> std::convertible_to<std::vector<layer_cost>>;
};

template <class M>
concept model = model_shaped<M> && model_has_params<M> && model_has_workspace<M> && model_runs<M> &&
    model_costs<M>;

template <class M>
constexpr bool check_model() {
  static_assert(model_shaped<M>,
                "model: a model needs 'input_shape()' and 'output_shape()' returning sample_shape");
  static_assert(model_has_params<M>, "model: a model needs 'make_params()'");
  static_assert(model_has_workspace<M>,
                "model: a model needs 'workspace_type', 'make_workspace(std::size_t)' and "
                "'workspace_floats(std::size_t)'");
  static_assert(model_runs<M>,
                "model: a model needs 'forward(workspace, params, input, batch, run_options)' "
                "returning std::span<const float> and 'backward(workspace, params, grad_output)'");
  static_assert(model_costs<M>, "model: a model needs 'costs()' returning layer_cost per layer");
  return true;
}

// What a container asks for a layer's saved state: layer_traits' form taking the tensor place
// (requirement 10) where the traits have it (a specialization of tier 2 may not), else the
// place-free one.
template <class L>
std::size_t layer_workspace_elements(const L& l, const sample_shape& in, std::size_t batch,
                                     const tensor_place& place) {
  if constexpr (requires { layer_traits<L>::workspace_elements(l, in, batch, place); }) {
    return layer_traits<L>::workspace_elements(l, in, batch, place);
  } else {
    return layer_traits<L>::workspace_elements(l, in, batch);
  }
}

template <class L>
constexpr bool check_layer() {
  static_assert(layer_tagged<L>,
                "model: a layer declares 'using layer_category = strata::model::layer_tag;' or "
                "specializes strata::model::enable_layer");
  static_assert(layer_shapes<L>,
                "model: a layer needs 'sample_shape output_shape(const sample_shape&) const'");
  static_assert(layer_forwards<L>,
                "model: a layer needs 'void forward(const strata::model::forward_args&) const'");
  static_assert(layer_backwards<L>,
                "model: a layer needs 'void backward(const strata::model::backward_args&) const'");
  // Requirement 9 checks itself where it is asked (layer_traits::splits_backward).
  (void)layer_splits_backward<L>();
  return true;
}

}  // namespace strata::model
