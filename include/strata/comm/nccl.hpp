// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata's NCCL layer. This is the only strata header that includes <nccl.h>; everything that
// speaks NCCL lives here, in sections:
//
//   1. dtype mapping   the NCCL datatype of each strata::dtype
//   2. the nccl comm backend (follows the dtype mapping)
//
// <nccl.h> includes <cuda_runtime.h>, so this header needs the CUDA include directory but not
// nvcc: it compiles with the host compiler (it launches no kernels of its own, and
// core/cuda.cuh, for cuda_check, streams and events, is plain CUDA runtime API).

#include <nccl.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/detail/wait.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/fingerprint.hpp"
#include "strata/comm/history.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/cuda.cuh"
#include "strata/core/deadline.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

// ---------------------------------------------------------------------------------------------
// 1. dtype mapping
//
// NCCL reduces every strata dtype natively, float16 and bfloat16 included (ncclBfloat16 since
// NCCL 2.10).

// The NCCL datatype of `type`. Throws strata::error for a value outside the enum.
constexpr ncclDataType_t nccl_datatype(dtype type) {
  switch (type) {
    case dtype::float32:
      return ncclFloat32;
    case dtype::float64:
      return ncclFloat64;
    case dtype::float16:
      return ncclFloat16;
    case dtype::bfloat16:
      return ncclBfloat16;
    case dtype::int32:
      return ncclInt32;
    case dtype::int64:
      return ncclInt64;
    case dtype::uint8:
      return ncclUint8;
  }
  throw error("nccl_datatype: invalid dtype value " + std::to_string(static_cast<unsigned>(type)));
}

// nccl_datatype(dtype_of<T>); a T that is not an element type fails to compile, with the list of
// the allowed ones.
template <class T>
constexpr ncclDataType_t nccl_datatype_of() {
  return nccl_datatype(dtype_of<T>);
}

// ---------------------------------------------------------------------------------------------
// 2. the nccl comm backend
//
// strata::comm::nccl is a comm_backend over NCCL: one rank per CUDA device, buffers are device
// pointers of that device, and every operation runs on the communicator's own CUDA stream
// (stream()), in the order it was issued. Order the producers of a buffer before the call
// (cudaStreamWaitEvent(c.stream(), ...)) and its consumers after the request.
//
//   strata::comm::threads::run(n, [](strata::comm::threads& host) {
//     strata::comm::nccl gpu(host);                 // collective over `host`
//     gpu.all_reduce(d_grads, d_grads, count, dtype::float32, reduce_op::avg);
//   });
//
// - Bootstrap: rank 0 of any other comm_backend (threads, mpi) makes the ncclUniqueId and
//   broadcasts its bytes; every rank then creates its communicator non-blocking
//   (ncclConfig_t::blocking = 0, ncclCommInitRankConfig) and polls ncclCommGetAsyncError until it
//   leaves ncclInProgress, within config().timeout. The ranks agree on success through the
//   bootstrap communicator, so that a failure on one rank fails every rank.
// - Device: nccl_config::device, or the bootstrap rank modulo the number of visible devices.
//   NCCL supports one rank per device in a communicator; across several nodes, pass the local
//   rank's device.
// - Requests: a CUDA event recorded after the operation. wait() / test() poll cudaEventQuery and
//   ncclCommGetAsyncError; past the deadline (config().timeout after the call), or on an
//   asynchronous error, the communicator is aborted (ncclCommAbort) and comm_error is thrown
//   (timeout; peer_failed for ncclRemoteError; backend otherwise) naming the op, its sequence
//   number and this rank's recent operations. Any later call on the communicator throws
//   comm_error (aborted).
// - Collectives: ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast, ncclReduce;
//   avg is ncclAvg (NCCL scales floating-point inputs by 1/size before summing, so an average can
//   differ from sum / size in the last bit; integers are summed then divided). all_to_all is a
//   group of ncclSend / ncclRecv; barrier is a one-element all-reduce. A zero-element collective
//   runs that barrier, so that it synchronizes like any other.
// - Point to point: send / recv are ncclSend / ncclRecv, each in its own group. NCCL has no tags:
//   the tag is recorded in the history but messages between two ranks match in the order they
//   were issued. As in NCCL, a send blocks the stream until the peer's matching receive runs, so
//   two ranks that both send before they receive deadlock (use all_to_all for an exchange).
// - Fingerprints: when should_fingerprint(config(), sequence) says so, the ranks all-reduce (max)
//   the two fingerprint words on the device before the collective, and on disagreement all-gather
//   their op_signatures and throw comm_error (mismatch) on every rank, before any data moves.
//   The check waits for the communicator's stream.
// - Split: ncclCommSplit, non-blocking, with a new stream for the new communicator.
// - Fault injection: fault_injector::global() is consulted before each operation (throw_error
//   throws strata::error; wrong_count adds one element; hang stops answering until the deadline;
//   kill aborts this rank's communicator).
//
// A communicator is used by one thread at a time, as an NCCL communicator is.

// The NCCL reduction of `op` (avg is ncclAvg).
constexpr ncclRedOp_t nccl_reduce_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      return ncclSum;
    case reduce_op::avg:
      return ncclAvg;
    case reduce_op::min:
      return ncclMin;
    case reduce_op::max:
      return ncclMax;
    case reduce_op::prod:
      return ncclProd;
  }
  throw error("nccl_reduce_op: invalid reduce_op value " +
              std::to_string(static_cast<unsigned>(op)));
}

// How a rank joins an nccl communicator.
struct nccl_config {
  // The CUDA device of this rank; -1 picks the bootstrap rank modulo the number of devices.
  int device = -1;

  bool operator==(const nccl_config&) const = default;
};

inline std::string to_string(const nccl_config& c) {
  return "nccl_config{.device = " + std::to_string(c.device) + "}";
}

class nccl;

namespace detail {

// Makes `device` current for a scope, ignoring errors (for destructors and abort paths).
class quiet_device_guard {
 public:
  explicit quiet_device_guard(int device) noexcept : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      previous_ = device_;
    }
    if (previous_ != device_) {
      (void)cudaSetDevice(device_);
    }
  }
  ~quiet_device_guard() {
    if (previous_ != device_) {
      (void)cudaSetDevice(previous_);
    }
  }
  quiet_device_guard(const quiet_device_guard&) = delete;
  quiet_device_guard& operator=(const quiet_device_guard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

inline std::string nccl_result_text(ncclResult_t r) {
  return std::string(ncclGetErrorString(r)) + " (" + std::to_string(static_cast<int>(r)) + ")";
}

// What a communicator and its outstanding requests share: the NCCL handle, the stream, the
// history, the sequence numbers and the scratch memory of fingerprints and barriers.
class nccl_state {
 public:
  // Scratch layout (device and pinned host, same offsets): fingerprint words, barrier word,
  // then one op_signature per rank.
  static constexpr std::size_t words_offset = 0;
  static constexpr std::size_t barrier_offset = 16;
  static constexpr std::size_t signatures_offset = 64;

  nccl_state(int device, int rank, int size, const comm_config& config)
      : device_(device),
        rank_(rank),
        size_(size),
        config_(config),
        stream_(device),
        event_(cuda_event_config{.device = device, .timing = false}),
        history_(config.history_length),
        scratch_bytes_(signatures_offset + static_cast<std::size_t>(size) * sizeof(op_signature)) {
    device_scratch_ = cuda(device_).allocate(scratch_bytes_);
    try {
      host_scratch_ = cuda_pinned{}.allocate(scratch_bytes_);
    } catch (...) {
      cuda(device_).deallocate(device_scratch_, scratch_bytes_);
      throw;
    }
    std::memset(host_scratch_, 0, scratch_bytes_);
  }

  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;

  // Finalizes and destroys the communicator (aborts it when it does not quiesce within the
  // timeout), then frees the scratch memory.
  ~nccl_state() {
    if (comm_ != nullptr) {
      const quiet_device_guard guard(device_);
      const deadline limit = deadline::after(config_.timeout);
      const ncclResult_t finalize = ncclCommFinalize(comm_);
      bool quiet = finalize == ncclSuccess || finalize == ncclInProgress;
      for (detail::poll_backoff backoff; quiet;) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
            (state != ncclSuccess && state != ncclInProgress) || limit.expired()) {
          quiet = false;
          break;
        }
        if (state == ncclSuccess) {
          break;
        }
        backoff.pause();
      }
      if (quiet) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    cuda_pinned{}.deallocate(host_scratch_, scratch_bytes_);
    cuda(device_).deallocate(device_scratch_, scratch_bytes_);
  }

  int device() const noexcept { return device_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const comm_config& config() const noexcept { return config_; }
  cudaStream_t stream() const noexcept { return stream_.get(); }
  ncclComm_t comm() const noexcept { return comm_; }
  bool aborted() const noexcept { return aborted_; }
  op_history& history() noexcept { return history_; }

  void adopt(ncclComm_t comm) noexcept { comm_ = comm; }

  std::uint64_t next_sequence(bool collective) noexcept {
    return collective ? collective_sequence_++ : p2p_sequence_++;
  }

  std::byte* device_scratch(std::size_t offset) const noexcept {
    return static_cast<std::byte*>(device_scratch_) + offset;
  }
  std::byte* host_scratch(std::size_t offset) const noexcept {
    return static_cast<std::byte*>(host_scratch_) + offset;
  }

  void abort() noexcept {
    if (comm_ != nullptr) {
      const quiet_device_guard guard(device_);
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    aborted_ = true;
  }

  comm_error error_for(comm_error_kind kind, const op_signature& op, const std::string& message) {
    return comm_error(comm_error_info{.kind = kind,
                                      .op = std::string(comm::to_string(op.op)),
                                      .sequence = op.sequence,
                                      .rank = rank_},
                      "nccl: " + message + "\nlast operations on rank " + std::to_string(rank_) +
                          ":\n" + history_.to_string());
  }

  // Aborts the communicator (its kernels stop; peers fail at their own deadlines, or sooner
  // with ncclRemoteError) and throws.
  [[noreturn]] void fail(comm_error_kind kind, const op_signature& op, const std::string& message) {
    abort();
    throw error_for(kind, op, message);
  }

  [[noreturn]] void fail_nccl(ncclResult_t r, const op_signature& op, const std::string& call) {
    const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
    std::string message = call + " failed with " + nccl_result_text(r);
    if (last != nullptr && *last != '\0') {
      message += ": " + std::string(last);
    }
    fail(r == ncclRemoteError ? comm_error_kind::peer_failed : comm_error_kind::backend, op,
         message);
  }

  [[noreturn]] void fail_timeout(const op_signature& op, const std::string& what) {
    fail(comm_error_kind::timeout, op,
         what + " did not complete within " + std::to_string(config_.timeout) +
             " s (comm_config::timeout); the communicator is aborted");
  }

  // Throws comm_error (aborted) when the communicator can no longer be used.
  void ensure_usable(const op_signature& op) {
    if (aborted_ || comm_ == nullptr) {
      throw error_for(comm_error_kind::aborted, op,
                      "the communicator was aborted by an earlier error on this rank");
    }
  }

  // The result of an NCCL call that enqueues work: success and ncclInProgress go on.
  void check_call(ncclResult_t r, const op_signature& op, const char* call) {
    if (r != ncclSuccess && r != ncclInProgress) {
      fail_nccl(r, op, call);
    }
  }

  void check_cuda(cudaError_t status, const op_signature& op, const char* call) {
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail(comm_error_kind::backend, op,
           std::string(call) + " failed with " + cudaGetErrorName(status) + " (" +
               cudaGetErrorString(status) + ")");
    }
  }

  // The communicator's state: true once it left ncclInProgress; throws on an error.
  bool settled(const op_signature& op) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) {
      fail_nccl(r, op, "ncclCommGetAsyncError");
    }
    if (state == ncclInProgress) {
      return false;
    }
    if (state != ncclSuccess) {
      fail_nccl(state, op, "the communicator (asynchronous error)");
    }
    return true;
  }

  // Polls until the communicator leaves ncclInProgress (a non-blocking call finished enqueuing).
  void wait_settled(const op_signature& op, const deadline& limit, const char* what) {
    for (detail::poll_backoff backoff; !settled(op);) {
      if (limit.expired()) {
        fail_timeout(op, what);
      }
      backoff.pause();
    }
  }

  // One poll of an operation's event: true when done; throws on an error or past the deadline.
  bool event_done(cudaEvent_t event, const op_signature& op, const deadline& limit) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) {
      (void)settled(op);
      return true;
    }
    if (status != cudaErrorNotReady) {
      check_cuda(status, op, "cudaEventQuery");
    }
    (void)cudaGetLastError();
    (void)settled(op);
    if (limit.expired()) {
      fail_timeout(op, std::string(comm::to_string(op.op)));
    }
    return false;
  }

  // Waits for everything issued so far on the stream.
  void wait_stream(const op_signature& op, const deadline& limit) {
    check_cuda(cudaEventRecord(event_.get(), stream_.get()), op, "cudaEventRecord");
    for (detail::poll_backoff backoff; !event_done(event_.get(), op, limit);) {
      backoff.pause();
    }
  }

  // Enqueues a one-element all-reduce: the barrier, and the stand-in for empty collectives.
  ncclResult_t enqueue_barrier() {
    return ncclAllReduce(device_scratch(barrier_offset), device_scratch(barrier_offset), 1,
                         ncclInt32, ncclSum, comm_, stream_.get());
  }

  // The fingerprint check of `op` (see the header comment). Throws comm_error (mismatch) on
  // every rank when the ranks' signatures differ.
  void check_fingerprint(const op_signature& op, const deadline& limit) {
    const fingerprint_words mine = fingerprint_check_words(op);
    std::memcpy(host_scratch(words_offset), &mine, sizeof mine);
    check_cuda(cudaMemcpyAsync(device_scratch(words_offset), host_scratch(words_offset),
                               sizeof mine, cudaMemcpyHostToDevice, stream_.get()),
               op, "cudaMemcpyAsync(fingerprint)");
    check_call(ncclAllReduce(device_scratch(words_offset), device_scratch(words_offset), 2,
                             ncclUint64, ncclMax, comm_, stream_.get()),
               op, "ncclAllReduce(fingerprint)");
    wait_settled(op, limit, "the fingerprint check");
    check_cuda(cudaMemcpyAsync(host_scratch(words_offset), device_scratch(words_offset),
                               sizeof mine, cudaMemcpyDeviceToHost, stream_.get()),
               op, "cudaMemcpyAsync(fingerprint)");
    wait_stream(op, limit);
    fingerprint_words reduced{};
    std::memcpy(&reduced, host_scratch(words_offset), sizeof reduced);
    if (fingerprints_agree(reduced)) {
      return;
    }
    // They differ: gather every rank's signature for the message.
    const std::size_t one = sizeof(op_signature);
    const std::size_t mine_at = signatures_offset + static_cast<std::size_t>(rank_) * one;
    std::memcpy(host_scratch(mine_at), &op, one);
    check_cuda(cudaMemcpyAsync(device_scratch(mine_at), host_scratch(mine_at), one,
                               cudaMemcpyHostToDevice, stream_.get()),
               op, "cudaMemcpyAsync(signature)");
    check_call(ncclAllGather(device_scratch(mine_at), device_scratch(signatures_offset), one,
                             ncclUint8, comm_, stream_.get()),
               op, "ncclAllGather(signatures)");
    wait_settled(op, limit, "the fingerprint check");
    check_cuda(cudaMemcpyAsync(host_scratch(signatures_offset), device_scratch(signatures_offset),
                               one * static_cast<std::size_t>(size_), cudaMemcpyDeviceToHost,
                               stream_.get()),
               op, "cudaMemcpyAsync(signatures)");
    wait_stream(op, limit);
    std::vector<op_signature> all(static_cast<std::size_t>(size_));
    std::memcpy(all.data(), host_scratch(signatures_offset), one * all.size());
    throw error_for(comm_error_kind::mismatch, op,
                    "ranks called different collectives: " + describe_mismatch(all));
  }

 private:
  int device_;
  int rank_;
  int size_;
  comm_config config_;
  cuda_stream stream_;
  cuda_event event_;
  op_history history_;
  std::size_t scratch_bytes_;
  void* device_scratch_ = nullptr;
  void* host_scratch_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::uint64_t collective_sequence_ = 0;
  std::uint64_t p2p_sequence_ = 0;
};

// Polls a communicator that is being created (non-blocking init or split) until it is ready.
// Returns "" when it is, or what went wrong (the caller aborts it).
inline std::string nccl_wait_created(ncclComm_t comm, const deadline& limit, const char* call) {
  for (detail::poll_backoff backoff;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) {
      return std::string("ncclCommGetAsyncError failed with ") + nccl_result_text(r);
    }
    if (state == ncclSuccess) {
      return {};
    }
    if (state != ncclInProgress) {
      const char* last = ncclGetLastError(comm);
      return std::string(call) + " failed with " + nccl_result_text(state) +
             (last != nullptr && *last != '\0' ? ": " + std::string(last) : std::string{});
    }
    if (limit.expired()) {
      return std::string(call) + " did not complete within the deadline (comm_config::timeout)";
    }
    backoff.pause();
  }
}

// Creates a non-blocking ncclConfig_t.
inline ncclConfig_t nccl_nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace detail

class nccl {
 public:
  using policy_category = comm_backend_tag;

  // The handle of an operation in flight: a CUDA event recorded after it on the communicator's
  // stream. A default-constructed request is complete.
  class request {
   public:
    request() = default;

    // True once the operation is done. Throws comm_error (after aborting the communicator) on an
    // asynchronous NCCL error or when the deadline has passed.
    bool test() {
      if (!pending_) {
        return true;
      }
      try {
        if (state_->aborted()) {
          throw state_->error_for(comm_error_kind::aborted, signature_,
                                  "the communicator was aborted before the operation completed");
        }
        const strata::detail::cuda_device_guard guard(state_->device());
        if (!state_->event_done(event_->get(), signature_, deadline_)) {
          return false;
        }
      } catch (...) {
        pending_ = false;
        state_->history().finish(slot_, op_status::failed);
        throw;
      }
      pending_ = false;
      state_->history().finish(slot_, op_status::completed);
      return true;
    }

    // Returns once the operation is done; throws as test() does.
    void wait() {
      for (detail::poll_backoff backoff; !test();) {
        backoff.pause();
      }
    }

   private:
    friend class nccl;

    std::shared_ptr<detail::nccl_state> state_{};
    std::optional<cuda_event> event_{};
    op_signature signature_{};
    std::size_t slot_ = 0;
    deadline deadline_ = deadline::never();
    bool pending_ = false;
  };
  using request_type = request;

  // Joins the ranks of `bootstrap` in a new NCCL communicator, with bootstrap.config().
  // Collective over `bootstrap`.
  template <class Bootstrap>
  requires(!std::is_same_v<std::remove_cvref_t<Bootstrap>, nccl> &&
           comm_backend<Bootstrap>) explicit nccl(Bootstrap& bootstrap, nccl_config options = {})
      : nccl(bootstrap, bootstrap.config(), options) {}

  // ... with `config` for the new communicator.
  template <class Bootstrap>
  requires(!std::is_same_v<std::remove_cvref_t<Bootstrap>, nccl> && comm_backend<Bootstrap>)
      nccl(Bootstrap& bootstrap, const comm_config& config, nccl_config options = {})
      : rank_(bootstrap.rank()), size_(bootstrap.size()), config_(config) {
    init(bootstrap, options);
  }

  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;
  nccl(nccl&&) noexcept = default;
  nccl& operator=(nccl&&) noexcept = default;
  ~nccl() = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const comm_config& config() const noexcept { return config_; }
  // The CUDA device of this rank, and the stream every operation runs on.
  int device() const noexcept { return state_ ? state_->device() : -1; }
  cudaStream_t stream() const noexcept { return state_ ? state_->stream() : nullptr; }
  // The NCCL communicator (null once aborted).
  ncclComm_t native_handle() const noexcept { return state_ ? state_->comm() : nullptr; }
  // This rank's recent operations, oldest first.
  std::string history() const { return state_ ? state_->history().to_string() : std::string{}; }

  // ---- collectives ------------------------------------------------------------------------------

  request all_reduce_async(const void* send, void* recv, std::size_t count, dtype type,
                           reduce_op op) {
    return start(reducing(op_kind::all_reduce, count, type, op, -1), -1, -1,
                 [&](detail::nccl_state& s, std::size_t n) {
                   return ncclAllReduce(send, recv, n, nccl_datatype(type), nccl_reduce_op(op),
                                        s.comm(), s.stream());
                 });
  }

  request reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, dtype type,
                               reduce_op op) {
    return start(reducing(op_kind::reduce_scatter, recv_count, type, op, -1), -1, -1,
                 [&](detail::nccl_state& s, std::size_t n) {
                   return ncclReduceScatter(send, recv, n, nccl_datatype(type), nccl_reduce_op(op),
                                            s.comm(), s.stream());
                 });
  }

  request all_gather_async(const void* send, void* recv, std::size_t send_count, dtype type) {
    return start(plain(op_kind::all_gather, send_count, type, -1), -1, -1,
                 [&](detail::nccl_state& s, std::size_t n) {
                   return ncclAllGather(send, recv, n, nccl_datatype(type), s.comm(), s.stream());
                 });
  }

  request broadcast_async(void* buffer, std::size_t count, dtype type, int root) {
    check_rank(op_kind::broadcast, "root", root);
    return start(plain(op_kind::broadcast, count, type, root), -1, -1,
                 [&](detail::nccl_state& s, std::size_t n) {
                   return ncclBroadcast(buffer, buffer, n, nccl_datatype(type), root, s.comm(),
                                        s.stream());
                 });
  }

  request reduce_async(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                       int root) {
    check_rank(op_kind::reduce, "root", root);
    return start(reducing(op_kind::reduce, count, type, op, root), -1, -1,
                 [&](detail::nccl_state& s, std::size_t n) {
                   return ncclReduce(send, recv, n, nccl_datatype(type), nccl_reduce_op(op), root,
                                     s.comm(), s.stream());
                 });
  }

  request all_to_all_async(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    return start(plain(op_kind::all_to_all, count_per_rank, type, -1), -1, -1,
                 [&](detail::nccl_state& s, std::size_t n) {
                   const std::size_t bytes = n * size_of(type);
                   const ncclDataType_t t = nccl_datatype(type);
                   ncclResult_t r = ncclGroupStart();
                   for (int peer = 0; peer < size_ && r == ncclSuccess; ++peer) {
                     const auto at = static_cast<std::size_t>(peer) * bytes;
                     r = ncclSend(static_cast<const std::byte*>(send) + at, n, t, peer, s.comm(),
                                  s.stream());
                     if (r == ncclSuccess) {
                       r = ncclRecv(static_cast<std::byte*>(recv) + at, n, t, peer, s.comm(),
                                    s.stream());
                     }
                   }
                   const ncclResult_t end = ncclGroupEnd();
                   return r != ncclSuccess ? r : end;
                 });
  }

  request barrier_async() {
    return start(plain(op_kind::barrier, 0, dtype::uint8, -1), -1, -1,
                 [](detail::nccl_state&, std::size_t) { return ncclSuccess; });
  }

  void all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op) {
    all_reduce_async(send, recv, count, type, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, dtype type,
                      reduce_op op) {
    reduce_scatter_async(send, recv, recv_count, type, op).wait();
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, dtype type) {
    all_gather_async(send, recv, send_count, type).wait();
  }
  void broadcast(void* buffer, std::size_t count, dtype type, int root) {
    broadcast_async(buffer, count, type, root).wait();
  }
  void reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op, int root) {
    reduce_async(send, recv, count, type, op, root).wait();
  }
  void all_to_all(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    all_to_all_async(send, recv, count_per_rank, type).wait();
  }
  void barrier() { barrier_async().wait(); }

  // ---- point to point ---------------------------------------------------------------------------

  request send_async(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    check_rank(op_kind::send, "peer", peer);
    return start(plain(op_kind::send, count, type, -1), peer, tag,
                 [&](detail::nccl_state& s, std::size_t n) {
                   ncclResult_t r = ncclGroupStart();
                   if (r == ncclSuccess) {
                     r = ncclSend(buffer, n, nccl_datatype(type), peer, s.comm(), s.stream());
                   }
                   const ncclResult_t end = ncclGroupEnd();
                   return r != ncclSuccess ? r : end;
                 });
  }

  request recv_async(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    check_rank(op_kind::recv, "peer", peer);
    return start(plain(op_kind::recv, count, type, -1), peer, tag,
                 [&](detail::nccl_state& s, std::size_t n) {
                   ncclResult_t r = ncclGroupStart();
                   if (r == ncclSuccess) {
                     r = ncclRecv(buffer, n, nccl_datatype(type), peer, s.comm(), s.stream());
                   }
                   const ncclResult_t end = ncclGroupEnd();
                   return r != ncclSuccess ? r : end;
                 });
  }

  void send(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    send_async(buffer, count, type, peer, tag).wait();
  }
  void recv(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    recv_async(buffer, count, type, peer, tag).wait();
  }

  // ---- split ------------------------------------------------------------------------------------

  // The ranks that pass the same color (>= 0), ordered by (key, rank), on this rank's device with
  // a new stream. Collective (ncclCommSplit, non-blocking).
  nccl split(int color, int key) {
    if (color < 0) {
      invalid(op_kind::split, "color " + std::to_string(color) + " is negative");
    }
    detail::nccl_state& s = live(op_kind::split);
    op_signature op = plain(op_kind::split, 0, dtype::uint8, -1);
    op.sequence = s.next_sequence(true);
    const deadline limit = deadline::after(s.config().timeout);
    const std::size_t slot = s.history().start(op);
    try {
      inject_fault(s, op);
      const strata::detail::cuda_device_guard guard(s.device());
      if (should_fingerprint(s.config(), op.sequence)) {
        s.check_fingerprint(op, limit);
      }
      ncclConfig_t config = detail::nccl_nonblocking_config();
      ncclComm_t child = nullptr;
      s.check_call(ncclCommSplit(s.comm(), color, key, &child, &config), op, "ncclCommSplit");
      s.wait_settled(op, limit, "ncclCommSplit");
      if (child == nullptr) {
        s.fail(comm_error_kind::backend, op, "ncclCommSplit returned no communicator");
      }
      auto state = adopt_child(s, child, op, limit);
      s.history().finish(slot, op_status::completed);
      return nccl(std::move(state), config_);
    } catch (...) {
      s.history().finish(slot, op_status::failed);
      throw;
    }
  }

 private:
  nccl(std::shared_ptr<detail::nccl_state> state, const comm_config& config)
      : state_(std::move(state)), rank_(state_->rank()), size_(state_->size()), config_(config) {}

  template <class Bootstrap>
  void init(Bootstrap& bootstrap, const nccl_config& options) {
    // 1. rank 0 makes the unique id; its bytes and a success flag go to every rank.
    std::array<std::uint8_t, sizeof(ncclUniqueId) + 1> blob{};
    std::string failure;
    if (rank_ == 0) {
      ncclUniqueId id{};
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r == ncclSuccess) {
        std::memcpy(blob.data(), &id, sizeof id);
        blob.back() = 1;
      } else {
        failure = "ncclGetUniqueId failed with " + detail::nccl_result_text(r);
      }
    }
    bootstrap.broadcast(blob.data(), blob.size(), dtype::uint8, 0);
    if (blob.back() == 0 && failure.empty()) {
      failure = "rank 0 could not create the NCCL unique id";
    }
    // 2. every rank creates its communicator (non-blocking) and polls it to completion.
    std::shared_ptr<detail::nccl_state> state;
    if (failure.empty()) {
      try {
        state = std::make_shared<detail::nccl_state>(choose_device(options), rank_, size_, config_);
        ncclUniqueId id{};
        std::memcpy(&id, blob.data(), sizeof id);
        ncclConfig_t config = detail::nccl_nonblocking_config();
        const strata::detail::cuda_device_guard guard(state->device());
        ncclComm_t comm = nullptr;
        const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
        state->adopt(comm);
        if (comm == nullptr || (r != ncclSuccess && r != ncclInProgress)) {
          failure = "ncclCommInitRankConfig failed with " + detail::nccl_result_text(r);
        } else {
          failure = detail::nccl_wait_created(comm, deadline::after(config_.timeout),
                                              "ncclCommInitRankConfig");
        }
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    // 3. the ranks agree: one failure fails every rank.
    std::int32_t ok = failure.empty() ? 1 : 0;
    bootstrap.all_reduce(&ok, &ok, 1, dtype::int32, reduce_op::min);
    if (ok == 0) {
      if (state) {
        state->abort();
      }
      throw comm_error(
          comm_error_info{.kind = comm_error_kind::backend, .op = "nccl init", .rank = rank_},
          failure.empty() ? "another rank failed to create its NCCL communicator"
                          : "creating the NCCL communicator failed: " + failure);
    }
    state_ = std::move(state);
  }

  int choose_device(const nccl_config& options) const {
    if (options.device >= 0) {
      return options.device;
    }
    int devices = 0;
    cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (devices <= 0) {
      throw error("strata::comm::nccl: no CUDA device is visible");
    }
    return rank_ % devices;
  }

  std::shared_ptr<detail::nccl_state> adopt_child(detail::nccl_state& parent, ncclComm_t child,
                                                  const op_signature& op, const deadline& limit) {
    const std::string failure = detail::nccl_wait_created(child, limit, "ncclCommSplit");
    if (!failure.empty()) {
      (void)ncclCommAbort(child);
      parent.fail(limit.expired() ? comm_error_kind::timeout : comm_error_kind::backend, op,
                  failure);
    }
    int rank = 0;
    int size = 0;
    if (ncclCommUserRank(child, &rank) != ncclSuccess ||
        ncclCommCount(child, &size) != ncclSuccess) {
      (void)ncclCommAbort(child);
      parent.fail(comm_error_kind::backend, op, "cannot read the new communicator's rank and size");
    }
    std::shared_ptr<detail::nccl_state> state;
    try {
      state = std::make_shared<detail::nccl_state>(parent.device(), rank, size, config_);
    } catch (...) {
      (void)ncclCommAbort(child);
      throw;
    }
    state->adopt(child);
    return state;
  }

  static op_signature plain(op_kind op, std::size_t count, dtype type, int root) {
    return op_signature{.sequence = 0,
                        .count = count,
                        .root = root,
                        .op = op,
                        .type = type,
                        .reduction = reduce_op::sum,
                        .reduces = 0};
  }

  static op_signature reducing(op_kind op, std::size_t count, dtype type, reduce_op reduction,
                               int root) {
    op_signature s = plain(op, count, type, root);
    s.reduction = reduction;
    s.reduces = 1;
    return s;
  }

  [[noreturn]] void invalid(op_kind op, const std::string& why) const {
    throw comm_error(comm_error_info{.kind = comm_error_kind::invalid_argument,
                                     .op = std::string(comm::to_string(op)),
                                     .rank = rank_},
                     "nccl: " + why);
  }

  void check_rank(op_kind op, const char* what, int r) const {
    if (r < 0 || r >= size_) {
      invalid(op, std::string(what) + " " + std::to_string(r) +
                      " is not a rank of this communicator (size " + std::to_string(size_) + ")");
    }
  }

  detail::nccl_state& live(op_kind op) {
    if (!state_) {
      invalid(op, "the communicator was moved from");
    }
    state_->ensure_usable(plain(op, 0, dtype::uint8, -1));
    return *state_;
  }

  // Applies a planned fault of fault_injector::global() to `op`.
  static void inject_fault(detail::nccl_state& s, op_signature& op) {
    const auto action = fault_injector::global().at(s.rank(), op.op, op.sequence);
    if (!action) {
      return;
    }
    switch (*action) {
      case fault_action::wrong_count:
        ++op.count;
        return;
      case fault_action::throw_error:
        throw error("strata::comm::nccl: injected fault 'throw' in " + to_string(op) + " on rank " +
                    std::to_string(s.rank()));
      case fault_action::hang: {
        const deadline limit = deadline::after(s.config().timeout);
        for (detail::poll_backoff backoff; !limit.expired();) {
          backoff.pause();
        }
        s.fail_timeout(op, "an injected hang");
      }
      case fault_action::kill:
        s.abort();
        throw s.error_for(comm_error_kind::aborted, op, "injected fault 'kill'");
    }
  }

  // Issues one operation: sequence number, fault injection, fingerprint check (collectives),
  // history, the NCCL call `enqueue(state, count)` (a stand-in barrier for empty collectives),
  // the wait for a non-blocking enqueue, and the event the request polls.
  template <class Enqueue>
  request start(op_signature op, int peer, int tag, Enqueue&& enqueue) {
    detail::nccl_state& s = live(op.op);
    const bool collective = op.op != op_kind::send && op.op != op_kind::recv;
    op.sequence = s.next_sequence(collective);
    const deadline limit = deadline::after(s.config().timeout);
    const std::size_t slot = s.history().start(op, peer, tag);
    try {
      inject_fault(s, op);
      const strata::detail::cuda_device_guard guard(s.device());
      if (collective && should_fingerprint(s.config(), op.sequence)) {
        s.check_fingerprint(op, limit);
      }
      const bool stand_in = collective && (op.count == 0 || op.op == op_kind::barrier);
      s.check_call(stand_in ? s.enqueue_barrier() : enqueue(s, static_cast<std::size_t>(op.count)),
                   op, nccl_call_name(op.op));
      s.wait_settled(op, limit, nccl_call_name(op.op));
      request r;
      r.event_.emplace(cuda_event_config{.device = s.device(), .timing = false});
      s.check_cuda(cudaEventRecord(r.event_->get(), s.stream()), op, "cudaEventRecord");
      r.state_ = state_;
      r.signature_ = op;
      r.slot_ = slot;
      r.deadline_ = limit;
      r.pending_ = true;
      return r;
    } catch (...) {
      s.history().finish(slot, op_status::failed);
      throw;
    }
  }

  static const char* nccl_call_name(op_kind op) noexcept {
    switch (op) {
      case op_kind::all_reduce:
        return "ncclAllReduce";
      case op_kind::reduce_scatter:
        return "ncclReduceScatter";
      case op_kind::all_gather:
        return "ncclAllGather";
      case op_kind::broadcast:
        return "ncclBroadcast";
      case op_kind::reduce:
        return "ncclReduce";
      case op_kind::all_to_all:
        return "ncclSend/ncclRecv (all_to_all)";
      case op_kind::send:
        return "ncclSend";
      case op_kind::recv:
        return "ncclRecv";
      case op_kind::barrier:
        return "ncclAllReduce (barrier)";
      case op_kind::split:
        return "ncclCommSplit";
    }
    return "nccl";
  }

  std::shared_ptr<detail::nccl_state> state_{};
  int rank_ = 0;
  int size_ = 1;
  comm_config config_{};
};

static_assert(check_comm_backend<nccl>());

}  // namespace strata::comm
