// SPDX-License-Identifier: Apache-2.0
#pragma once

// What an executor that runs a step's passes itself (a pipeline's) and the trainer hand each
// other. The trainer knows the model and the loss, the executor the order and the ranks:
//   - model_outline: the model as a partitioner sees it (per layer: cost, parameters);
//   - micro_batch: samples as the step has them (inputs, labels, dataset indices);
//   - stage_passes: the compute on this rank's chunks of the model, which the trainer makes
//     from the model, its loss and the precision policy (train/stage_passes.hpp): forward,
//     the loss of the last chunk, backward (whole or the input pass), the weight pass;
//   - pass_runner: what such an executor offers (its passes_runner()): a step's micro-batches
//     through the passes, and a forward-only run for evaluation.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/model/concepts.hpp"
#include "strata/model/loss.hpp"

namespace strata::parallel {

class bucket_reducer;  // parallel/bucket_reducer.hpp

// Per layer: its cost per sample, its parameter count and, when a probe measured them, the
// seconds of its forward and backward on one micro-batch (empty: not measured).
struct model_outline {
  std::vector<model::layer_cost> costs{};
  std::vector<std::size_t> parameters{};
  std::vector<double> seconds{};
};

// `size` samples: inputs (size x input elements; empty where this rank does not read them),
// labels and dataset indices.
struct micro_batch {
  std::span<const float> inputs{};
  std::span<const std::int32_t> labels{};
  std::span<const std::uint64_t> indices{};
  std::size_t size = 0;
};

// The compute on this rank's chunks (chunk c: the c-th layer range the executor gave it). A
// `slot` is memory the executor reuses: one forward's activations kept until its backward (and
// weight pass) on that slot.
class stage_passes {
 public:
  virtual ~stage_passes() = default;
  // Floats per sample entering and leaving chunk c.
  virtual std::size_t input_elements(int chunk) const = 0;
  virtual std::size_t output_elements(int chunk) const = 0;
  // The parameter store's group of chunk c's first layer (the chunks' groups follow each other).
  virtual std::size_t first_group(int chunk) const = 0;
  // Chunk c forward on `input` (b.size samples); the output stays valid until the slot's next
  // forward. `input` must stay alive until the slot's backward.
  virtual std::span<const float> forward(int chunk, std::size_t slot, std::span<const float> input,
                                         const micro_batch& b, bool training) = 0;
  // The loss of the last chunk's output for b; with `grad` non-empty, its gradient (times the
  // step's scale) into grad.
  virtual model::loss_result loss(std::span<const float> output, const micro_batch& b,
                                  std::span<float> grad) = 0;
  // Chunk c backward from the gradient of its output, adding its parameter gradients (`split`:
  // the input-gradient pass only); returns the gradient of its input, valid until the slot's next
  // backward (empty when no layer in front has parameters). `last`: the step's last pass over
  // the chunk's gradients, when every chunk after it is complete: each layer is reported to it
  // as the pass completes its gradients (group_done, in decreasing groups), so that their
  // buckets leave while the pass goes on; else null.
  virtual std::span<const float> backward(int chunk, std::size_t slot,
                                          std::span<const float> grad_output, bool split,
                                          bucket_reducer* last) = 0;
  // The weight pass a split backward left (`last` as for backward; reports only the layers
  // whose weight pass it runs).
  virtual void backward_weight(int chunk, std::size_t slot, bucket_reducer* last) = 0;
};

class pass_runner {
 public:
  virtual ~pass_runner() = default;
  // A step: the batch policy's micro-batches through forward, the loss and backward on every
  // stage, the parameter gradients added into the compute parameters. Returns the loss of the
  // samples this rank's last chunk saw (nothing on other stages).
  virtual model::loss_result run_step(std::span<const micro_batch> batches,
                                      stage_passes& passes) = 0;
  // Evaluation: forward and the loss only; every rank returns the whole result.
  virtual model::loss_result run_forward(std::span<const micro_batch> batches,
                                         stage_passes& passes) = 0;
  // Whether its backward passes come split into input and weight passes (stage_passes::
  // backward with split = true, then backward_weight).
  virtual bool splits_backward() const = 0;
};

}  // namespace strata::parallel
