// SPDX-License-Identifier: Apache-2.0
#pragma once

// estimate_memory<Policies...>(model, batch, options): the bytes one rank's training step holds,
// by part, before anything is allocated. The adaptive batch policy takes its first micro-batch
// from it; the tuner plans with it.
//
//   auto e = strata::train::estimate_memory<strata::precision::bf16>(
//       model, 256, {.optimizer_state_per_parameter = 2});   // AdamW
//   std::printf("%s\n", to_string(e).c_str());
//
// Per parameter (P parameters, s optimizer floats per parameter, T the compute type):
//
//   policy        layout   parameters  gradients         master  optimizer   sum (Adam, s = 2)
//   fp32          any      4           4                 -       4s          16
//   mixed<T>      device   sizeof(T)   sizeof(T) + 4     4       4s          20
//   mixed<T>      host     4           4 + 4             4       4s          24
//
// The gradients of a mixed policy are the compute copy's (T) plus the float32 master gradients
// they are unscaled into. On the host the compute copy is held in float (layers compute in
// float32 on values T can hold), so mixed precision there costs memory instead of saving it;
// the device layout is what a CUDA rank holds. Activations: the model's workspace for the
// micro-batch (its outputs, saved state and the two gradient buffers, less with activation
// checkpointing) in float on the host and in T on a device, plus the float32 loss gradient.
// Buffers are counted as the host allocator rounds them (to 64 bytes): the host estimate of
// parameters, gradients, master weights and optimizer state equals what the trainer allocates;
// activations are within 64 bytes per workspace buffer.

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "strata/core/policy.hpp"
#include "strata/model/concepts.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/mixed.hpp"

namespace strata::train {

enum class memory_layout { host, device };

struct estimate_options {
  std::size_t optimizer_state_per_parameter = 0;  // SGD: 0 (no momentum) or 1; AdamW: 2
  std::size_t checkpoint_every = 0;               // activation checkpointing segments
  memory_layout layout = memory_layout::host;
  // Ranks the optimizer state is sharded over (parallel::zero1); the parameters are then padded
  // to a multiple of shards x 16 floats.
  std::size_t shards = 1;
  // A rank of a tensor-parallel group (requirement 10 of model/concepts.hpp): its slices of the
  // split tensors and its layers' workspace at that place.
  model::tensor_place tensor{};

  friend bool operator==(const estimate_options&, const estimate_options&) = default;
};

struct memory_estimate {
  std::size_t parameter_count = 0;  // with the per-layer alignment padding
  std::size_t parameters = 0;       // bytes of the copy the model runs on
  std::size_t gradients = 0;        // bytes of its gradients (+ float32 master gradients)
  std::size_t master_weights = 0;   // bytes of the float32 master copy (mixed only)
  std::size_t optimizer_state = 0;  // bytes
  std::size_t activations = 0;      // bytes for one micro-batch

  // Everything that does not grow with the batch.
  std::size_t model_state() const noexcept {
    return parameters + gradients + master_weights + optimizer_state;
  }
  std::size_t total() const noexcept { return model_state() + activations; }
  double bytes_per_parameter() const noexcept {
    return parameter_count == 0
               ? 0.0
               : static_cast<double>(model_state()) / static_cast<double>(parameter_count);
  }

  friend bool operator==(const memory_estimate&, const memory_estimate&) = default;
};

inline std::string to_string(const memory_estimate& e) {
  auto mib = [](std::size_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(text);
  };
  char per[32];
  std::snprintf(per, sizeof per, "%.2f", e.bytes_per_parameter());
  return "parameters " + mib(e.parameters) + ", gradients " + mib(e.gradients) + ", master " +
         mib(e.master_weights) + ", optimizer " + mib(e.optimizer_state) + ", activations " +
         mib(e.activations) + ", total " + mib(e.total()) + " (" + per + " bytes/parameter, " +
         std::to_string(e.parameter_count) + " parameters)";
}

namespace detail {

inline std::size_t allocated_bytes(std::size_t bytes) noexcept {
  return (bytes + 63) / 64 * 64;
}

}  // namespace detail

template <class... Policies, class Model>
memory_estimate estimate_memory(const Model& model, std::size_t batch,
                                const estimate_options& options = {}) {
  using precision_policy = typename policy_set<type_list<precision::fp32>,
                                               Policies...>::template get<precision_policy_tag>;
  static_assert(precision::check_precision_policy<precision_policy>());
  constexpr bool copy = precision_policy::has_compute_copy;
  // The parameter count as param_store lays it out: each layer's group starts on 64 bytes.
  std::size_t count = 0;
  if constexpr (requires { model.parameter_groups(); }) {
    for (const auto& group : model.parameter_groups()) {
      count = (count + 15) / 16 * 16;
      for (const model::param_spec& spec : group) {
        count += model::local_spec(spec, options.tensor).elements();
      }
    }
  } else {
    count = model.make_params().size();
  }
  const std::size_t shards = options.shards == 0 ? 1 : options.shards;
  if (shards > 1) {
    count = (count + shards * 16 - 1) / (shards * 16) * (shards * 16);
  }
  const bool device = options.layout == memory_layout::device;
  const std::size_t compute_size =
      device ? size_of(precision_policy::compute_dtype) : sizeof(float);
  const std::size_t floats = count * sizeof(float);
  using detail::allocated_bytes;
  memory_estimate e;
  e.parameter_count = count;
  e.parameters = allocated_bytes(count * compute_size);
  e.gradients = allocated_bytes(count * compute_size);
  if constexpr (copy) {
    e.gradients += allocated_bytes(floats);
    e.master_weights = allocated_bytes(floats);
  }
  e.optimizer_state = allocated_bytes(floats / shards * options.optimizer_state_per_parameter);
  std::size_t workspace = 0;
  if constexpr (requires { model.workspace_floats(batch, model::workspace_config{}); }) {
    workspace = model.workspace_floats(
        batch, model::workspace_config{.checkpoint_every = options.checkpoint_every,
                                       .tensor = options.tensor});
  } else {
    workspace = model.workspace_floats(batch);
  }
  e.activations = workspace * compute_size +
                  allocated_bytes(batch * model.output_shape().elements() * sizeof(float));
  return e;
}

}  // namespace strata::train
