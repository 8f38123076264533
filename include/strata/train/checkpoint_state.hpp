// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the trainer writes into a checkpoint's state besides its files (docs/train.md,
// "Checkpoints"), as one set of functions for every trainer type: the position, the optimizer's
// and loss scaler's state, the layout, and for a checkpoint inside an epoch the epoch's running
// sums.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata::train::detail {

// The part of an epoch done before a checkpoint in its middle: its running sums, so that a
// resumed run reports the epoch as an uninterrupted one does (train loss and accuracy over all
// of its samples, its steps; its seconds include the part before the stop).
struct epoch_so_far {
  double loss_sum = 0.0;  // summed over the epoch's samples so far, every rank's
  std::uint64_t correct = 0;
  std::uint64_t steps = 0;
  std::uint64_t samples = 0;
  std::uint64_t skipped_steps = 0;
  double seconds = 0.0;
  double data_seconds = 0.0;
  double compute_seconds = 0.0;
  double comm_seconds = 0.0;

  friend bool operator==(const epoch_so_far&, const epoch_so_far&) = default;
};

inline nlohmann::json to_json(const epoch_so_far& e) {
  return {{"loss_sum", e.loss_sum},
          {"correct", e.correct},
          {"steps", e.steps},
          {"samples", e.samples},
          {"skipped_steps", e.skipped_steps},
          {"seconds", e.seconds},
          {"data_s", e.data_seconds},
          {"compute_s", e.compute_seconds},
          {"comm_s", e.comm_seconds}};
}

// The sums of a checkpoint's "epoch_so_far" (zeros when it has none: an epoch boundary, or a
// checkpoint from before it was recorded).
inline epoch_so_far epoch_so_far_from_json(const nlohmann::json& state) {
  epoch_so_far e{};
  if (!state.contains("epoch_so_far")) {
    return e;
  }
  const nlohmann::json& j = state.at("epoch_so_far");
  e.loss_sum = j.at("loss_sum").get<double>();
  e.correct = j.at("correct").get<std::uint64_t>();
  e.steps = j.at("steps").get<std::uint64_t>();
  e.samples = j.at("samples").get<std::uint64_t>();
  e.skipped_steps = j.at("skipped_steps").get<std::uint64_t>();
  e.seconds = j.at("seconds").get<double>();
  e.data_seconds = j.at("data_s").get<double>();
  e.compute_seconds = j.at("compute_s").get<double>();
  e.comm_seconds = j.at("comm_s").get<double>();
  return e;
}

// What a checkpoint's state records besides its files (docs/train.md, "Checkpoints").
struct checkpoint_state_fields {
  std::uint64_t epoch = 0;       // epochs done
  std::uint64_t next_batch = 0;  // batches of the next epoch done
  std::uint64_t step = 0;
  std::uint64_t samples_per_batch = 0;
  std::int64_t seed = 0;
  std::string optimizer_describe{};
  std::uint64_t optimizer_step_count = 0;
  nlohmann::json loss_scaler{};
  std::uint64_t skipped_steps = 0;
  std::string_view batch{};  // the batch policy's name
  nlohmann::json batch_state{};
  std::string_view precision{};
  int world_size = 1;
  std::string_view parallel{};
  std::string params_xxh3{};
  nlohmann::json run{};
  std::optional<epoch_so_far> so_far{};  // a checkpoint inside an epoch
};

// The state JSON of a checkpoint: one function for every trainer type, not one per type.
inline nlohmann::json checkpoint_state_json(const checkpoint_state_fields& f) {
  nlohmann::json state{
      {"epoch", f.epoch},
      {"next_batch", f.next_batch},
      {"step", f.step},
      {"sampler",
       {{"epoch", f.epoch}, {"position", f.next_batch * f.samples_per_batch}, {"seed", f.seed}}},
      {"rng",
       {{"seed", f.seed},
        {"init", "stream (seed, 0, tensor index, substream 0x1A17)"},
        {"augmentation", "stream (seed, epoch, sample index)"},
        {"dropout", "stream (seed, step, sample index, layer)"}}},
      {"optimizer", {{"describe", f.optimizer_describe}, {"step_count", f.optimizer_step_count}}},
      {"lr_schedule", {{"step", f.step}}},
      {"loss_scaler", f.loss_scaler},
      {"skipped_steps", f.skipped_steps},
      {"batch", {{"policy", std::string(f.batch)}, {"state", f.batch_state}}},
      {"precision", std::string(f.precision)},
      {"layout", {{"world_size", f.world_size}, {"parallel", std::string(f.parallel)}}},
      {"params_xxh3", f.params_xxh3},
      {"run", f.run}};
  if (f.so_far) {
    state["epoch_so_far"] = to_json(*f.so_far);
  }
  return state;
}

// What the batch policy saved (batch/concepts.hpp, 5.): null when nothing. A checkpoint written
// before batch policies kept their own state has batch::adaptive's next micro-batch as
// "adaptive_micro_batch".
inline nlohmann::json batch_state_from_json(const nlohmann::json& state) {
  if (state.contains("batch")) {
    return state.at("batch").at("state");
  }
  if (state.contains("adaptive_micro_batch") &&
      state.at("adaptive_micro_batch").get<std::size_t>() > 0) {
    return {{"micro_batch", state.at("adaptive_micro_batch")}};
  }
  return nullptr;
}

}  // namespace strata::train::detail
