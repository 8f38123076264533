// SPDX-License-Identifier: Apache-2.0
#pragma once

// sequential<Layers...>: layers applied in order, composed at compile time.
//
//   strata::model::sequential mlp({.channels = 1, .height = 28, .width = 28},
//                                 strata::model::flatten{},
//                                 strata::model::linear{.in = 784, .out = 1024},
//                                 strata::model::relu{}, ...);
//   auto params = mlp.make_params();  params.initialize(seed);
//   auto work = mlp.make_workspace(batch);
//   auto logits = mlp.forward(work, params, inputs, batch, {.training = true});
//   mlp.backward(work, params, grad_logits);   // adds into params.grads()
//
// The model owns no memory: parameters live in a param_store (layer i's tensors are group i,
// named "<i>.<tensor>"), activations and the layers' saved state in a workspace made for a
// largest batch. forward keeps every layer's output (and a view of the input, which must stay
// alive until backward); backward walks the layers in reverse through two ping-pong gradient
// buffers. Input gradients are computed only where a layer further down has parameters: the
// layers in front of the first parameter (flatten, the first linear's input) skip them, and a
// parameter-free layer with no input gradient to give is not run backward at all.
// With run_options.storage float16 or bfloat16, every layer output and input gradient is
// rounded through that type as it is written (mixed precision on the host).
//
// A pipeline stage runs part of the layers: make_params(config, ranges) makes a store of the
// layers in `ranges` only (the groups keep the whole model's names and initial values), and
// make_workspace(capacity, config, range, group) a workspace that runs layers [range.first,
// range.last) on the store's groups from `group` on: forward takes the range's input and returns
// its output, backward takes the gradient of that output and leaves the gradient of the input
// in grad_input(w) (when a layer in front of the range has parameters). With
// workspace_config::split_backward, backward runs the input-gradient passes only (whole
// backwards for layers that cannot split) and backward_weight the weight passes.
//
// Under tensor parallelism (requirement 10 of concepts.hpp) the store (param_store_config::
// tensor) holds the rank's slices, the workspace (workspace_config::tensor) its layers' share of
// the activations, and forward hands run_options::tensor (the rank's group) to every layer; the
// three must name the same place (forward throws, naming them, otherwise).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/host.hpp"
#include "strata/core/round.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/param_store.hpp"

namespace strata::model {

// The memory one model needs for batches of up to `capacity` samples.
class sequential_workspace {
 public:
  sequential_workspace() = default;

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t batch() const noexcept { return batch_; }
  const workspace_config& config() const noexcept { return config_; }
  // Floats held (activations, saved state and gradient buffers).
  std::size_t floats() const noexcept {
    std::size_t n = 0;
    for (const auto& b : owned_) {
      n += b.size();
    }
    return n;
  }
  // Floats of activations and saved state only (without the two gradient buffers).
  std::size_t activation_floats() const noexcept { return floats() - gradient_floats_; }
  // The layers it runs and the store group of the first one.
  layer_range range() const noexcept { return range_; }
  std::size_t first_group() const noexcept { return group_base_; }
  // The gradient of the range's input from the last backward; empty when no layer in front of
  // the range has parameters (nobody needs it).
  std::span<const float> grad_input() const noexcept { return grad_input_; }

 private:
  template <class...>
  friend class sequential;

  std::size_t capacity_ = 0;
  std::size_t batch_ = 0;  // of the last forward
  bool forward_done_ = false;
  workspace_config config_{};
  std::span<const float> input_{};
  run_options options_{};  // of the last forward, for recomputation
  std::vector<buffer<float>> owned_{};
  std::vector<float*> outputs_{};  // outputs_[i]: layer i's output (capacity x elements)
  std::vector<float*> saved_{};    // saved_[i]: layer i's workspace
  float* grad_a_ = nullptr;
  float* grad_b_ = nullptr;
  std::size_t gradient_floats_ = 0;
  layer_range range_{};
  std::size_t group_base_ = 0;
  std::span<const float> grad_input_{};
  std::vector<float*> kept_grad_output_{};  // split_backward: per layer, its grad_output for W
  bool weights_pending_ = false;            // split_backward: backward done, W not yet
};

template <class... Layers>
class sequential {
  static_assert(sizeof...(Layers) > 0, "model: sequential needs at least one layer");
  static_assert((check_layer<Layers>() && ...));

 public:
  static constexpr std::size_t layer_count = sizeof...(Layers);
  using workspace_type = sequential_workspace;

  explicit sequential(sample_shape input, Layers... layers) : layers_(std::move(layers)...) {
    shapes_[0] = input;
    if (input.elements() == 0) {
      throw std::invalid_argument("sequential: the input shape " + to_string(input) +
                                  " has no elements");
    }
    for_each_layer([&]<std::size_t I>(const auto& l) {
      try {
        shapes_[I + 1] = layer_traits<layer_t<I>>::output_shape(l, shapes_[I]);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("sequential: layer " + std::to_string(I) + " (input " +
                                    to_string(shapes_[I]) + "): " + e.what());
      }
    });
    // A layer's input gradient is needed only when some layer before it has parameters.
    bool parameters_before = false;
    const auto groups = parameter_groups();
    for (std::size_t i = 0; i < layer_count; ++i) {
      wants_grad_input_[i] = parameters_before;
      std::size_t n = 0;
      for (const auto& spec : groups[i]) {
        n += spec.elements();
      }
      parameters_before = parameters_before || n > 0;
    }
  }

  sample_shape input_shape() const noexcept { return shapes_[0]; }
  sample_shape output_shape() const noexcept { return shapes_[layer_count]; }
  // shapes()[i] is layer i's input, shapes()[i + 1] its output.
  const std::array<sample_shape, layer_count + 1>& shapes() const noexcept { return shapes_; }

  template <std::size_t I>
  const auto& layer() const noexcept {
    return std::get<I>(layers_);
  }

  // Parameter groups: group i holds layer i's tensors.
  std::vector<std::string> group_names() const {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < layer_count; ++i) {
      names.push_back(std::to_string(i));
    }
    return names;
  }
  std::vector<std::vector<param_spec>> parameter_groups() const {
    std::vector<std::vector<param_spec>> groups(layer_count);
    for_each_layer([&]<std::size_t I>(const auto& l) {
      groups[I] = layer_traits<layer_t<I>>::parameters(l, shapes_[I]);
    });
    return groups;
  }
  param_store make_params(param_store_config config = {}) const {
    return param_store(group_names(), parameter_groups(), config);
  }

  // The store of the layers in `ranges` only (a pipeline rank's chunks, in the order given): the
  // groups keep the whole model's names ("<layer>") and draw the whole model's initial values.
  param_store make_params(param_store_config config, std::span<const layer_range> ranges) const {
    const auto names = group_names();
    const auto groups = parameter_groups();
    std::vector<std::size_t> first_tensor(layer_count + 1, 0);
    for (std::size_t i = 0; i < layer_count; ++i) {
      first_tensor[i + 1] = first_tensor[i] + groups[i].size();
    }
    std::vector<std::string> part_names;
    std::vector<std::vector<param_spec>> part_groups;
    config.group_first_tensor.clear();
    for (const layer_range& r : ranges) {
      check_range(r);
      for (std::size_t i = r.first; i < r.last; ++i) {
        part_names.push_back(names[i]);
        part_groups.push_back(groups[i]);
        config.group_first_tensor.push_back(first_tensor[i]);
      }
    }
    return param_store(part_names, part_groups, config);
  }

  // Per-sample cost of each layer, and their sum.
  std::vector<layer_cost> costs() const {
    std::vector<layer_cost> out(layer_count);
    for_each_layer([&]<std::size_t I>(const auto& l) {
      out[I] = layer_traits<layer_t<I>>::cost(l, shapes_[I]);
    });
    return out;
  }
  layer_cost total_cost() const {
    layer_cost sum{};
    for (const auto& c : costs()) {
      sum += c;
    }
    return sum;
  }

  // Floats a workspace for `batch` samples holds (ask before allocating).
  std::size_t workspace_floats(std::size_t batch, workspace_config config = {}) const {
    return workspace_floats(batch, config, {0, layer_count});
  }
  std::size_t workspace_floats(std::size_t batch, workspace_config config,
                               layer_range range) const {
    const plan p = make_plan(batch, config, range);
    std::size_t n = 0;
    for (std::size_t size : p.buffers) {
      n += size;
    }
    return n;
  }

  sequential_workspace make_workspace(std::size_t capacity, workspace_config config = {}) const {
    return make_workspace(capacity, config, {0, layer_count}, 0);
  }

  // A workspace that runs layers `range` on the store's groups from `first_group` on.
  sequential_workspace make_workspace(std::size_t capacity, workspace_config config,
                                      layer_range range, std::size_t first_group) const {
    if (capacity == 0) {
      throw std::invalid_argument("sequential: a workspace needs a capacity of at least 1");
    }
    check_range(range);
    if (config.split_backward && config.checkpoint_every != 0) {
      throw std::invalid_argument(
          "sequential: split_backward keeps every layer's input for the weight pass; it does not "
          "go with checkpoint_every = " +
          std::to_string(config.checkpoint_every));
    }
    const plan p = make_plan(capacity, config, range);
    sequential_workspace w;
    w.capacity_ = capacity;
    w.config_ = config;
    w.range_ = range;
    w.group_base_ = first_group;
    for (std::size_t size : p.buffers) {
      w.owned_.emplace_back(size);
    }
    for (std::size_t i = 0; i < layer_count; ++i) {
      w.outputs_.push_back(w.owned_[p.output_buffer[i]].data());
      w.saved_.push_back(w.owned_[p.saved_buffer[i]].data());
      w.kept_grad_output_.push_back(w.owned_[p.grad_output_buffer[i]].data());
    }
    w.grad_a_ = w.owned_[p.grad_a].data();
    w.grad_b_ = w.owned_[p.grad_b].data();
    w.gradient_floats_ = p.buffers[p.grad_a] + p.buffers[p.grad_b];
    return w;
  }

  // Runs the workspace's layers on `batch` samples of `input` (batch x the range's input
  // elements; the model's input for a whole-model workspace) and returns their output (batch x
  // output elements), valid until the next forward.
  std::span<const float> forward(sequential_workspace& w, const param_store& params,
                                 std::span<const float> input, std::size_t batch,
                                 const run_options& options = {}) const {
    check_batch(w, batch, "forward");
    const layer_range r = w.range_;
    if (input.size() != batch * shapes_[r.first].elements()) {
      throw std::invalid_argument("sequential::forward: input has " + std::to_string(input.size()) +
                                  " floats, " + std::to_string(batch) + " samples of " +
                                  to_string(shapes_[r.first]) + " need " +
                                  std::to_string(batch * shapes_[r.first].elements()));
    }
    check_params(w, params);
    if (options.tensor.place != w.config_.tensor ||
        options.tensor.place != params.config().tensor) {
      throw std::invalid_argument(
          "sequential::forward: run for tensor-parallel rank " +
          std::to_string(options.tensor.place.rank) + " of " +
          std::to_string(options.tensor.place.size) + ", but the workspace is for rank " +
          std::to_string(w.config_.tensor.rank) + " of " + std::to_string(w.config_.tensor.size) +
          " and the parameters for rank " + std::to_string(params.config().tensor.rank) + " of " +
          std::to_string(params.config().tensor.size));
    }
    w.batch_ = batch;
    w.input_ = input;
    w.options_ = options;
    w.forward_done_ = false;
    w.weights_pending_ = false;
    forward_range(w, params, r.first, r.last);
    w.forward_done_ = true;
    return output_of(w, r.last - 1, batch);
  }

  // Back-propagates grad_output (batch x output elements, for the batch of the last forward)
  // and adds every parameter's gradient into params.grads() (writes them after
  // params.discard_grads()).
  void backward(sequential_workspace& w, param_store& params,
                std::span<const float> grad_output) const {
    backward(w, params, grad_output, [](std::size_t) {});
  }

  // The same, calling after_layer(g) as soon as the layer of store group g has its parameter
  // gradients complete (layers in reverse order; for a whole-model workspace g is the layer):
  // data parallelism starts communicating a bucket of gradients while the layers before it are
  // still going back.
  template <class AfterLayer>
  void backward(sequential_workspace& w, param_store& params, std::span<const float> grad_output,
                AfterLayer&& after_layer) const {
    backward(
        w, params, grad_output, after_layer, [](std::size_t, std::size_t) {}, 0);
  }

  // The same, also passing `chunk` to the layers (backward_args::progress) and calling
  // part_done(g, n) whenever the layer of group g reports the first n elements of its parameter
  // gradients final; linear reports blocks of rows of its weight gradient of at least `chunk`
  // floats, so data parallelism starts reducing a large layer's first bucket while the layer
  // computes the rest. chunk = 0: layers compute their gradients whole.
  // With split_backward, the layers that split run their input-gradient pass only (after_layer
  // and part_done are then called by backward_weight for them).
  template <class AfterLayer, class PartDone>
  void backward(sequential_workspace& w, param_store& params, std::span<const float> grad_output,
                AfterLayer&& after_layer, PartDone&& part_done, std::size_t chunk) const {
    if (!w.forward_done_) {
      throw std::logic_error("sequential::backward: no forward pass to go back through");
    }
    const std::size_t batch = w.batch_;
    const layer_range r = w.range_;
    if (grad_output.size() != batch * shapes_[r.last].elements()) {
      throw std::invalid_argument("sequential::backward: grad_output has " +
                                  std::to_string(grad_output.size()) + " floats, expected " +
                                  std::to_string(batch * shapes_[r.last].elements()));
    }
    check_params(w, params);
    const bool split = w.config_.split_backward;
    // The gradients' bound before this backward (param_store::grad_bound), read before anything
    // takes them to write; the layers' reports (requirement 11) add to it at the end.
    const double bound_before = params.grad_bound();
    double moved = 0.0;
    // Discarded gradients (param_store::discard_grads): each layer writes its own (writes_grads)
    // or finds them zeroed here, so no pass over all of them comes first. A workspace that runs
    // part of the store's groups, or leaves weight passes for later, has them zeroed first.
    if (params.grads_discarded() &&
        (split || w.group_base_ != 0 || r.size() != params.groups().size())) {
      (void)params.grads();
    }
    const bool fresh = params.grads_discarded();
    std::span<const float> upstream = grad_output;
    bool into_a = true;
    const std::size_t k = w.config_.checkpoint_every;
    w.grad_input_ = {};
    for_each_layer_reverse([&]<std::size_t I>(const auto& l) {
      if (I < r.first || I >= r.last) {
        return;
      }
      if (k > 0 && (I + 1 == r.last || (I + 1) % k == 0)) {
        // The last layer of a segment: recompute the segment's forward first.
        forward_range(w, params, std::max(r.first, I - I % k), I + 1);
      }
      const std::size_t g = I - r.first + w.group_base_;
      backward_args a = backward_args_of<I>(w, params, l, batch, g);
      a.grad_output = upstream;
      std::span<float> grad_in{};
      if (wants_grad_input_[I]) {
        grad_in = std::span<float>(into_a ? w.grad_a_ : w.grad_b_, batch * shapes_[I].elements());
      }
      a.grad_input = grad_in;
      double layer_bound = std::numeric_limits<double>::infinity();
      if (!a.grads.empty()) {
        a.grad_bound = &layer_bound;
      }
      if (fresh) {
        if constexpr (layer_writes_grads<layer_t<I>>()) {
          a.write_grads = true;
        } else {
          std::fill(a.grads.begin(), a.grads.end(), 0.0f);
        }
      }
      // What the layer reports goes to part_done with the layer's group.
      struct part_target {
        std::remove_reference_t<PartDone>* part_done;
        std::size_t group;
      } target{std::addressof(part_done), g};
      if (chunk > 0 && !a.grads.empty()) {
        a.progress = {.report =
                          [](void* context, std::size_t n) {
                            const auto* t = static_cast<part_target*>(context);
                            (*t->part_done)(t->group, n);
                          },
                      .context = &target,
                      .chunk = chunk};
      }
      bool weights_later = false;
      if constexpr (layer_splits_backward<layer_t<I>>()) {
        if (split && !a.grads.empty()) {
          // The weight pass reads this grad_output later: keep a copy (the ping-pong buffers
          // are overwritten further down).
          float* kept = w.kept_grad_output_[I];
          std::copy(upstream.begin(), upstream.end(), kept);
          if (!grad_in.empty()) {
            layer_traits<layer_t<I>>::backward_input(l, a);
            round_through(grad_in, w.options_.storage);
          }
          weights_later = true;
        }
      }
      if (!weights_later) {
        if (!a.grads.empty() || !grad_in.empty()) {
          layer_traits<layer_t<I>>::backward(l, a);
          round_through(grad_in, w.options_.storage);
        }
        after_layer(g);
      }
      if (!a.grads.empty()) {  // a weight pass left for later is not bounded here
        moved = weights_later || !(layer_bound >= 0.0) ? std::numeric_limits<double>::infinity()
                                                       : std::max(moved, layer_bound);
      }
      upstream = grad_in;
      into_a = !into_a;
    });
    w.grad_input_ = upstream;
    w.weights_pending_ = split;
    params.grads_written(bound_before + moved);
  }

  // split_backward: the weight passes the last backward left (after_layer(g) after each, in
  // reverse layer order), adding into params.grads().
  void backward_weight(sequential_workspace& w, param_store& params) const {
    backward_weight(w, params, [](std::size_t) {});
  }
  template <class AfterLayer>
  void backward_weight(sequential_workspace& w, param_store& params,
                       AfterLayer&& after_layer) const {
    if (!w.weights_pending_) {
      throw std::logic_error(
          "sequential::backward_weight: no input-gradient pass (a backward with split_backward) "
          "waiting for its weight pass");
    }
    check_params(w, params);
    const std::size_t batch = w.batch_;
    const layer_range r = w.range_;
    for_each_layer_reverse([&]<std::size_t I>(const auto& l) {
      if constexpr (layer_splits_backward<layer_t<I>>()) {
        if (I < r.first || I >= r.last) {
          return;
        }
        const std::size_t g = I - r.first + w.group_base_;
        backward_args a = backward_args_of<I>(w, params, l, batch, g);
        if (a.grads.empty()) {
          return;
        }
        a.grad_output =
            std::span<const float>(w.kept_grad_output_[I], batch * shapes_[I + 1].elements());
        layer_traits<layer_t<I>>::backward_weight(l, a);
        after_layer(g);
      }
    });
    w.weights_pending_ = false;
  }

 private:
  template <std::size_t I>
  using layer_t = std::tuple_element_t<I, std::tuple<Layers...>>;

  template <class F>
  void for_each_layer(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<I>(std::get<I>(layers_)), ...);
    }
    (std::index_sequence_for<Layers...>{});
  }

  template <class F>
  void for_each_layer_reverse(F&& f) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f.template operator()<layer_count - 1 - I>(std::get<layer_count - 1 - I>(layers_)), ...);
    }
    (std::index_sequence_for<Layers...>{});
  }

  // The arguments of layer I's backward passes without grad_output and grad_input.
  template <std::size_t I, class L>
  backward_args backward_args_of(sequential_workspace& w, param_store& params, const L& l,
                                 std::size_t batch, std::size_t group) const {
    backward_args a;
    a.batch = batch;
    a.in_shape = shapes_[I];
    a.out_shape = shapes_[I + 1];
    a.input = I == w.range_.first ? w.input_ : output_of(w, I - 1, batch);
    a.output = output_of(w, I, batch);
    a.params = params.group_values(group);
    a.grads = params.group_grads_to_write(group);
    a.workspace = saved_of(w, I, l, batch);
    a.storage = w.options_.storage;
    a.tensor = w.options_.tensor;
    return a;
  }

  void check_range(const layer_range& r) const {
    if (r.first >= r.last || r.last > layer_count) {
      throw std::invalid_argument("sequential: layers [" + std::to_string(r.first) + ", " +
                                  std::to_string(r.last) + ") are not a run of the model's " +
                                  std::to_string(layer_count) + " layers");
    }
  }

  std::size_t max_elements(const layer_range& r) const noexcept {
    std::size_t m = 0;
    for (std::size_t i = r.first; i <= r.last; ++i) {
      m = shapes_[i].elements() > m ? shapes_[i].elements() : m;
    }
    return m;
  }

  std::span<float> output_of(sequential_workspace& w, std::size_t i, std::size_t batch) const {
    return std::span<float>(w.outputs_[i], batch * shapes_[i + 1].elements());
  }

  template <class L>
  std::span<float> saved_of(sequential_workspace& w, std::size_t i, const L& l,
                            std::size_t batch) const {
    const std::size_t n = layer_workspace_elements(l, shapes_[i], batch, w.config_.tensor);
    return std::span<float>(w.saved_[i], n);
  }

  // Runs layers [first, last) forward with the options of the last forward() call.
  void forward_range(sequential_workspace& w, const param_store& params, std::size_t first,
                     std::size_t last) const {
    const std::size_t batch = w.batch_;
    const run_options& options = w.options_;
    for_each_layer([&]<std::size_t I>(const auto& l) {
      if (I < first || I >= last) {
        return;
      }
      forward_args a;
      a.batch = batch;
      a.in_shape = shapes_[I];
      a.out_shape = shapes_[I + 1];
      a.input = I == w.range_.first ? w.input_ : output_of(w, I - 1, batch);
      a.output = output_of(w, I, batch);
      a.params = params.group_values(I - w.range_.first + w.group_base_);
      a.workspace = saved_of(w, I, l, batch);
      a.training = options.training;
      a.rng = {.seed = options.seed, .step = options.step, .layer = static_cast<std::uint32_t>(I)};
      a.sample_ids = options.sample_ids;
      a.storage = options.storage;
      a.tensor = options.tensor;
      layer_traits<layer_t<I>>::forward(l, a);
      round_through(a.output, options.storage);
    });
  }

  // Which buffer holds each layer's output, saved state and (split_backward) kept gradient.
  // Layers outside the range share one empty buffer. Without checkpointing every layer of the
  // range has its own. With segments of k, the last layer of each segment keeps its own output;
  // the other outputs share k - 1 slots (slot = position in the segment) and every saved state
  // shares k slots, each slot as large as its largest user, since only one segment's inner
  // activations are alive at a time.
  struct plan {
    std::vector<std::size_t> buffers{};  // sizes in floats
    std::vector<std::size_t> output_buffer{};
    std::vector<std::size_t> saved_buffer{};
    std::vector<std::size_t> grad_output_buffer{};
    std::size_t grad_a = 0;
    std::size_t grad_b = 0;
  };

  plan make_plan(std::size_t batch, const workspace_config& config, const layer_range& r) const {
    plan p;
    p.buffers.push_back(0);  // buffer 0: empty, for what the range does not use
    p.output_buffer.assign(layer_count, 0);
    p.saved_buffer.assign(layer_count, 0);
    p.grad_output_buffer.assign(layer_count, 0);
    std::array<std::size_t, layer_count> saved_sizes{};
    std::array<bool, layer_count> splits{};
    const auto groups = parameter_groups();
    for_each_layer([&]<std::size_t I>(const auto& l) {
      saved_sizes[I] = layer_workspace_elements(l, shapes_[I], batch, config.tensor);
      splits[I] = layer_splits_backward<layer_t<I>>() && !groups[I].empty();
    });
    const std::size_t k = config.checkpoint_every;
    if (k == 0) {
      for (std::size_t i = r.first; i < r.last; ++i) {
        p.output_buffer[i] = p.buffers.size();
        p.buffers.push_back(batch * shapes_[i + 1].elements());
        p.saved_buffer[i] = p.buffers.size();
        p.buffers.push_back(saved_sizes[i]);
        if (config.split_backward && splits[i]) {
          p.grad_output_buffer[i] = p.buffers.size();
          p.buffers.push_back(batch * shapes_[i + 1].elements());
        }
      }
    } else {
      std::vector<std::size_t> output_slot(k, 0);
      std::vector<std::size_t> saved_slot(k, 0);
      for (std::size_t i = r.first; i < r.last; ++i) {
        saved_slot[i % k] = std::max(saved_slot[i % k], saved_sizes[i]);
        if (!keeps_output(i, k, r)) {
          output_slot[i % k] = std::max(output_slot[i % k], batch * shapes_[i + 1].elements());
        }
      }
      const std::size_t output_base = p.buffers.size();
      p.buffers.insert(p.buffers.end(), output_slot.begin(), output_slot.end());
      const std::size_t saved_base = p.buffers.size();
      p.buffers.insert(p.buffers.end(), saved_slot.begin(), saved_slot.end());
      for (std::size_t i = r.first; i < r.last; ++i) {
        if (keeps_output(i, k, r)) {
          p.output_buffer[i] = p.buffers.size();
          p.buffers.push_back(batch * shapes_[i + 1].elements());
        } else {
          p.output_buffer[i] = output_base + i % k;
        }
        p.saved_buffer[i] = saved_base + i % k;
      }
    }
    p.grad_a = p.buffers.size();
    p.buffers.push_back(batch * max_elements(r));
    p.grad_b = p.buffers.size();
    p.buffers.push_back(batch * max_elements(r));
    return p;
  }

  static bool keeps_output(std::size_t i, std::size_t k, const layer_range& r) noexcept {
    return i + 1 == r.last || (i + 1) % k == 0;
  }

  void check_batch(const sequential_workspace& w, std::size_t batch, const char* op) const {
    if (batch == 0 || batch > w.capacity_) {
      throw std::invalid_argument(std::string("sequential::") + op + ": batch " +
                                  std::to_string(batch) + " is outside 1.." +
                                  std::to_string(w.capacity_) + " (the workspace's capacity)");
    }
    if (w.outputs_.size() != layer_count) {
      throw std::invalid_argument(std::string("sequential::") + op +
                                  ": the workspace was not made by this model");
    }
  }

  void check_params(const sequential_workspace& w, const param_store& params) const {
    if (params.groups().size() < w.group_base_ + w.range_.size()) {
      throw std::invalid_argument("sequential: the param_store has " +
                                  std::to_string(params.groups().size()) +
                                  " groups, the workspace runs " + std::to_string(w.range_.size()) +
                                  " layers from group " + std::to_string(w.group_base_));
    }
    if (w.group_base_ == 0 && w.range_.first == 0 && w.range_.last == layer_count &&
        params.groups().size() != layer_count) {
      throw std::invalid_argument("sequential: the param_store has " +
                                  std::to_string(params.groups().size()) + " groups, the model " +
                                  std::to_string(layer_count) + " layers");
    }
  }

  std::tuple<Layers...> layers_;
  std::array<sample_shape, layer_count + 1> shapes_{};
  std::array<bool, layer_count> wants_grad_input_{};
};

}  // namespace strata::model
