// SPDX-License-Identifier: Apache-2.0
#pragma once

// The CUDA execution space (one device, one stream), RAII streams and events, pinned host memory,
// and cuda_check, which turns every CUDA status into a strata exception. Needs nvcc.
//
// Memory accounting is per device ("cuda:0", "cuda:1", ...) and counts the bytes asked of
// cudaMalloc, rounded up to the requested alignment; the driver's own granularity and the CUDA
// context are not counted, so memory_info().device_free is the device's word on what is left.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/core/execution_space.hpp"
#include "strata/core/host.hpp"
#include "strata/core/memory.hpp"

namespace strata {

// A CUDA call that failed for a reason other than memory.
class cuda_error : public error {
 public:
  cuda_error(cudaError_t status, std::string call, const std::string& what)
      : error(what), status_(status), call_(std::move(call)) {}

  cudaError_t status() const noexcept { return status_; }
  const std::string& call() const noexcept { return call_; }

 private:
  cudaError_t status_;
  std::string call_;
};

// Throws unless status is cudaSuccess: memory_error (with `request`) for
// cudaErrorMemoryAllocation, cuda_error otherwise. The message names the call, the CUDA error
// and the caller's file and line. Clears the runtime's last error so that the next check
// reports its own status.
//
//   my_kernel<<<grid, block, 0, stream.get()>>>(...);
//   strata::cuda_check(cudaGetLastError(), "my_kernel");
inline void cuda_check(cudaError_t status, std::string_view call, memory_request request = {},
                       std::source_location where = std::source_location::current()) {
  if (status == cudaSuccess) {
    return;
  }
  (void)cudaGetLastError();
  const std::string message = std::string(call) + " failed with " + cudaGetErrorName(status) +
                              " (" + cudaGetErrorString(status) + ") at " + where.file_name() +
                              ":" + std::to_string(where.line());
  if (status == cudaErrorMemoryAllocation) {
    throw memory_error(std::move(request), message);
  }
  throw cuda_error(status, std::string(call), "CUDA error: " + message);
}

namespace detail {

// Makes `device` current for a scope and restores the previous device.
class cuda_device_guard {
 public:
  explicit cuda_device_guard(int device) : device_(device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) {
      cuda_check(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
    }
  }
  ~cuda_device_guard() {
    if (previous_ != device_) {
      (void)cudaSetDevice(previous_);
    }
  }

  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

// The tracker of one device; created on first use and alive until exit.
inline memory_tracker& cuda_tracker(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<memory_tracker>> trackers;
  const std::lock_guard lock(mutex);
  std::unique_ptr<memory_tracker>& slot = trackers[device];
  if (!slot) {
    slot = std::make_unique<memory_tracker>("cuda:" + std::to_string(device));
  }
  return *slot;
}

inline memory_tracker& cuda_pinned_tracker() noexcept {
  static memory_tracker tracker("cuda_pinned");
  return tracker;
}

inline void check_alignment(const memory_tracker& tracker, std::size_t alignment) {
  if (!is_power_of_two(alignment)) {
    throw error(tracker.space() + ": alignment " + std::to_string(alignment) +
                " is not a power of two");
  }
}

inline std::size_t rounded_or_throw(const memory_tracker& tracker, std::size_t bytes,
                                    std::size_t alignment) {
  std::size_t rounded = 0;
  if (!round_up(bytes, alignment, rounded)) {
    const memory_stats now = tracker.stats();
    throw memory_error(
        {.space = tracker.space(), .requested = bytes, .in_use = now.in_use, .budget = now.budget},
        "the request overflows the address space");
  }
  return rounded;
}

inline memory_request request_for(const memory_tracker& tracker, std::size_t bytes) {
  const memory_stats now = tracker.stats();
  return {.space = tracker.space(), .requested = bytes, .in_use = now.in_use, .budget = now.budget};
}

}  // namespace detail

class cuda;
class cuda_event;

// An owning CUDA stream on one device, created non-blocking (it does not synchronize with the
// legacy default stream). Move-only.
class cuda_stream {
 public:
  explicit cuda_stream(int device = 0) : device_(device) {
    const detail::cuda_device_guard guard(device_);
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
  }
  ~cuda_stream() {
    if (stream_ != nullptr) {
      (void)cudaStreamDestroy(stream_);
    }
  }

  cuda_stream(cuda_stream&& other) noexcept
      : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)) {}
  cuda_stream& operator=(cuda_stream&& other) noexcept {
    if (this != &other) {
      if (stream_ != nullptr) {
        (void)cudaStreamDestroy(stream_);
      }
      device_ = other.device_;
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;

  cudaStream_t get() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

  void synchronize() const { cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // Work submitted to this stream after the call waits for `event`.
  void wait(const cuda_event& event) const;

  // The execution space of this stream's device that submits to this stream.
  cuda space() const;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

struct cuda_event_config {
  int device = 0;
  bool timing = true;  // false creates the event with cudaEventDisableTiming (cheaper to sync)

  bool operator==(const cuda_event_config&) const = default;
};

inline std::string to_string(const cuda_event_config& c) {
  return "cuda_event_config{.device = " + std::to_string(c.device) +
         ", .timing = " + (c.timing ? "true" : "false") + "}";
}

// An owning CUDA event. Move-only.
class cuda_event {
 public:
  explicit cuda_event(cuda_event_config config = {}) : config_(config) {
    const detail::cuda_device_guard guard(config_.device);
    cuda_check(cudaEventCreateWithFlags(&event_,
                                        config_.timing ? cudaEventDefault : cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
  }
  ~cuda_event() {
    if (event_ != nullptr) {
      (void)cudaEventDestroy(event_);
    }
  }

  cuda_event(cuda_event&& other) noexcept
      : config_(other.config_), event_(std::exchange(other.event_, nullptr)) {}
  cuda_event& operator=(cuda_event&& other) noexcept {
    if (this != &other) {
      if (event_ != nullptr) {
        (void)cudaEventDestroy(event_);
      }
      config_ = other.config_;
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;

  cudaEvent_t get() const noexcept { return event_; }
  const cuda_event_config& config() const noexcept { return config_; }

  void record(cudaStream_t stream) {
    cuda_check(cudaEventRecord(event_, stream), "cudaEventRecord");
  }
  void record(const cuda_stream& stream) { record(stream.get()); }

  void synchronize() const { cuda_check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

  // True once all work captured by the last record() is done.
  bool ready() const {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    cuda_check(status, "cudaEventQuery");
    return true;
  }

 private:
  cuda_event_config config_;
  cudaEvent_t event_ = nullptr;
};

// Milliseconds between two recorded, completed events created with timing.
inline float elapsed_milliseconds(const cuda_event& start, const cuda_event& stop) {
  float ms = 0.0f;
  cuda_check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
  return ms;
}

inline void cuda_stream::wait(const cuda_event& event) const {
  cuda_check(cudaStreamWaitEvent(stream_, event.get(), 0), "cudaStreamWaitEvent");
}

// Device memory of one GPU; work goes to one stream (by default the legacy default stream).
// A value is a handle: copies share the device's tracker. The copies, fill and zero below
// return when done; the *_async copies return at once and complete in stream order (from
// pinned host memory they overlap with the host).
class cuda {
 public:
  using execution_space_category = execution_space_tag;
  static constexpr bool host_accessible = false;
  static constexpr std::size_t default_alignment = 256;

  cuda() : cuda(0) {}
  explicit cuda(int device, cudaStream_t stream = nullptr)
      : device_(device), stream_(stream), tracker_(&detail::cuda_tracker(device)) {}

  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }

  std::string_view name() const noexcept { return tracker_->space(); }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) const {
    detail::check_alignment(*tracker_, alignment);
    if (bytes == 0) {
      return nullptr;
    }
    const std::size_t rounded = detail::rounded_or_throw(*tracker_, bytes, alignment);
    const detail::cuda_device_guard guard(device_);
    tracker_->reserve(rounded);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, rounded);
    if (status != cudaSuccess) {
      tracker_->release(rounded);
      cuda_check(status, "cudaMalloc", detail::request_for(*tracker_, rounded));
    }
    if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
      (void)cudaFree(p);
      tracker_->release(rounded);
      throw error(tracker_->space() + ": cudaMalloc returned memory aligned to less than " +
                  std::to_string(alignment) + " bytes");
    }
    return p;
  }

  void deallocate(void* p, std::size_t bytes,
                  std::size_t alignment = default_alignment) const noexcept {
    if (p == nullptr) {
      return;
    }
    int previous = device_;
    (void)cudaGetDevice(&previous);
    if (previous != device_) {
      (void)cudaSetDevice(device_);
    }
    (void)cudaFree(p);
    if (previous != device_) {
      (void)cudaSetDevice(previous);
    }
    std::size_t rounded = 0;
    detail::round_up(bytes, alignment, rounded);
    tracker_->release(rounded);
  }

  void copy_from_host(void* dst, const void* src, std::size_t bytes) const {
    copy_and_wait(dst, src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync(host to device)");
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) const {
    copy_and_wait(dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync(device to host)");
  }
  void copy(void* dst, const void* src, std::size_t bytes) const {
    copy_and_wait(dst, src, bytes, cudaMemcpyDeviceToDevice, "cudaMemcpyAsync(device to device)");
  }

  void copy_from_host_async(void* dst, const void* src, std::size_t bytes) const {
    copy_async(dst, src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync(host to device)");
  }
  void copy_to_host_async(void* dst, const void* src, std::size_t bytes) const {
    copy_async(dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync(device to host)");
  }

  void fill(void* dst, std::size_t bytes, std::byte value) const {
    if (bytes == 0) {
      return;
    }
    const detail::cuda_device_guard guard(device_);
    cuda_check(cudaMemsetAsync(dst, static_cast<int>(value), bytes, stream_), "cudaMemsetAsync");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void zero(void* dst, std::size_t bytes) const { fill(dst, bytes, std::byte{0}); }

  memory_tracker& memory() const noexcept { return *tracker_; }

  // The tracker's stats with cudaMemGetInfo's total and free bytes of the device.
  memory_snapshot memory_info() const {
    const detail::cuda_device_guard guard(device_);
    std::size_t free_bytes = 0;
    std::size_t total = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    return {.stats = tracker_->stats(), .device_total = total, .device_free = free_bytes};
  }

  // Waits for all work submitted to this space's stream.
  void synchronize() const {
    const detail::cuda_device_guard guard(device_);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  bool operator==(const cuda& other) const noexcept {
    return device_ == other.device_ && stream_ == other.stream_;
  }

 private:
  void copy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                  const char* call) const {
    if (bytes == 0) {
      return;
    }
    const detail::cuda_device_guard guard(device_);
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), call);
  }

  void copy_and_wait(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                     const char* call) const {
    if (bytes == 0) {
      return;
    }
    const detail::cuda_device_guard guard(device_);
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), call);
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  int device_;
  cudaStream_t stream_;
  memory_tracker* tracker_;
};

inline cuda cuda_stream::space() const {
  return cuda(device_, stream_);
}

// Page-locked host memory (cudaHostAlloc, portable to every device), for staging data that is
// copied to GPUs asynchronously (the data loader). Host-accessible; accounted in one
// process-wide tracker named "cuda_pinned", separate from the host tracker.
class cuda_pinned {
 public:
  using execution_space_category = execution_space_tag;
  static constexpr bool host_accessible = true;
  static constexpr std::size_t default_alignment = host::default_alignment;

  std::string_view name() const noexcept { return "cuda_pinned"; }

  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) const {
    memory_tracker& tracker = memory();
    detail::check_alignment(tracker, alignment);
    if (bytes == 0) {
      return nullptr;
    }
    const std::size_t rounded = detail::rounded_or_throw(tracker, bytes, alignment);
    tracker.reserve(rounded);
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, rounded, cudaHostAllocPortable);
    if (status != cudaSuccess) {
      tracker.release(rounded);
      cuda_check(status, "cudaHostAlloc", detail::request_for(tracker, rounded));
    }
    if (reinterpret_cast<std::uintptr_t>(p) % alignment != 0) {
      (void)cudaFreeHost(p);
      tracker.release(rounded);
      throw error("cuda_pinned: cudaHostAlloc returned memory aligned to less than " +
                  std::to_string(alignment) + " bytes");
    }
    return p;
  }

  void deallocate(void* p, std::size_t bytes,
                  std::size_t alignment = default_alignment) const noexcept {
    if (p == nullptr) {
      return;
    }
    (void)cudaFreeHost(p);
    std::size_t rounded = 0;
    detail::round_up(bytes, alignment, rounded);
    memory().release(rounded);
  }

  void copy_from_host(void* dst, const void* src, std::size_t bytes) const noexcept {
    host{}.copy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) const noexcept {
    host{}.copy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) const noexcept {
    host{}.copy(dst, src, bytes);
  }
  void fill(void* dst, std::size_t bytes, std::byte value) const noexcept {
    host{}.fill(dst, bytes, value);
  }
  void zero(void* dst, std::size_t bytes) const noexcept { host{}.zero(dst, bytes); }

  memory_tracker& memory() const noexcept { return detail::cuda_pinned_tracker(); }

  // The tracker's stats with the machine's memory (pinned memory is host memory).
  memory_snapshot memory_info() const noexcept {
    const detail::meminfo info = detail::read_meminfo();
    return {.stats = memory().stats(), .device_total = info.total, .device_free = info.available};
  }

  void synchronize() const noexcept {}

  bool operator==(const cuda_pinned&) const = default;
};

// Pinned host staging storage: buffer<T, cuda_pinned>.
template <class T>
using pinned_buffer = buffer<T, cuda_pinned>;

}  // namespace strata
