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
#include "strata/train/trainer_support.hpp"

namespace strata::train {

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
    fit_run<TrainSet, Augment> run(*this, train, augment);
    const auto test_now = [&] { return evaluate(test, test_transform); };
    while (run.epoch < run.epochs && train_epoch(run, test_now)) {
    }
    if (run.summary.steps_this_run == 0 && step_ == run.start_step && run.epoch >= run.epochs) {
      // Resumed a finished run: report its final evaluation.
      const eval_result ev = test_now();
      run.summary.test_loss = ev.loss;
      run.summary.test_accuracy = ev.accuracy;
    }
    run.summary.epochs_done = run.epoch;
    run.summary.steps = step_;
    run.summary.skipped_steps = skipped_steps_;
    run.summary.steps_this_run = step_ - run.start_step;
    run.summary.samples_per_second =
        run.train_seconds > 0.0 ? static_cast<double>(run.train_samples) / run.train_seconds : 0.0;
    run.summary.wall_seconds = seconds_since(run.begin);
    run.summary.params_xxh3 = xxh3_hex(params_.values());
    exec_->end_fit(step_);
    return run.summary;
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
    return optim::make_optimizer(detail::optimizer_choice(cfg_));
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

  // What one fit() holds: this rank's loader, the schedule, the checkpoint store, the progress,
  // the metrics file, the step runner, and where the run stands. Set up in the order the log
  // shows it: the compute lines, then the resume.
  template <class TrainSet, class Augment>
  struct fit_run {
    using loader_type = data::prefetch_loader<data::subset<TrainSet>, Augment>;

    fit_run(trainer& t, const TrainSet& train, const Augment& augment)
        : view(train, static_cast<std::size_t>(t.cfg_.max_train_samples)),
          micro_batch(t.loader_batch()),
          loader(view, augment, t.training_sampler(view.size()), t.loader_settings(false)),
          store({.dir = t.run_.directory,
                 .keep = static_cast<std::size_t>(t.cfg_.checkpoint_keep),
                 .config_hash = t.run_.fingerprint}),
          bar({.enabled = t.options_.print_progress && t.rank() == 0,
               .log_every = static_cast<std::uint64_t>(t.cfg_.log_every),
               .terminal = t.options_.terminal,
               .out = t.options_.progress_out}),
          grad_logits(micro_batch * t.model_.output_shape().elements()),
          runner(t, grad_logits, t.model_.output_shape().elements(), t.exec_->begin_fit(), bar) {
      t.check_input_shape(data::dataset_traits<data::subset<TrainSet>>::shape(view), augment,
                          "training");
      // The batch policy sizes the loader batches and says how many of them each optimizer
      // step takes (the epoch's last step may take fewer); the schedule and the progress count
      // steps of the size it gives late in training.
      const std::size_t steady = std::max<std::size_t>(
          1, t.batch_.loader_batches(std::numeric_limits<std::uint64_t>::max()));
      steps_per_epoch = (loader.batches_per_epoch() + steady - 1) / steady;
      if (steps_per_epoch == 0) {
        throw config_error({.key = "batch_size_per_gpu", .file = {}, .line = 0, .column = 0},
                           "the training set's " + std::to_string(view.size()) +
                               " samples make no batch of " +
                               std::to_string(t.cfg_.batch_size_per_gpu) + " (drop_last is on)");
      }
      epochs = static_cast<std::uint64_t>(t.cfg_.epochs);
      schedule = optim::make_lr_schedule(detail::schedule_config(t.cfg_, steps_per_epoch));
      t.log_compute(bar, micro_batch);
      summary.run_directory = t.run_.directory.string();
      t.start_or_resume(*this);
      start_step = t.step_;
      metrics = metrics_writer(t.rank() == 0 ? t.cfg_.metrics_file : std::string(),
                               !summary.resumed_from.empty());
      t.batch_.begin(runner);
    }

    const clock::time_point begin = clock::now();
    const data::subset<TrainSet> view;
    const std::size_t micro_batch;  // samples per loader batch
    loader_type loader;
    checkpoint_store store;
    progress bar;
    buffer<float> grad_logits;
    step_runner runner;
    std::uint64_t start_step = 0;  // the step this fit() started at, after resuming
    std::uint64_t steps_per_epoch = 0;
    std::uint64_t epochs = 0;
    optim::any_lr_schedule schedule{};
    metrics_writer metrics{};
    fit_summary summary{};
    std::uint64_t epoch = 0;        // epochs done
    std::uint64_t first_batch = 0;  // of the next epoch (a mid-epoch resume)
    double train_seconds = 0.0;     // this run's training time and samples
    std::size_t train_samples = 0;
  };

  // A fresh run, or the newest checkpoint of this run continued (resume), said in the log.
  template <class Run>
  void start_or_resume(Run& run) {
    if (cfg_.resume != config::resume_mode::never) {
      if (auto resumed = resume(run.store, run.bar)) {
        run.epoch = resumed->epoch;
        run.first_batch = resumed->next_batch;
        run.summary.resumed_from = resumed->name;
      }
    }
    set_aside_pending_ = run.summary.resumed_from.empty();
    if (run.summary.resumed_from.empty()) {
      run.bar.message("run " + run_.name + ": starting afresh, checkpoints in " +
                      run_.directory.string() + old_layout_note(run_));
    } else if (run.epoch >= run.epochs) {
      run.bar.message("run " + run_.name + " has trained " + std::to_string(run.epoch) +
                      " epochs, epochs = " + std::to_string(run.epochs) +
                      ": nothing to train (raise epochs to train longer, or resume = false to "
                      "start afresh)");
    }
  }

  // This rank's shard of the training samples (the executor's data_shard), reshuffled every
  // epoch.
  data::distributed_sampler training_sampler(std::size_t samples) const {
    const parallel::data_shard_of shard = exec_->data_shard();
    return data::distributed_sampler(
        {.dataset_size = samples,
         .ranks = shard.shards,
         .rank = shard.index,
         .seed = static_cast<std::uint64_t>(cfg_.seed),
         .shuffle = true,
         .remainder = cfg_.sampler_remainder == config::sampler_remainder_kind::pad
                          ? data::remainder_policy::pad
                          : data::remainder_policy::drop});
  }

  // The log's compute lines (train/compute.hpp), on rank 0 with progress on.
  void log_compute(progress& bar, std::size_t micro_batch) const {
    if (!options_.print_progress || rank() != 0) {
      return;
    }
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

  // An epoch's running sums: its metrics so far and the part before the checkpoint it resumed
  // from.
  struct epoch_totals {
    epoch_metrics metrics{};
    double loss_sum = 0.0;
    std::size_t correct = 0;
    double seconds_before = 0.0;  // of this epoch, before the checkpoint it resumed from
    std::size_t samples_before = 0;

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
    detail::epoch_so_far so_far() const {
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

  // One epoch from run.first_batch: its steps, then (unless max_steps stopped it) the
  // evaluation, the epoch's metrics and the checkpoint the cadence asks for. Returns whether
  // training goes on.
  template <class Run, class Evaluate>
  bool train_epoch(Run& run, const Evaluate& test_now) {
    run.loader.start_epoch(static_cast<std::uint32_t>(run.epoch), run.first_batch);
    epoch_totals e = epoch_start(run);
    const auto epoch_begin = clock::now();
    bool stopped = false;
    while (!stopped && run.loader.next_batch() < run.loader.batches_per_epoch()) {
      parallel::step_totals all{};
      const step_metrics sm = train_step(run, e.metrics.steps, all);
      e.add(sm, all);
      run.metrics.write(sm);
      for (auto& f : step_callbacks_) {
        f(sm);
      }
      const std::uint64_t total = run.epochs * run.steps_per_epoch;
      run.bar.step(sm, run.steps_per_epoch, run.epochs, total > step_ ? total - step_ : 0);
      stopped = cfg_.max_steps > 0 && step_ >= static_cast<std::uint64_t>(cfg_.max_steps) &&
                run.loader.next_batch() < run.loader.batches_per_epoch();
    }
    const double own_seconds = seconds_since(epoch_begin);  // this run's part of the epoch
    run.train_seconds += own_seconds;
    e.metrics.seconds = e.seconds_before + own_seconds;
    run.train_samples += e.metrics.samples - e.samples_before;
    if (stopped) {
      save(run.store, run.epoch, run.loader.next_batch(), run.bar, e.so_far());
      run.summary.stopped_by_max_steps = true;
      return false;
    }
    end_epoch(run, e, test_now);
    const bool max_reached =
        cfg_.max_steps > 0 && step_ >= static_cast<std::uint64_t>(cfg_.max_steps);
    if (max_reached && run.epoch != run.epochs) {
      run.summary.stopped_by_max_steps = true;
      return false;
    }
    return true;
  }

  // The epoch's sums: zero, or (a mid-epoch resume) those of the checkpoint.
  template <class Run>
  epoch_totals epoch_start(const Run& run) const {
    epoch_totals e{.metrics = {.epoch = run.epoch}};
    if (run.first_batch > 0) {
      const detail::epoch_so_far& s = resumed_so_far_;
      e.loss_sum = s.loss_sum;
      e.correct = static_cast<std::size_t>(s.correct);
      e.metrics.steps = s.steps;
      e.metrics.samples = static_cast<std::size_t>(s.samples);
      e.metrics.skipped_steps = s.skipped_steps;
      e.metrics.data_seconds = s.data_seconds;
      e.metrics.compute_seconds = s.compute_seconds;
      e.metrics.comm_seconds = s.comm_seconds;
      e.seconds_before = s.seconds;
      e.samples_before = e.metrics.samples;
    }
    return e;
  }

  // After an epoch's last step: the evaluation, the epoch's metrics and callbacks, and the
  // checkpoint after the last epoch, every checkpoint_interval epochs, and at max_steps.
  template <class Run, class Evaluate>
  void end_epoch(Run& run, epoch_totals& e, const Evaluate& test_now) {
    epoch_metrics& em = e.metrics;
    const auto samples = static_cast<double>(em.samples);
    em.train_loss = em.samples == 0 ? 0.0 : e.loss_sum / samples;
    em.train_accuracy = em.samples == 0 ? 0.0 : static_cast<double>(e.correct) / samples;
    em.samples_per_second = em.seconds > 0.0 ? samples / em.seconds : 0.0;
    const eval_result ev = test_now();
    em.test_loss = ev.loss;
    em.test_accuracy = ev.accuracy;
    em.peak_bytes = host{}.memory().stats().peak;
    run.summary.test_loss = ev.loss;
    run.summary.test_accuracy = ev.accuracy;
    run.metrics.write(em);
    run.bar.epoch(em, run.epochs);
    for (auto& f : epoch_callbacks_) {
      f(em);
    }
    ++run.epoch;
    run.first_batch = 0;
    const bool interval = cfg_.checkpoint_interval > 0 &&
                          run.epoch % static_cast<std::uint64_t>(cfg_.checkpoint_interval) == 0;
    const bool max_reached =
        cfg_.max_steps > 0 && step_ >= static_cast<std::uint64_t>(cfg_.max_steps);
    if (run.epoch == run.epochs || interval || max_reached) {
      save(run.store, run.epoch, 0, run.bar);
    }
  }

  // One optimizer step: the loader batches the batch policy asks for, gradients summed, each
  // scaled by 1 / (samples of the whole step) so that the step's gradient is their mean; the
  // executor's synchronisation; the precision policy's decision and the update.
  // `all`: the step's totals over the ranks.
  template <class Run>
  step_metrics train_step(Run& run, std::uint64_t epoch_step, parallel::step_totals& all) {
    const std::size_t per_epoch = run.loader.batches_per_epoch();
    const std::size_t first = run.loader.next_batch();
    const std::size_t micro = std::min<std::size_t>(
        std::max<std::size_t>(1, batch_.loader_batches(step_)), per_epoch - first);
    const std::size_t step_samples =
        std::min(run.loader.sampler().samples_per_rank(), (first + micro) * run.micro_batch) -
        first * run.micro_batch;
    const double lr = run.schedule.lr(step_);
    const double scale = loss_scale();
    begin_step();
    run.runner.begin_step(static_cast<float>(scale / static_cast<double>(step_samples)));
    model::loss_result loss{};
    double data_seconds = 0.0;
    double compute = 0.0;
    for (std::size_t m = 0; m < micro; ++m) {
      auto b = run.loader.next();
      const auto compute_begin = clock::now();
      data_seconds += b->wait_seconds;
      loss += batch_.run(
          run.runner,
          {.inputs = b->inputs, .labels = b->labels, .indices = b->indices, .size = b->size},
          m + 1 == micro);
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
                            .overlapped = run.runner.overlapped()});
    compute -= synced.blocked_in_backward;
    const auto update_begin = clock::now();
    const bool applied = finish_step(lr);
    compute += seconds_since(update_begin);
    all = synced.all;
    const double samples = synced.all.samples;
    const step_metrics sm{
        .epoch = run.epoch,
        .step = step_,
        .epoch_step = epoch_step,
        .samples = static_cast<std::size_t>(samples),
        .loss = synced.all.loss_sum / samples,
        .accuracy = synced.all.correct / samples,
        .lr = lr,
        .data_seconds = data_seconds,
        .compute_seconds = compute,
        .comm_seconds = synced.comm_seconds,
        .samples_per_second = samples / (data_seconds + compute + synced.comm_seconds),
        .peak_bytes = host{}.memory().stats().peak,
        .skipped = !applied,
        .loss_scale = scale,
        .micro_batch = batch_.micro_batch()};
    ++step_;
    return sm;
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
