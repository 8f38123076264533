// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the trainer (train/trainer.hpp) returns and takes besides its configuration, and the
// configuration checks and mappings it applies before training: fit()'s summary, evaluation
// results, trainer_options, the parameters' hash, whether a checkpoint may be continued, the
// optimizer's bounds, and the optimizer and learning-rate schedule a configuration names; an
// epoch's running sums; the parameter store as the executor shards it; writing a checkpoint
// and finding the newest one to continue.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include "strata/core/digest.hpp"

#include "strata/comm/any_comm.hpp"
#include "strata/config/policy_keys.hpp"
#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
#include "strata/core/error.hpp"
#include "strata/model/param_store.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/passes.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/checkpoint_state.hpp"
#include "strata/train/launch_check.hpp"
#include "strata/train/metrics.hpp"
#include "strata/train/progress.hpp"
#include "strata/train/reshard.hpp"
#include "strata/train/run.hpp"
#include "strata/train/stage_passes.hpp"

namespace strata::train {

// The xxh3 of a float range as 16 hex digits (core/digest.hpp), as the summary prints it.
using strata::xxh3_hex;

// The result of fit().
struct fit_summary {
  std::uint64_t epochs_done = 0;  // epochs completed, over all runs of the checkpointed job
  std::uint64_t steps = 0;        // global optimizer steps done
  std::uint64_t steps_this_run = 0;
  double test_loss = 0.0;  // of the last evaluation
  double test_accuracy = 0.0;
  double samples_per_second = 0.0;  // training samples / training wall time, this run
  double wall_seconds = 0.0;        // fit() from start to end
  std::string params_xxh3{};        // of the final parameters, hex
  std::string resumed_from{};       // checkpoint name; empty when started fresh
  std::string run_directory{};      // checkpoint_dir/<run name>: this run's checkpoints
  bool stopped_by_max_steps = false;
  std::uint64_t skipped_steps = 0;  // steps skipped for non-finite gradients, over the whole job

  friend bool operator==(const fit_summary&, const fit_summary&) = default;
};

struct eval_result {
  double loss = 0.0;
  double accuracy = 0.0;
  std::size_t samples = 0;

  friend bool operator==(const eval_result&, const eval_result&) = default;
};

// Options that are not part of the run's configuration.
struct trainer_options {
  bool print_progress = true;
  std::FILE* progress_out = nullptr;  // nullptr: stdout
  int terminal = -1;                  // progress bar: 1 / 0 force; -1 ask isatty
  std::size_t eval_batch = 500;
  // Under a launcher of several processes (mpiexec; core/launcher.hpp) a trainer whose ranks do
  // not span them is refused: each process would train alone, into the same checkpoint
  // directory. true: this process means to train on its own (give each its own
  // checkpoint_dir or run_name).
  bool independent_processes = false;

  friend bool operator==(const trainer_options&, const trainer_options&) = default;
};

namespace detail {

// Throws config_error when `run` may not continue `checkpoint` (key resume, or run_name when the
// run is named), naming every difference; says in the log when epochs changed.
inline void check_continues(const loaded_checkpoint& checkpoint, const run_identity& run,
                            const config::train_config& cfg, progress& bar) {
  const nlohmann::json& s = checkpoint.state;
  const nlohmann::json saved_run = s.contains("run") ? s.at("run") : nlohmann::json();
  const std::vector<std::string> differences = run_differences(saved_run, run);
  if (!differences.empty()) {
    std::string text = "the checkpoint " + checkpoint.info.path.string() +
                       " was written by a run with other settings: ";
    for (std::size_t i = 0; i < differences.size(); ++i) {
      text += (i == 0 ? "" : "; ") + differences[i];
    }
    throw config_error({.key = cfg.run_name.empty() ? "resume" : "run_name"},
                       text +
                           ". Give this run another run_name, or resume = false to start "
                           "afresh (the earlier checkpoints are kept aside)");
  }
  if (const std::vector<std::string> moved = layout_changes(saved_run, run); !moved.empty()) {
    // The fingerprint names the layout: the reader cuts the tensors anew (reader_for).
    std::string text = "continuing run " + run.name + " under another layout:";
    for (const std::string& m : moved) {
      text += " " + m + ";";
    }
    text.pop_back();
    bar.message(text);
  } else {
    check_config_hash(checkpoint, run.fingerprint);
  }
  if (const auto then = saved_setting(saved_run, "epochs");
      then && *then != std::to_string(cfg.epochs)) {
    bar.message("epochs: " + *then + " in the checkpoint, " + std::to_string(cfg.epochs) +
                " in this run: the learning-rate schedule is recomputed for " +
                std::to_string(cfg.epochs) + " epochs");
  }
}

// Throws config_error naming an optimizer key outside what the update rules take: the config
// allows 1.0 for these, and the rules divide by (1 - value) or never decay. (The parallel
// policy checks its own keys, parallel/concepts.hpp; the batch and precision policies theirs.)
inline void refuse_optimizer_bounds(const config::train_config& cfg) {
  if (cfg.optimizer == config::optimizer_kind::sgd && cfg.momentum >= 1.0) {
    throw config_error({.key = "momentum"},
                       "SGD momentum must be below 1, got " + std::to_string(cfg.momentum));
  }
  if (cfg.optimizer == config::optimizer_kind::adamw &&
      (cfg.adam_beta1 >= 1.0 || cfg.adam_beta2 >= 1.0)) {
    throw config_error({.key = cfg.adam_beta1 >= 1.0 ? "adam_beta1" : "adam_beta2"},
                       "AdamW betas must be below 1");
  }
}

// The optimizer the configuration names (optimizer, momentum, nesterov, weight_decay, adam_*).
inline optim::optimizer_choice optimizer_choice(const config::train_config& c) {
  optim::optimizer_choice choice{};
  choice.kind = c.optimizer == config::optimizer_kind::sgd
                    ? optim::optimizer_choice::kind_type::sgd
                    : optim::optimizer_choice::kind_type::adamw;
  choice.sgd = {.momentum = c.momentum,
                .nesterov = c.nesterov && c.momentum > 0.0,
                .weight_decay = c.weight_decay};
  choice.adamw = {.beta1 = c.adam_beta1,
                  .beta2 = c.adam_beta2,
                  .eps = c.adam_eps,
                  .weight_decay = c.weight_decay};
  return choice;
}

// The learning-rate schedule the configuration names, in steps of an epoch of steps_per_epoch.
inline optim::lr_schedule_config schedule_config(const config::train_config& cfg_,
                                                 std::uint64_t steps_per_epoch) {
  optim::lr_schedule_config s{};
  switch (cfg_.lr_schedule) {
    case config::lr_schedule_kind::constant:
      s.kind = optim::lr_schedule_config::kind_type::constant;
      break;
    case config::lr_schedule_kind::step:
      s.kind = optim::lr_schedule_config::kind_type::step;
      break;
    case config::lr_schedule_kind::cosine:
      s.kind = optim::lr_schedule_config::kind_type::cosine;
      break;
  }
  const double per_epoch = static_cast<double>(steps_per_epoch);
  const auto warmup = static_cast<std::uint64_t>(cfg_.warmup_epochs * per_epoch + 0.5);
  s.lr = cfg_.lr;
  s.warmup_steps = static_cast<double>(warmup);
  s.step_size = static_cast<std::uint64_t>(cfg_.lr_step_size) * steps_per_epoch;
  s.gamma = cfg_.lr_gamma;
  s.min_lr = cfg_.lr_min;
  const std::uint64_t total = static_cast<std::uint64_t>(cfg_.epochs) * steps_per_epoch;
  s.total_steps = total > warmup ? total - warmup : 1;
  return s;
}

// An epoch's running sums: its metrics so far and the part before the checkpoint it resumed
// from.
struct epoch_totals {
  epoch_metrics metrics{};
  double loss_sum = 0.0;
  std::size_t correct = 0;
  double seconds_before = 0.0;  // of this epoch, before the checkpoint it resumed from
  std::size_t samples_before = 0;

  // Epoch `epoch` from its start (no checkpoint inside it), or continuing `s`.
  static epoch_totals start(std::uint64_t epoch, const epoch_so_far* s) {
    epoch_totals e{.metrics = {.epoch = epoch}};
    if (s != nullptr) {
      e.loss_sum = s->loss_sum;
      e.correct = static_cast<std::size_t>(s->correct);
      e.metrics.steps = s->steps;
      e.metrics.samples = static_cast<std::size_t>(s->samples);
      e.metrics.skipped_steps = s->skipped_steps;
      e.metrics.data_seconds = s->data_seconds;
      e.metrics.compute_seconds = s->compute_seconds;
      e.metrics.comm_seconds = s->comm_seconds;
      e.seconds_before = s->seconds;
      e.samples_before = e.metrics.samples;
    }
    return e;
  }

  void add(const step_metrics& sm, const parallel::step_totals& all) {
    loss_sum += all.loss_sum;
    correct += static_cast<std::size_t>(all.correct);
    metrics.steps += 1;
    metrics.skipped_steps += sm.skipped ? 1 : 0;
    metrics.samples += sm.samples;
    metrics.data_seconds += sm.data_seconds;
    metrics.compute_seconds += sm.compute_seconds;
    metrics.comm_seconds += sm.comm_seconds;
  }

  epoch_so_far so_far() const {
    return {.loss_sum = loss_sum,
            .correct = correct,
            .steps = metrics.steps,
            .samples = metrics.samples,
            .skipped_steps = metrics.skipped_steps,
            .seconds = metrics.seconds,
            .data_seconds = metrics.data_seconds,
            .compute_seconds = metrics.compute_seconds,
            .comm_seconds = metrics.comm_seconds};
  }
};

// What the trainer does with its four policies together: the run identity's description of them
// and the configuration checks before the optimizer is made.
template <class Batch, class Precision, class Parallel, class Loss>
struct policies_of {
  // As the run's identity names them (train/run.hpp): the loss only when it is not the default,
  // the policies' own [policy] keys (config/policy_keys.hpp) only away from their defaults.
  // Without the parallel policy and its keys (`parallel` false): what a run continued under
  // another layout keeps.
  static std::string description(const config::train_config& cfg, bool parallel = true) {
    std::string text = std::string(Batch::name) + ", " + std::string(Precision::name) +
                       (Precision::scales_loss ? " with a loss scaler" : "") +
                       (parallel ? ", " + std::string(Parallel::name) : std::string());
    if constexpr (!std::is_same_v<Loss, model::softmax_cross_entropy>) {
      text += ", loss " + std::string(Loss::name);
    }
    const std::string keys =
        parallel ? config::policy_settings_text<Batch, Precision, Parallel, Loss>(cfg)
                 : config::policy_settings_text<Batch, Precision, Loss>(cfg);
    if (!keys.empty()) {
      text += "; " + keys;
    }
    return text;
  }

  // Validates the configuration, checks the [policy] table against the keys the policies
  // declare, lets each policy check its own keys (a key of a policy not chosen is refused,
  // naming it), refuses a launch the trainer does not span, and makes the optimizer.
  static optim::any_optimizer checked_optimizer(const config::train_config& cfg, int world,
                                                int rank, bool independent_processes) {
    config::validate(cfg);
    config::check_policy_keys<Batch, Precision, Parallel, Loss>(cfg);
    Parallel::check_config(cfg, world, rank);
    refuse_optimizer_bounds(cfg);
    Batch::check_config(cfg);
    Precision::check_config(cfg);
    if (!independent_processes) {
      refuse_launch_mismatch(Parallel::distributed, cfg, detect_launch());
    }
    return optim::make_optimizer(optimizer_choice(cfg));
  }
};

// The layers this rank holds when its executor holds part of the model (a pipeline's
// rank_layers, from the model's outline), after the policy's own check of the configuration;
// empty: the whole model.
// `split`: the layers of every virtual stage in model order ("3,5"), as [policy] pipeline_split
// writes them: the checkpoint records it, so that a resume under another split is refused by name.
template <class Executor, class Policy, class Model>
std::vector<model::layer_range> rank_layers_of(const Model& m, const config::train_config& cfg,
                                               comm::any_comm* comm, std::string* split = nullptr) {
  if constexpr (requires(const parallel::model_outline& o) {
                  {
                    Executor::rank_layers(o, cfg, 1, 0)
                    } -> std::convertible_to<std::vector<model::layer_range>>;
                }) {
    const int world = comm != nullptr ? comm->size() : 1;
    const int rank = comm != nullptr ? comm->rank() : 0;
    Policy::check_config(cfg, world, rank);
    if constexpr (runs_layer_ranges<Model>) {
      parallel::model_outline outline = outline_of(m);
      if constexpr (requires {
                      { Executor::measures_layers(cfg) } -> std::convertible_to<std::size_t>;
                    }) {
        // A probe of each layer on a micro-batch; every rank takes the slowest rank's times, so
        // that all of them cut the model alike.
        if (const std::size_t batch = Executor::measures_layers(cfg); batch > 0) {
          outline.seconds = probe_layer_seconds(m, batch, static_cast<std::uint64_t>(cfg.seed));
          if (comm != nullptr) {
            comm->all_reduce(outline.seconds.data(), outline.seconds.data(), outline.seconds.size(),
                             dtype::float64, comm::reduce_op::max);
          }
        }
      }
      if (split != nullptr) {
        std::vector<std::pair<std::size_t, std::size_t>> all;
        for (int r = 0; r < world; ++r) {
          for (const model::layer_range& l : Executor::rank_layers(outline, cfg, world, r)) {
            all.emplace_back(l.first, l.last);
          }
        }
        std::sort(all.begin(), all.end());
        all.erase(std::unique(all.begin(), all.end()), all.end());
        for (const auto& [first, last] : all) {
          if (!split->empty()) {
            *split += ',';
          }
          *split += std::to_string(last - first);
        }
      }
      return Executor::rank_layers(outline, cfg, world, rank);
    } else {
      throw std::invalid_argument(
          "parallel policy " + std::string(Policy::name) +
          " gives each rank some of the layers: the model must run layer ranges "
          "(make_params(config, ranges), make_workspace(capacity, config, range, group), "
          "backward_weight, as model::sequential does)");
    }
  } else {
    return {};
  }
}

// Whether the executor shares the initial parameters itself (its ranks hold different ones).
template <class Executor>
constexpr bool shares_initial_params() {
  if constexpr (requires { Executor::shares_initial_params; }) {
    return Executor::shares_initial_params;
  } else {
    return false;
  }
}

// The executor's pass runner when it runs a step's passes itself, else null.
template <class Executor>
parallel::pass_runner* passes_runner_of(Executor& e) {
  if constexpr (requires {
                  { e.passes_runner() } -> std::convertible_to<parallel::pass_runner*>;
                }) {
    return e.passes_runner();
  } else {
    return nullptr;
  }
}

// The summary's params_xxh3: of this rank's parameters, or (collective) what the executor
// makes of every rank's (a pipeline: rank 0 hashes every stage's, in stage order).
template <class Executor>
std::string params_digest_of(Executor& e, std::span<const float> mine) {
  if constexpr (requires {
                  { e.params_digest(mine) } -> std::convertible_to<std::string>;
                }) {
    return e.params_digest(mine);
  } else {
    return xxh3_hex(mine);
  }
}

// The checkpoint blob this rank's parameters are read from.
template <class Executor>
std::string params_blob_of(const Executor& e) {
  if constexpr (requires {
                  { e.params_blob() } -> std::convertible_to<std::string>;
                }) {
    return e.params_blob();
  } else {
    return "rank-0.params.bin";
  }
}

// Every tensor of the whole model (names and specs, as a store of it would list them), for the
// run's identity: the same on every rank whatever part of the model a rank holds.
template <class Model>
std::vector<model::param_entry> whole_model_entries(const Model& m,
                                                    const model::param_store& mine) {
  if constexpr (requires {
                  m.group_names();
                  m.parameter_groups();
                }) {
    std::vector<model::param_entry> out;
    const auto names = m.group_names();
    const auto groups = m.parameter_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (const model::param_spec& spec : groups[g]) {
        out.push_back({.name = names[g] + "." + spec.name,
                       .spec = spec,
                       .offset = 0,
                       .group = g,
                       .index = out.size()});
      }
    }
    return out;
  } else {
    return mine.entries();
  }
}

// The model's parameter store (the layers in `layers` only, when not empty), padded to `shards`
// equal shards when the parallel policy (`policy`, for the message) shards the optimizer state.
// With tensor parallelism (`place`), the slices of this rank.
template <class Model>
model::param_store make_param_store(const Model& m, int shards, std::string_view policy,
                                    const std::vector<model::layer_range>& layers = {},
                                    const model::tensor_place& place = {}) {
  const auto multiple = static_cast<std::size_t>(shards) * 16;
  if (!layers.empty()) {
    if constexpr (runs_layer_ranges<Model>) {
      return m.make_params({.size_multiple = multiple, .tensor = place}, layers);
    }
  }
  // Padding only where the optimizer state is sharded: a store like one rank's.
  const model::param_store_config config{.size_multiple = shards > 1 ? multiple : 1,
                                         .tensor = place};
  if (shards <= 1 && place.size == 1) {
    return m.make_params();
  }
  if constexpr (requires { m.make_params(model::param_store_config{}); }) {
    return m.make_params(config);
  } else {
    throw std::invalid_argument(
        "parallel policy " + std::string(policy) + " cuts the parameters into " +
        std::to_string(shards) +
        " shards: the model's make_params must take a param_store_config (sequential's does), "
        "to pad them to equal shards");
  }
}

// The job's communicator as the executor orders its ranks (a mesh: tensor groups together).
template <class Executor>
std::optional<comm::any_comm> arranged_comm(std::optional<comm::any_comm> comm,
                                            const config::train_config& cfg) {
  if constexpr (requires(comm::any_comm & c) {
                  { Executor::arrange(c, cfg) } -> std::same_as<comm::any_comm>;
                }) {
    if (comm) {
      return Executor::arrange(*comm, cfg);
    }
  }
  return comm;
}

// This rank's place in its tensor-parallel group (a group of one unless the executor says).
template <class Executor>
model::tensor_place tensor_place_of(const config::train_config& cfg,
                                    const std::optional<comm::any_comm>& comm) {
  if constexpr (requires {
                  { Executor::tensor_place(cfg, 1, 0) } -> std::same_as<model::tensor_place>;
                }) {
    return Executor::tensor_place(cfg, comm ? comm->size() : 1, comm ? comm->rank() : 0);
  } else {
    return {};
  }
}

// The tensor-parallel group the layers reach (none unless the executor has one).
template <class Executor>
model::tensor_context tensor_context_of(Executor& e) {
  if constexpr (requires {
                  { e.tensor_context() } -> std::same_as<model::tensor_context>;
                }) {
    return e.tensor_context();
  } else {
    return {};
  }
}

// The layout a checkpoint is written under, as the tensor manifest records it: a checkpoint
// resumes under another one through checkpoint_reader (train/reshard.hpp).
struct layout_id {
  std::string text{};         // the policy, ranks, tensor size, optimizer shards, split
  std::uint64_t samples = 0;  // a loader batch over every data-parallel rank
  std::size_t state_per_parameter = 0;
};

template <class Executor>
layout_id layout_of(std::string_view policy, const config::train_config& cfg, int world,
                    const std::string& split, const Executor& e, std::size_t loader_batch,
                    std::size_t state_per_parameter) {
  return {.text = std::string(policy) + " on " + std::to_string(world) + " ranks (tensor " +
                  std::to_string(cfg.tensor_parallel_size) + ", optimizer shards " +
                  std::to_string(Executor::shards(cfg, world)) +
                  (split.empty() ? std::string() : ", layers per stage " + split) + ")",
          .samples = loader_batch * static_cast<std::uint64_t>(e.data_shard().shards),
          .state_per_parameter = state_per_parameter};
}

// `state` with the stages' split (`split`, as rank_layers_of gives it; empty: none) as
// "layers_per_stage" and the tensor manifest (null on ranks that do not write) as "tensors".
inline nlohmann::json with_layout(nlohmann::json state, const std::string& split,
                                  nlohmann::json manifest) {
  if (!split.empty()) {
    state["layers_per_stage"] = split;
  }
  if (!manifest.is_null()) {
    state["tensors"] = std::move(manifest);
  }
  return state;
}

// Collective over `group`: the tensor manifest of a checkpoint (on rank 0; null elsewhere).
// `samples`: a loader batch over every data-parallel rank.
template <class Executor>
nlohmann::json manifest_of(const Executor& e, const model::param_store& params,
                           comm::any_comm* group, const layout_id& layout) {
  return tensor_manifest(group, describe_rank(params, params_blob_of(e), optimizer_blobs_of(e)),
                         layout.text, layout.samples, layout.state_per_parameter);
}

// Throws config_error naming policy.pipeline_split when `checkpoint`, written before checkpoints
// carried a tensor manifest, was written by stages that held other layers than this run's: its
// stages' blobs hold their own layers only. Nothing is read or written before it.
inline void check_layer_split(const loaded_checkpoint& checkpoint, const std::string& split) {
  const nlohmann::json& s = checkpoint.state;
  if (split.empty() || !s.contains("layers_per_stage") || s.contains("tensors")) {
    return;
  }
  const std::string written = s.at("layers_per_stage").get<std::string>();
  if (written != split) {
    throw config_error(
        {.key = "policy.pipeline_split", .file = {}, .line = 0, .column = 0},
        "the checkpoint " + checkpoint.info.path.string() + " was written by stages of " + written +
            " layers, this run's split is " + split +
            " and the checkpoint has no tensor manifest to cut its stages anew (written by an "
            "earlier strata). The checkpoint is untouched: resume it under its own split");
  }
}

// How this rank reads `checkpoint`: as written, or cut anew when it was written under another
// layout (said in the log). A checkpoint whose loader batches held another number of samples
// over all data-parallel ranks (`samples`) is a config_error naming batch_size_per_gpu: its
// position in the epoch counts those batches.
template <class Executor>
checkpoint_reader reader_for(const loaded_checkpoint& checkpoint, const Executor& e,
                             const model::param_store& params, const layout_id& layout,
                             const std::string& split, progress& bar) {
  check_layer_split(checkpoint, split);
  checkpoint_reader read(checkpoint, layout.text,
                         describe_rank(params, params_blob_of(e), optimizer_blobs_of(e)), params,
                         layout.state_per_parameter);
  if (!read.reshards()) {
    return read;
  }
  const nlohmann::json& t = checkpoint.state.at("tensors");
  const auto then =
      t.contains("samples_per_batch") && t.at("samples_per_batch").is_number_unsigned()
          ? t.at("samples_per_batch").get<std::uint64_t>()
          : 0;
  if (then != layout.samples) {
    throw config_error({.key = "batch_size_per_gpu", .file = {}, .line = 0, .column = 0},
                       "the checkpoint " + checkpoint.info.path.string() + " (" +
                           read.written_under() + ") took " + std::to_string(then) +
                           " samples per loader batch over its data-parallel ranks, this run (" +
                           layout.text + ") " + std::to_string(layout.samples) +
                           ": give batch_size_per_gpu x data-parallel ranks the checkpoint's "
                           "product to continue it");
  }
  bar.message("checkpoint " + checkpoint.info.name + " was written under " + read.written_under() +
              ": its tensors are cut anew for " + layout.text);
  return read;
}

// Where a resumed run continues: `epoch` epochs done and `next_batch` batches of the next, from
// the checkpoint `name`.
struct resume_point {
  std::uint64_t epoch = 0;
  std::uint64_t next_batch = 0;
  std::string name{};
};

// What one checkpoint holds besides its state: the master parameters and the executor's blobs.
struct checkpoint_parts {
  std::span<const float> params;
  const std::vector<parallel::state_blob>& executor_blobs;
};

// Rank 0 writes the checkpoint (a fresh run first moves the directory's earlier checkpoints
// aside, once: `set_aside_pending`); every rank of `group` waits until it has, so that no rank
// runs ahead of the newest checkpoint. Says where in the log.
inline void write_checkpoint(checkpoint_store& store, checkpoint_position at,
                             const nlohmann::json& state, const checkpoint_parts& parts, int rank,
                             comm::any_comm* group, const run_identity& run,
                             bool& set_aside_pending, progress& bar) {
  std::vector<checkpoint_blob> blobs = {
      {.name = "rank-0.params.bin", .bytes = std::as_bytes(parts.params)}};
  for (const parallel::state_blob& b : parts.executor_blobs) {
    blobs.push_back({.name = b.name, .bytes = b.bytes});
  }
  std::string where;
  if (rank == 0) {
    if (set_aside_pending) {
      if (const auto to = set_aside(run.directory)) {
        bar.message("run " + run.name + ": the earlier checkpoints of this name are kept in " +
                    to->string());
      }
    }
    where = store.save(at, state, blobs).path.string();
  }
  set_aside_pending = false;
  if (group != nullptr) {
    group->barrier();
  }
  bar.message("checkpoint " + where);
}

// The newest valid checkpoint of the run that `run` may continue (the skipped ones said in the
// log), or none; none with resume = required is a config_error.
inline std::optional<loaded_checkpoint> newest_to_continue(checkpoint_store& store,
                                                           const run_identity& run,
                                                           const config::train_config& cfg,
                                                           progress& bar) {
  std::vector<checkpoint_error> problems;
  std::optional<loaded_checkpoint> loaded = store.load_latest(&problems);
  for (const auto& p : problems) {
    bar.message(std::string("checkpoint skipped: ") + p.what());
  }
  if (!loaded) {
    if (cfg.resume == config::resume_mode::required) {
      throw config_error({.key = "resume"}, no_checkpoint_message(run, problems));
    }
    return std::nullopt;
  }
  check_continues(*loaded, run, cfg, bar);
  return loaded;
}

}  // namespace detail

}  // namespace strata::train
