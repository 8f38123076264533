// SPDX-License-Identifier: Apache-2.0
#pragma once

// The trainer's side of a pipeline (parallel/passes.hpp): the compute on this rank's chunks of
// the model, made from the model (layer ranges of a sequential), the loss and the compute
// parameters. Each (chunk, slot) gets its own workspace the first time it is used, sized for the
// largest micro-batch; forward runs in training or evaluation mode with the step's seed, step and
// the samples' dataset indices, so dropout draws what it draws on one rank.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/loss.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/bucket_reducer.hpp"
#include "strata/parallel/passes.hpp"

namespace strata::train::detail {

// Whether Model runs layer ranges (model/sequential.hpp): what a pipeline stage needs.
template <class Model>
concept runs_layer_ranges = requires(const Model& m, model::param_store_config c,
                                     std::span<const model::layer_range> r, std::size_t n,
                                     model::workspace_config w, model::layer_range one,
                                     typename Model::workspace_type& ws, model::param_store& p) {
  m.make_params(c, r);
  { m.make_workspace(n, w, one, n) } -> std::same_as<typename Model::workspace_type>;
  m.backward_weight(ws, p);
  { ws.grad_input() } -> std::convertible_to<std::span<const float>>;
  m.shapes();
};

// The model's outline for a partitioner: each layer's cost and parameter count.
template <class Model>
parallel::model_outline outline_of(const Model& m) {
  parallel::model_outline out{.costs = m.costs(), .parameters = {}};
  for (const auto& group : m.parameter_groups()) {
    std::size_t n = 0;
    for (const model::param_spec& s : group) {
      n += s.elements();
    }
    out.parameters.push_back(n);
  }
  return out;
}

// The seconds of each layer's forward and backward (its input gradient only where a layer in
// front has parameters, as in training) on `batch` samples: the best of `repeats` after one
// warm-up, each layer alone with a store of its own parameters (so the probe never holds the
// whole model).
template <class Model>
std::vector<double> probe_layer_seconds(const Model& m, std::size_t batch, std::uint64_t seed,
                                        int repeats = 3) {
  using clock = std::chrono::steady_clock;
  const std::size_t layers = m.costs().size();
  std::vector<double> out(layers, 0.0);
  for (std::size_t i = 0; i < layers; ++i) {
    const model::layer_range one{i, i + 1};
    model::param_store params = m.make_params({}, std::span<const model::layer_range>(&one, 1));
    params.initialize(seed);
    auto w = m.make_workspace(batch, {}, one, 0);
    const std::vector<float> input(batch * m.shapes()[i].elements(), 0.5f);
    const std::vector<float> grad(batch * m.shapes()[i + 1].elements(), 0.01f);
    double best = 0.0;
    for (int r = 0; r <= repeats; ++r) {
      const auto begin = clock::now();
      (void)m.forward(w, params, input, batch, {.training = true, .seed = seed});
      m.backward(w, params, grad);
      const double s = std::chrono::duration<double>(clock::now() - begin).count();
      if (r == 1 || (r > 1 && s < best)) {
        best = s;  // r = 0 warms up
      }
    }
    out[i] = best;
  }
  return out;
}

template <class Model, class Loss>
class model_stage_passes final : public parallel::stage_passes {
 public:
  struct settings {
    std::vector<model::layer_range> chunks;  // this rank's, in the store's group order
    std::size_t capacity = 1;                // the largest micro-batch
    std::size_t checkpoint_every = 0;
    bool split_backward = false;
    std::uint64_t seed = 0;
    dtype storage = dtype::float32;
    model::tensor_context tensor{};  // this rank's tensor-parallel group
  };

  model_stage_passes(const Model& m, const Loss& loss, model::param_store& params, settings s)
      : model_(m), loss_(loss), params_(params), s_(std::move(s)) {
    std::size_t group = 0;
    for (const model::layer_range& r : s_.chunks) {
      first_group_.push_back(group);
      group += r.size();
    }
  }

  // The step whose forward passes run next (dropout's streams) and the scale of the loss
  // gradient (loss scale / samples of the step).
  void begin_step(std::uint32_t step, float grad_scale) noexcept {
    step_ = step;
    grad_scale_ = grad_scale;
  }

  std::size_t input_elements(int chunk) const override {
    return model_.shapes()[s_.chunks[static_cast<std::size_t>(chunk)].first].elements();
  }
  std::size_t output_elements(int chunk) const override {
    return model_.shapes()[s_.chunks[static_cast<std::size_t>(chunk)].last].elements();
  }
  std::size_t first_group(int chunk) const override {
    return first_group_[static_cast<std::size_t>(chunk)];
  }

  std::span<const float> forward(int chunk, std::size_t slot, std::span<const float> input,
                                 const parallel::micro_batch& b, bool training) override {
    return model_.forward(workspace(chunk, slot), params_, input, b.size,
                          {.training = training,
                           .seed = s_.seed,
                           .step = training ? step_ : 0,
                           .sample_ids = b.indices,
                           .storage = s_.storage,
                           .tensor = s_.tensor});
  }

  model::loss_result loss(std::span<const float> output, const parallel::micro_batch& b,
                          std::span<float> grad) override {
    return loss_.evaluate({.batch = b.size,
                           .classes = output_elements(static_cast<int>(s_.chunks.size()) - 1),
                           .logits = output,
                           .labels = b.labels,
                           .grad_logits = grad,
                           .grad_scale = grad.empty() ? 1.0f : grad_scale_,
                           .tensor = s_.tensor});
  }

  std::span<const float> backward(int chunk, std::size_t slot, std::span<const float> grad_output,
                                  bool split, parallel::bucket_reducer* last) override {
    auto& w = workspace(chunk, slot);
    if (split != s_.split_backward) {
      throw std::logic_error("pipeline stage: a " + std::string(split ? "split" : "whole") +
                             " backward on passes made for the other kind");
    }
    if (last != nullptr) {
      model_.backward(
          w, params_, grad_output, [last](std::size_t g) { last->group_done(g); },
          [last](std::size_t g, std::size_t n) { last->part_done(g, n); }, last->part_elements());
    } else {
      model_.backward(w, params_, grad_output);
    }
    return w.grad_input();
  }

  void backward_weight(int chunk, std::size_t slot, parallel::bucket_reducer* last) override {
    if (last != nullptr) {
      model_.backward_weight(workspace(chunk, slot), params_,
                             [last](std::size_t g) { last->group_done(g); });
    } else {
      model_.backward_weight(workspace(chunk, slot), params_);
    }
  }

 private:
  typename Model::workspace_type& workspace(int chunk, std::size_t slot) {
    const auto key = std::pair{chunk, slot};
    auto it = work_.find(key);
    if (it == work_.end()) {
      const auto c = static_cast<std::size_t>(chunk);
      it = work_
               .emplace(key, model_.make_workspace(
                                 s_.capacity,
                                 model::workspace_config{.checkpoint_every = s_.checkpoint_every,
                                                         .split_backward = s_.split_backward,
                                                         .tensor = s_.tensor.place},
                                 s_.chunks[c], first_group_[c]))
               .first;
    }
    return it->second;
  }

  const Model& model_;
  const Loss& loss_;
  model::param_store& params_;
  settings s_;
  std::vector<std::size_t> first_group_{};
  std::map<std::pair<int, std::size_t>, typename Model::workspace_type> work_{};
  std::uint32_t step_ = 0;
  float grad_scale_ = 1.0f;
};

}  // namespace strata::train::detail
