// SPDX-License-Identifier: Apache-2.0
#pragma once

// device_prefetcher: moves a prefetch_loader's batches to a GPU, copying batch k+1 on its own
// stream while the step computes on batch k.
//
//   strata::data::prefetch_loader<D, T, strata::cuda_pinned> loader(...);   // page-locked
//   strata::data::device_prefetcher gpu(loader, {.device = 0, .compute_stream = stream});
//   gpu.start_epoch(epoch);
//   while (auto batch = gpu.next()) { launch_step(batch->inputs, batch->labels, stream); }
//
// Two device buffers alternate. next() hands the step batch k, makes the compute stream wait
// for its copy (an event, not a host wait), fetches batch k+1 from the loader and starts copying
// it into the other buffer once the compute stream has finished with the batch that buffer held
// (the compute stream's work queued before this call). So the host never waits for the GPU
// except for the copy of batch k itself, issued one step earlier. With a loader in pageable
// host memory (strata::host) the copies are correct but do not overlap.
//
// A device_batch is valid until the next call to next() or start_epoch(), and its device data
// may be read only by work queued on the compute stream.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "strata/core/cuda.cuh"
#include "strata/core/host.hpp"
#include "strata/data/prefetch_loader.hpp"

namespace strata::data {

struct device_prefetcher_config {
  int device = 0;
  cudaStream_t compute_stream = nullptr;  // the stream the step's kernels run on

  friend bool operator==(const device_prefetcher_config&,
                         const device_prefetcher_config&) = default;
};

// One batch on the device.
struct device_batch {
  std::uint32_t epoch = 0;
  std::size_t step = 0;
  std::size_t first_sample = 0;
  sample_shape shape{};
  std::size_t size = 0;
  const float* inputs = nullptr;           // device: size x shape.elements()
  const std::int32_t* labels = nullptr;    // device: size
  std::span<const std::size_t> indices{};  // host: dataset index of each sample
  double wait_seconds = 0.0;               // the loader's wait for this batch on the host
};

template <class Loader>
class device_prefetcher {
 public:
  device_prefetcher(Loader& loader, device_prefetcher_config config)
      : loader_(&loader),
        config_(config),
        copy_stream_(config.device),
        space_(config.device, copy_stream_.get()) {
    const std::size_t elements = loader.config().batch_size * loader.output_shape().elements();
    for (auto& b : buffers_) {
      b.inputs = buffer<float, cuda>(space_, elements);
      b.labels = buffer<std::int32_t, cuda>(space_, loader.config().batch_size);
      b.indices.reserve(loader.config().batch_size);
      b.copied = cuda_event({.device = config.device, .timing = false});
      b.consumed = cuda_event({.device = config.device, .timing = false});
    }
  }

  device_prefetcher(const device_prefetcher&) = delete;
  device_prefetcher& operator=(const device_prefetcher&) = delete;

  ~device_prefetcher() {
    // The copies read the loader's buffers: let them finish before either goes away.
    (void)cudaStreamSynchronize(copy_stream_.get());
  }

  const device_prefetcher_config& config() const noexcept { return config_; }

  // Starts the loader's epoch and the copy of its first batch.
  void start_epoch(std::uint32_t epoch, std::size_t first_batch = 0) {
    copy_stream_.synchronize();
    loader_->start_epoch(epoch, first_batch);
    for (auto& b : buffers_) {
      b.in_use = false;
    }
    pending_ = -1;
    stage(0);
  }

  // The next batch on the device, or nothing at the end of the epoch.
  std::optional<device_batch> next() {
    if (pending_ < 0) {
      return std::nullopt;
    }
    const int current = pending_;
    slot& b = buffers_[current];
    const int other = 1 - current;
    // The batch the step held before this call lives in `other`: its readers are queued on
    // the compute stream by now.
    if (buffers_[other].in_use) {
      buffers_[other].consumed.record(config_.compute_stream);
      buffers_[other].in_use = false;
      buffers_[other].wait_consumed = true;
    }
    cuda_check(cudaStreamWaitEvent(config_.compute_stream, b.copied.get(), 0),
               "cudaStreamWaitEvent");
    // The loader's buffer of this batch is released by the loader's next call: the copy out of
    // it must be done first.
    b.copied.synchronize();
    b.in_use = true;
    device_batch out = b.view;
    out.inputs = b.inputs.data();
    out.labels = b.labels.data();
    out.indices = std::span<const std::size_t>(b.indices);
    pending_ = -1;
    stage(other);
    return out;
  }

 private:
  struct slot {
    buffer<float, cuda> inputs{};
    buffer<std::int32_t, cuda> labels{};
    std::vector<std::size_t> indices{};
    cuda_event copied{};  // replaced in the constructor with events of the right device
    cuda_event consumed{};
    device_batch view{};
    bool in_use = false;
    bool wait_consumed = false;
  };

  // Fetches the loader's next batch and starts copying it into buffer `which`.
  void stage(int which) {
    auto batch = loader_->next();
    if (!batch) {
      return;
    }
    slot& b = buffers_[which];
    if (b.wait_consumed) {
      copy_stream_.wait(b.consumed);
      b.wait_consumed = false;
    }
    space_.copy_from_host_async(b.inputs.data(), batch->inputs.data(), batch->inputs.size_bytes());
    space_.copy_from_host_async(b.labels.data(), batch->labels.data(), batch->labels.size_bytes());
    b.copied.record(copy_stream_);
    b.indices.assign(batch->indices.begin(), batch->indices.end());
    b.view.epoch = batch->epoch;
    b.view.step = batch->step;
    b.view.first_sample = batch->first_sample;
    b.view.shape = batch->shape;
    b.view.size = batch->size;
    b.view.wait_seconds = batch->wait_seconds;
    pending_ = which;
  }

  Loader* loader_;
  device_prefetcher_config config_;
  cuda_stream copy_stream_;
  cuda space_;
  slot buffers_[2];
  int pending_ = -1;
};

}  // namespace strata::data
