// SPDX-License-Identifier: Apache-2.0
#pragma once

// prefetch_loader: worker threads read and augment samples ahead of the training step and hand
// the step whole batches, in sampler order, from a bounded set of batch buffers.
//
//   strata::data::prefetch_loader loader(dataset, augmentation, sampler,
//                                        {.batch_size = 64, .workers = 2, .prefetch_depth = 4});
//   loader.start_epoch(epoch);
//   while (auto batch = loader.next()) { step(batch->inputs, batch->labels); }
//
// How it works. The epoch is a list of (batch, slot-in-batch) items taken in order from one
// atomic counter, so every worker helps with the oldest unfinished batch and batches complete in
// order. There are prefetch_depth + 1 batch buffers: the one the step holds and prefetch_depth
// that workers fill ahead; a worker whose item belongs to a batch more than prefetch_depth ahead
// of the step waits for a buffer. Buffers are allocated once, aligned, in the loader's execution
// space (host, or page-locked host memory with strata::cuda_pinned so that copies to a device
// can run asynchronously; see data/device_prefetcher.cuh).
//
// What it guarantees.
//   - The batches do not depend on the worker count: sample i of epoch e is transformed with the
//     context (seed, e, i), and batches hold the sampler's order. workers = 0 builds each batch
//     in the calling thread (the synchronous baseline) with the same result.
//   - next() reports how long the step waited for its batch (batch_view::wait_seconds) and the
//     epoch's totals (stats()).
//   - Workers account their host allocations (a transform's buffers) where the thread that built
//     the loader does: on a thread rank of comm::threads, in that rank's account and budget.
//   - A worker's exception ends the epoch: the next call to next() throws data_error naming the
//     worker, the sample index and the original message.
//   - A batch not ready within config().timeout_seconds makes next() throw data_error naming the
//     batch, and each worker still busy with its sample and for how long.
//   - start_epoch() and the destructor stop and join every worker, mid-epoch too; a worker that
//     is inside the dataset's read() or a transform is joined when that call returns.
//   - STRATA_LOADER_FAULT makes a worker throw or stall at a given sample (the fault suite,
//     data/loader_fault.hpp).
//
// The dataset must outlive the loader; the transform is copied into it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/core/cpus.hpp"
#include "strata/core/error.hpp"
#include "strata/core/execution_space.hpp"
#include "strata/core/host.hpp"
#include "strata/data/concepts.hpp"
#include "strata/data/loader_fault.hpp"
#include "strata/data/sampler.hpp"

namespace strata::data {

// The transform that returns its input: the default of a loader without augmentation.
struct no_transform {
  using transform_category = transform_tag;
  sample_shape output_shape(const sample_shape& in) const { return in; }
  void apply(std::span<const float> in, const sample_shape&, std::span<float> out,
             const transform_context&) const {
    std::copy(in.begin(), in.end(), out.begin());
  }
  friend bool operator==(const no_transform&, const no_transform&) = default;
};

struct loader_config {
  std::size_t batch_size = 64;     // samples per batch on this rank
  std::size_t workers = 2;         // worker threads; 0 = build batches in the calling thread
  std::size_t prefetch_depth = 4;  // batches filled ahead of the one the step holds
  bool drop_last = false;          // drop the epoch's last partial batch
  double timeout_seconds = 60.0;   // longest wait for one batch; <= 0 waits forever
  std::uint64_t seed = 0;          // augmentation seed (sample i of epoch e draws (seed, e, i))
  std::size_t alignment = 64;      // bytes; batch inputs start on this boundary
  // Added to each worker's nice value (Linux, where each thread has its own; at most 19): on
  // CPUs the workers share with compute threads (the GEMM's, other ranks'), the compute runs
  // first and the workers take the time it leaves. 0 keeps the caller's priority.
  int worker_nice = 10;

  friend bool operator==(const loader_config&, const loader_config&) = default;
};

inline std::string to_string(const loader_config& c) {
  return "loader_config{.batch_size = " + std::to_string(c.batch_size) +
         ", .workers = " + std::to_string(c.workers) +
         ", .prefetch_depth = " + std::to_string(c.prefetch_depth) +
         ", .drop_last = " + (c.drop_last ? "true" : "false") +
         ", .timeout_seconds = " + std::to_string(c.timeout_seconds) +
         ", .seed = " + std::to_string(c.seed) + ", .alignment = " + std::to_string(c.alignment) +
         ", .worker_nice = " + std::to_string(c.worker_nice) + "}";
}

// One batch as the step sees it; valid until the next call to next() or start_epoch().
struct batch_view {
  std::uint32_t epoch = 0;
  std::size_t step = 0;                    // batch number within the epoch
  std::size_t first_sample = 0;            // this rank's position of the batch's first sample
  sample_shape shape{};                    // of one sample, after the transform
  std::size_t size = 0;                    // samples in this batch (the last one may be short)
  std::span<const float> inputs{};         // size x shape.elements(), sample-major
  std::span<const std::int32_t> labels{};  // size
  std::span<const std::size_t> indices{};  // dataset index of each sample
  double wait_seconds = 0.0;               // how long next() waited for this batch
};

// The epoch so far, from the step's side.
struct loader_stats {
  std::size_t batches = 0;
  std::size_t samples = 0;
  double wait_seconds = 0.0;      // total time next() waited
  double max_wait_seconds = 0.0;  // longest single wait

  friend bool operator==(const loader_stats&, const loader_stats&) = default;
};

template <class Dataset, class Transform = no_transform, class Space = host>
class prefetch_loader {
  static_assert(check_dataset<Dataset>());
  static_assert(check_transform<Transform>());
  static_assert(execution_space<Space>, "data: the loader's Space must be an execution_space");
  static_assert(host_accessible_space<Space>,
                "data: the loader fills batches from the host: its Space must be host-accessible "
                "(strata::host or strata::cuda_pinned)");

 public:
  using dataset_type = Dataset;
  using transform_type = Transform;
  using space_type = Space;

  prefetch_loader(const Dataset& dataset, Transform transform, distributed_sampler sampler,
                  loader_config config, Space space = {})
      : dataset_(&dataset),
        transform_(std::move(transform)),
        sampler_(std::move(sampler)),
        config_(config),
        space_(std::move(space)) {
    (void)planned_loader_fault();  // a bad STRATA_LOADER_FAULT fails here, not in a worker
    if (config_.batch_size == 0) {
      throw std::invalid_argument("prefetch_loader: batch_size must be at least 1");
    }
    if (config_.prefetch_depth == 0) {
      throw std::invalid_argument("prefetch_loader: prefetch_depth must be at least 1");
    }
    if (sampler_.config().dataset_size != dataset_traits<Dataset>::size(dataset)) {
      throw std::invalid_argument(
          "prefetch_loader: the sampler is for " + std::to_string(sampler_.config().dataset_size) +
          " samples, the dataset has " + std::to_string(dataset_traits<Dataset>::size(dataset)));
    }
    in_shape_ = dataset_traits<Dataset>::shape(dataset);
    out_shape_ = transform_traits<Transform>::output_shape(transform_, in_shape_);
    in_elements_ = in_shape_.elements();
    out_elements_ = out_shape_.elements();
    const std::size_t slots = config_.workers == 0 ? 1 : config_.prefetch_depth + 1;
    slots_.reserve(slots);
    for (std::size_t s = 0; s < slots; ++s) {
      slots_.push_back(std::make_unique<slot>(space_, config_, out_elements_));
    }
  }

  prefetch_loader(const prefetch_loader&) = delete;
  prefetch_loader& operator=(const prefetch_loader&) = delete;

  ~prefetch_loader() { stop_workers(); }

  const loader_config& config() const noexcept { return config_; }
  const distributed_sampler& sampler() const noexcept { return sampler_; }
  sample_shape input_shape() const noexcept { return in_shape_; }
  sample_shape output_shape() const noexcept { return out_shape_; }
  std::size_t slot_count() const noexcept { return slots_.size(); }

  // Batches this rank gets per epoch.
  std::size_t batches_per_epoch() const noexcept {
    const std::size_t n = sampler_.samples_per_rank();
    return config_.drop_last ? n / config_.batch_size
                             : (n + config_.batch_size - 1) / config_.batch_size;
  }

  // Starts `epoch` at batch `first_batch` (to resume mid-epoch); stops the previous epoch's
  // workers first.
  void start_epoch(std::uint32_t epoch, std::size_t first_batch = 0) {
    stop_workers();
    if (first_batch > batches_per_epoch()) {
      throw std::invalid_argument("prefetch_loader: first_batch " + std::to_string(first_batch) +
                                  " is past the epoch's " + std::to_string(batches_per_epoch()) +
                                  " batches");
    }
    sampler_.set_epoch(epoch,
                       std::min(first_batch * config_.batch_size, sampler_.samples_per_rank()));
    epoch_ = epoch;
    next_batch_ = first_batch;
    end_batch_ = batches_per_epoch();
    holding_ = false;
    stats_ = {};
    failure_ = {};
    failed_.store(false);
    stop_.store(false);
    released_ = first_batch;
    next_item_.store(first_batch * config_.batch_size);
    for (auto& s : slots_) {
      s->done.store(0);
    }
    started_ = true;
    if (config_.workers > 0) {
      progress_ = std::vector<worker_progress>(config_.workers);
      threads_.reserve(config_.workers);
      for (std::size_t w = 0; w < config_.workers; ++w) {
        threads_.emplace_back([this, w] {
          lower_this_thread_priority(config_.worker_nice);
          const host_account_scope in(owner_);  // the builder's account (a thread rank's)
          work(w);
        });
      }
    }
  }

  // The next batch of the epoch, or nothing once the epoch is done. Throws data_error when a
  // worker failed or the batch is late.
  std::optional<batch_view> next() {
    if (!started_) {
      throw std::logic_error("prefetch_loader: next() before start_epoch()");
    }
    release_held();
    if (next_batch_ >= end_batch_) {
      return std::nullopt;
    }
    const std::size_t k = next_batch_;
    slot& s = *slots_[k % slots_.size()];
    const std::size_t count = batch_samples(k);
    const auto begin = clock::now();
    if (config_.workers == 0) {
      build_in_caller(k, s, count);
    } else {
      wait_for(k, s, count);
    }
    const double waited = seconds_since(begin);
    holding_ = true;
    ++next_batch_;
    stats_.batches += 1;
    stats_.samples += count;
    stats_.wait_seconds += waited;
    stats_.max_wait_seconds = std::max(stats_.max_wait_seconds, waited);
    batch_view view;
    view.epoch = epoch_;
    view.step = k;
    view.first_sample = k * config_.batch_size;
    view.shape = out_shape_;
    view.size = count;
    view.inputs = std::span<const float>(s.inputs.data(), count * out_elements_);
    view.labels = std::span<const std::int32_t>(s.labels.data(), count);
    view.indices = std::span<const std::size_t>(s.indices.data(), count);
    view.wait_seconds = waited;
    return view;
  }

  // The epoch so far.
  const loader_stats& stats() const noexcept { return stats_; }

  // Where the step stands: the sampler state after the batches handed out so far (what a
  // checkpoint stores to resume with start_epoch(epoch, next_batch())).
  std::uint32_t epoch() const noexcept { return epoch_; }
  std::size_t next_batch() const noexcept { return next_batch_; }

 private:
  using clock = std::chrono::steady_clock;

  struct slot {
    slot(const Space& space, const loader_config& config, std::size_t sample_elements)
        : inputs(space, config.batch_size * sample_elements, {.alignment = config.alignment}),
          labels(space, config.batch_size, {}),
          indices(config.batch_size) {}
    buffer<float, Space> inputs;
    buffer<std::int32_t, Space> labels;
    std::vector<std::size_t> indices;
    std::atomic<std::size_t> done{0};  // samples of the slot's current batch written
  };

  // What a worker is doing, for the stall report.
  struct worker_progress {
    std::atomic<std::uint64_t> sample{0};
    std::atomic<std::int64_t> since_ns{-1};  // -1: not inside a sample
  };

  struct failure_info {
    std::exception_ptr error{};
    std::string message{};
    std::optional<std::uint64_t> sample_index{};
  };

  static double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }

  std::size_t batch_samples(std::size_t k) const noexcept {
    const std::size_t n = sampler_.samples_per_rank();
    const std::size_t first = k * config_.batch_size;
    return std::min(config_.batch_size, n - first);
  }

  // Reads, transforms and stores sample j of batch k into slot s.
  // `stop` (null in the caller's thread) ends an injected stall (data/loader_fault.hpp).
  template <class OnIndex>
  void fill_sample(std::size_t k, std::size_t j, slot& s, std::vector<float>& scratch,
                   OnIndex&& on_index, const std::atomic<bool>* stop) {
    const std::size_t position = k * config_.batch_size + j;
    const std::size_t index = sampler_.index_at(position);
    on_index(index);
    detail::loader_fault_point(epoch_, index, stop);
    scratch.resize(in_elements_);
    const std::int32_t label =
        dataset_traits<Dataset>::read(*dataset_, index, std::span<float>(scratch));
    std::span<float> out(s.inputs.data() + j * out_elements_, out_elements_);
    transform_context context{};
    context.seed = config_.seed;
    context.epoch = epoch_;
    context.sample_index = index;
    transform_traits<Transform>::apply(transform_, std::span<const float>(scratch), in_shape_, out,
                                       context);
    s.labels.data()[j] = label;
    s.indices[j] = index;
  }

  void build_in_caller(std::size_t k, slot& s, std::size_t count) {
    std::uint64_t current = 0;
    try {
      for (std::size_t j = 0; j < count; ++j) {
        fill_sample(
            k, j, s, sync_scratch_, [&](std::size_t index) { current = index; }, nullptr);
      }
    } catch (const std::exception& e) {
      throw data_error({.file = {}, .offset = {}, .sample_index = current},
                       "loader failed on sample " + std::to_string(current) + " (epoch " +
                           std::to_string(epoch_) + ", batch " + std::to_string(k) +
                           ", no workers): " + e.what());
    }
  }

  void work(std::size_t w) {
    std::vector<float> scratch;
    worker_progress& me = progress_[w];
    const std::size_t per_batch = config_.batch_size;
    while (!stop_.load(std::memory_order_relaxed) && !failed_.load(std::memory_order_relaxed)) {
      const std::size_t item = next_item_.fetch_add(1);
      const std::size_t k = item / per_batch;
      const std::size_t j = item % per_batch;
      if (k >= end_batch_ || j >= batch_samples(k)) {
        return;
      }
      {
        std::unique_lock lock(mutex_);
        workers_cv_.wait(
            lock, [&] { return k < released_ + slots_.size() || stop_.load() || failed_.load(); });
        if (stop_.load() || failed_.load()) {
          return;
        }
      }
      slot& s = *slots_[k % slots_.size()];
      std::uint64_t current = 0;
      try {
        me.since_ns.store(now_ns());
        fill_sample(
            k, j, s, scratch,
            [&](std::size_t index) {
              current = index;
              me.sample.store(index);
            },
            &stop_);
        me.since_ns.store(-1);
      } catch (...) {
        me.since_ns.store(-1);
        fail(w, current, k, std::current_exception());
        return;
      }
      if (s.done.fetch_add(1, std::memory_order_acq_rel) + 1 == batch_samples(k)) {
        std::lock_guard lock(mutex_);
        step_cv_.notify_all();
      }
    }
  }

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
        .count();
  }

  void fail(std::size_t w, std::uint64_t index, std::size_t k, std::exception_ptr error) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::lock_guard lock(mutex_);
    if (!failed_.load()) {
      failure_.error = error;
      failure_.sample_index = index;
      failure_.message = "loader worker " + std::to_string(w) + " failed on sample " +
                         std::to_string(index) + " (epoch " + std::to_string(epoch_) + ", batch " +
                         std::to_string(k) + "): " + what;
      failed_.store(true);
    }
    step_cv_.notify_all();
    workers_cv_.notify_all();
  }

  void wait_for(std::size_t k, slot& s, std::size_t count) {
    std::unique_lock lock(mutex_);
    const auto ready = [&] {
      return s.done.load(std::memory_order_acquire) == count || failed_.load();
    };
    if (config_.timeout_seconds > 0.0 && config_.timeout_seconds < 1e9) {
      const auto limit = clock::now() + std::chrono::duration_cast<clock::duration>(
                                            std::chrono::duration<double>(config_.timeout_seconds));
      if (!step_cv_.wait_until(lock, limit, ready)) {
        lock.unlock();
        throw_stalled(k, s, count);
      }
    } else {
      step_cv_.wait(lock, ready);
    }
    if (failed_.load() && s.done.load(std::memory_order_acquire) != count) {
      throw data_error({.file = {}, .offset = {}, .sample_index = failure_.sample_index},
                       failure_.message);
    }
  }

  [[noreturn]] void throw_stalled(std::size_t k, const slot& s, std::size_t count) {
    std::string busy;
    std::optional<std::uint64_t> oldest_sample;
    double oldest = -1.0;
    const std::int64_t now = now_ns();
    for (std::size_t w = 0; w < progress_.size(); ++w) {
      const std::int64_t since = progress_[w].since_ns.load();
      if (since < 0) {
        continue;
      }
      const double busy_for = static_cast<double>(now - since) * 1e-9;
      const std::uint64_t sample = progress_[w].sample.load();
      busy += "; worker " + std::to_string(w) + " has been on sample " + std::to_string(sample) +
              " for " + std::to_string(busy_for) + " s";
      if (busy_for > oldest) {
        oldest = busy_for;
        oldest_sample = sample;
      }
    }
    if (busy.empty()) {
      busy = "; no worker is inside a sample";
    }
    throw data_error({.file = {}, .offset = {}, .sample_index = oldest_sample},
                     "loader: batch " + std::to_string(k) + " of epoch " + std::to_string(epoch_) +
                         " not ready after " + std::to_string(config_.timeout_seconds) +
                         " s (loader_timeout), " + std::to_string(s.done.load()) + " of " +
                         std::to_string(count) + " samples done" + busy);
  }

  void release_held() {
    if (!holding_) {
      return;
    }
    holding_ = false;
    if (config_.workers == 0) {
      return;
    }
    const std::size_t held = next_batch_ - 1;
    slots_[held % slots_.size()]->done.store(0, std::memory_order_relaxed);
    {
      std::lock_guard lock(mutex_);
      released_ = held + 1;
    }
    workers_cv_.notify_all();
  }

  void stop_workers() {
    {
      std::lock_guard lock(mutex_);
      stop_.store(true);
    }
    workers_cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) {
        t.join();
      }
    }
    threads_.clear();
  }

  const Dataset* dataset_;
  Transform transform_;
  distributed_sampler sampler_;
  loader_config config_;
  Space space_;
  sample_shape in_shape_{};
  sample_shape out_shape_{};
  std::size_t in_elements_ = 0;
  std::size_t out_elements_ = 0;
  std::vector<std::unique_ptr<slot>> slots_{};
  std::vector<float> sync_scratch_{};

  // Epoch state, written by start_epoch() before the workers start.
  std::uint32_t epoch_ = 0;
  std::size_t end_batch_ = 0;
  bool started_ = false;

  // The step's side.
  std::size_t next_batch_ = 0;
  bool holding_ = false;
  loader_stats stats_{};

  // Shared with the workers.
  std::mutex mutex_;
  std::condition_variable step_cv_;     // a batch completed, or a worker failed
  std::condition_variable workers_cv_;  // a buffer was released, or stop
  std::size_t released_ = 0;            // batches below this no longer hold a buffer
  std::atomic<std::size_t> next_item_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  failure_info failure_{};
  std::vector<worker_progress> progress_{};
  host owner_{};  // the host allocations of the thread that built the loader; workers count there
  std::vector<std::thread> threads_{};
};

}  // namespace strata::data
