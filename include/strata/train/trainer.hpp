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
// default. Each is a contract a user's type may implement (docs/extending.md): batch
// (batch/concepts.hpp; fixed by default), precision (precision/concepts.hpp; fp32), parallel
// (parallel/concepts.hpp; single_rank; a distributed one takes this rank's comm::any_comm at
// construction, which is collective) and loss (model/loss.hpp; softmax_cross_entropy). The
// configuration must name the same policies; a key of a policy not chosen is a config_error.
//
// The trainer keeps the epochs, the loader, evaluation, metrics, progress, callbacks and the
// checkpoint cadence and files. One step: fresh gradients; the batch policy's micro-batches
// (forward, loss scaled by 1 / samples of the step, backward); the executor's synchronize; the
// precision policy's check and vote (a step skipped on every rank, or the executor's update).
// Checkpoints every checkpoint_interval epochs, after the last one and when max_steps stops a
// run, in checkpoint_dir/<run name> (train/run.hpp); fit() continues that run's newest valid one
// unless resume = false, bit for bit as an uninterrupted run (docs/train.md, "Checkpoints").

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
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
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"
#include "strata/core/policy.hpp"
#include "strata/data/concepts.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/subset.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/param_store.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/parallel/data_executor.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/parallel/single_rank.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/loss_scaler.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/compute.hpp"
#include "strata/train/fit_run.hpp"
#include "strata/train/metrics.hpp"
#include "strata/train/progress.hpp"
#include "strata/train/run.hpp"
#include "strata/train/step_runner.hpp"
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
  using policy_ops =
      detail::policies_of<batch_policy, precision_policy, parallel_policy, loss_type>;
  static constexpr dtype compute_dtype = precision_policy::compute_dtype;
  // The parallel policy's part of each step (parallel/executor.hpp).
  using executor_type = typename parallel_policy::executor;
  struct construct_tag {};

 public:
  // Whether this trainer is one rank of a parallel job (its constructor takes a communicator).
  static constexpr bool distributed = parallel_policy::distributed;
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
        comm_(detail::arranged_comm<executor_type>(std::move(comm), cfg_)),
        layers_(detail::rank_layers_of<executor_type, parallel_policy>(
            model_, cfg_, comm_ ? &*comm_ : nullptr, &layer_split_)),
        params_(fresh_store()),
        optimizer_(policy_ops::checked_optimizer(
            cfg_, comm ? comm->size() : 1, comm ? comm->rank() : 0, options.independent_processes)),
        batch_(cfg_),
        precision_(cfg_) {
    loss_.check_output(model_.output_shape());
    params_.initialize(static_cast<std::uint64_t>(cfg_.seed));
    run_ = make_run_identity(
        cfg_, detail::whole_model_entries(model_, params_),
        to_string(model_.input_shape()) + " -> " + to_string(model_.output_shape()),
        policy_ops::description(cfg_), policy_ops::description(cfg_, false));
    // For the whole process (every rank of comm::threads sets the same before the broadcast).
    gemm_ = detail::set_up_gemm(cfg_, comm_ ? comm_->ranks_sharing_cpus() : 1);
    precision_.prepare([this] { return fresh_store(); });
    if (comm_) {
      // Every rank runs the same settings and model before anything moves or is written.
      check_ranks_agree(*comm_, run_);
      if constexpr (!detail::shares_initial_params<executor_type>()) {
        comm_->broadcast(params_.values().data(), params_.size(), dtype::float32, 0);
      }
    }
    exec_.emplace(parallel::step_context{.comm = comm_ ? &*comm_ : nullptr,
                                         .master = params_,
                                         .compute = compute_params(),
                                         .optimizer = optimizer_,
                                         .cfg = cfg_,
                                         .precision = parallel::precision_ops_of(precision_)});
  }

 public:
  // This rank and the number of ranks that train together (0 and 1 on one rank; beside dedicated
  // parameter servers, the workers' or the servers' group).
  int rank() const noexcept { return group() != nullptr ? group()->rank() : 0; }
  int world_size() const noexcept { return group() != nullptr ? group()->size() : 1; }

  // The parallel policy's executor: its state and its own queries (blocking_buckets(); a
  // parameter server's max_lead(); top-k's topk_residual(); parallel/data_executor.hpp).
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
  // The host memory budget (bytes) of this rank's adaptive micro-batch: memory_budget_mb, else
  // batch::default_memory_budget() over comm::ranks_sharing_memory (threads; a node's ranks).
  std::size_t memory_budget() const {
    return cfg_.memory_budget_mb > 0 ? static_cast<std::size_t>(cfg_.memory_budget_mb) << 20
                                     : batch::default_memory_budget() /
                                           static_cast<std::size_t>(std::max(
                                               1, comm_ ? comm_->ranks_sharing_memory() : 1));
  }

  void on_step(std::function<void(const step_metrics&)> f) {
    step_callbacks_.push_back(std::move(f));
  }
  void on_epoch(std::function<void(const epoch_metrics&)> f) {
    epoch_callbacks_.push_back(std::move(f));
  }
  // Called once per optimizer step after the last backward, before the overflow check and the
  // update, with the step number and the gradients as the precision policy holds them (mixed:
  // the compute copy's, times the loss scale). For inspection and fault injection (an inf here
  // makes a mixed-precision step skip).
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
    fit_run<trainer, TrainSet, Augment> run(*this, train, augment);
    const auto test_now = [&] { return evaluate(test, test_transform); };
    while (run.epoch < run.epochs && train_epoch(run, test_now)) {
    }
    if (run.summary.steps_this_run == 0 && step_ == run.start_step && run.epoch >= run.epochs) {
      // Resumed a finished run: report its final evaluation.
      const eval_result ev = test_now();
      run.summary.test_loss = ev.loss;
      run.summary.test_accuracy = ev.accuracy;
    }
    exec_->end_fit(step_);
    return run.finish(step_, skipped_steps_, detail::params_digest_of(*exec_, params_.values()));
  }

  // Loss and accuracy of the current parameters on `test` (the first max_eval_samples).
  template <class TestSet, class TestTransform>
  eval_result evaluate(const TestSet& test, const TestTransform& transform) {
    return evaluation<trainer>::run(*this, test, transform);
  }

 private:
  using clock = std::chrono::steady_clock;

  static double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }

  // Samples per training loader batch, as the batch policy cuts them.
  std::size_t loader_batch() const { return batch_.loader_batch(); }
  detail::layout_id layout() const {
    return detail::layout_of(parallel_policy::name, cfg_, comm_ ? comm_->size() : 1, layer_split_,
                             *exec_, loader_batch(), optimizer_.state_per_parameter());
  }

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

  using runner_type = step_runner<Model, loss_type, batch_policy, precision_policy>;
  template <class, class, class>
  friend struct fit_run;  // sets one fit() up (train/fit_run.hpp)
  template <class>
  friend struct evaluation;  // one evaluate() (train/fit_run.hpp)

  typename runner_type::parts runner_parts() {
    return {.model = model_,
            .loss = loss_,
            .precision = precision_,
            .master = params_,
            .cfg = cfg_,
            .step = step_,
            .memory_budget = memory_budget(),
            .optimizer_state_per_parameter = optimizer_.state_per_parameter(),
            .group = group(),
            .passes_runner = detail::passes_runner_of(*exec_),
            .layers = &layers_,
            .tensor = detail::tensor_context_of(*exec_)};
  }

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

  // One epoch from run.first_batch: its steps, then (unless max_steps stopped it) the
  // evaluation, the epoch's metrics and the checkpoint the cadence asks for. Returns whether
  // training goes on.
  template <class Run, class Evaluate>
  bool train_epoch(Run& run, const Evaluate& test_now) {
    run.loader.start_epoch(static_cast<std::uint32_t>(run.epoch), run.first_batch);
    detail::epoch_totals e =
        detail::epoch_totals::start(run.epoch, run.first_batch > 0 ? &resumed_so_far_ : nullptr);
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

  // After an epoch's last step: the evaluation, the epoch's metrics and callbacks, and the
  // checkpoint after the last epoch, every checkpoint_interval epochs, and at max_steps.
  template <class Run, class Evaluate>
  void end_epoch(Run& run, detail::epoch_totals& e, const Evaluate& test_now) {
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
    // precision policy decides; every rank that holds parameters votes alike. On one rank,
    // gradients the layers bounded are finite for certain (read before `to` takes them to write).
    const bool certain =
        group() == nullptr && std::as_const(compute_params()).grads_certainly_finite();
    const auto [first, size] = exec_->owned();
    const bool apply = precision::finish(
        precision_, step_, std::as_const(compute_params()).grads().subspan(first, size),
        params_.grads().subspan(first, size),
        [this](bool nonfinite) { return exec_->any_rank_nonfinite(nonfinite); },
        {.certainly_finite = certain});
    if (!apply) {
      ++skipped_steps_;
      exec_->skipped();
      return false;
    }
    exec_->update(lr);
    return true;
  }

  // An uninitialised parameter store, sharded as the executor asks.
  model::param_store fresh_store() const {
    return detail::make_param_store(model_, executor_type::shards(cfg_, comm_ ? comm_->size() : 1),
                                    parallel_policy::name, layers_,
                                    detail::tensor_place_of<executor_type>(cfg_, comm_));
  }

  // This run's checkpoint directory, keeping checkpoint_keep of them.
  checkpoint_store checkpoints() const {
    return checkpoint_store({.dir = run_.directory,
                             .keep = static_cast<std::size_t>(cfg_.checkpoint_keep),
                             .config_hash = run_.fingerprint});
  }

  // The ranks that train together (null on one rank).
  comm::any_comm* group() const noexcept { return exec_ ? exec_->group() : nullptr; }

  // A rank that serves (dedicated parameter servers): resume its part when asked to, then the
  // executor serves until the workers say finish.
  fit_summary serve() {
    const auto begin = clock::now();
    checkpoint_store store = checkpoints();
    progress quiet({.enabled = false});
    fit_summary summary{.run_directory = run_.directory.string()};
    if (cfg_.resume != config::resume_mode::never) {
      const auto resumed = resume(store, quiet);
      summary.resumed_from = resumed ? resumed->name : std::string();
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
    // The executor's blobs first: collective (dedicated servers bring their parameters).
    const std::vector<parallel::state_blob> parts = exec_->state_blobs(step_);
    // `epoch` epochs done, `next_batch` batches of the next (epoch-E[-step-B]); the tensors.
    nlohmann::json state =
        detail::with_layout(detail::checkpoint_state_json(
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
                                 .so_far = so_far}),
                            layer_split_, detail::manifest_of(*exec_, params_, group(), layout()));
    detail::write_checkpoint(store, {.epoch = epoch, .step = next_batch}, state,
                             {.params = params_.values(), .executor_blobs = parts}, rank(), group(),
                             run_, set_aside_pending_, bar);
  }

  std::optional<detail::resume_point> resume(checkpoint_store& store, progress& bar) {
    std::optional<loaded_checkpoint> loaded = detail::newest_to_continue(store, run_, cfg_, bar);
    if (!loaded) {
      return std::nullopt;
    }
    const nlohmann::json& s = loaded->state;
    detail::checkpoint_reader read =
        detail::reader_for(*loaded, *exec_, params_, layout(), layer_split_, bar);
    read(detail::params_blob_of(*exec_), params_.values());
    exec_->restore([&](std::string_view name, std::span<float> into) { read(name, into); });
    step_ = s.at("step").get<std::uint64_t>();
    optimizer_.set_step_count(s.at("optimizer").at("step_count").get<std::uint64_t>());
    precision_.restore(s.contains("loss_scaler") ? s.at("loss_scaler") : nlohmann::json());
    skipped_steps_ = s.contains("skipped_steps") ? s.at("skipped_steps").get<std::uint64_t>() : 0;
    batch_.restore(detail::batch_state_from_json(s));
    resumed_so_far_ = detail::epoch_so_far_from_json(s);
    detail::resume_point point{.epoch = s.at("epoch").get<std::uint64_t>(),
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
  std::string layer_split_{};             // with layers_: every virtual stage's layer count ("3,5")
  // The layers this rank holds when the parallel policy cuts the model (a pipeline's stage);
  // empty: all of them.
  std::vector<model::layer_range> layers_{};
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
