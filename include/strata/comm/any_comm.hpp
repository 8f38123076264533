// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata::comm::any_comm: a non-owning, type-erased handle on a communicator of any comm_backend,
// so that a class (the trainer) can hold "some communicator" without being a template on it.
//
//     strata::comm::threads::run(2, [](strata::comm::threads& c) {
//       strata::comm::any_comm comm(c);         // refers to c; c must outlive it
//       comm.all_reduce(grads, strata::comm::reduce_op::avg);
//       auto r = comm.all_gather_async(shard, full);
//       r.wait();
//     });
//
// Every operation of the contract except split is offered, blocking and non-blocking, with the
// contract's untyped signatures (pointer, count, dtype) and, for the common ones, typed forms over
// contiguous ranges that check sizes like collectives.hpp does. Calls go through one virtual call
// to the backend's member of the same name; arguments, results and errors are the backend's.
// any_comm is a reference: copies refer to the same communicator, and the communicator is used
// from one thread, as always. split(color, key) is the exception: the backend's sub-communicator
// it makes is owned by the returned handle (and its copies), so that any_comm is itself a
// comm_backend and the algorithms of algorithms.hpp (make_hierarchy, ...) run over it.
//
// any_comm::request holds the backend's request_type by value (one heap allocation per
// non-blocking call). Like every comm request, a default-constructed request is complete: test()
// is true and wait() returns at once. test() / wait() rethrow the operation's error, once (the
// backend's request reports it once); after completion the held request is released.

#include <concepts>
#include <cstddef>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"

namespace strata::comm {

class any_comm {
 public:
  class request {
   public:
    request() noexcept = default;
    request(request&&) noexcept = default;
    request& operator=(request&&) noexcept = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() = default;

    // True once the operation is complete (always, for an empty request); rethrows its error.
    bool test() {
      if (!held_) {
        return true;
      }
      if (!held_->test()) {
        return false;
      }
      held_.reset();
      return true;
    }

    // Blocks until the operation is complete (returns at once for an empty request); rethrows its
    // error.
    void wait() {
      if (held_) {
        held_->wait();
        held_.reset();
      }
    }

    // Whether an operation is still held (false for a default-constructed or completed request).
    bool pending() const noexcept { return held_ != nullptr; }

   private:
    friend class any_comm;

    struct holder_base {
      virtual ~holder_base() = default;
      virtual bool test() = 0;
      virtual void wait() = 0;
    };

    template <class R>
    struct holder final : holder_base {
      explicit holder(R&& r) : inner(std::move(r)) {}
      bool test() override { return inner.test(); }
      void wait() override { inner.wait(); }
      R inner;
    };

    template <class R>
    requires(!std::is_same_v<std::remove_cvref_t<R>, request>) explicit request(R&& r)
        : held_(std::make_unique<holder<std::remove_cvref_t<R>>>(std::forward<R>(r))) {}

    std::unique_ptr<holder_base> held_{};
  };
  using request_type = request;
  using policy_category = comm_backend_tag;

  // Refers to `c`, which must outlive this handle and every copy of it.
  template <class C>
  requires(!std::same_as<std::remove_cv_t<C>, any_comm>) &&
      comm_backend<C> explicit any_comm(C& c) noexcept : self_(&c),
  ops_(&model<C>::instance) {}

  any_comm(const any_comm&) noexcept = default;
  any_comm& operator=(const any_comm&) noexcept = default;

  // Collective: a handle on the backend's split(color, key), owning that sub-communicator.
  any_comm split(int color, int key) { return ops_->split(self_, color, key); }

  int rank() const noexcept { return ops_->rank(self_); }
  int size() const noexcept { return ops_->size(self_); }
  const comm_config& config() const noexcept { return ops_->config(self_); }
  // The wrapped backend's comm::nonblocking_progresses (see concepts.hpp).
  bool progresses_nonblocking() const noexcept { return ops_->progresses_nonblocking(); }
  // The wrapped backend's comm::ranks_sharing_cpus (see concepts.hpp).
  int ranks_sharing_cpus() const noexcept { return ops_->ranks_sharing_cpus(self_); }
  // The wrapped backend's comm::ranks_sharing_memory (see concepts.hpp).
  int ranks_sharing_memory() const noexcept { return ops_->ranks_sharing_memory(self_); }

  // ---- untyped: the contract's signatures -----------------------------------------------------

  void all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op) {
    ops_->all_reduce(self_, send, recv, count, type, op);
  }
  request all_reduce_async(const void* send, void* recv, std::size_t count, dtype type,
                           reduce_op op) {
    return ops_->all_reduce_async(self_, send, recv, count, type, op);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, dtype type,
                      reduce_op op) {
    ops_->reduce_scatter(self_, send, recv, recv_count, type, op);
  }
  request reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, dtype type,
                               reduce_op op) {
    return ops_->reduce_scatter_async(self_, send, recv, recv_count, type, op);
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, dtype type) {
    ops_->all_gather(self_, send, recv, send_count, type);
  }
  request all_gather_async(const void* send, void* recv, std::size_t send_count, dtype type) {
    return ops_->all_gather_async(self_, send, recv, send_count, type);
  }
  void broadcast(void* buffer, std::size_t count, dtype type, int root) {
    ops_->broadcast(self_, buffer, count, type, root);
  }
  request broadcast_async(void* buffer, std::size_t count, dtype type, int root) {
    return ops_->broadcast_async(self_, buffer, count, type, root);
  }
  void reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op, int root) {
    ops_->reduce(self_, send, recv, count, type, op, root);
  }
  request reduce_async(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                       int root) {
    return ops_->reduce_async(self_, send, recv, count, type, op, root);
  }
  void all_to_all(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    ops_->all_to_all(self_, send, recv, count_per_rank, type);
  }
  request all_to_all_async(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    return ops_->all_to_all_async(self_, send, recv, count_per_rank, type);
  }
  void barrier() { ops_->barrier(self_); }
  request barrier_async() { return ops_->barrier_async(self_); }
  void send(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    ops_->send(self_, buffer, count, type, peer, tag);
  }
  void recv(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    ops_->recv(self_, buffer, count, type, peer, tag);
  }
  request send_async(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return ops_->send_async(self_, buffer, count, type, peer, tag);
  }
  request recv_async(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return ops_->recv_async(self_, buffer, count, type, peer, tag);
  }

  // ---- typed: contiguous ranges, sizes checked on this rank first (as in collectives.hpp) ------

  // In place.
  template <mutable_dtype_range R>
  void all_reduce(R&& data, reduce_op op = reduce_op::sum) {
    all_reduce(std::ranges::data(data), std::ranges::data(data), std::ranges::size(data),
               dtype_of<detail::element_t<R>>, op);
  }
  template <mutable_dtype_range R>
  request all_reduce_async(R&& data, reduce_op op = reduce_op::sum) {
    return all_reduce_async(std::ranges::data(data), std::ranges::data(data),
                            std::ranges::size(data), dtype_of<detail::element_t<R>>, op);
  }
  // `out` gets this rank's reduced slice; `in` holds size() slices of out's size.
  template <dtype_range In, mutable_dtype_range Out>
  void reduce_scatter(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    detail::check_reduce_scatter(*this, in, out);
    reduce_scatter(std::ranges::data(in), std::ranges::data(out), std::ranges::size(out),
                   dtype_of<detail::element_t<In>>, op);
  }
  template <dtype_range In, mutable_dtype_range Out>
  request reduce_scatter_async(In&& in, Out&& out, reduce_op op = reduce_op::sum) {
    detail::check_reduce_scatter(*this, in, out);
    return reduce_scatter_async(std::ranges::data(in), std::ranges::data(out),
                                std::ranges::size(out), dtype_of<detail::element_t<In>>, op);
  }
  // `out` holds size() slices, slice r from rank r.
  template <dtype_range In, mutable_dtype_range Out>
  void all_gather(In&& in, Out&& out) {
    detail::check_all_gather(*this, in, out);
    all_gather(std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
               dtype_of<detail::element_t<In>>);
  }
  template <dtype_range In, mutable_dtype_range Out>
  request all_gather_async(In&& in, Out&& out) {
    detail::check_all_gather(*this, in, out);
    return all_gather_async(std::ranges::data(in), std::ranges::data(out), std::ranges::size(in),
                            dtype_of<detail::element_t<In>>);
  }
  template <mutable_dtype_range R>
  void broadcast(R&& data, int root) {
    detail::check_root(*this, op_kind::broadcast, root);
    broadcast(std::ranges::data(data), std::ranges::size(data), dtype_of<detail::element_t<R>>,
              root);
  }
  template <dtype_range R>
  void send(R&& data, int peer, int tag = 0) {
    detail::check_peer(*this, op_kind::send, peer);
    send(std::ranges::data(data), std::ranges::size(data), dtype_of<detail::element_t<R>>, peer,
         tag);
  }
  template <mutable_dtype_range R>
  void recv(R&& data, int peer, int tag = 0) {
    detail::check_peer(*this, op_kind::recv, peer);
    recv(std::ranges::data(data), std::ranges::size(data), dtype_of<detail::element_t<R>>, peer,
         tag);
  }

 private:
  // The operations of one backend type, called on a `void*` that points to a communicator of it.
  struct interface {
    virtual int rank(const void* c) const noexcept = 0;
    virtual int size(const void* c) const noexcept = 0;
    virtual const comm_config& config(const void* c) const noexcept = 0;
    virtual bool progresses_nonblocking() const noexcept = 0;
    virtual int ranks_sharing_cpus(const void* c) const noexcept = 0;
    virtual int ranks_sharing_memory(const void* c) const noexcept = 0;
    virtual void all_reduce(void* c, const void* s, void* r, std::size_t n, dtype t,
                            reduce_op op) const = 0;
    virtual request all_reduce_async(void* c, const void* s, void* r, std::size_t n, dtype t,
                                     reduce_op op) const = 0;
    virtual void reduce_scatter(void* c, const void* s, void* r, std::size_t n, dtype t,
                                reduce_op op) const = 0;
    virtual request reduce_scatter_async(void* c, const void* s, void* r, std::size_t n, dtype t,
                                         reduce_op op) const = 0;
    virtual void all_gather(void* c, const void* s, void* r, std::size_t n, dtype t) const = 0;
    virtual request all_gather_async(void* c, const void* s, void* r, std::size_t n,
                                     dtype t) const = 0;
    virtual void broadcast(void* c, void* b, std::size_t n, dtype t, int root) const = 0;
    virtual request broadcast_async(void* c, void* b, std::size_t n, dtype t, int root) const = 0;
    virtual void reduce(void* c, const void* s, void* r, std::size_t n, dtype t, reduce_op op,
                        int root) const = 0;
    virtual request reduce_async(void* c, const void* s, void* r, std::size_t n, dtype t,
                                 reduce_op op, int root) const = 0;
    virtual void all_to_all(void* c, const void* s, void* r, std::size_t n, dtype t) const = 0;
    virtual request all_to_all_async(void* c, const void* s, void* r, std::size_t n,
                                     dtype t) const = 0;
    virtual any_comm split(void* c, int color, int key) const = 0;
    virtual void barrier(void* c) const = 0;
    virtual request barrier_async(void* c) const = 0;
    virtual void send(void* c, const void* b, std::size_t n, dtype t, int peer, int tag) const = 0;
    virtual void recv(void* c, void* b, std::size_t n, dtype t, int peer, int tag) const = 0;
    virtual request send_async(void* c, const void* b, std::size_t n, dtype t, int peer,
                               int tag) const = 0;
    virtual request recv_async(void* c, void* b, std::size_t n, dtype t, int peer,
                               int tag) const = 0;

   protected:
    ~interface() = default;
  };

  // One stateless instance per backend type; the communicator travels as `void*`.
  template <class C>
  struct model final : interface {
    static const model instance;

    static C& self(void* c) noexcept { return *static_cast<C*>(c); }
    static const C& self(const void* c) noexcept { return *static_cast<const C*>(c); }

    int rank(const void* c) const noexcept override { return self(c).rank(); }
    int size(const void* c) const noexcept override { return self(c).size(); }
    const comm_config& config(const void* c) const noexcept override { return self(c).config(); }
    bool progresses_nonblocking() const noexcept override { return nonblocking_progresses<C>; }
    int ranks_sharing_cpus(const void* c) const noexcept override {
      return comm::ranks_sharing_cpus(self(c));
    }
    int ranks_sharing_memory(const void* c) const noexcept override {
      return comm::ranks_sharing_memory(self(c));
    }
    void all_reduce(void* c, const void* s, void* r, std::size_t n, dtype t,
                    reduce_op op) const override {
      self(c).all_reduce(s, r, n, t, op);
    }
    request all_reduce_async(void* c, const void* s, void* r, std::size_t n, dtype t,
                             reduce_op op) const override {
      return request(self(c).all_reduce_async(s, r, n, t, op));
    }
    void reduce_scatter(void* c, const void* s, void* r, std::size_t n, dtype t,
                        reduce_op op) const override {
      self(c).reduce_scatter(s, r, n, t, op);
    }
    request reduce_scatter_async(void* c, const void* s, void* r, std::size_t n, dtype t,
                                 reduce_op op) const override {
      return request(self(c).reduce_scatter_async(s, r, n, t, op));
    }
    void all_gather(void* c, const void* s, void* r, std::size_t n, dtype t) const override {
      self(c).all_gather(s, r, n, t);
    }
    request all_gather_async(void* c, const void* s, void* r, std::size_t n,
                             dtype t) const override {
      return request(self(c).all_gather_async(s, r, n, t));
    }
    void broadcast(void* c, void* b, std::size_t n, dtype t, int root) const override {
      self(c).broadcast(b, n, t, root);
    }
    request broadcast_async(void* c, void* b, std::size_t n, dtype t, int root) const override {
      return request(self(c).broadcast_async(b, n, t, root));
    }
    void reduce(void* c, const void* s, void* r, std::size_t n, dtype t, reduce_op op,
                int root) const override {
      self(c).reduce(s, r, n, t, op, root);
    }
    request reduce_async(void* c, const void* s, void* r, std::size_t n, dtype t, reduce_op op,
                         int root) const override {
      return request(self(c).reduce_async(s, r, n, t, op, root));
    }
    void all_to_all(void* c, const void* s, void* r, std::size_t n, dtype t) const override {
      self(c).all_to_all(s, r, n, t);
    }
    request all_to_all_async(void* c, const void* s, void* r, std::size_t n,
                             dtype t) const override {
      return request(self(c).all_to_all_async(s, r, n, t));
    }
    any_comm split(void* c, int color, int key) const override {
      auto owned = std::make_shared<C>(self(c).split(color, key));
      any_comm out(*owned);
      out.owner_ = std::move(owned);
      return out;
    }
    void barrier(void* c) const override { self(c).barrier(); }
    request barrier_async(void* c) const override { return request(self(c).barrier_async()); }
    void send(void* c, const void* b, std::size_t n, dtype t, int peer, int tag) const override {
      self(c).send(b, n, t, peer, tag);
    }
    void recv(void* c, void* b, std::size_t n, dtype t, int peer, int tag) const override {
      self(c).recv(b, n, t, peer, tag);
    }
    request send_async(void* c, const void* b, std::size_t n, dtype t, int peer,
                       int tag) const override {
      return request(self(c).send_async(b, n, t, peer, tag));
    }
    request recv_async(void* c, void* b, std::size_t n, dtype t, int peer, int tag) const override {
      return request(self(c).recv_async(b, n, t, peer, tag));
    }
  };

  void* self_;
  const interface* ops_;
  std::shared_ptr<void> owner_{};  // split results: keeps the sub-communicator alive
};

template <class C>
inline const any_comm::model<C> any_comm::model<C>::instance{};

static_assert(comm_request<any_comm::request>);

}  // namespace strata::comm
