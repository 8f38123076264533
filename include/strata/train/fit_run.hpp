// SPDX-License-Identifier: Apache-2.0
#pragma once

// fit_run: what one trainer::fit() holds (train/trainer.hpp): this rank's loader over its shard
// of the training set, the checkpoint store, the progress, the step runner, the learning-rate
// schedule, the metrics file, and where the run stands. Its constructor sets the run up in the
// order the log shows it: the compute lines, then the fresh start or the resume; then the batch
// policy's begin(). The trainer, a friend, reads and advances it epoch by epoch. evaluation is
// one trainer::evaluate().

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include "strata/core/cpus.hpp"
#include "strata/core/error.hpp"
#include "strata/data/concepts.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/subset.hpp"
#include "strata/model/blas.hpp"
#include "strata/model/param_store.hpp"
#include "strata/optim/lr_schedule.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/compute.hpp"
#include "strata/train/metrics.hpp"
#include "strata/train/progress.hpp"
#include "strata/train/step_runner.hpp"
#include "strata/train/trainer_support.hpp"

namespace strata::train {

namespace detail {

// The training set as a rank reads it: a rank that does not read input samples (a pipeline's
// later stages: executor reads_inputs() false) gets zeros and label 0 without reading anything;
// its loader still gives the batches' sizes and sample indices.
template <class Dataset>
class input_reader {
 public:
  using dataset_category = data::dataset_tag;
  input_reader(const Dataset& d, bool reads) : data_(&d), reads_(reads) {}
  std::size_t size() const { return data::dataset_traits<Dataset>::size(*data_); }
  sample_shape shape() const { return data::dataset_traits<Dataset>::shape(*data_); }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    if (!reads_) {
      std::fill(out.begin(), out.end(), 0.0f);
      return 0;
    }
    return data::dataset_traits<Dataset>::read(*data_, i, out);
  }

 private:
  const Dataset* data_;
  bool reads_;
};

// The augmentation as such a rank runs it: not at all (zeros out).
template <class Transform>
class input_transform {
 public:
  using transform_category = data::transform_tag;
  input_transform(const Transform& t, bool applies) : t_(&t), applies_(applies) {}
  sample_shape output_shape(const sample_shape& in) const {
    return data::transform_traits<Transform>::output_shape(*t_, in);
  }
  void apply(std::span<const float> in, const sample_shape& in_shape, std::span<float> out,
             const data::transform_context& context) const {
    if (!applies_) {
      std::fill(out.begin(), out.end(), 0.0f);
      return;
    }
    data::transform_traits<Transform>::apply(*t_, in, in_shape, out, context);
  }

 private:
  const Transform* t_;
  bool applies_;
};

// Whether this rank's executor reads input samples (default: yes).
template <class Executor>
bool reads_inputs_of(const Executor& e) {
  if constexpr (requires {
                  { e.reads_inputs() } -> std::convertible_to<bool>;
                }) {
    return e.reads_inputs();
  } else {
    return true;
  }
}

}  // namespace detail

template <class Trainer, class TrainSet, class Augment>
struct fit_run {
  using loader_type = data::prefetch_loader<data::subset<detail::input_reader<TrainSet>>,
                                            detail::input_transform<Augment>>;
  using clock = std::chrono::steady_clock;

  fit_run(Trainer& t, const TrainSet& train, const Augment& augment)
      : reads(detail::reads_inputs_of(*t.exec_)),
        reader(train, reads),
        transform(augment, reads),
        view(reader, static_cast<std::size_t>(t.cfg_.max_train_samples)),
        micro_batch(t.loader_batch()),
        loader(view, transform, training_sampler(t, view.size()), t.loader_settings(false)),
        store(t.checkpoints()),
        bar({.enabled = t.options_.print_progress && t.rank() == 0,
             .log_every = static_cast<std::uint64_t>(t.cfg_.log_every),
             .terminal = t.options_.terminal,
             .out = t.options_.progress_out}),
        runner(t.runner_parts(), micro_batch, t.exec_->begin_fit(), bar) {
    t.check_input_shape(data::dataset_traits<TrainSet>::shape(train), augment, "training");
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
    log_compute(t);
    summary.run_directory = t.run_.directory.string();
    t.start_or_resume(*this);
    start_step = t.step_;
    metrics = metrics_writer(t.rank() == 0 ? t.cfg_.metrics_file : std::string(),
                             !summary.resumed_from.empty());
    t.batch_.begin(runner);
  }

  // The summary after the last epoch (or max_steps): the run's counts and speed, the final
  // parameters' hash.
  fit_summary finish(std::uint64_t step, std::uint64_t skipped_steps, std::string params_xxh3) {
    summary.epochs_done = epoch;
    summary.steps = step;
    summary.skipped_steps = skipped_steps;
    summary.steps_this_run = step - start_step;
    summary.samples_per_second =
        train_seconds > 0.0 ? static_cast<double>(train_samples) / train_seconds : 0.0;
    summary.wall_seconds = std::chrono::duration<double>(clock::now() - begin).count();
    summary.params_xxh3 = std::move(params_xxh3);
    return summary;
  }

  // This rank's shard of the training samples (the executor's data_shard), reshuffled every
  // epoch.
  static data::distributed_sampler training_sampler(const Trainer& t, std::size_t samples) {
    const parallel::data_shard_of shard = t.exec_->data_shard();
    return data::distributed_sampler(
        {.dataset_size = samples,
         .ranks = shard.shards,
         .rank = shard.index,
         .seed = static_cast<std::uint64_t>(t.cfg_.seed),
         .shuffle = true,
         .remainder = t.cfg_.sampler_remainder == config::sampler_remainder_kind::pad
                          ? data::remainder_policy::pad
                          : data::remainder_policy::drop});
  }

  // The log's compute lines (train/compute.hpp), on rank 0 with progress on: the GEMM measured
  // on a product of the loader batch and the largest weight tensor.
  void log_compute(const Trainer& t) {
    if (!t.options_.print_progress || t.rank() != 0) {
      return;
    }
    std::size_t rows = 1;
    std::size_t cols = 1;
    for (const model::param_entry& e : t.params_.entries()) {
      if (e.spec.rows * e.spec.cols > rows * cols) {
        rows = e.spec.rows;
        cols = e.spec.cols;
      }
    }
    for (const std::string& line :
         detail::compute_log(t.gemm_, micro_batch, rows, cols, to_string(Trainer::compute_dtype))) {
      bar.message(line);
    }
    const data::loader_config settings = t.loader_settings(false);
    const std::string threads = detail::threads_note(
        usable_cpus(), t.comm_ ? t.comm_->ranks_sharing_cpus() : 1, model::blas_threads(),
        reads ? settings.workers : 0, settings.worker_nice);
    if (!threads.empty()) {
      bar.message(threads);
    }
  }

  const clock::time_point begin = clock::now();
  const bool reads;  // this rank reads input samples (not a pipeline's later stage)
  const detail::input_reader<TrainSet> reader;
  const detail::input_transform<Augment> transform;
  const data::subset<detail::input_reader<TrainSet>> view;
  const std::size_t micro_batch;  // samples per loader batch
  loader_type loader;
  checkpoint_store store;
  progress bar;
  typename Trainer::runner_type runner;
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

// One trainer::evaluate(): the test loader over the first max_eval_samples (a rank that reads no
// input samples, a pipeline's later stage, evaluates without them too), then its batches on this
// rank's model, or through the executor's stages when it runs the passes. The trainer, a friend,
// calls run().
template <class Trainer>
struct evaluation {
  template <class TestSet, class TestTransform>
  static eval_result run(Trainer& t, const TestSet& test, const TestTransform& transform) {
    const data::subset<TestSet> view(test, static_cast<std::size_t>(t.cfg_.max_eval_samples));
    t.check_input_shape(data::dataset_traits<data::subset<TestSet>>::shape(view), transform,
                        "test");
    const bool reads = detail::reads_inputs_of(*t.exec_);
    const detail::input_reader<data::subset<TestSet>> reader(view, reads);
    const detail::input_transform<TestTransform> applied(transform, reads);
    data::prefetch_loader loader(
        reader, applied, data::distributed_sampler({.dataset_size = view.size(), .shuffle = false}),
        t.loader_settings(true));
    const auto seed = static_cast<std::uint64_t>(t.cfg_.seed);
    t.cast_to_compute();
    const model::tensor_context tensor = detail::tensor_context_of(*t.exec_);
    if (parallel::pass_runner* runner = detail::passes_runner_of(*t.exec_)) {
      return detail::evaluate_in_stages(t.model_, t.loss_, t.compute_params(), t.layers_, *runner,
                                        loader, seed, Trainer::compute_dtype, tensor);
    }
    const std::size_t batch = loader.config().batch_size;
    if (t.eval_work_.capacity() < batch) {
      t.eval_work_ = detail::training_workspace(t.model_, batch, 0, tensor.place);
    }
    const eval_result out =
        detail::evaluate_batches(t.model_, t.eval_work_, t.compute_params(), t.loss_, loader, seed,
                                 Trainer::compute_dtype, tensor);
    if constexpr (Trainer::batch_policy::frees_evaluation_memory) {
      t.eval_work_ = {};  // the memory goes back to training
    }
    return out;
  }
};

}  // namespace strata::train
