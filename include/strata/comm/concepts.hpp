// SPDX-License-Identifier: Apache-2.0
#pragma once

// The comm_backend contract. Data, parameter-server, tensor and pipeline parallelism talk only
// through it.
//
// A comm backend C is a communicator: one rank's handle on a group of ranks. It
//   1. opts in with `using policy_category = strata::comm_backend_tag;` and is movable;
//   2. says who it is: `int rank() const noexcept`, `int size() const noexcept`, and
//      `const comm_config& config() const noexcept`;
//   3. names a request type `C::request_type` (see comm_request): the handle of a non-blocking
//      operation, with `bool test()` and `void wait()`;
//   4. offers the collectives, blocking, over untyped buffers with a runtime dtype:
//        all_reduce(const void* send, void* recv, size_t count, dtype, reduce_op)
//        reduce_scatter(const void* send, void* recv, size_t recv_count, dtype, reduce_op)
//        all_gather(const void* send, void* recv, size_t send_count, dtype)
//        broadcast(void* buffer, size_t count, dtype, int root)
//        reduce(const void* send, void* recv, size_t count, dtype, reduce_op, int root)
//        all_to_all(const void* send, void* recv, size_t count_per_rank, dtype)
//        barrier()
//   5. offers each of them non-blocking as `<name>_async(...)`, returning request_type;
//   6. offers point-to-point messages with tags: send / recv and send_async / recv_async
//        send(const void* buffer, size_t count, dtype, int peer, int tag)
//        recv(void* buffer, size_t count, dtype, int peer, int tag)
//   7. splits: `C split(int color, int key)` is collective and returns a communicator of the same
//      backend over the ranks that passed the same color, ordered by (key, rank).
//
// Semantics every backend keeps (tests/conformance/comm_backend.hpp checks them):
//   - every dtype of core/ and every reduce_op; avg is sum / size; 16-bit floats accumulate in
//     float; zero-element calls are legal and still synchronize like any other call;
//   - in place: all_reduce and reduce with send == recv; all_gather with
//     send == recv + rank * send_count elements; reduce_scatter with
//     recv == send + rank * recv_count elements (the NCCL convention);
//   - every wait has the deadline config().timeout; past it, or when a peer fails, the call
//     throws comm_error (timeout / peer_failed / mismatch / aborted) naming op, sequence number
//     and ranks, on every rank; with fingerprints on, ranks whose calls differ get `mismatch`
//     before any data moves;
//   - collectives on one communicator complete in the order they were issued, blocking and
//     non-blocking mixed; messages match in issue order per (peer, tag) and are not held behind
//     pending collectives (so exchanges that MPI allows do not deadlock); a blocking send may
//     return only once the receiver has the data, as MPI's standard send may.

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/policy.hpp"

namespace strata::comm {

// 3. The handle of a non-blocking operation.
template <class R>
concept comm_request = std::movable<R> && std::default_initializable<R> && requires(R& r) {
  { r.test() } -> std::same_as<bool>;
  { r.wait() } -> std::same_as<void>;
};

// 1.
template <class C>
concept comm_backend_tagged = policy_of<C, comm_backend_tag> && std::movable<C>;

// 2.
template <class C>
concept comm_backend_has_rank = requires(const C& c) {
  { c.rank() }
  noexcept->std::same_as<int>;
};
template <class C>
concept comm_backend_has_size = requires(const C& c) {
  { c.size() }
  noexcept->std::same_as<int>;
};
template <class C>
concept comm_backend_has_config = requires(const C& c) {
  { c.config() }
  noexcept->std::same_as<const comm_config&>;
};
template <class C>
concept comm_backend_identity =
    comm_backend_has_rank<C> && comm_backend_has_size<C> && comm_backend_has_config<C>;

// 3.
template <class C>
concept comm_backend_requests = requires {
  typename C::request_type;
}
&&comm_request<typename C::request_type>;

// 4.
template <class C>
concept comm_backend_collectives = requires(C& c, const void* in, void* out, std::size_t n, dtype t,
                                            reduce_op op, int root) {
  { c.all_reduce(in, out, n, t, op) } -> std::same_as<void>;
  { c.reduce_scatter(in, out, n, t, op) } -> std::same_as<void>;
  { c.all_gather(in, out, n, t) } -> std::same_as<void>;
  { c.broadcast(out, n, t, root) } -> std::same_as<void>;
  { c.reduce(in, out, n, t, op, root) } -> std::same_as<void>;
  { c.all_to_all(in, out, n, t) } -> std::same_as<void>;
  { c.barrier() } -> std::same_as<void>;
};

// 5.
template <class C>
concept comm_backend_nonblocking = comm_backend_requests<C> &&
    requires(C& c, const void* in, void* out, std::size_t n, dtype t, reduce_op op, int root) {
  { c.all_reduce_async(in, out, n, t, op) } -> std::same_as<typename C::request_type>;
  { c.reduce_scatter_async(in, out, n, t, op) } -> std::same_as<typename C::request_type>;
  { c.all_gather_async(in, out, n, t) } -> std::same_as<typename C::request_type>;
  { c.broadcast_async(out, n, t, root) } -> std::same_as<typename C::request_type>;
  { c.reduce_async(in, out, n, t, op, root) } -> std::same_as<typename C::request_type>;
  { c.all_to_all_async(in, out, n, t) } -> std::same_as<typename C::request_type>;
  { c.barrier_async() } -> std::same_as<typename C::request_type>;
};

// 6.
template <class C>
concept comm_backend_point_to_point = comm_backend_requests<C> &&
    requires(C& c, const void* in, void* out, std::size_t n, dtype t, int peer, int tag) {
  { c.send(in, n, t, peer, tag) } -> std::same_as<void>;
  { c.recv(out, n, t, peer, tag) } -> std::same_as<void>;
  { c.send_async(in, n, t, peer, tag) } -> std::same_as<typename C::request_type>;
  { c.recv_async(out, n, t, peer, tag) } -> std::same_as<typename C::request_type>;
};

// 7.
template <class C>
concept comm_backend_splits = requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

template <class C>
concept comm_backend = comm_backend_tagged<C> && comm_backend_identity<C> &&
    comm_backend_requests<C> && comm_backend_collectives<C> && comm_backend_nonblocking<C> &&
    comm_backend_point_to_point<C> && comm_backend_splits<C>;

// Optional: `static constexpr bool nonblocking_progresses = false;` says that the backend's
// non-blocking collectives advance only while some call of this rank polls them (test / wait),
// as Open MPI's do, so that starting one early overlaps little and a blocking call at the same
// point is the faster choice (parallel::bucket_reducer's `bucket_launch = auto` reads it).
// Backends that say nothing progress on their own.
template <class C>
inline constexpr bool nonblocking_progresses = [] {
  if constexpr (requires { C::nonblocking_progresses; }) {
    return static_cast<bool>(C::nonblocking_progresses);
  } else {
    return true;
  }
}();

// Optional: how many ranks of the job run on the CPUs this process may use (itself included), so
// that the trainer can share them out (the BLAS threads, model/blas.hpp). A backend says it by a
// member `int ranks_sharing_cpus() const noexcept` (comm::threads: size(), every rank is a
// thread of this process; comm::mpi asks the launcher); backends without one count 1.
template <class C>
int ranks_sharing_cpus(const C& c) noexcept {
  if constexpr (requires {
                  { c.ranks_sharing_cpus() } -> std::convertible_to<int>;
                }) {
    return c.ranks_sharing_cpus();
  } else {
    return 1;
  }
}

// Optional: how many ranks of the job share this process's memory (itself included), so that a
// default memory budget can be shared out among them (the trainer's memory_budget_mb when unset).
// A backend says it by a member `int ranks_sharing_memory() const noexcept` (comm::threads:
// size(); comm::mpi: the ranks on this node); backends without one count 1.
template <class C>
int ranks_sharing_memory(const C& c) noexcept {
  if constexpr (requires {
                  { c.ranks_sharing_memory() } -> std::convertible_to<int>;
                }) {
    return c.ranks_sharing_memory();
  } else {
    return 1;
  }
}

// One readable error per missing requirement, for the places where policies meet (nvcc reports
// only "failed deduction" for an unsatisfied concept).
template <class C>
consteval bool check_comm_backend() {
  static_assert(comm_backend_tagged<C>,
                "CommBackend: missing 'using policy_category = strata::comm_backend_tag' or not "
                "movable");
  static_assert(comm_backend_has_rank<C>, "CommBackend: missing 'int rank() const noexcept'");
  static_assert(comm_backend_has_size<C>, "CommBackend: missing 'int size() const noexcept'");
  static_assert(comm_backend_has_config<C>,
                "CommBackend: missing 'const comm_config& config() const noexcept'");
  static_assert(comm_backend_requests<C>,
                "CommBackend: missing 'request_type' with 'bool test()' and 'void wait()'");
  static_assert(comm_backend_collectives<C>,
                "CommBackend: missing a blocking collective (all_reduce, reduce_scatter, "
                "all_gather, broadcast, reduce, all_to_all, barrier)");
  static_assert(comm_backend_nonblocking<C>,
                "CommBackend: missing a non-blocking collective '<name>_async' returning "
                "request_type");
  static_assert(comm_backend_point_to_point<C>,
                "CommBackend: missing 'send', 'recv', 'send_async' or 'recv_async'");
  static_assert(comm_backend_splits<C>, "CommBackend: missing 'C split(int color, int key)'");
  return comm_backend<C>;
}

}  // namespace strata::comm
