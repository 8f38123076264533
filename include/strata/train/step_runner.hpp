// SPDX-License-Identifier: Apache-2.0
#pragma once

// step_runner: the trainer's side of a step as the batch policy sees it (batch::step_runner in
// batch/concepts.hpp). One per fit(), holding the training workspace and the loss gradient's
// buffer: each micro_step runs forward in training mode, the loss with its gradient scaled by the
// step's scale, and backward, adding the parameter gradients into the compute parameters. The
// step's last backward starts the executor's gradient buckets when it has a reducer.
//
// It refuses what the batch contract rules out: a micro-step after the step's last one, more
// samples than a loader batch, restart() after the last micro-step.
//
// Under an executor that runs the passes itself (a pipeline: parallel/passes.hpp) the runner
// keeps each micro-step's samples and, at the step's last, hands them all to the executor with
// the passes over this rank's layers; the step's loss is then reported by its last micro-step.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/batch/concepts.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/loss.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/bucket_reducer.hpp"
#include "strata/parallel/passes.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/progress.hpp"
#include "strata/train/stage_passes.hpp"
#include "strata/train/trainer_support.hpp"

namespace strata::train {

namespace detail {

// The training workspace for `capacity` samples, with activation checkpointing every `every`
// layers when the model offers it (else `every` must be 0).
template <class Model>
typename Model::workspace_type training_workspace(const Model& m, std::size_t capacity,
                                                  std::size_t every,
                                                  const model::tensor_place& place = {}) {
  if constexpr (requires { m.make_workspace(capacity, model::workspace_config{}); }) {
    return m.make_workspace(capacity,
                            model::workspace_config{.checkpoint_every = every, .tensor = place});
  } else {
    if (place.size != 1) {
      throw std::invalid_argument(
          "tensor parallelism needs a model whose make_workspace takes a workspace_config");
    }
    if (every != 0) {
      throw config_error({.key = "activation_checkpoint_every", .file = {}, .line = 0, .column = 0},
                         "this model does not offer activation checkpointing");
    }
    return m.make_workspace(capacity);
  }
}

// Backward of the last forward, starting the reducer's buckets as layers (and the parts of large
// layers, where the model reports them) complete their gradients.
template <class Model, class Work>
void backward_into_buckets(const Model& m, Work& work, model::param_store& p,
                           std::span<const float> grad, parallel::bucket_reducer& reducer) {
  // The memory backward is about to write: the reducer reads each bucket only once backward
  // reports it complete, and rounds it through the compute type as it starts.
  reducer.begin(p.grads_to_write());
  if constexpr (requires {
                  m.backward(
                      work, p, grad, [](std::size_t) {}, [](std::size_t, std::size_t) {},
                      std::size_t{});
                }) {
    m.backward(
        work, p, grad, [&reducer](std::size_t layer) { reducer.group_done(layer); },
        [&reducer](std::size_t layer, std::size_t n) { reducer.part_done(layer, n); },
        reducer.part_elements());
  } else if constexpr (requires { m.backward(work, p, grad, [](std::size_t) {}); }) {
    m.backward(work, p, grad, [&reducer](std::size_t layer) { reducer.group_done(layer); });
  } else {
    m.backward(work, p, grad);
  }
}

// Loss and accuracy over every batch of `loader` (an epoch from its start): forward in evaluation
// mode on `params`, then the loss without a gradient.
template <class Model, class Loss, class Loader>
eval_result evaluate_batches(const Model& m, typename Model::workspace_type& work,
                             model::param_store& params, const Loss& loss, Loader& loader,
                             std::uint64_t seed, dtype storage,
                             const model::tensor_context& tensor = {}) {
  const std::size_t classes = m.output_shape().elements();
  eval_result out;
  double loss_sum = 0.0;
  std::size_t correct = 0;
  loader.start_epoch(0);
  while (auto b = loader.next()) {
    const auto logits = m.forward(work, params, b->inputs, b->size,
                                  {.training = false,
                                   .seed = seed,
                                   .step = 0,
                                   .sample_ids = {},
                                   .storage = storage,
                                   .tensor = tensor});
    const model::loss_result r = loss.evaluate({.batch = b->size,
                                                .classes = classes,
                                                .logits = logits,
                                                .labels = b->labels,
                                                .grad_logits = {},
                                                .grad_scale = 1.0f,
                                                .tensor = tensor});
    loss_sum += r.loss_sum;
    correct += r.correct;
    out.samples += b->size;
  }
  if (out.samples > 0) {
    out.loss = loss_sum / static_cast<double>(out.samples);
    out.accuracy = static_cast<double>(correct) / static_cast<double>(out.samples);
  }
  return out;
}

// evaluate_batches through an executor that runs the passes (a pipeline): forward and the loss
// of a few loader batches at a time over the stages; every rank returns the whole result.
template <class Model, class Loss, class Loader>
eval_result evaluate_in_stages(const Model& m, const Loss& loss, model::param_store& params,
                               const std::vector<model::layer_range>& layers,
                               parallel::pass_runner& runner, Loader& loader, std::uint64_t seed,
                               dtype storage, const model::tensor_context& tensor = {}) {
  if constexpr (!runs_layer_ranges<Model>) {
    throw std::invalid_argument("evaluation in stages needs a model that runs layer ranges");
  } else {
    model_stage_passes<Model, Loss> passes(m, loss, params,
                                           {.chunks = layers,
                                            .capacity = loader.config().batch_size,
                                            .checkpoint_every = 0,
                                            .split_backward = runner.splits_backward(),
                                            .seed = seed,
                                            .storage = storage,
                                            .tensor = tensor});
    struct kept {
      std::vector<float> inputs;
      std::vector<std::int32_t> labels;
      std::vector<std::uint64_t> indices;
    };
    std::vector<kept> group;
    model::loss_result total{};
    const auto run = [&] {
      std::vector<parallel::micro_batch> batches;
      for (const kept& k : group) {
        batches.push_back({.inputs = k.inputs,
                           .labels = k.labels,
                           .indices = k.indices,
                           .size = k.labels.size()});
      }
      if (!batches.empty()) {
        total += runner.run_forward(batches, passes);
      }
      group.clear();
    };
    loader.start_epoch(0);
    while (auto b = loader.next()) {
      kept& k = group.emplace_back();
      k.inputs.assign(b->inputs.begin(), b->inputs.end());
      k.labels.assign(b->labels.begin(), b->labels.end());
      if (group.size() == 8) {
        run();
      }
    }
    run();
    eval_result out;
    out.samples = total.samples;
    if (total.samples > 0) {
      out.loss = total.loss_sum / static_cast<double>(total.samples);
      out.accuracy = static_cast<double>(total.correct) / static_cast<double>(total.samples);
    }
    return out;
  }
}

}  // namespace detail

template <class Model, class Loss, class BatchPolicy, class PrecisionPolicy>
class step_runner {
 public:
  using workspace = typename Model::workspace_type;

  // What the runner reads of the trainer's state; the references outlive it.
  struct parts {
    const Model& model;
    const Loss& loss;
    PrecisionPolicy& precision;
    model::param_store& master;
    const config::train_config& cfg;
    const std::uint64_t& step;  // the trainer's step counter
    std::size_t memory_budget;
    std::size_t optimizer_state_per_parameter;
    comm::any_comm* group;  // the ranks that step together, null on one rank
    // An executor that runs the step's passes itself (else null), and this rank's layers.
    parallel::pass_runner* passes_runner = nullptr;
    const std::vector<model::layer_range>* layers = nullptr;
    model::tensor_context tensor{};  // this rank's tensor-parallel group
  };

  // `loader_batch`: samples per loader batch; `reducer`: the executor's (null: none).
  step_runner(parts p, std::size_t loader_batch, parallel::bucket_reducer* reducer, progress& bar)
      : p_(p),
        loader_batch_(loader_batch),
        classes_(p.model.output_shape().elements()),
        grad_logits_(p.passes_runner != nullptr ? 0 : loader_batch * classes_),
        reducer_(reducer),
        bar_(bar) {
    if (p.passes_runner != nullptr) {
      make_stage_passes(loader_batch);
    }
  }

  // Before a step's first micro-step: the scale of its gradients (loss scale / samples).
  void begin_step(float grad_scale) noexcept {
    grad_scale_ = grad_scale;
    ended_ = false;
    overlapped_ = false;
    pending_.clear();
  }
  // Whether the step's last backward started the gradient buckets.
  bool overlapped() const noexcept { return overlapped_; }

  model::loss_result micro_step(const batch::samples& b, bool last) {
    if (ended_) {
      throw error("batch policy " + std::string(BatchPolicy::name) +
                  ": a micro-step after the step's last one (last = true) at step " +
                  std::to_string(p_.step));
    }
    if (b.size > loader_batch_) {
      throw std::invalid_argument("batch policy " + std::string(BatchPolicy::name) +
                                  ": a micro-step of " + std::to_string(b.size) +
                                  " samples, more than a loader batch");
    }
    ended_ = last;
    if (p_.passes_runner != nullptr) {
      return through_passes(b, last);
    }
    if (work_.capacity() < b.size) {
      set_workspace(b.size);
    }
    overlapped_ = last && reducer_ != nullptr;
    return forward_backward(b);
  }
  void restart() {
    if (ended_) {
      throw error("batch policy " + std::string(BatchPolicy::name) +
                  ": restart() after the step's last micro-step at step " +
                  std::to_string(p_.step));
    }
    p_.precision.compute(p_.master).discard_grads();
    pending_.clear();
  }
  void set_workspace(std::size_t samples) {
    if (p_.passes_runner != nullptr) {
      return;  // the stage passes keep their own, per micro-batch in flight
    }
    work_ = workspace{};
    if (samples > 0) {
      work_ = detail::training_workspace(
          p_.model, samples, static_cast<std::size_t>(p_.cfg.activation_checkpoint_every),
          p_.tensor.place);
    }
  }
  std::size_t workspace_capacity() const { return work_.capacity(); }
  std::uint64_t step() const { return p_.step; }
  std::size_t memory_budget() const { return p_.memory_budget; }
  memory_tracker& memory() { return host{}.memory(); }
  std::size_t activation_bytes(std::size_t micro) const {
    const estimate_options options{
        .optimizer_state_per_parameter = p_.optimizer_state_per_parameter,
        .checkpoint_every = static_cast<std::size_t>(p_.cfg.activation_checkpoint_every),
        .layout = memory_layout::host};
    return estimate_memory<PrecisionPolicy>(p_.model, micro, options).activations;
  }
  // The minimum over the ranks that step together (one all_reduce of an int64).
  std::size_t agree_min(std::size_t value) {
    if (p_.group == nullptr) {
      return value;
    }
    const auto mine = static_cast<std::int64_t>(value);
    std::int64_t agreed = 0;
    p_.group->all_reduce(&mine, &agreed, 1, dtype::int64, comm::reduce_op::min);
    return static_cast<std::size_t>(agreed);
  }
  void message(std::string line) { bar_.message(line); }

 private:
  // Forward, loss and backward of one micro-batch, adding its gradients (scaled by the step's
  // scale) into the compute parameters; the last of an overlapped step starts the buckets.
  model::loss_result forward_backward(const batch::samples& b) {
    static_assert(std::is_same_v<std::size_t, std::uint64_t>,
                  "trainer: sample ids are passed as dataset indices (size_t == uint64_t)");
    model::param_store& p = p_.precision.compute(p_.master);
    const auto logits = p_.model.forward(work_, p, b.inputs, b.size,
                                         {.training = true,
                                          .seed = static_cast<std::uint64_t>(p_.cfg.seed),
                                          .step = static_cast<std::uint32_t>(p_.step),
                                          .sample_ids = std::span<const std::uint64_t>(b.indices),
                                          .storage = PrecisionPolicy::compute_dtype,
                                          .tensor = p_.tensor});
    const std::span<float> grad(grad_logits_.data(), b.size * classes_);
    const model::loss_result loss = p_.loss.evaluate({.batch = b.size,
                                                      .classes = classes_,
                                                      .logits = logits,
                                                      .labels = b.labels,
                                                      .grad_logits = grad,
                                                      .grad_scale = grad_scale_,
                                                      .tensor = p_.tensor});
    if (overlapped_) {
      detail::backward_into_buckets(p_.model, work_, p, grad, *reducer_);
      return loss;
    }
    p_.model.backward(work_, p, grad);
    const double bound = p.grad_bound();
    p_.precision.store(p.grads());  // as the compute type holds them
    if constexpr (PrecisionPolicy::compute_dtype == dtype::float32) {
      p.grads_written(bound);  // rounding through float32 changed nothing (requirement 5)
    }
    return loss;
  }

  // A pipeline's micro-step: the samples kept (the loader reuses its memory); at the step's last,
  // all of them through the executor's schedule.
  model::loss_result through_passes(const batch::samples& b, bool last) {
    kept& k = pending_.emplace_back();
    k.inputs.assign(b.inputs.begin(), b.inputs.end());
    k.labels.assign(b.labels.begin(), b.labels.end());
    k.indices.assign(b.indices.begin(), b.indices.end());
    if (!last) {
      return {};
    }
    if constexpr (!detail::runs_layer_ranges<Model>) {
      return {};  // make_stage_passes refused this model
    } else {
      std::vector<parallel::micro_batch> batches;
      for (const kept& x : pending_) {
        batches.push_back({.inputs = x.inputs,
                           .labels = x.labels,
                           .indices = x.indices,
                           .size = x.labels.size()});
      }
      passes_->begin_step(static_cast<std::uint32_t>(p_.step), grad_scale_);
      model::param_store& p = p_.precision.compute(p_.master);
      const model::loss_result loss = p_.passes_runner->run_step(batches, *passes_);
      p_.precision.store(p.grads());  // as the compute type holds them
      pending_.clear();
      return loss;
    }
  }

  void make_stage_passes(std::size_t loader_batch) {
    if constexpr (detail::runs_layer_ranges<Model>) {
      passes_.emplace(
          p_.model, p_.loss, p_.precision.compute(p_.master),
          typename passes_type::settings{
              .chunks = *p_.layers,
              .capacity = loader_batch,
              .checkpoint_every = static_cast<std::size_t>(p_.cfg.activation_checkpoint_every),
              .split_backward = p_.passes_runner->splits_backward(),
              .seed = static_cast<std::uint64_t>(p_.cfg.seed),
              .storage = PrecisionPolicy::compute_dtype,
              .tensor = p_.tensor});
    } else {
      throw std::invalid_argument(
          "the parallel policy runs the model in stages: the model must run layer ranges "
          "(make_params(config, ranges), make_workspace(capacity, config, range, group), "
          "backward_weight, as model::sequential does)");
    }
  }

  struct kept {
    std::vector<float> inputs;
    std::vector<std::int32_t> labels;
    std::vector<std::uint64_t> indices;
  };
  struct no_passes {};
  using passes_type = std::conditional_t<detail::runs_layer_ranges<Model>,
                                         detail::model_stage_passes<Model, Loss>, no_passes>;

  parts p_;
  std::optional<passes_type> passes_{};
  std::vector<kept> pending_{};
  std::size_t loader_batch_;
  std::size_t classes_;
  buffer<float> grad_logits_;
  parallel::bucket_reducer* reducer_;
  progress& bar_;
  workspace work_{};
  float grad_scale_ = 1.0f;
  bool ended_ = false;
  bool overlapped_ = false;
};

}  // namespace strata::train
