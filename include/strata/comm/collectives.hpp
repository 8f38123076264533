// SPDX-License-Identifier: Apache-2.0
#pragma once

// Typed front ends of any comm_backend: contiguous ranges instead of (pointer, count, dtype), with
// the sizes checked on this rank before anything is sent. Blocking forms return when the
// operation is complete; `_async` forms return the backend's request.
//
//     std::vector<float> grads(n);
//     strata::comm::all_reduce(comm, grads, strata::comm::reduce_op::avg);   // in place
//     auto r = strata::comm::all_gather_async(comm, shard, full);           // overlap...
//     r.wait();

#include <cstddef>
#include <ranges>
#include <string>
#include <type_traits>

#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

// A contiguous range of one of core/'s dtypes.
template <class R>
concept dtype_range = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    arithmetic_dtype<std::remove_cv_t<std::ranges::range_value_t<R>>>;

// ... that can be written.
template <class R>
concept mutable_dtype_range =
    dtype_range<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

namespace detail {

template <class R>
using element_t = std::remove_cv_t<std::ranges::range_value_t<R>>;

template <class C>
[[noreturn]] void invalid(const C& c, op_kind op, const std::string& why) {
  throw comm_error(comm_error_info{.kind = comm_error_kind::invalid_argument,
                                   .op = std::string(to_string(op)),
                                   .rank = c.rank()},
                   why);
}

template <class In, class Out>
constexpr void same_element() {
  static_assert(std::is_same_v<element_t<In>, element_t<Out>>,
                "strata::comm: send and receive ranges must have the same element type");
}

template <class C>
void check_root(const C& c, op_kind op, int root) {
  if (root < 0 || root >= c.size()) {
    invalid(c, op,
            "root " + std::to_string(root) + " is not a rank of this communicator (size " +
                std::to_string(c.size()) + ")");
  }
}

template <class C>
void check_peer(const C& c, op_kind op, int peer) {
  if (peer < 0 || peer >= c.size()) {
    invalid(c, op,
            "peer " + std::to_string(peer) + " is not a rank of this communicator (size " +
                std::to_string(c.size()) + ")");
  }
}

inline std::string sizes(std::size_t a, std::size_t b) {
  return std::to_string(a) + " vs " + std::to_string(b);
}

}  // namespace detail

// ---- all_reduce ---------------------------------------------------------------------------------

template <comm_backend C, mutable_dtype_range R>
void all_reduce(C& c, R&& data, reduce_op op = reduce_op::sum) {
  using T = detail::element_t<R>;
  c.all_reduce(std::ranges::data(data), std::ranges::data(data), std::ranges::size(data),
               dtype_of<T>, op);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void all_reduce(C& c, In&& in, Out&& out, reduce_op op = reduce_op::sum) {
  detail::same_element<In, Out>();
  if (std::ranges::size(in) != std::ranges::size(out)) {
    detail::invalid(c, op_kind::all_reduce,
                    "send and receive sizes differ: " +
                        detail::sizes(std::ranges::size(in), std::ranges::size(out)));
  }
  c.all_reduce(std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
               dtype_of<detail::element_t<In>>, op);
}

template <comm_backend C, mutable_dtype_range R>
typename C::request_type all_reduce_async(C& c, R&& data, reduce_op op = reduce_op::sum) {
  using T = detail::element_t<R>;
  return c.all_reduce_async(std::ranges::data(data), std::ranges::data(data),
                            std::ranges::size(data), dtype_of<T>, op);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
typename C::request_type all_reduce_async(C& c, In&& in, Out&& out, reduce_op op = reduce_op::sum) {
  detail::same_element<In, Out>();
  if (std::ranges::size(in) != std::ranges::size(out)) {
    detail::invalid(c, op_kind::all_reduce,
                    "send and receive sizes differ: " +
                        detail::sizes(std::ranges::size(in), std::ranges::size(out)));
  }
  return c.all_reduce_async(std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
                            dtype_of<detail::element_t<In>>, op);
}

// ---- reduce_scatter: out gets this rank's reduced slice; in has size() slices ------------------

namespace detail {
template <class C, class In, class Out>
void check_reduce_scatter(const C& c, const In& in, const Out& out) {
  same_element<In, Out>();
  const auto n = static_cast<std::size_t>(c.size());
  if (std::ranges::size(in) != std::ranges::size(out) * n) {
    invalid(c, op_kind::reduce_scatter,
            "the send size must be size() x the receive size: " +
                sizes(std::ranges::size(in), std::ranges::size(out) * n));
  }
}
}  // namespace detail

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void reduce_scatter(C& c, In&& in, Out&& out, reduce_op op = reduce_op::sum) {
  detail::check_reduce_scatter(c, in, out);
  c.reduce_scatter(std::ranges::data(in), std::ranges::data(out), std::ranges::size(out),
                   dtype_of<detail::element_t<In>>, op);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
typename C::request_type reduce_scatter_async(C& c, In&& in, Out&& out,
                                              reduce_op op = reduce_op::sum) {
  detail::check_reduce_scatter(c, in, out);
  return c.reduce_scatter_async(std::ranges::data(in), std::ranges::data(out),
                                std::ranges::size(out), dtype_of<detail::element_t<In>>, op);
}

// ---- all_gather: out holds size() slices, slice r from rank r -----------------------------------

namespace detail {
template <class C, class In, class Out>
void check_all_gather(const C& c, const In& in, const Out& out) {
  same_element<In, Out>();
  const auto n = static_cast<std::size_t>(c.size());
  if (std::ranges::size(out) != std::ranges::size(in) * n) {
    invalid(c, op_kind::all_gather,
            "the receive size must be size() x the send size: " +
                sizes(std::ranges::size(out), std::ranges::size(in) * n));
  }
}
}  // namespace detail

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void all_gather(C& c, In&& in, Out&& out) {
  detail::check_all_gather(c, in, out);
  c.all_gather(std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
               dtype_of<detail::element_t<In>>);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
typename C::request_type all_gather_async(C& c, In&& in, Out&& out) {
  detail::check_all_gather(c, in, out);
  return c.all_gather_async(std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
                            dtype_of<detail::element_t<In>>);
}

// ---- broadcast ----------------------------------------------------------------------------------

template <comm_backend C, mutable_dtype_range R>
void broadcast(C& c, R&& data, int root) {
  detail::check_root(c, op_kind::broadcast, root);
  c.broadcast(std::ranges::data(data), std::ranges::size(data), dtype_of<detail::element_t<R>>,
              root);
}

template <comm_backend C, mutable_dtype_range R>
typename C::request_type broadcast_async(C& c, R&& data, int root) {
  detail::check_root(c, op_kind::broadcast, root);
  return c.broadcast_async(std::ranges::data(data), std::ranges::size(data),
                           dtype_of<detail::element_t<R>>, root);
}

// ---- reduce: out is written at root only (it may be empty elsewhere) ----------------------------

namespace detail {
template <class C, class In, class Out>
void* check_reduce(const C& c, const In& in, Out& out, int root) {
  same_element<In, Out>();
  check_root(c, op_kind::reduce, root);
  if (c.rank() == root && std::ranges::size(out) != std::ranges::size(in)) {
    invalid(c, op_kind::reduce,
            "at the root, send and receive sizes differ: " +
                sizes(std::ranges::size(in), std::ranges::size(out)));
  }
  return c.rank() == root ? static_cast<void*>(std::ranges::data(out)) : nullptr;
}
}  // namespace detail

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void reduce(C& c, In&& in, Out&& out, reduce_op op, int root) {
  void* recv = detail::check_reduce(c, in, out, root);
  c.reduce(std::ranges::data(in), recv, std::ranges::size(in), dtype_of<detail::element_t<In>>, op,
           root);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
typename C::request_type reduce_async(C& c, In&& in, Out&& out, reduce_op op, int root) {
  void* recv = detail::check_reduce(c, in, out, root);
  return c.reduce_async(std::ranges::data(in), recv, std::ranges::size(in),
                        dtype_of<detail::element_t<In>>, op, root);
}

// ---- all_to_all: slice r of in goes to rank r; slice r of out comes from rank r -----------------

namespace detail {
template <class C, class In, class Out>
std::size_t check_all_to_all(const C& c, const In& in, const Out& out) {
  same_element<In, Out>();
  const auto n = static_cast<std::size_t>(c.size());
  if (std::ranges::size(in) != std::ranges::size(out) || std::ranges::size(in) % n != 0) {
    invalid(c, op_kind::all_to_all,
            "send and receive sizes must be equal and divisible by size() = " + std::to_string(n) +
                ": " + sizes(std::ranges::size(in), std::ranges::size(out)));
  }
  return std::ranges::size(in) / n;
}
}  // namespace detail

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
void all_to_all(C& c, In&& in, Out&& out) {
  const std::size_t per_rank = detail::check_all_to_all(c, in, out);
  c.all_to_all(std::ranges::data(in), std::ranges::data(out), per_rank,
               dtype_of<detail::element_t<In>>);
}

template <comm_backend C, dtype_range In, mutable_dtype_range Out>
typename C::request_type all_to_all_async(C& c, In&& in, Out&& out) {
  const std::size_t per_rank = detail::check_all_to_all(c, in, out);
  return c.all_to_all_async(std::ranges::data(in), std::ranges::data(out), per_rank,
                            dtype_of<detail::element_t<In>>);
}

// ---- point to point -----------------------------------------------------------------------------

template <comm_backend C, dtype_range R>
void send(C& c, R&& data, int peer, int tag = 0) {
  detail::check_peer(c, op_kind::send, peer);
  c.send(std::ranges::data(data), std::ranges::size(data), dtype_of<detail::element_t<R>>, peer,
         tag);
}

template <comm_backend C, mutable_dtype_range R>
void recv(C& c, R&& data, int peer, int tag = 0) {
  detail::check_peer(c, op_kind::recv, peer);
  c.recv(std::ranges::data(data), std::ranges::size(data), dtype_of<detail::element_t<R>>, peer,
         tag);
}

template <comm_backend C, dtype_range R>
typename C::request_type send_async(C& c, R&& data, int peer, int tag = 0) {
  detail::check_peer(c, op_kind::send, peer);
  return c.send_async(std::ranges::data(data), std::ranges::size(data),
                      dtype_of<detail::element_t<R>>, peer, tag);
}

template <comm_backend C, mutable_dtype_range R>
typename C::request_type recv_async(C& c, R&& data, int peer, int tag = 0) {
  detail::check_peer(c, op_kind::recv, peer);
  return c.recv_async(std::ranges::data(data), std::ranges::size(data),
                      dtype_of<detail::element_t<R>>, peer, tag);
}

template <comm_backend C>
void barrier(C& c) {
  c.barrier();
}

}  // namespace strata::comm
