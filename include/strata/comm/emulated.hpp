// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata::comm::emulated<Inner>: a comm_backend that runs every operation on an inner backend and
// then holds its completion back until a modelled network link would have carried it, so that
// communication / compute overlap can be measured on one machine (threads as the inner backend)
// as if the ranks sat behind 10 GbE, 100 GbE or InfiniBand.
//
//     strata::comm::threads::run(4, [](strata::comm::threads& t) {
//       strata::comm::emulated comm(std::move(t), strata::comm::network_link::ethernet_10g());
//       auto r = strata::comm::all_reduce_async(comm, grads);   // returns at once
//       backward_of_the_next_layer();                           // overlaps the modelled transfer
//       r.wait();                                               // sleeps out what is left
//     });
//
// The cost model (modelled_transfer), with bytes = count x size_of(dtype), n = size(), alpha =
// link latency and beta = link bandwidth:
//   all_reduce (ring)          2(n-1)/n x bytes on the wire, 2(n-1) latency steps
//   reduce_scatter, all_gather (n-1)/n x (n x count) elements, n-1 steps (half a ring all_reduce;
//                              count is the per-rank count the contract takes)
//   all_to_all                 (n-1)/n x (n x count_per_rank) elements, n-1 steps (pairwise)
//   broadcast, reduce          bytes (pipelined along a chain), n-1 steps (filling the chain)
//   send, recv                 bytes, 1 step (a send on the outgoing direction, a receive on the
//                              incoming one: the link is full duplex)
//   barrier                    no bytes, ceil(log2 n) steps (a dissemination barrier)
//   split                      free (a set-up operation)
// time = alpha x steps + bytes_on_wire / beta (beta = 0: infinite bandwidth); with n = 1 there is
// nothing to send and the time is 0. Bytes on the wire are rounded down to whole bytes.
//
// The link is this rank's and full duplex: its outgoing direction carries the collectives (whose
// cost above is what this rank sends) and the sends, one operation at a time; its incoming
// direction carries the receives, independently, so that a ring over point-to-point messages,
// which sends and receives at once at every step, costs what the collective does. An operation
// issued at t starts at max(t, free_at of its direction), completes `time` later, and moves
// free_at there; the clocks are per communicator (a split has its own). Blocking operations run the
// inner operation and then sleep (std::this_thread::sleep_until, never a spin) until the completion
// time; non-blocking ones start the inner operation at once and return a request whose wait() waits
// for the inner request and then sleeps until the completion time, and whose test() is true once
// both are done. The inner operation itself still synchronizes the ranks, so a late peer delays
// everyone as it would on any backend; the modelled start is this rank's issue time, not the last
// peer's arrival (an approximation that errs towards optimism when ranks are skewed). The modelled
// delays are not subject to config().timeout; the inner backend's waits are.
//
// Everything else (results, in-place rules, ordering, errors, fingerprints) is the inner backend's:
// emulated forwards every argument unchanged, so it passes the conformance suite whenever Inner
// does. A communicator and its requests are used from one thread, like any communicator.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/policy.hpp"

namespace strata::comm {

// A network link as seen from one rank: a fixed cost per message step plus a bandwidth.
// The presets are nominal line rates with round, assumed latencies (no protocol overhead, no
// congestion); they are meant for relative comparisons, not as measurements of any cluster.
struct network_link {
  double latency_seconds = 0;             // per step (one hop of a ring, one message)
  double bandwidth_bytes_per_second = 0;  // 0 = infinite
  std::string name{};

  // Zero delay: emulated<Inner> behaves like Inner (counters still count bytes).
  static network_link none() { return network_link{.name = "none"}; }
  // 10 Gbit/s Ethernet: 1.25e9 B/s; 20 us per step assumed (a TCP/IP stack).
  static network_link ethernet_10g() {
    return network_link{
        .latency_seconds = 20e-6, .bandwidth_bytes_per_second = 1.25e9, .name = "ethernet_10g"};
  }
  // 100 Gbit/s Ethernet: 12.5e9 B/s; 10 us per step assumed (a TCP/IP stack, no RDMA).
  static network_link ethernet_100g() {
    return network_link{
        .latency_seconds = 10e-6, .bandwidth_bytes_per_second = 12.5e9, .name = "ethernet_100g"};
  }
  // InfiniBand HDR: 200 Gbit/s = 25e9 B/s; 1.5 us per step assumed (RDMA through one switch).
  static network_link infiniband_hdr() {
    return network_link{
        .latency_seconds = 1.5e-6, .bandwidth_bytes_per_second = 25e9, .name = "infiniband_hdr"};
  }

  bool operator==(const network_link&) const = default;
};

inline std::string to_string(const network_link& l) {
  return "network_link{.latency_seconds = " + std::to_string(l.latency_seconds) +
         ", .bandwidth_bytes_per_second = " + std::to_string(l.bandwidth_bytes_per_second) +
         ", .name = \"" + l.name + "\"}";
}

// Throws strata::error naming the field and value unless both numbers are finite and >= 0.
inline void validate(const network_link& l) {
  const auto check = [&](double v, const char* field) {
    if (!std::isfinite(v) || v < 0) {
      throw error("comm::network_link '" + l.name + "': " + field + " = " + std::to_string(v) +
                  " (it must be finite and >= 0)");
    }
  };
  check(l.latency_seconds, "latency_seconds");
  check(l.bandwidth_bytes_per_second, "bandwidth_bytes_per_second (0 = infinite)");
}

// What one operation costs on a link.
struct link_transfer {
  std::uint64_t bytes_on_wire = 0;  // sent by this rank
  std::uint64_t steps = 0;          // latency steps
  double seconds = 0;               // latency x steps + bytes_on_wire / bandwidth
};

// The cost of `op` with the `count` argument of its member function (per rank for
// reduce_scatter, all_gather and all_to_all) on a communicator of `size` ranks. See the table at
// the top of this file.
inline link_transfer modelled_transfer(const network_link& l, op_kind op, std::size_t count,
                                       dtype type, int size) {
  if (size <= 1) {
    return {};
  }
  const auto n = static_cast<std::uint64_t>(size);
  const std::uint64_t bytes = static_cast<std::uint64_t>(count) * size_of(type);
  link_transfer t;
  switch (op) {
    case op_kind::all_reduce:
      t.bytes_on_wire = 2 * (n - 1) * bytes / n;
      t.steps = 2 * (n - 1);
      break;
    case op_kind::reduce_scatter:
    case op_kind::all_gather:
    case op_kind::all_to_all:
      t.bytes_on_wire = (n - 1) * bytes;  // (n-1)/n of the n x count elements in all
      t.steps = n - 1;
      break;
    case op_kind::broadcast:
    case op_kind::reduce:
      t.bytes_on_wire = bytes;
      t.steps = n - 1;
      break;
    case op_kind::send:
    case op_kind::recv:
      t.bytes_on_wire = bytes;
      t.steps = 1;
      break;
    case op_kind::barrier:
      while ((std::uint64_t{1} << t.steps) < n) {
        ++t.steps;
      }
      break;
    case op_kind::split:
      return {};
  }
  t.seconds = l.latency_seconds * static_cast<double>(t.steps);
  if (l.bandwidth_bytes_per_second > 0) {
    t.seconds += static_cast<double>(t.bytes_on_wire) / l.bandwidth_bytes_per_second;
  }
  return t;
}

template <comm_backend Inner>
class emulated {
 public:
  using policy_category = comm_backend_tag;
  using clock = std::chrono::steady_clock;

  // The handle of a non-blocking operation: the inner request plus the modelled completion time.
  // A default-constructed request is complete (test() is true, wait() returns at once).
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&&) noexcept = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() = default;

    // True once the inner operation is complete and the modelled time has passed; rethrows the
    // inner operation's error.
    bool test() {
      if (!inner_done_) {
        if (!inner_.test()) {
          return false;
        }
        inner_done_ = true;
      }
      return clock::now() >= due_;
    }

    // Waits for the inner operation (rethrowing its error), then sleeps until the modelled
    // completion time.
    void wait() {
      if (!inner_done_) {
        inner_.wait();
        inner_done_ = true;
      }
      sleep_until(due_);
    }

    // When the link finishes this operation in the model.
    clock::time_point completion_time() const noexcept { return due_; }

   private:
    friend class emulated;
    request(typename Inner::request_type inner, clock::time_point due)
        : inner_(std::move(inner)), due_(due), inner_done_(false) {}

    typename Inner::request_type inner_{};
    clock::time_point due_{};
    bool inner_done_ = true;
  };
  using request_type = request;

  // Wraps `inner` (moved in); throws strata::error when the link has a negative or non-finite
  // field.
  explicit emulated(Inner inner, network_link l = network_link::none())
      : inner_(std::move(inner)), link_(std::move(l)) {
    static_assert(check_comm_backend<emulated>());
    validate(link_);
  }

  emulated(emulated&&) noexcept(std::is_nothrow_move_constructible_v<Inner>) = default;
  emulated& operator=(emulated&&) noexcept(std::is_nothrow_move_assignable_v<Inner>) = default;
  emulated(const emulated&) = delete;
  emulated& operator=(const emulated&) = delete;
  ~emulated() = default;

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  const comm_config& config() const noexcept { return inner_.config(); }

  // The inner backend's placement of ranks (the link is modelled, the CPUs are real).
  int ranks_sharing_cpus() const noexcept { return ::strata::comm::ranks_sharing_cpus(inner_); }
  int ranks_sharing_memory() const noexcept { return ::strata::comm::ranks_sharing_memory(inner_); }

  const network_link& link_model() const noexcept { return link_; }
  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }

  // Bytes this rank's collectives and sends put on the link, summed over every operation issued
  // so far on this communicator; the bytes of its receives, separately.
  std::uint64_t bytes_sent() const noexcept { return bytes_sent_; }
  std::uint64_t bytes_received() const noexcept { return bytes_received_; }
  // The same over this communicator and every communicator split from it (transitively), which
  // share one tally: what a rank sent in all, e.g. through the groups of a hierarchical
  // all-reduce that a trainer split off.
  std::uint64_t bytes_sent_with_splits() const noexcept {
    return tally_->sent.load(std::memory_order_relaxed);
  }
  std::uint64_t bytes_received_with_splits() const noexcept {
    return tally_->received.load(std::memory_order_relaxed);
  }
  // The modelled transfer times of the collectives and sends, summed (queueing behind earlier
  // operations not included; receives run on the other direction of the link and overlap them).
  double delay_seconds() const noexcept { return delay_seconds_; }
  // When the outgoing direction of the link is free again (the completion time of the last
  // collective or send issued).
  clock::time_point link_free_at() const noexcept { return link_free_at_; }

  // Changes the link for the operations issued from now on (validated like the constructor's);
  // `split(c, k).with_link(fast)` gives a sub-communicator its own link.
  emulated& with_link(network_link l) & {
    validate(l);
    link_ = std::move(l);
    return *this;
  }
  emulated with_link(network_link l) && {
    validate(l);
    link_ = std::move(l);
    return std::move(*this);
  }

  // ---- blocking collectives -------------------------------------------------------------------

  void all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op) {
    blocking(op_kind::all_reduce, count, type,
             [&] { inner_.all_reduce(send, recv, count, type, op); });
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, dtype type,
                      reduce_op op) {
    blocking(op_kind::reduce_scatter, recv_count, type,
             [&] { inner_.reduce_scatter(send, recv, recv_count, type, op); });
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, dtype type) {
    blocking(op_kind::all_gather, send_count, type,
             [&] { inner_.all_gather(send, recv, send_count, type); });
  }
  void broadcast(void* buffer, std::size_t count, dtype type, int root) {
    blocking(op_kind::broadcast, count, type, [&] { inner_.broadcast(buffer, count, type, root); });
  }
  void reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op, int root) {
    blocking(op_kind::reduce, count, type,
             [&] { inner_.reduce(send, recv, count, type, op, root); });
  }
  void all_to_all(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    blocking(op_kind::all_to_all, count_per_rank, type,
             [&] { inner_.all_to_all(send, recv, count_per_rank, type); });
  }
  void barrier() {
    blocking(op_kind::barrier, 0, dtype::uint8, [&] { inner_.barrier(); });
  }

  // ---- non-blocking collectives ---------------------------------------------------------------

  request all_reduce_async(const void* send, void* recv, std::size_t count, dtype type,
                           reduce_op op) {
    return async(op_kind::all_reduce, count, type,
                 [&] { return inner_.all_reduce_async(send, recv, count, type, op); });
  }
  request reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, dtype type,
                               reduce_op op) {
    return async(op_kind::reduce_scatter, recv_count, type,
                 [&] { return inner_.reduce_scatter_async(send, recv, recv_count, type, op); });
  }
  request all_gather_async(const void* send, void* recv, std::size_t send_count, dtype type) {
    return async(op_kind::all_gather, send_count, type,
                 [&] { return inner_.all_gather_async(send, recv, send_count, type); });
  }
  request broadcast_async(void* buffer, std::size_t count, dtype type, int root) {
    return async(op_kind::broadcast, count, type,
                 [&] { return inner_.broadcast_async(buffer, count, type, root); });
  }
  request reduce_async(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                       int root) {
    return async(op_kind::reduce, count, type,
                 [&] { return inner_.reduce_async(send, recv, count, type, op, root); });
  }
  request all_to_all_async(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    return async(op_kind::all_to_all, count_per_rank, type,
                 [&] { return inner_.all_to_all_async(send, recv, count_per_rank, type); });
  }
  request barrier_async() {
    return async(op_kind::barrier, 0, dtype::uint8, [&] { return inner_.barrier_async(); });
  }

  // ---- messages -------------------------------------------------------------------------------

  void send(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    blocking(op_kind::send, count, type, [&] { inner_.send(buffer, count, type, peer, tag); });
  }
  void recv(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    blocking(op_kind::recv, count, type, [&] { inner_.recv(buffer, count, type, peer, tag); });
  }
  request send_async(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return async(op_kind::send, count, type,
                 [&] { return inner_.send_async(buffer, count, type, peer, tag); });
  }
  request recv_async(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return async(op_kind::recv, count, type,
                 [&] { return inner_.recv_async(buffer, count, type, peer, tag); });
  }

  // ---- split ----------------------------------------------------------------------------------

  // Collective: an emulated communicator over the inner split, with the same link (change it
  // with with_link), a free link and counters at zero (bytes_*_with_splits go on adding up).
  emulated split(int color, int key) {
    emulated part(inner_.split(color, key), link_);
    part.tally_ = tally_;
    return part;
  }

 private:
  static void sleep_until(clock::time_point due) {
    if (clock::now() < due) {
      std::this_thread::sleep_until(due);
    }
  }

  // Books an operation issued at `issued` on the link; returns its completion time.
  clock::time_point book(clock::time_point issued, op_kind op, std::size_t count, dtype type) {
    const link_transfer t = modelled_transfer(link_, op, count, type, size());
    const bool incoming = op == op_kind::recv;
    clock::time_point& free_at = incoming ? incoming_free_at_ : link_free_at_;
    const auto start = std::max(issued, free_at);
    const auto done =
        start + std::chrono::ceil<clock::duration>(std::chrono::duration<double>(t.seconds));
    free_at = done;
    (incoming ? bytes_received_ : bytes_sent_) += t.bytes_on_wire;
    (incoming ? tally_->received : tally_->sent)
        .fetch_add(t.bytes_on_wire, std::memory_order_relaxed);
    if (!incoming) {
      delay_seconds_ += t.seconds;
    }
    return done;
  }

  // The inner operation runs first, so that its errors come first and a failed operation books
  // nothing.
  template <class F>
  void blocking(op_kind op, std::size_t count, dtype type, F&& run) {
    const auto issued = clock::now();
    run();
    sleep_until(book(issued, op, count, type));
  }

  template <class F>
  request async(op_kind op, std::size_t count, dtype type, F&& start) {
    const auto issued = clock::now();
    typename Inner::request_type inner = start();
    return request(std::move(inner), book(issued, op, count, type));
  }

  Inner inner_;
  network_link link_;
  clock::time_point link_free_at_{};
  clock::time_point incoming_free_at_{};
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t bytes_received_ = 0;
  double delay_seconds_ = 0;
  // Shared with the communicators split from this one.
  struct tally {
    std::atomic<std::uint64_t> sent{0};
    std::atomic<std::uint64_t> received{0};
  };
  std::shared_ptr<tally> tally_ = std::make_shared<tally>();
};

}  // namespace strata::comm
