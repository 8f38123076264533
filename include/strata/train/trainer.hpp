// SPDX-License-Identifier: Apache-2.0
#pragma once

// trainer<Model, Policies...>: the training loop where the families meet.
//
//   strata::train::trainer<decltype(model), strata::batch::accumulate, strata::precision::bf16>
//       run(model, cfg);  // cfg: a strata::config::train_config naming the same policies
//   run.on_epoch([](const strata::train::epoch_metrics& m) { ... });
//   auto summary = run.fit(train_set, augmentation, test_set, test_transform);
//
// Policy slots (core/policy.hpp), one per family, in any order; a family not named keeps its
// default:
//   batch      any batch_policy (batch/concepts.hpp): batch::fixed (default);
//              batch::accumulate (gradient_accumulation_steps micro-batches per optimizer step);
//              batch::adaptive (the micro-batch follows a memory budget, the samples per step
//              stay as configured); or the user's own. The policy says how many loader batches
//              each step takes and runs each through the trainer's step_runner.
//   precision  any precision_policy (precision/concepts.hpp): precision::fp32 (default);
//              precision::fp16 (float16 with the dynamic loss scaler) and precision::bf16
//              (bfloat16), aliases of precision::mixed<T, Scaler>: a 16-bit compute copy of the
//              parameters, float32 master weights; or the user's own. The policy holds the
//              parameters forward sees, stores the gradients, and decides each step by a vote
//              of the ranks.
//   parallel   any parallel_policy (parallel/concepts.hpp): parallel::single_rank (default);
//              parallel::data<Sync, Compressor>: all_reduce or hierarchical (optionally
//              compress::cast<float16 | bfloat16>), all_gather with compress::topk,
//              parameter_server (optionally compress::topk); parallel::zero1 (the optimizer state
//              sharded over the ranks); or the user's own. Its executor (parallel/executor.hpp)
//              does the policy's part of each step: the gradients' synchronisation, the update,
//              the skip vote, the optimizer state in checkpoints, a server role. A distributed
//              trainer takes this rank's communicator (comm::any_comm) at construction, which is
//              collective.
//   loss       any loss (model/loss.hpp): model::softmax_cross_entropy (default), which takes a
//              1x1xclasses output; or the user's own, for outputs of any shape it takes.
// The configuration must name the same policies, and a key of a policy not chosen is refused:
// config_error, naming the key.
//
// One step: zero the gradients; for each micro-batch, take the loader's next batch (data time),
// forward in training mode, the loss (softmax cross-entropy by default) with its gradient
// scaled by 1 / (samples of the step), backward (compute time); the executor's synchronize (data
// parallel: the gradients averaged, bucket by bucket during the last backward where the policy
// allows; comm time); the precision policy unscales and checks them, and the step is skipped on
// every rank that votes when they are not finite; else the executor's update (one optimizer update
// per parameter tensor at the schedule's rate). Evaluation after every epoch. Checkpoints
// (train/checkpoint.hpp) every checkpoint_interval epochs, after the last epoch and when max_steps
// stops a run, into the run's own directory checkpoint_dir/<run name> (train/run.hpp); unless
// resume = false, fit() continues that run's newest valid one as docs/train.md, "Checkpoints",
// says. A resumed run restores the parameters, the optimizer and loss-scaler state, the step and
// the loader's position, so that it matches an uninterrupted run bit for bit (not with
// parameter_server_async, whose runs are not repeatable).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "strata/batch/accumulate.hpp"
#include "strata/batch/adaptive.hpp"
#include "strata/batch/fixed.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/config/train_config.hpp"
#include "strata/config/validate.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"
#include "strata/core/policy.hpp"
#include "strata/core/round.hpp"
#include "strata/data/concepts.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/subset.hpp"
#include "strata/model/blas.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/param_store.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/single_rank.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/loss_scaler.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/checkpoint_state.hpp"
#include "strata/train/compute.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/launch_check.hpp"
#include "strata/train/metrics.hpp"
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

}  // namespace detail

template <class Model, class... Policies>
class trainer {
  static_assert(model::check_model<Model>());
  using policies = policy_set<
      type_list<batch::fixed, precision::fp32, parallel::single_rank, model::softmax_cross_entropy>,
      Policies...>;
  using batch_policy = typename policies::template get<batch_policy_tag>;
  using precision_policy = typename policies::template get<precision_policy_tag>;
  using parallel_policy = typename policies::template get<parallel_policy_tag>;
  using loss_type = typename policies::template get<loss_tag>;
  static_assert(batch::check_batch_policy<batch_policy>());
  static_assert(precision::check_precision_policy<precision_policy>());
  static_assert(parallel::check_parallel_policy<parallel_policy>());
  static_assert(model::check_loss<loss_type>());
  static constexpr dtype compute_dtype = precision_policy::compute_dtype;
  // The parallel policy's part of each step (parallel/executor.hpp).
  using executor_type = typename parallel_policy::executor;
  struct construct_tag {};

 public:
  // Whether this trainer is one rank of a data-parallel job (its constructor takes a
  // communicator).
  static constexpr bool distributed = parallel_policy::distributed;

 public:
  using model_type = Model;

  // One rank (parallel::single_rank).
  trainer(Model model, config::train_config cfg,
          trainer_options options = {}) requires(!distributed)
      : trainer(construct_tag{}, std::move(model), std::move(cfg), options, std::nullopt) {}

  // This rank of a data-parallel job (parallel::data): `comm` spans the job's ranks, as many as
  // world_size. Construction is collective: rank 0's initial parameters go to every rank.
  trainer(Model model, config::train_config cfg, comm::any_comm comm,
          trainer_options options = {}) requires distributed
      : trainer(construct_tag{}, std::move(model), std::move(cfg), options, comm) {}

 private:
  trainer(construct_tag, Model model, config::train_config cfg, trainer_options options,
          std::optional<comm::any_comm> comm)
      : model_(std::move(model)),
        cfg_(std::move(cfg)),
        options_(options),
        comm_(comm),
        params_(make_store(model_, executor_type::shards(cfg_, comm ? comm->size() : 1))),
        optimizer_(checked_optimizer(cfg_, comm ? comm->size() : 1, comm ? comm->rank() : 0,
                                     options.independent_processes)),
        batch_(cfg_),
        precision_(cfg_) {
    loss_.check_output(model_.output_shape());
    params_.initialize(static_cast<std::uint64_t>(cfg_.seed));
    run_ = make_run_identity(
        cfg_, params_, to_string(model_.input_shape()) + " -> " + to_string(model_.output_shape()),
        std::string(batch_policy::name) + ", " + std::string(precision_policy::name) +
            (precision_policy::scales_loss ? " with a loss scaler" : "") + ", " +
            std::string(parallel_policy::name) +
            (std::is_same_v<loss_type, model::softmax_cross_entropy>
                 ? std::string()
                 : ", loss " + std::string(loss_type::name)));
    // The GEMM's provider and threads, for the whole process (every rank of comm::threads sets
    // the same before the collective broadcast below).
    gemm_ = detail::choose_gemm(cfg_);
    if (cfg_.blas_threads != 0) {
      model::set_blas_threads(static_cast<int>(cfg_.blas_threads));
    } else if (!model::blas_threads_from_environment()) {
      model::set_blas_threads(
          model::automatic_blas_threads(comm_ ? comm_->ranks_sharing_cpus() : 1));
    }
    precision_.prepare(
        [&] { return make_store(model_, executor_type::shards(cfg_, comm_ ? comm_->size() : 1)); });
    if (comm_) {
      // Every rank runs the same settings and model before anything moves or is written.
      check_ranks_agree(*comm_, run_);
      comm_->broadcast(params_.values().data(), params_.size(), dtype::float32, 0);
    }
    exec_.emplace(parallel::step_context{
        .comm = comm_ ? &*comm_ : nullptr,
        .master = params_,
        .compute = compute_params(),
        .optimizer = optimizer_,
        .cfg = cfg_,
        .precision = {.round = [this](std::span<float> g) { precision_.store(g); },
                      .finite = [this](std::span<const float> g) { return precision_.finite(g); },
                      .to_master = [this](std::span<float> g,
                                          double scale) { return precision_.to_master(g, scale); },
                      .skips_steps = precision_policy::skips_steps,
                      .compute = compute_dtype}});
  }

 public:
  // This rank and the number of ranks that train together (0 and 1 on one rank; beside dedicated
  // parameter servers, the workers' or the servers' group).
  int rank() const noexcept { return group() != nullptr ? group()->rank() : 0; }
  int world_size() const noexcept { return group() != nullptr ? group()->size() : 1; }

  // The parallel policy's executor: its state and its own queries (data_executor:
  // blocking_buckets(), max_lead(), topk_residual()).
  executor_type& executor() noexcept { return *exec_; }
  const executor_type& executor() const noexcept { return *exec_; }

  // The executor holds references into the trainer.
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  const Model& model() const noexcept { return model_; }
  const config::train_config& config() const noexcept { return cfg_; }
  model::param_store& params() noexcept { return params_; }
  const model::param_store& params() const noexcept { return params_; }
  std::uint64_t step() const noexcept { return step_; }
  // This run's name, fingerprint and checkpoint directory (train/run.hpp).
  const run_identity& run() const noexcept { return run_; }
  // The host memory budget, in bytes, that this rank's adaptive micro-batch keeps within:
  // memory_budget_mb, which is each rank's; unset (0), batch::default_memory_budget() divided by
  // comm::ranks_sharing_memory (every thread rank of comm::threads; the node's ranks under
  // mpiexec).
  std::size_t memory_budget() const {
    if (cfg_.memory_budget_mb > 0) {
      return static_cast<std::size_t>(cfg_.memory_budget_mb) << 20;
    }
    const int sharing = comm_ ? std::max(1, comm_->ranks_sharing_memory()) : 1;
    return batch::default_memory_budget() / static_cast<std::size_t>(sharing);
  }

  void on_step(std::function<void(const step_metrics&)> f) {
    step_callbacks_.push_back(std::move(f));
  }
  void on_epoch(std::function<void(const epoch_metrics&)> f) {
    epoch_callbacks_.push_back(std::move(f));
  }
  // Called once per optimizer step after the last backward, before the overflow check and the
  // update, with the step number and the step's gradients as the precision policy holds them
  // (mixed: the compute copy's, multiplied by the loss scale). For inspection and for tests that
  // inject faults (an inf here makes a mixed-precision step skip).
  void on_gradients(std::function<void(std::uint64_t, std::span<float>)> f) {
    gradient_callbacks_.push_back(std::move(f));
  }

  // Mixed precision: the loss scale now (1 without a scaler) and the steps skipped so far.
  double loss_scale() const noexcept { return precision_.loss_scale(); }
  std::uint64_t skipped_steps() const noexcept { return skipped_steps_; }

  // Trains for config().epochs epochs in all (continuing a checkpointed run when resume is on),
  // evaluating on `test` after every epoch.
  template <class TrainSet, class Augment, class TestSet, class TestTransform>
  fit_summary fit(const TrainSet& train, const Augment& augment, const TestSet& test,
                  const TestTransform& test_transform) {
    static_assert(data::check_dataset<TrainSet>() && data::check_dataset<TestSet>());
    static_assert(data::check_transform<Augment>() && data::check_transform<TestTransform>());
    if (exec_->serves()) {
      return serve();
    }
    const auto fit_begin = clock::now();
    const data::subset<TrainSet> train_view(train,
                                            static_cast<std::size_t>(cfg_.max_train_samples));
    check_input_shape(data::dataset_traits<data::subset<TrainSet>>::shape(train_view), augment,
                      "training");

    data::distributed_sampler sampler(
        {.dataset_size = train_view.size(),
         .ranks = world_size(),
         .rank = rank(),
         .seed = static_cast<std::uint64_t>(cfg_.seed),
         .shuffle = true,
         .remainder = cfg_.sampler_remainder == config::sampler_remainder_kind::pad
                          ? data::remainder_policy::pad
                          : data::remainder_policy::drop});
    // The batch policy sizes the loader batches and says how many of them each optimizer step
    // takes (the epoch's last step may take fewer); the schedule and the progress count steps
    // of the size it gives late in training.
    const std::size_t micro_batch = loader_batch();
    data::prefetch_loader loader(train_view, augment, std::move(sampler), loader_settings(false));
    const std::size_t samples_per_rank = loader.sampler().samples_per_rank();
    const std::size_t micro_batches_per_epoch = loader.batches_per_epoch();
    const std::size_t steady =
        std::max<std::size_t>(1, batch_.loader_batches(std::numeric_limits<std::uint64_t>::max()));
    const std::uint64_t steps_per_epoch = (micro_batches_per_epoch + steady - 1) / steady;
    if (steps_per_epoch == 0) {
      throw config_error({.key = "batch_size_per_gpu", .file = {}, .line = 0, .column = 0},
                         "the training set's " + std::to_string(train_view.size()) +
                             " samples make no batch of " +
                             std::to_string(cfg_.batch_size_per_gpu) + " (drop_last is on)");
    }
    const auto epochs = static_cast<std::uint64_t>(cfg_.epochs);
    const auto schedule = optim::make_lr_schedule(schedule_config(steps_per_epoch));

    checkpoint_store store({.dir = run_.directory,
                            .keep = static_cast<std::size_t>(cfg_.checkpoint_keep),
                            .config_hash = run_.fingerprint});
    progress bar({.enabled = options_.print_progress && rank() == 0,
                  .log_every = static_cast<std::uint64_t>(cfg_.log_every),
                  .terminal = options_.terminal,
                  .out = options_.progress_out});

    if (options_.print_progress && rank() == 0) {
      std::size_t rows = 1;
      std::size_t cols = 1;
      for (const model::param_entry& e : params_.entries()) {
        if (e.spec.rows * e.spec.cols > rows * cols) {
          rows = e.spec.rows;
          cols = e.spec.cols;
        }
      }
      for (const std::string& line :
           detail::compute_log(gemm_, micro_batch, rows, cols, to_string(compute_dtype))) {
        bar.message(line);
      }
    }
    fit_summary summary;
    summary.run_directory = run_.directory.string();
    std::uint64_t epoch = 0;
    std::uint64_t first_batch = 0;
    if (cfg_.resume != config::resume_mode::never) {
      if (auto resumed = resume(store, bar)) {
        epoch = resumed->epoch;
        first_batch = resumed->next_batch;
        summary.resumed_from = resumed->name;
      }
    }
    set_aside_pending_ = summary.resumed_from.empty();
    if (summary.resumed_from.empty()) {
      bar.message("run " + run_.name + ": starting afresh, checkpoints in " +
                  run_.directory.string() + old_layout_note(run_));
    } else if (epoch >= epochs) {
      bar.message("run " + run_.name + " has trained " + std::to_string(epoch) +
                  " epochs, epochs = " + std::to_string(epochs) +
                  ": nothing to train (raise epochs to train longer, or resume = false to start "
                  "afresh)");
    }
    // Rank 0 writes the metrics: a row holds the step's totals over the ranks, and thread ranks
    // share one configuration, so the others would write the same file at once.
    metrics_writer metrics(rank() == 0 ? cfg_.metrics_file : std::string(),
                           !summary.resumed_from.empty());

    const std::size_t classes = model_.output_shape().elements();
    buffer<float> grad_logits(micro_batch * classes);
    parallel::bucket_reducer* const reducer = exec_->begin_fit();
    step_runner runner(*this, grad_logits, classes, reducer, bar);
    batch_.begin(runner);
    double train_seconds = 0.0;
    std::size_t train_samples = 0;
    const std::uint64_t start_step = step_;

    while (epoch < epochs) {
      loader.start_epoch(static_cast<std::uint32_t>(epoch), first_batch);
      epoch_metrics em{.epoch = epoch};
      double loss_sum = 0.0;
      std::size_t correct = 0;
      double seconds_before = 0.0;  // of this epoch, before the checkpoint it resumed from
      std::size_t samples_before = 0;
      if (first_batch > 0) {
        const detail::epoch_so_far& e = resumed_so_far_;
        loss_sum = e.loss_sum;
        correct = static_cast<std::size_t>(e.correct);
        em.steps = e.steps;
        em.samples = static_cast<std::size_t>(e.samples);
        em.skipped_steps = e.skipped_steps;
        em.data_seconds = e.data_seconds;
        em.compute_seconds = e.compute_seconds;
        em.comm_seconds = e.comm_seconds;
        seconds_before = e.seconds;
        samples_before = em.samples;
      }
      const auto epoch_begin = clock::now();
      bool stop = false;
      while (loader.next_batch() < micro_batches_per_epoch) {
        // One optimizer step: the loader batches the batch policy asks for, gradients summed,
        // each scaled by 1 / (samples of the whole step) so that the step's gradient is their
        // mean.
        const std::size_t first = loader.next_batch();
        const std::size_t micro =
            std::min<std::size_t>(std::max<std::size_t>(1, batch_.loader_batches(step_)),
                                  micro_batches_per_epoch - first);
        const std::size_t step_samples =
            std::min(samples_per_rank, (first + micro) * micro_batch) - first * micro_batch;
        const double lr = schedule.lr(step_);
        const double scale = loss_scale();
        begin_step();
        runner.begin_step(static_cast<float>(scale / static_cast<double>(step_samples)));
        model::loss_result loss{};
        double data_seconds = 0.0;
        double compute = 0.0;
        for (std::size_t m = 0; m < micro; ++m) {
          auto b = loader.next();
          const auto compute_begin = clock::now();
          data_seconds += b->wait_seconds;
          const model::loss_result part = batch_.run(
              runner,
              {.inputs = b->inputs, .labels = b->labels, .indices = b->indices, .size = b->size},
              m + 1 == micro);
          loss.loss_sum += part.loss_sum;
          loss.correct += part.correct;
          compute += seconds_since(compute_begin);
        }
        // The parallel policy's part: gradients made the ones to apply, totals over the ranks.
        const parallel::sync_result synced =
            exec_->synchronize({.step = step_,
                                .lr = lr,
                                .loss_scale = scale,
                                .mine = {.loss_sum = loss.loss_sum,
                                         .correct = static_cast<double>(loss.correct),
                                         .samples = static_cast<double>(step_samples)},
                                .overlapped = runner.overlapped()});
        compute -= synced.blocked_in_backward;
        const double comm_seconds = synced.comm_seconds;
        loss.loss_sum = synced.all.loss_sum;
        loss.correct = static_cast<std::size_t>(synced.all.correct);
        const auto global_samples = static_cast<std::size_t>(synced.all.samples);
        const auto update_begin = clock::now();
        const bool applied = finish_step(lr);
        compute += seconds_since(update_begin);
        const auto samples = static_cast<double>(global_samples);
        step_metrics sm{.epoch = epoch,
                        .step = step_,
                        .epoch_step = em.steps,
                        .samples = global_samples,
                        .loss = loss.loss_sum / samples,
                        .accuracy = static_cast<double>(loss.correct) / samples,
                        .lr = lr,
                        .data_seconds = data_seconds,
                        .compute_seconds = compute,
                        .comm_seconds = comm_seconds,
                        .samples_per_second = samples / (data_seconds + compute + comm_seconds),
                        .peak_bytes = host{}.memory().stats().peak,
                        .skipped = !applied,
                        .loss_scale = scale,
                        .micro_batch = batch_.micro_batch()};
        ++step_;
        loss_sum += loss.loss_sum;
        correct += loss.correct;
        em.steps += 1;
        em.skipped_steps += applied ? 0 : 1;
        em.samples += global_samples;
        em.data_seconds += sm.data_seconds;
        em.compute_seconds += sm.compute_seconds;
        em.comm_seconds += sm.comm_seconds;
        metrics.write(sm);
        for (auto& f : step_callbacks_) {
          f(sm);
        }
        bar.step(sm, steps_per_epoch, epochs,
                 epochs * steps_per_epoch > step_ ? epochs * steps_per_epoch - step_ : 0);
        if (cfg_.max_steps > 0 && step_ >= static_cast<std::uint64_t>(cfg_.max_steps) &&
            loader.next_batch() < micro_batches_per_epoch) {
          save(store, epoch, loader.next_batch(), bar,
               detail::epoch_so_far{.loss_sum = loss_sum,
                                    .correct = correct,
                                    .steps = em.steps,
                                    .samples = em.samples,
                                    .skipped_steps = em.skipped_steps,
                                    .seconds = seconds_before + seconds_since(epoch_begin),
                                    .data_seconds = em.data_seconds,
                                    .compute_seconds = em.compute_seconds,
                                    .comm_seconds = em.comm_seconds});
          summary.stopped_by_max_steps = true;
          stop = true;
          break;
        }
      }
      const double own_seconds = seconds_since(epoch_begin);  // this run's part of the epoch
      train_seconds += own_seconds;
      em.seconds = seconds_before + own_seconds;
      train_samples += em.samples - samples_before;
      if (stop) {
        break;
      }
      em.train_loss = em.samples == 0 ? 0.0 : loss_sum / static_cast<double>(em.samples);
      em.train_accuracy =
          em.samples == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(em.samples);
      em.samples_per_second = em.seconds > 0.0 ? static_cast<double>(em.samples) / em.seconds : 0.0;
      const eval_result ev = evaluate(test, test_transform);
      em.test_loss = ev.loss;
      em.test_accuracy = ev.accuracy;
      em.peak_bytes = host{}.memory().stats().peak;
      summary.test_loss = ev.loss;
      summary.test_accuracy = ev.accuracy;
      metrics.write(em);
      bar.epoch(em, epochs);
      for (auto& f : epoch_callbacks_) {
        f(em);
      }
      ++epoch;
      first_batch = 0;
      const bool last = epoch == epochs;
      const bool interval = cfg_.checkpoint_interval > 0 &&
                            epoch % static_cast<std::uint64_t>(cfg_.checkpoint_interval) == 0;
      const bool max_reached =
          cfg_.max_steps > 0 && step_ >= static_cast<std::uint64_t>(cfg_.max_steps);
      if (last || interval || max_reached) {
        save(store, epoch, 0, bar);
      }
      if (max_reached && !last) {
        summary.stopped_by_max_steps = true;
        break;
      }
    }
    if (summary.steps_this_run == 0 && step_ == start_step && epoch >= epochs) {
      // Resumed a finished run: report its final evaluation.
      const eval_result ev = evaluate(test, test_transform);
      summary.test_loss = ev.loss;
      summary.test_accuracy = ev.accuracy;
    }
    summary.epochs_done = epoch;
    summary.steps = step_;
    summary.skipped_steps = skipped_steps_;
    summary.steps_this_run = step_ - start_step;
    summary.samples_per_second =
        train_seconds > 0.0 ? static_cast<double>(train_samples) / train_seconds : 0.0;
    summary.wall_seconds = seconds_since(fit_begin);
    summary.params_xxh3 = xxh3_hex(params_.values());
    exec_->end_fit(step_);
    return summary;
  }

  // Loss and accuracy of the current parameters on `test` (the first max_eval_samples).
  template <class TestSet, class TestTransform>
  eval_result evaluate(const TestSet& test, const TestTransform& transform) {
    const data::subset<TestSet> view(test, static_cast<std::size_t>(cfg_.max_eval_samples));
    check_input_shape(data::dataset_traits<data::subset<TestSet>>::shape(view), transform, "test");
    data::prefetch_loader loader(
        view, transform, data::distributed_sampler({.dataset_size = view.size(), .shuffle = false}),
        loader_settings(true));
    const std::size_t batch = loader.config().batch_size;
    if (eval_work_.capacity() < batch) {
      eval_work_ = model_.make_workspace(batch);
    }
    const std::size_t classes = model_.output_shape().elements();
    eval_result out;
    double loss_sum = 0.0;
    std::size_t correct = 0;
    cast_to_compute();
    loader.start_epoch(0);
    while (auto b = loader.next()) {
      const auto logits = model_.forward(eval_work_, compute_params(), b->inputs, b->size,
                                         {.training = false,
                                          .seed = static_cast<std::uint64_t>(cfg_.seed),
                                          .step = 0,
                                          .sample_ids = {},
                                          .storage = compute_dtype});
      const model::loss_result r = loss_.evaluate({.batch = b->size,
                                                   .classes = classes,
                                                   .logits = logits,
                                                   .labels = b->labels,
                                                   .grad_logits = {},
                                                   .grad_scale = 1.0f});
      loss_sum += r.loss_sum;
      correct += r.correct;
      out.samples += b->size;
    }
    if constexpr (batch_policy::frees_evaluation_memory) {
      eval_work_ = typename Model::workspace_type{};  // the memory goes back to training
    }
    if (out.samples > 0) {
      out.loss = loss_sum / static_cast<double>(out.samples);
      out.accuracy = static_cast<double>(correct) / static_cast<double>(out.samples);
    }
    return out;
  }

 private:
  using clock = std::chrono::steady_clock;

  struct resume_point {
    std::uint64_t epoch = 0;
    std::uint64_t next_batch = 0;
    std::string name{};
  };

  static double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }

  static optim::optimizer_choice optimizer_choice(const config::train_config& c) {
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

  optim::lr_schedule_config schedule_config(std::uint64_t steps_per_epoch) const {
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

  // Samples per training loader batch, as the batch policy cuts them.
  std::size_t loader_batch() const { return batch_.loader_batch(); }

  data::loader_config loader_settings(bool eval) const {
    return {.batch_size = eval ? options_.eval_batch : loader_batch(),
            .workers = static_cast<std::size_t>(cfg_.loader_workers),
            .prefetch_depth = static_cast<std::size_t>(cfg_.prefetch_depth),
            .drop_last = eval ? false : cfg_.drop_last,
            .timeout_seconds = cfg_.loader_timeout,
            .seed = static_cast<std::uint64_t>(cfg_.seed),
            .alignment = 64};
  }

  template <class Transform>
  void check_input_shape(sample_shape dataset_shape, const Transform& t, const char* which) const {
    const sample_shape out = data::transform_traits<Transform>::output_shape(t, dataset_shape);
    if (out != model_.input_shape()) {
      throw std::invalid_argument(std::string("trainer: the ") + which + " samples are " +
                                  to_string(out) + " after the transform, the model takes " +
                                  to_string(model_.input_shape()));
    }
  }

  // The training workspace, with activation checkpointing when the model offers it.
  auto training_workspace(std::size_t capacity) const {
    const auto every = static_cast<std::size_t>(cfg_.activation_checkpoint_every);
    if constexpr (requires { model_.make_workspace(capacity, model::workspace_config{}); }) {
      return model_.make_workspace(capacity, model::workspace_config{.checkpoint_every = every});
    } else {
      if (every != 0) {
        throw config_error(
            {.key = "activation_checkpoint_every", .file = {}, .line = 0, .column = 0},
            "this model does not offer activation checkpointing");
      }
      return model_.make_workspace(capacity);
    }
  }

  // Validates the configuration, refuses what this trainer does not run, and makes the optimizer.
  static optim::any_optimizer checked_optimizer(const config::train_config& cfg_, int world,
                                                int rank, bool independent_processes) {
    config::validate(cfg_);
    parallel_policy::check_config(cfg_, world, rank);
    detail::refuse_optimizer_bounds(cfg_);
    batch_policy::check_config(cfg_);
    precision_policy::check_config(cfg_);
    if (!independent_processes) {
      detail::refuse_launch_mismatch(distributed, cfg_, detect_launch());
    }
    return optim::make_optimizer(optimizer_choice(cfg_));
  }

  using workspace = typename Model::workspace_type;

  // The trainer's side of a step as the batch policy sees it (batch::step_runner,
  // batch/concepts.hpp): one per fit(), holding the training workspace. It refuses what the
  // contract rules out: a micro-step after the step's last one, more samples than a loader batch.
  class step_runner {
   public:
    step_runner(trainer& t, buffer<float>& grad_logits, std::size_t classes,
                parallel::bucket_reducer* reducer, progress& bar)
        : t_(t), grad_logits_(grad_logits), classes_(classes), reducer_(reducer), bar_(bar) {}

    // Before a step's first micro-step: the scale of its gradients (loss scale / samples).
    void begin_step(float grad_scale) noexcept {
      grad_scale_ = grad_scale;
      ended_ = false;
      overlapped_ = false;
    }
    // Whether the step's last backward started the gradient buckets.
    bool overlapped() const noexcept { return overlapped_; }

    model::loss_result micro_step(const batch::samples& b, bool last) {
      if (ended_) {
        throw error("batch policy " + std::string(batch_policy::name) +
                    ": a micro-step after the step's last one (last = true) at step " +
                    std::to_string(t_.step_));
      }
      if (b.size * classes_ > grad_logits_.size()) {
        throw std::invalid_argument("batch policy " + std::string(batch_policy::name) +
                                    ": a micro-step of " + std::to_string(b.size) +
                                    " samples, more than a loader batch");
      }
      if (work_.capacity() < b.size) {
        set_workspace(b.size);
      }
      ended_ = last;
      overlapped_ = last && reducer_ != nullptr;
      return t_.micro_step(b, work_, grad_logits_, classes_, grad_scale_,
                           overlapped_ ? reducer_ : nullptr);
    }
    void restart() {
      if (ended_) {
        throw error("batch policy " + std::string(batch_policy::name) +
                    ": restart() after the step's last micro-step at step " +
                    std::to_string(t_.step_));
      }
      t_.compute_params().discard_grads();
    }
    void set_workspace(std::size_t samples) {
      work_ = workspace{};
      if (samples > 0) {
        work_ = t_.training_workspace(samples);
      }
    }
    std::size_t workspace_capacity() const { return work_.capacity(); }
    std::uint64_t step() const { return t_.step_; }
    std::size_t memory_budget() const { return t_.memory_budget(); }
    memory_tracker& memory() { return host{}.memory(); }
    std::size_t activation_bytes(std::size_t micro) const {
      const estimate_options options{
          .optimizer_state_per_parameter = t_.optimizer_.state_per_parameter(),
          .checkpoint_every = static_cast<std::size_t>(t_.cfg_.activation_checkpoint_every),
          .layout = memory_layout::host};
      return estimate_memory<precision_policy>(t_.model_, micro, options).activations;
    }
    // The minimum over the ranks that step together (one all_reduce of an int64).
    std::size_t agree_min(std::size_t value) {
      comm::any_comm* const g = t_.group();
      if (g == nullptr) {
        return value;
      }
      const auto mine = static_cast<std::int64_t>(value);
      std::int64_t agreed = 0;
      g->all_reduce(&mine, &agreed, 1, dtype::int64, comm::reduce_op::min);
      return static_cast<std::size_t>(agreed);
    }
    void message(std::string line) { bar_.message(line); }

   private:
    trainer& t_;
    buffer<float>& grad_logits_;
    std::size_t classes_;
    parallel::bucket_reducer* reducer_;
    progress& bar_;
    workspace work_{};
    float grad_scale_ = 1.0f;
    bool ended_ = false;
    bool overlapped_ = false;
  };

  // Forward, loss and backward of one micro-batch, adding its gradients (scaled by grad_scale)
  // into the param_store.
  model::loss_result micro_step(const batch::samples& b, workspace& work,
                                buffer<float>& grad_logits, std::size_t classes, float grad_scale,
                                parallel::bucket_reducer* reducer = nullptr) {
    static_assert(std::is_same_v<std::size_t, std::uint64_t>,
                  "trainer: sample ids are passed as dataset indices (size_t == uint64_t)");
    model::param_store& p = compute_params();
    const auto logits = model_.forward(work, p, b.inputs, b.size,
                                       {.training = true,
                                        .seed = static_cast<std::uint64_t>(cfg_.seed),
                                        .step = static_cast<std::uint32_t>(step_),
                                        .sample_ids = std::span<const std::uint64_t>(b.indices),
                                        .storage = compute_dtype});
    const std::span<float> grad(grad_logits.data(), b.size * classes);
    const model::loss_result loss = loss_.evaluate({.batch = b.size,
                                                    .classes = classes,
                                                    .logits = logits,
                                                    .labels = b.labels,
                                                    .grad_logits = grad,
                                                    .grad_scale = grad_scale});
    if (reducer != nullptr) {
      // The buckets start as backward completes them; the reducer rounds each through the
      // compute type as it starts.
      // The memory backward is about to write: the reducer reads each bucket only once
      // backward reports it complete.
      reducer->begin(p.grads_to_write());
      if constexpr (requires {
                      model_.backward(
                          work, p, grad, [](std::size_t) {}, [](std::size_t, std::size_t) {},
                          std::size_t{});
                    }) {
        // Large layers also report parts of their gradients, for the buckets cut out of them.
        model_.backward(
            work, p, grad, [reducer](std::size_t layer) { reducer->group_done(layer); },
            [reducer](std::size_t layer, std::size_t n) { reducer->part_done(layer, n); },
            reducer->part_elements());
      } else if constexpr (requires { model_.backward(work, p, grad, [](std::size_t) {}); }) {
        model_.backward(work, p, grad,
                        [reducer](std::size_t layer) { reducer->group_done(layer); });
      } else {
        model_.backward(work, p, grad);
      }
      return loss;
    }
    model_.backward(work, p, grad);
    precision_.store(p.grads());  // as the compute type holds them
    return loss;
  }

  // The parameters the model runs on: the master copy in fp32, the compute copy when mixed.
  model::param_store& compute_params() noexcept { return precision_.compute(params_); }

  // Mixed: the compute copy takes the master values rounded through the compute type.
  void cast_to_compute() { precision_.refresh(params_); }

  // Before a step's first micro-step: fresh gradients (and the compute copy when mixed). The
  // first backward writes them (param_store::discard_grads), with no pass to zero them.
  void begin_step() {
    cast_to_compute();
    compute_params().discard_grads();
  }

  // After a step's last micro-step: hand the gradients to the callbacks, then (mixed) unscale
  // them into the master gradients and check them; apply the update unless they overflowed.
  // Returns whether the update was applied.
  bool finish_step(double lr) {
    for (auto& f : gradient_callbacks_) {
      f(step_, compute_params().grads());
    }
    // With sharded state only this rank's shard of the gradients is reduced and used. The
    // precision policy decides; every rank that holds parameters votes alike (the executor's
    // vote).
    const auto [first, size] = exec_->owned();
    const std::span<const float> from =
        std::as_const(compute_params()).grads().subspan(first, size);
    const std::span<float> to = params_.grads().subspan(first, size);
    const bool apply = precision_.finish(step_, from, to, [this](bool local_nonfinite) {
      return exec_->any_rank_nonfinite(local_nonfinite);
    });
    if (!apply) {
      ++skipped_steps_;
      exec_->skipped();
      return false;
    }
    exec_->update(lr);
    return true;
  }

  // The ranks that train together (null on one rank).
  comm::any_comm* group() const noexcept { return exec_ ? exec_->group() : nullptr; }

  // The parameter store, padded to `shards` equal shards when the executor shards the optimizer
  // state.
  static model::param_store make_store(const Model& m, int shards) {
    if (shards <= 1) {
      return m.make_params();
    }
    if constexpr (requires { m.make_params(model::param_store_config{}); }) {
      return m.make_params(
          model::param_store_config{.size_multiple = static_cast<std::size_t>(shards) * 16});
    } else {
      throw std::invalid_argument(
          std::string("parallel policy ") + std::string(parallel_policy::name) +
          " cuts the parameters into " + std::to_string(shards) +
          " shards: the model's make_params must take a param_store_config (sequential's "
          "does), to pad them to equal shards");
    }
  }

  // A rank that serves (dedicated parameter servers): resume its part when asked to, then the
  // executor serves until the workers say finish.
  fit_summary serve() {
    const auto begin = clock::now();
    checkpoint_store store({.dir = run_.directory,
                            .keep = static_cast<std::size_t>(cfg_.checkpoint_keep),
                            .config_hash = run_.fingerprint});
    progress quiet({.enabled = false,
                    .log_every = 1,
                    .terminal = options_.terminal,
                    .out = options_.progress_out});
    fit_summary summary;
    summary.run_directory = run_.directory.string();
    if (cfg_.resume != config::resume_mode::never) {
      if (auto resumed = resume(store, quiet)) {
        summary.resumed_from = resumed->name;
      }
    }
    const std::uint64_t start_step = step_;
    step_ = exec_->serve(step_);
    summary.steps = step_;
    summary.skipped_steps = skipped_steps_;
    summary.steps_this_run = step_ - start_step;
    summary.wall_seconds = seconds_since(begin);
    return summary;
  }

  void save(checkpoint_store& store, std::uint64_t epoch, std::uint64_t next_batch, progress& bar,
            std::optional<detail::epoch_so_far> so_far = std::nullopt) {
    // The executor's blobs first: collective, and (asynchronous dedicated servers) they bring
    // the parameters as the servers hold them.
    const std::vector<parallel::state_blob> parts = exec_->state_blobs(step_);
    // The position: `epoch` epochs done and `next_batch` batches of the next one (names
    // epoch-E or epoch-E-step-B).
    nlohmann::json state = detail::checkpoint_state_json(
        {.epoch = epoch,
         .next_batch = next_batch,
         .step = step_,
         .samples_per_batch = static_cast<std::uint64_t>(loader_batch()),
         .seed = cfg_.seed,
         .optimizer_describe = optimizer_.describe(),
         .optimizer_step_count = optimizer_.step_count(),
         .loss_scaler = precision_.state(),
         .skipped_steps = skipped_steps_,
         .batch = batch_policy::name,
         .batch_state = batch_.state(),
         .precision = precision_policy::name,
         .world_size = world_size(),
         .parallel = parallel_policy::name,
         .params_xxh3 = xxh3_hex(params_.values()),
         .run = run_.to_json(),
         .so_far = so_far});
    std::vector<checkpoint_blob> blobs = {
        {.name = "rank-0.params.bin", .bytes = std::as_bytes(std::as_const(params_).values())}};
    for (const parallel::state_blob& b : parts) {
      blobs.push_back({.name = b.name, .bytes = b.bytes});
    }
    // Every rank holds the same parameters and optimizer state: rank 0 writes them, and the
    // others wait until it has (so that a rank never runs ahead of the newest checkpoint).
    std::string where;
    if (rank() == 0) {
      if (set_aside_pending_) {
        // A run that did not continue its directory's checkpoints keeps them, moved aside.
        if (const auto to = set_aside(run_.directory)) {
          bar.message("run " + run_.name + ": the earlier checkpoints of this name are kept in " +
                      to->string());
        }
      }
      where = store.save({.epoch = epoch, .step = next_batch}, state, blobs).path.string();
    }
    set_aside_pending_ = false;
    if (comm::any_comm* const g = group()) {
      g->barrier();
    }
    bar.message("checkpoint " + where);
  }

  std::optional<resume_point> resume(checkpoint_store& store, progress& bar) {
    std::vector<checkpoint_error> problems;
    std::optional<loaded_checkpoint> loaded = store.load_latest(&problems);
    for (const auto& p : problems) {
      bar.message(std::string("checkpoint skipped: ") + p.what());
    }
    if (!loaded) {
      if (cfg_.resume == config::resume_mode::required) {
        throw config_error({.key = "resume"}, no_checkpoint_message(run_, problems));
      }
      return std::nullopt;
    }
    const nlohmann::json& s = loaded->state;
    detail::check_continues(*loaded, run_, cfg_, bar);
    loaded->copy_blob("rank-0.params.bin", params_.values());
    exec_->restore(
        [&](std::string_view name, std::span<float> into) { loaded->copy_blob(name, into); });
    step_ = s.at("step").get<std::uint64_t>();
    optimizer_.set_step_count(s.at("optimizer").at("step_count").get<std::uint64_t>());
    precision_.restore(s.contains("loss_scaler") ? s.at("loss_scaler") : nlohmann::json());
    skipped_steps_ = s.contains("skipped_steps") ? s.at("skipped_steps").get<std::uint64_t>() : 0;
    batch_.restore(detail::batch_state_from_json(s));
    resumed_so_far_ = detail::epoch_so_far_from_json(s);
    resume_point point{.epoch = s.at("epoch").get<std::uint64_t>(),
                       .next_batch = s.at("next_batch").get<std::uint64_t>(),
                       .name = loaded->info.name};
    bar.message("run " + run_.name + ": resumed from " + loaded->info.path.string() + " (step " +
                std::to_string(step_) + ")");
    return point;
  }

  Model model_;
  config::train_config cfg_;
  trainer_options options_;
  std::optional<comm::any_comm> comm_{};  // parallel::data: this rank's communicator
  model::param_store params_;
  optim::any_optimizer optimizer_;
  batch_policy batch_;          // how a step's samples are cut into micro-batches
  precision_policy precision_;  // the compute copy, the loss scale, the skip decision
  loss_type loss_{};  // ends the model: softmax_cross_entropy unless the policies name another
  typename Model::workspace_type eval_work_{};
  std::uint64_t step_ = 0;
  run_identity run_{};
  model::gemm_decision gemm_{};
  bool set_aside_pending_ = false;  // fresh run: move earlier checkpoints aside at the first save
  std::vector<std::function<void(const step_metrics&)>> step_callbacks_{};
  std::vector<std::function<void(const epoch_metrics&)>> epoch_callbacks_{};
  std::vector<std::function<void(std::uint64_t, std::span<float>)>> gradient_callbacks_{};
  std::uint64_t skipped_steps_ = 0;
  detail::epoch_so_far resumed_so_far_{};  // the resumed checkpoint's part of its epoch
  std::optional<executor_type> exec_{};    // the parallel policy's part of each step
};

}  // namespace strata::train
