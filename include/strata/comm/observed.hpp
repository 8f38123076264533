// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata::comm::observed<Inner, Observer>: a comm_backend that runs every operation on an inner
// backend unchanged and first tells an observer what it is about to run. The base for a user's
// wrapper that counts, logs or traces communication around any backend, without forwarding the
// contract's eighteen operations by hand (examples/03_custom_policies/byte_counter.hpp counts
// bytes in 30 lines):
//
//     struct print_ops {
//       void operator()(const strata::comm::op_event& e) { std::printf("%zu\n", e.bytes); }
//     };
//     strata::comm::threads::run(2, [](strata::comm::threads& t) {
//       strata::comm::observed comm(std::move(t), print_ops{});
//       strata::comm::any_comm handle(comm);   // hand it to a trainer like any backend
//     });
//
// An observer O (concept op_observer) is copy-constructible and callable as `o(const op_event&)`;
// it is called on the calling rank's thread, before the operation starts (blocking or not), once
// per operation, split included. A split communicator gets a copy of the observer: share state
// between the copies (a shared_ptr) to see the operations of every communicator split from this
// one. Errors, requests, fingerprints and timeouts are the inner backend's, so observed<Inner, O>
// passes the conformance suite whenever Inner does.

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"

namespace strata::comm {

// One operation as an observer sees it.
struct op_event {
  op_kind op = op_kind::barrier;
  bool async = false;         // a <name>_async call
  std::size_t count = 0;      // elements, as the call passed them
  dtype type = dtype::uint8;  // uint8 for barrier and split
  int peer = -1;              // send / recv: the peer; broadcast / reduce: the root; else -1
  int tag = -1;               // send / recv
  // The bytes of this rank's input to the operation: its send buffer (reduce_scatter: size()
  // slices; all_to_all: size() blocks; broadcast: the root's buffer, counted on every rank), or
  // the receive buffer of a recv. 0 for barrier and split.
  std::size_t bytes = 0;
};

// An observer of a communicator's operations.
template <class O>
concept op_observer = std::copy_constructible<O> && requires(O& o, const op_event& e) {
  o(e);
};

template <class O>
consteval bool check_op_observer() {
  static_assert(std::copy_constructible<O>,
                "comm::observed Observer: must be copy-constructible "
                "(a split communicator gets a copy)");
  static_assert(
      requires(O & o, const op_event& e) { o(e); },
      "comm::observed Observer: missing 'void operator()(const strata::comm::op_event&)'");
  return op_observer<O>;
}

template <comm_backend Inner, class Observer>
class observed {
  static_assert(check_op_observer<Observer>());

 public:
  using policy_category = comm_backend_tag;
  using request_type = typename Inner::request_type;
  static constexpr bool nonblocking_progresses = ::strata::comm::nonblocking_progresses<Inner>;

  // Wraps `inner` (moved in).
  explicit observed(Inner inner, Observer observer = Observer{})
      : inner_(std::move(inner)), observer_(std::move(observer)) {}

  int rank() const noexcept { return inner_.rank(); }
  int size() const noexcept { return inner_.size(); }
  const comm_config& config() const noexcept { return inner_.config(); }
  int ranks_sharing_cpus() const noexcept { return ::strata::comm::ranks_sharing_cpus(inner_); }
  int ranks_sharing_memory() const noexcept { return ::strata::comm::ranks_sharing_memory(inner_); }

  Inner& inner() noexcept { return inner_; }
  const Inner& inner() const noexcept { return inner_; }
  Observer& observer() noexcept { return observer_; }
  const Observer& observer() const noexcept { return observer_; }

  // Collective: an observed communicator over the inner split, with a copy of the observer.
  observed split(int color, int key) {
    see({.op = op_kind::split});
    return observed(inner_.split(color, key), observer_);
  }

  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    see(event(op_kind::all_reduce, false, n, t, n));
    inner_.all_reduce(s, r, n, t, op);
  }
  request_type all_reduce_async(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    see(event(op_kind::all_reduce, true, n, t, n));
    return inner_.all_reduce_async(s, r, n, t, op);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    see(event(op_kind::reduce_scatter, false, n, t, n * slices()));
    inner_.reduce_scatter(s, r, n, t, op);
  }
  request_type reduce_scatter_async(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    see(event(op_kind::reduce_scatter, true, n, t, n * slices()));
    return inner_.reduce_scatter_async(s, r, n, t, op);
  }
  void all_gather(const void* s, void* r, std::size_t n, dtype t) {
    see(event(op_kind::all_gather, false, n, t, n));
    inner_.all_gather(s, r, n, t);
  }
  request_type all_gather_async(const void* s, void* r, std::size_t n, dtype t) {
    see(event(op_kind::all_gather, true, n, t, n));
    return inner_.all_gather_async(s, r, n, t);
  }
  void broadcast(void* b, std::size_t n, dtype t, int root) {
    see(event(op_kind::broadcast, false, n, t, n, root));
    inner_.broadcast(b, n, t, root);
  }
  request_type broadcast_async(void* b, std::size_t n, dtype t, int root) {
    see(event(op_kind::broadcast, true, n, t, n, root));
    return inner_.broadcast_async(b, n, t, root);
  }
  void reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op, int root) {
    see(event(op_kind::reduce, false, n, t, n, root));
    inner_.reduce(s, r, n, t, op, root);
  }
  request_type reduce_async(const void* s, void* r, std::size_t n, dtype t, reduce_op op,
                            int root) {
    see(event(op_kind::reduce, true, n, t, n, root));
    return inner_.reduce_async(s, r, n, t, op, root);
  }
  void all_to_all(const void* s, void* r, std::size_t n, dtype t) {
    see(event(op_kind::all_to_all, false, n, t, n * slices()));
    inner_.all_to_all(s, r, n, t);
  }
  request_type all_to_all_async(const void* s, void* r, std::size_t n, dtype t) {
    see(event(op_kind::all_to_all, true, n, t, n * slices()));
    return inner_.all_to_all_async(s, r, n, t);
  }
  void barrier() {
    see({.op = op_kind::barrier});
    inner_.barrier();
  }
  request_type barrier_async() {
    see({.op = op_kind::barrier, .async = true});
    return inner_.barrier_async();
  }
  void send(const void* b, std::size_t n, dtype t, int peer, int tag) {
    see(event(op_kind::send, false, n, t, n, peer, tag));
    inner_.send(b, n, t, peer, tag);
  }
  void recv(void* b, std::size_t n, dtype t, int peer, int tag) {
    see(event(op_kind::recv, false, n, t, n, peer, tag));
    inner_.recv(b, n, t, peer, tag);
  }
  request_type send_async(const void* b, std::size_t n, dtype t, int peer, int tag) {
    see(event(op_kind::send, true, n, t, n, peer, tag));
    return inner_.send_async(b, n, t, peer, tag);
  }
  request_type recv_async(void* b, std::size_t n, dtype t, int peer, int tag) {
    see(event(op_kind::recv, true, n, t, n, peer, tag));
    return inner_.recv_async(b, n, t, peer, tag);
  }

 private:
  std::size_t slices() const noexcept { return static_cast<std::size_t>(inner_.size()); }

  // `elements`: of this rank's input, for the byte count. An invalid dtype is counted as 0 bytes
  // here and refused by the inner backend.
  static op_event event(op_kind op, bool async, std::size_t count, dtype t, std::size_t elements,
                        int peer = -1, int tag = -1) noexcept {
    return {.op = op,
            .async = async,
            .count = count,
            .type = t,
            .peer = peer,
            .tag = tag,
            .bytes = elements * element_bytes(t)};
  }
  static std::size_t element_bytes(dtype t) noexcept {
    try {
      return size_of(t);
    } catch (...) {
      return 0;
    }
  }

  void see(const op_event& e) { observer_(e); }

  Inner inner_;
  Observer observer_;
};

}  // namespace strata::comm
