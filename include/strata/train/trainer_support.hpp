// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the trainer (train/trainer.hpp) returns and takes besides its configuration, and the
// configuration checks and mappings it applies before training: fit()'s summary, evaluation
// results, trainer_options, the parameters' hash, whether a checkpoint may be continued, the
// optimizer's bounds, and the optimizer and learning-rate schedule a configuration names.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/progress.hpp"
#include "strata/train/run.hpp"

namespace strata::train {

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

// The xxh3 of a float range, as 16 hex digits.
inline std::string xxh3_hex(std::span<const float> values) {
  const XXH64_hash_t h = XXH3_64bits(values.data(), values.size_bytes());
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

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
  check_config_hash(checkpoint, run.fingerprint);
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

}  // namespace detail

}  // namespace strata::train
