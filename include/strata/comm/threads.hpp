// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata::comm::threads: N ranks as threads of one process, a comm_backend.
//
//     strata::comm::threads::run(4, [](strata::comm::threads& comm) {
//       std::vector<float> grads(n);
//       strata::comm::all_reduce(comm, grads, strata::comm::reduce_op::avg);
//     });
//
// Collectives work on shared memory directly. Each rank publishes pointers to its buffers (and
// the signature of its call) in its slot of the group's shared state and arrives at a phase;
// once every rank has arrived, the signatures are compared and each rank moves its share of the
// data straight between the peers' buffers (all_reduce: rank r reduces slice r of every send
// buffer, in rank order, and writes the result into every receive buffer), then arrives at a
// completion phase that keeps every buffer alive until all peers are done with it. Results are
// identical on every rank and deterministic: each element is reduced once, in rank order.
// Messages (send / recv) meet in the receiver's mailbox, matched on (source, tag) in the order
// they were posted, and are copied once, between the two user buffers: by the side that arrives
// second, unless the first is blocked waiting for it, which then copies itself (so that a rank
// that posts a send_async and then a blocking recv, as in a ring exchange, does not do both
// copies while its peer idles).
//
// Non-blocking collectives run on a per-communicator progress thread, started at the first of
// them, in the order they were issued; a blocking collective issued while some are pending runs
// after them, so collectives complete in issue order. Messages are posted at once, whether
// blocking or not: they never wait behind a pending collective nor hold one back (so exchanges
// that mix both cannot deadlock), and a pending send_async / recv_async completes when its
// counterpart arrives. Blocking send is synchronous: it returns when the receiver has the data.
//
// No hangs: every wait has the deadline config().timeout. A rank that throws marks itself
// failed and every other rank's current or next wait throws comm_error (peer_failed); a wait
// past its deadline throws comm_error (timeout, naming the ranks that did and did not arrive) and
// aborts the world, so that every other rank's wait throws comm_error (aborted). Every call's
// signature is compared before any data moves, whatever config().fingerprint says: on shared
// memory the check is a few loads, and a mismatched call would otherwise read or write past a
// peer's buffer. Every comm_error message ends with this rank's recent operations (op_history).
//
// Fault injection (fault.hpp) is consulted before each operation with (rank in this
// communicator, op, sequence). Collectives (barrier and split included) share one sequence
// counter per communicator; sends and receives have their own.

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/detail/threads_kernels.hpp"
#include "strata/comm/detail/threads_state.hpp"
#include "strata/comm/detail/wait.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/fingerprint.hpp"
#include "strata/comm/history.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/deadline.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"
#include "strata/core/policy.hpp"

namespace strata::comm {

namespace detail {

// What a rank stopped by a `kill` fault throws to end its thread (silently: it is not a failure).
class threads_killed : public error {
 public:
  using error::error;
};

struct threads_op {
  op_kind kind = op_kind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  dtype type = dtype::uint8;
  reduce_op reduction = reduce_op::sum;
  int root = -1;
  int peer = -1;
  int tag = 0;
  std::uint64_t sequence = 0;
};

constexpr bool is_point_to_point(op_kind k) noexcept {
  return k == op_kind::send || k == op_kind::recv;
}

constexpr bool reduces(op_kind k) noexcept {
  return k == op_kind::all_reduce || k == op_kind::reduce_scatter || k == op_kind::reduce;
}

inline op_signature signature_of(const threads_op& op) noexcept {
  return op_signature{
      .sequence = op.sequence,
      .count = op.count,
      .root = op.kind == op_kind::broadcast || op.kind == op_kind::reduce ? op.root : -1,
      .op = op.kind,
      .type = op.type,
      .reduction = reduces(op.kind) ? op.reduction : reduce_op::sum,
      .reduces = static_cast<std::uint8_t>(reduces(op.kind) ? 1 : 0)};
}

enum class record_state : std::uint8_t { free, queued, running, posted, done, failed };

// One non-blocking operation: its arguments, its message (send / recv) and its outcome.
struct threads_record {
  threads_op op{};
  p2p_post post{};
  std::atomic<record_state> state{record_state::free};
  std::exception_ptr error{};
  std::size_t history_slot = 0;
  deadline due = deadline::never();
  bool abandoned = false;  // its request is gone (guarded by the core's queue mutex)
  threads_record* next = nullptr;
};

struct threads_context {
  op_signature signature{};
  std::optional<deadline> due{};  // started at the first slow check of a wait
};

// Bytes [lo, hi) of `count` elements that rank `r` of `n` handles: contiguous, split on cache
// lines (relative to the buffer start) so that no two ranks write one line.
inline std::pair<std::size_t, std::size_t> slice_of(int r, int n, std::size_t count,
                                                    std::size_t element) noexcept {
  const std::size_t per_line = std::max<std::size_t>(1, threads_cache_line / element);
  const std::size_t lines = (count + per_line - 1) / per_line;
  const auto un = static_cast<std::size_t>(n);
  const auto ur = static_cast<std::size_t>(r);
  const std::size_t base = lines / un;
  const std::size_t extra = lines % un;
  const std::size_t first = ur * base + std::min(ur, extra);
  const std::size_t last = first + base + (ur < extra ? 1 : 0);
  return {std::min(count, first * per_line), std::min(count, last * per_line)};
}

inline const std::byte* byte_ptr(const void* p, std::size_t offset = 0) noexcept {
  return static_cast<const std::byte*>(p) + offset;
}

inline std::byte* byte_ptr(void* p, std::size_t offset = 0) noexcept {
  return static_cast<std::byte*>(p) + offset;
}

// One rank's end of one communicator. Shared by the communicator and its requests; the progress
// thread is owned (and joined) by the communicator.
class threads_core {
 public:
  threads_core(std::shared_ptr<group_state> group, int rank, comm_config config)
      : group_(std::move(group)),
        world_(group_->world.get()),
        rank_(rank),
        size_(group_->size()),
        world_rank_(group_->world_ranks[static_cast<std::size_t>(rank)]),
        config_(config),
        history_(config.history_length),
        pointers_(
            std::make_unique<std::byte[]>(2 * static_cast<std::size_t>(size_) * sizeof(void*))) {}

  threads_core(const threads_core&) = delete;
  threads_core& operator=(const threads_core&) = delete;
  ~threads_core() = default;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int world_rank() const noexcept { return world_rank_; }
  const comm_config& config() const noexcept { return config_; }
  const op_history& history() const noexcept { return history_; }
  const std::shared_ptr<group_state>& group() const noexcept { return group_; }

  std::uint64_t next_sequence(op_kind kind) noexcept {
    return is_point_to_point(kind) ? p2p_sequence_++ : collective_sequence_++;
  }

  // ---- blocking operations (the caller's thread) -----------------------------------------------

  // A blocking collective runs after every pending non-blocking one; a message is posted at
  // once (see issue).
  void run_blocking(const threads_op& op) {
    if (!is_point_to_point(op.kind)) {
      drain_queue();
    }
    const std::size_t slot = history_.start(signature_of(op), peer_of(op), tag_of(op));
    execute(op, slot, nullptr);
  }

  std::shared_ptr<group_state> split(int color, int key, std::uint64_t sequence, int& new_rank) {
    drain_queue();
    threads_op op{.kind = op_kind::split, .sequence = sequence};
    const std::size_t slot = history_.start(signature_of(op));
    threads_context ctx{.signature = signature_of(op)};
    try {
      begin(ctx);
      collective_entry& mine = entry(rank_, sequence);
      mine.color = color;
      mine.key = key;
      arrive_first(ctx, nullptr, nullptr);
      std::vector<std::pair<std::pair<int, int>, int>> same;  // ((key, old rank), old rank)
      for (int q = 0; q < size_; ++q) {
        const collective_entry& e = entry(q, sequence);
        if (e.color == color) {
          same.push_back({{e.key, q}, q});
        }
      }
      std::sort(same.begin(), same.end());
      const int leader = same.front().second;
      for (std::size_t i = 0; i < same.size(); ++i) {
        if (same[i].second == rank_) {
          new_rank = static_cast<int>(i);
        }
      }
      if (leader == rank_) {
        std::vector<int> world_ranks;
        world_ranks.reserve(same.size());
        for (const auto& m : same) {
          world_ranks.push_back(group_->world_ranks[static_cast<std::size_t>(m.second)]);
        }
        mine.split_result = std::make_shared<group_state>(group_->world, std::move(world_ranks));
      }
      sync(ctx, false);
      std::shared_ptr<group_state> result = entry(leader, sequence).split_result;
      sync(ctx, false);
      if (leader == rank_) {
        mine.split_result.reset();
      }
      history_.finish(slot, op_status::completed);
      return result;
    } catch (...) {
      history_.finish(slot, op_status::failed);
      note_thrown();
      throw;
    }
  }

  // ---- non-blocking operations -----------------------------------------------------------------

  // A non-blocking collective is queued for the progress thread, which runs collectives in issue
  // order. A message is posted at once, on this thread: it never waits behind a pending
  // collective nor holds one back (so that exchanges mixing both cannot deadlock), and when its
  // counterpart is already posted, the copy happens here.
  threads_record* issue(const threads_op& op) {
    threads_record* r = acquire_record();
    r->op = op;
    r->error = nullptr;
    r->abandoned = false;
    r->due = deadline::after(config_.timeout);
    r->history_slot = history_.start(signature_of(op), peer_of(op), tag_of(op));
    if (is_point_to_point(op.kind)) {
      r->state.store(record_state::running, std::memory_order_seq_cst);
      try {
        execute(op, r->history_slot, r);
      } catch (...) {
        r->error = std::current_exception();
        r->state.store(record_state::failed, std::memory_order_seq_cst);
      }
      return r;
    }
    r->state.store(record_state::queued, std::memory_order_seq_cst);
    {
      const std::lock_guard lock(queue_mutex_);
      r->next = nullptr;
      if (queue_tail_ == nullptr) {
        queue_head_ = r;
      } else {
        queue_tail_->next = r;
      }
      queue_tail_ = r;
    }
    ++issued_;
    enqueued_.fetch_add(1, std::memory_order_seq_cst);
    if (!progress_.joinable()) {
      progress_ = std::thread([this] { progress_loop(); });
    }
    queue_bell_.ring();
    return r;
  }

  // Whether `r` is complete; its error, if any, goes to `error`. `block`: wait for it.
  bool poll(threads_record& r, std::exception_ptr& error, bool block) {
    const auto complete = [&r] {
      const record_state s = r.state.load(std::memory_order_seq_cst);
      if (s == record_state::done || s == record_state::failed) {
        return true;
      }
      if (s != record_state::posted) {
        return false;
      }
      const post_state p = r.post.state.load(std::memory_order_seq_cst);
      return p == post_state::done || p == post_state::mismatch || p == post_state::withdrawn;
    };
    const auto check = [&] {
      if (r.state.load(std::memory_order_seq_cst) != record_state::posted) {
        return;
      }
      threads_context ctx{.signature = signature_of(r.op), .due = r.due};
      try {
        check_post(r.post, ctx);
      } catch (...) {
        r.error = std::current_exception();
      }
    };
    if (block) {
      wait_until(world_->bell, budget(), complete, check);
    } else if (!complete()) {
      check();
      if (!complete()) {
        return false;
      }
    }
    finish_record(r, error);
    return true;
  }

  // The request of `r` is gone.
  void release(threads_record* r) noexcept {
    const std::lock_guard lock(queue_mutex_);
    if (record_complete(*r)) {
      r->state.store(record_state::free, std::memory_order_relaxed);
      r->next = free_;
      free_ = r;
    } else {
      r->abandoned = true;
    }
  }

  // Stops the progress thread after it has run everything queued, withdraws messages that are
  // still unmatched, and tells the peers that this rank has left the group (their waits for it
  // fail at once). The core lives on while requests refer to it.
  void close(departure why = departure::destroyed) noexcept {
    if (progress_.joinable()) {
      {
        const std::lock_guard lock(queue_mutex_);
        stop_.store(true, std::memory_order_seq_cst);
      }
      queue_bell_.ring();
      progress_.join();
    }
    for (auto& r : pool_) {
      if (r->state.load(std::memory_order_seq_cst) == record_state::posted && withdraw(r->post)) {
        try {
          r->error = std::make_exception_ptr(
              make_error(comm_error_kind::aborted, signature_of(r->op),
                         "the communicator was destroyed while this " +
                             std::string(to_string(r->op.kind)) + " was unmatched"));
        } catch (...) {
          r->error = std::current_exception();
        }
        history_.finish(r->history_slot, op_status::failed);
      }
    }
    if (world_->state(world_rank_) != rank_state::killed) {
      group_->slots[static_cast<std::size_t>(rank_)].left.store(why, std::memory_order_seq_cst);
      world_->bell.ring();
    }
  }

 private:
  // ---- the executor ----------------------------------------------------------------------------

  // Runs `op` on this thread. For a message with a record (non-blocking), only posts it.
  void execute(const threads_op& op, std::size_t slot, threads_record* record) {
    threads_context ctx{.signature = signature_of(op)};
    try {
      begin(ctx);
      switch (op.kind) {
        case op_kind::all_reduce:
          all_reduce(op, ctx);
          break;
        case op_kind::reduce:
          reduce(op, ctx);
          break;
        case op_kind::reduce_scatter:
          reduce_scatter(op, ctx);
          break;
        case op_kind::all_gather:
          all_gather(op, ctx);
          break;
        case op_kind::broadcast:
          broadcast(op, ctx);
          break;
        case op_kind::all_to_all:
          all_to_all(op, ctx);
          break;
        case op_kind::barrier:
          arrive_first(ctx, nullptr, nullptr);
          break;
        case op_kind::send:
        case op_kind::recv:
          message(op, ctx, record);
          if (record != nullptr) {
            return;  // the history is finished when the request sees the outcome
          }
          break;
        case op_kind::split:
          break;
      }
      history_.finish(slot, op_status::completed);
    } catch (...) {
      history_.finish(slot, op_status::failed);
      note_thrown();
      throw;
    }
  }

  // Checks that precede every operation: this rank killed, the world in trouble, a planned fault.
  void begin(threads_context& ctx) {
    if (world_->state(world_rank_) == rank_state::killed) {
      throw threads_killed("rank " + std::to_string(rank_) + " was killed by fault injection");
    }
    if (world_->trouble() != 0) {
      raise_trouble(ctx, 0);
    }
    if (const auto fault =
            fault_injector::global().at(rank_, ctx.signature.op, ctx.signature.sequence)) {
      apply_fault(*fault, ctx);
    }
  }

  void apply_fault(fault_action action, threads_context& ctx) {
    const std::string where =
        std::string(to_string(ctx.signature.op)) + " #" + std::to_string(ctx.signature.sequence);
    switch (action) {
      case fault_action::kill:
        world_->mark(world_rank_, rank_state::killed);
        throw threads_killed("rank " + std::to_string(rank_) +
                             " was killed by fault injection in " + where);
      case fault_action::throw_error:
        throw error("fault injection: rank " + std::to_string(rank_) + " throws in " + where);
      case fault_action::hang: {
        const auto released = [this] {
          return world_->trouble() != 0 || world_->all_others_gone(world_rank_);
        };
        wait_until(world_->bell, budget_for(true), released, [] {});
        const auto reason = world_->abort_reason();
        raise(comm_error_kind::aborted, ctx.signature,
              "this rank was hung by fault injection until the world was aborted" +
                  (reason ? ": " + reason->what : std::string()));
      }
      case fault_action::wrong_count:
        ++ctx.signature.count;
        break;
    }
  }

  // ---- phases of a collective ------------------------------------------------------------------

  collective_entry& entry(int q, std::uint64_t sequence) noexcept {
    return group_->slots[static_cast<std::size_t>(q)].entries[sequence & 1u];
  }

  // Publishes this rank's buffers and signature, arrives at the first phase, and compares every
  // rank's signature. Throws (on every rank alike) when they differ.
  void arrive_first(threads_context& ctx, const void* send, void* recv) {
    collective_entry& mine = entry(rank_, ctx.signature.sequence);
    mine.send = send;
    mine.recv = recv;
    mine.signature = ctx.signature;
    sync(ctx, true);
    for (int q = 0; q < size_; ++q) {
      if (!(entry(q, ctx.signature.sequence).signature == ctx.signature)) {
        std::vector<op_signature> all;
        all.reserve(static_cast<std::size_t>(size_));
        for (int p = 0; p < size_; ++p) {
          all.push_back(entry(p, ctx.signature.sequence).signature);
        }
        raise(comm_error_kind::mismatch, ctx.signature,
              "ranks made different calls: " + describe_mismatch(all));
      }
    }
  }

  // Arrives at the next phase of the group and waits for every rank. In the first phase of a
  // collective a rank may withdraw (take its arrival back) while not everyone has arrived; once
  // all have, every rank goes through the whole collective, so later phases wait only for peers
  // that are moving data and cannot block.
  void sync(threads_context& ctx, bool first) {
    group_state& g = *group_;
    const std::uint64_t phase = ++phase_;
    const std::uint64_t target = phase * static_cast<std::uint64_t>(size_);
    g.slots[static_cast<std::size_t>(rank_)].arrived_phase.store(phase, std::memory_order_relaxed);
    if (g.arrivals.fetch_add(1, std::memory_order_seq_cst) + 1 >= target) {
      world_->bell.ring();
      return;
    }
    const auto ready = [&g, target] {
      return g.arrivals.load(std::memory_order_seq_cst) >= target;
    };
    wait_until(world_->bell, budget(), ready, [&] { check_phase(ctx, phase, target, first); });
  }

  void check_phase(threads_context& ctx, std::uint64_t phase, std::uint64_t target, bool first) {
    if (!ctx.due) {
      ctx.due = deadline::after(config_.timeout);
    }
    if (first && (world_->trouble() != 0 || member_gone(phase))) {
      if (!withdraw_arrival(target)) {
        return;
      }
      raise_trouble(ctx, phase);
    }
    if (ctx.due->expired()) {
      if (first && !withdraw_arrival(target)) {
        return;
      }
      auto [arrived, missing] = arrivals(phase);
      const std::string what =
          "rank " + std::to_string(rank_) + " waited " + seconds_text(config_.timeout) + " s in " +
          std::string(to_string(ctx.signature.op)) + " #" + std::to_string(ctx.signature.sequence) +
          " for ranks " + strata::detail::join_ranks(missing);
      world_->abort({.group = group_->id,
                     .phase = phase,
                     .what = what,
                     .arrived = arrived,
                     .missing = missing});
      raise(comm_error_kind::timeout, ctx.signature, what + "; the world is aborted",
            std::move(arrived), std::move(missing));
    }
  }

  // Takes this rank's arrival back unless everyone has arrived. (Its arrived_phase stays, so
  // that every rank reports the same arrivals.)
  bool withdraw_arrival(std::uint64_t target) noexcept {
    group_state& g = *group_;
    std::uint64_t v = g.arrivals.load(std::memory_order_seq_cst);
    while (v < target) {
      if (g.arrivals.compare_exchange_weak(v, v - 1, std::memory_order_seq_cst)) {
        return true;
      }
    }
    return false;
  }

  // Whether member q will never join another operation of this group: its thread returned from
  // its function, or it destroyed its communicator.
  bool gone(int q) const noexcept {
    return group_->slots[static_cast<std::size_t>(q)].left.load(std::memory_order_seq_cst) !=
               departure::none ||
           world_->state(group_->world_ranks[static_cast<std::size_t>(q)]) == rank_state::exited;
  }

  bool member_gone(std::uint64_t phase) const noexcept {
    for (int q = 0; q < size_; ++q) {
      if (group_->slots[static_cast<std::size_t>(q)].arrived_phase.load(std::memory_order_relaxed) <
              phase &&
          gone(q)) {
        return true;
      }
    }
    return false;
  }

  std::pair<std::vector<int>, std::vector<int>> arrivals(std::uint64_t phase) const {
    std::vector<int> arrived;
    std::vector<int> missing;
    for (int q = 0; q < size_; ++q) {
      const bool here = q == rank_ || group_->slots[static_cast<std::size_t>(q)].arrived_phase.load(
                                          std::memory_order_relaxed) >= phase;
      (here ? arrived : missing).push_back(q);
    }
    return {std::move(arrived), std::move(missing)};
  }

  std::string describe_rank(int world_rank) const {
    for (int q = 0; q < size_; ++q) {
      if (group_->world_ranks[static_cast<std::size_t>(q)] == world_rank) {
        return q == world_rank ? "rank " + std::to_string(q)
                               : "rank " + std::to_string(q) + " (world rank " +
                                     std::to_string(world_rank) + ")";
      }
    }
    return "world rank " + std::to_string(world_rank);
  }

  // Throws the error that the world's trouble means for this wait: a timeout of this very phase
  // (every waiting rank reports it), an abort, a failed rank, or a member that has returned.
  [[noreturn]] void raise_trouble(const threads_context& ctx, std::uint64_t phase) {
    std::vector<int> arrived;
    std::vector<int> missing;
    if (phase != 0) {
      std::tie(arrived, missing) = arrivals(phase);
    }
    if (const auto reason = world_->abort_reason()) {
      if (phase != 0 && reason->group == group_->id && reason->phase == phase) {
        raise(comm_error_kind::timeout, ctx.signature,
              "timed out waiting for ranks " + strata::detail::join_ranks(reason->missing) + " (" +
                  reason->what + "); the world is aborted",
              reason->arrived, reason->missing);
      }
      raise(comm_error_kind::aborted, ctx.signature, "the world was aborted: " + reason->what,
            std::move(arrived), std::move(missing));
    }
    if (const auto failure = world_->first_failure()) {
      raise(comm_error_kind::peer_failed, ctx.signature,
            describe_rank(failure->world_rank) + " failed: " + first_line(failure->what),
            std::move(arrived), std::move(missing));
    }
    for (const int q : missing) {
      if (gone(q)) {
        raise(comm_error_kind::peer_failed, ctx.signature,
              describe_rank(group_->world_ranks[static_cast<std::size_t>(q)]) +
                  (group_->slots[static_cast<std::size_t>(q)].left.load() == departure::destroyed
                       ? " destroyed its communicator"
                       : " returned from its function") +
                  " without joining this operation",
              std::move(arrived), std::move(missing));
      }
    }
    raise(comm_error_kind::aborted, ctx.signature, "the world is in trouble", std::move(arrived),
          std::move(missing));
  }

  static std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

  // ---- collectives -----------------------------------------------------------------------------

  // Rank r reduces slice r of every send buffer (in rank order, a block of 256 bytes at a time)
  // and writes the result into every rank's receive buffer; only rank r touches slice r of any
  // buffer, so in place is safe.
  void all_reduce(const threads_op& op, threads_context& ctx) {
    validate_buffers(op, ctx, op.send, op.recv);
    arrive_first(ctx, op.send, op.recv);
    const std::size_t es = size_of(op.type);
    const auto slice = slice_of(rank_, size_, op.count, es);
    const std::size_t lo = slice.first;  // (not a structured binding: lambdas capture it)
    const std::size_t hi = slice.second;
    if (lo < hi) {
      // Streaming stores to a line that was just read (in place) would cost more than they save.
      bool streaming = streams(op.count * es);
      for (int q = 0; q < size_ && streaming; ++q) {
        streaming = entry(q, op.sequence).send != entry(q, op.sequence).recv;
      }
      visit_dtype(op.type, [&](auto tag) {
        using T = decltype(tag);
        const auto [inputs, outputs] = pointer_arrays<T>();
        for (int q = 0; q < size_; ++q) {
          inputs[q] = static_cast<const T*>(entry(q, op.sequence).send) + lo;
          outputs[q] = static_cast<T*>(entry((rank_ + q) % size_, op.sequence).recv) + lo;
        }
        const auto n = static_cast<std::size_t>(size_);
        reduce_fanout(outputs, n, inputs, n, hi - lo, op.reduction, streaming);
      });
    }
    sync(ctx, false);
  }

  // Like all_reduce, with the root's receive buffer as the only output.
  void reduce(const threads_op& op, threads_context& ctx) {
    check_root(op, ctx);
    validate_buffers(op, ctx, op.send, rank_ == op.root ? op.recv : op.send);
    arrive_first(ctx, op.send, op.recv);
    const std::size_t es = size_of(op.type);
    const auto slice = slice_of(rank_, size_, op.count, es);
    const std::size_t lo = slice.first;  // (not a structured binding: lambdas capture it)
    const std::size_t hi = slice.second;
    if (lo < hi) {
      const collective_entry& root = entry(op.root, op.sequence);
      const bool streaming = streams(op.count * es) && root.send != root.recv;
      visit_dtype(op.type, [&](auto tag) {
        using T = decltype(tag);
        const auto [inputs, outputs] = pointer_arrays<T>();
        for (int q = 0; q < size_; ++q) {
          inputs[q] = static_cast<const T*>(entry(q, op.sequence).send) + lo;
        }
        outputs[0] = static_cast<T*>(entry(op.root, op.sequence).recv) + lo;
        reduce_fanout(outputs, 1, inputs, static_cast<std::size_t>(size_), hi - lo, op.reduction,
                      streaming);
      });
    }
    sync(ctx, false);
  }

  // Rank r reduces block r of every send buffer into its own receive buffer.
  void reduce_scatter(const threads_op& op, threads_context& ctx) {
    validate_buffers(op, ctx, op.send, op.recv);
    arrive_first(ctx, op.send, op.recv);
    if (op.count != 0) {
      const std::size_t bytes = op.count * size_of(op.type) * static_cast<std::size_t>(size_);
      const bool in_place =
          byte_ptr(op.recv) >= byte_ptr(op.send) && byte_ptr(op.recv) < byte_ptr(op.send, bytes);
      const bool streaming = streams(bytes) && !in_place;
      visit_dtype(op.type, [&](auto tag) {
        using T = decltype(tag);
        const auto [inputs, outputs] = pointer_arrays<T>();
        const std::size_t offset = static_cast<std::size_t>(rank_) * op.count;
        for (int q = 0; q < size_; ++q) {
          inputs[q] = static_cast<const T*>(entry(q, op.sequence).send) + offset;
        }
        outputs[0] = static_cast<T*>(op.recv);
        reduce_fanout(outputs, 1, inputs, static_cast<std::size_t>(size_), op.count, op.reduction,
                      streaming);
      });
    }
    sync(ctx, false);
  }

  // Each rank copies every peer's send buffer into its own receive buffer.
  void all_gather(const threads_op& op, threads_context& ctx) {
    validate_buffers(op, ctx, op.send, op.recv);
    arrive_first(ctx, op.send, op.recv);
    const std::size_t bytes = op.count * size_of(op.type);
    const bool streaming = streams(bytes * static_cast<std::size_t>(size_));
    for (int i = 0; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      copy_streaming(byte_ptr(op.recv, static_cast<std::size_t>(q) * bytes),
                     entry(q, op.sequence).send, bytes, streaming);
    }
    sync(ctx, false);
  }

  // Each rank copies the root's buffer into its own.
  void broadcast(const threads_op& op, threads_context& ctx) {
    check_root(op, ctx);
    validate_buffers(op, ctx, op.recv, op.recv);
    arrive_first(ctx, op.recv, op.recv);
    if (rank_ != op.root) {
      const std::size_t bytes = op.count * size_of(op.type);
      copy_streaming(op.recv, entry(op.root, op.sequence).send, bytes, streams(bytes));
    }
    sync(ctx, false);
  }

  // Each rank copies block r of every peer's send buffer into block q of its receive buffer. In
  // place, peers read this rank's send blocks while it writes, so it publishes a copy instead.
  void all_to_all(const threads_op& op, threads_context& ctx) {
    validate_buffers(op, ctx, op.send, op.recv);
    const std::size_t bytes = op.count * size_of(op.type);
    const void* send = op.send;
    if (send == op.recv && bytes != 0) {
      const std::size_t total = bytes * static_cast<std::size_t>(size_);
      if (scratch_.size() < total) {
        scratch_.resize(total);
      }
      std::memcpy(scratch_.data(), send, total);
      send = scratch_.data();
    }
    arrive_first(ctx, send, op.recv);
    const bool streaming = streams(bytes * static_cast<std::size_t>(size_));
    for (int i = 0; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      copy_streaming(byte_ptr(op.recv, static_cast<std::size_t>(q) * bytes),
                     byte_ptr(entry(q, op.sequence).send, static_cast<std::size_t>(rank_) * bytes),
                     bytes, streaming);
    }
    sync(ctx, false);
  }

  // Arrays of size_ input and size_ output pointers (storage reused by every call).
  template <class T>
  std::pair<const T**, T**> pointer_arrays() noexcept {
    std::byte* raw = pointers_.get();
    const auto n = static_cast<std::size_t>(size_);
    for (std::size_t q = 0; q < n; ++q) {
      ::new (raw + q * sizeof(void*)) const T*(nullptr);
      ::new (raw + (n + q) * sizeof(void*)) T*(nullptr);
    }
    return {std::launder(reinterpret_cast<const T**>(raw)),
            std::launder(reinterpret_cast<T**>(raw + n * sizeof(void*)))};
  }

  // Whether a collective whose buffers on one rank hold `bytes` uses streaming stores (all
  // ranks' send and receive buffers together exceed what caches hold).
  bool streams(std::size_t bytes) const noexcept {
    return 2 * bytes * static_cast<std::size_t>(size_) > streaming_footprint;
  }

  void check_root(const threads_op& op, const threads_context& ctx) {
    if (op.root < 0 || op.root >= size_) {
      raise(comm_error_kind::invalid_argument, ctx.signature,
            "root " + std::to_string(op.root) + " is not a rank of this communicator (size " +
                std::to_string(size_) + ")");
    }
  }

  void validate_buffers(const threads_op& op, const threads_context& ctx, const void* send,
                        const void* recv) {
    if (static_cast<unsigned>(op.type) > static_cast<unsigned>(dtype::uint8)) {
      raise(comm_error_kind::invalid_argument, ctx.signature,
            "invalid dtype value " + std::to_string(static_cast<unsigned>(op.type)));
    }
    if (reduces(op.kind) &&
        static_cast<unsigned>(op.reduction) > static_cast<unsigned>(reduce_op::prod)) {
      raise(comm_error_kind::invalid_argument, ctx.signature,
            "invalid reduce_op value " + std::to_string(static_cast<unsigned>(op.reduction)));
    }
    if (op.count != 0 && (send == nullptr || recv == nullptr)) {
      raise(comm_error_kind::invalid_argument, ctx.signature,
            "a null buffer for " + std::to_string(op.count) + " elements");
    }
  }

  // ---- messages --------------------------------------------------------------------------------

  void message(const threads_op& op, threads_context& ctx, threads_record* record) {
    const bool sending = op.kind == op_kind::send;
    if (op.peer < 0 || op.peer >= size_) {
      raise(comm_error_kind::invalid_argument, ctx.signature,
            "peer " + std::to_string(op.peer) + " is not a rank of this communicator (size " +
                std::to_string(size_) + ")");
    }
    validate_buffers(op, ctx, sending ? op.send : op.recv, sending ? op.send : op.recv);
    p2p_post local;
    p2p_post& post = record != nullptr ? record->post : local;
    post.send = op.send;
    post.recv = op.recv;
    post.count = ctx.signature.count;  // wrong_count faults included
    post.type = op.type;
    post.source = sending ? rank_ : op.peer;
    post.dest = sending ? op.peer : rank_;
    post.tag = op.tag;
    post.sending = sending;
    post.waiting = record == nullptr;
    post.partner = nullptr;
    post.next = nullptr;
    post.state.store(post_state::idle, std::memory_order_relaxed);
    if (record != nullptr) {
      record->state.store(record_state::posted, std::memory_order_seq_cst);
    }
    deliver(post, sending);
    if (record != nullptr) {
      return;
    }
    // Settled, or handed the copy (done here, outside the wait: ready() runs under the bell's
    // lock, and the copy rings it).
    const auto settled = [&post] {
      const post_state s = post.state.load(std::memory_order_seq_cst);
      return s == post_state::done || s == post_state::mismatch || s == post_state::withdrawn ||
             s == post_state::handoff;
    };
    wait_until(world_->bell, budget(), settled, [&] { check_post(post, ctx); });
    if (post.state.load(std::memory_order_seq_cst) == post_state::handoff) {
      transfer(*post.partner, post);
    }
    if (post.state.load(std::memory_order_seq_cst) == post_state::mismatch) {
      raise_message_mismatch(post, ctx.signature);
    }
  }

  // Posts a message side; when the other side is posted already, matches them: copies and
  // completes both, or, when the other side's owner is blocked waiting, leaves the copy to it.
  void deliver(p2p_post& post, bool sending) {
    mailbox& box = group_->mailboxes[static_cast<std::size_t>(post.dest)];
    p2p_post* other = nullptr;
    bool hand_off = false;
    {
      const std::lock_guard guard(box.lock);
      other = take_first(sending ? box.recvs : box.sends, post.source, post.dest, post.tag);
      if (other == nullptr) {
        post.state.store(post_state::posted, std::memory_order_seq_cst);
        append(sending ? box.sends : box.recvs, &post);
        return;
      }
      hand_off = other->waiting;
      post.state.store(post_state::matched, std::memory_order_seq_cst);
      if (hand_off) {
        other->partner = &post;
        other->state.store(post_state::handoff, std::memory_order_seq_cst);
      } else {
        other->state.store(post_state::matched, std::memory_order_seq_cst);
      }
    }
    if (hand_off) {
      world_->bell.ring();
      return;
    }
    transfer(*other, post);
  }

  // Copies between a matched pair (or records their mismatch) and completes both; `mine` is the
  // caller's, `theirs` may be freed by its owner as soon as its state changes, so it goes last.
  void transfer(p2p_post& theirs, p2p_post& mine) {
    p2p_post& s = mine.sending ? mine : theirs;
    p2p_post& r = mine.sending ? theirs : mine;
    post_state outcome = post_state::done;
    if (s.count != r.count || s.type != r.type) {
      s.other_count = r.count;
      s.other_type = r.type;
      r.other_count = s.count;
      r.other_type = s.type;
      outcome = post_state::mismatch;
    } else {
      const std::size_t bytes = s.count * size_of(s.type);
      copy_streaming(r.recv, s.send, bytes, 2 * bytes > streaming_footprint);
    }
    mine.state.store(outcome, std::memory_order_seq_cst);
    theirs.state.store(outcome, std::memory_order_seq_cst);
    world_->bell.ring();
  }

  // Takes an unmatched post back. Returns false when it was matched (then waits for the copy).
  bool withdraw(p2p_post& post) noexcept {
    mailbox& box = group_->mailboxes[static_cast<std::size_t>(post.dest)];
    {
      const std::lock_guard guard(box.lock);
      if (post.state.load(std::memory_order_seq_cst) == post_state::posted) {
        unlink(post.sending ? box.sends : box.recvs, &post);
        post.state.store(post_state::withdrawn, std::memory_order_seq_cst);
        return true;
      }
    }
    while (post.state.load(std::memory_order_seq_cst) == post_state::matched) {
      std::this_thread::yield();
    }
    return false;
  }

  // The slow checks of a message wait: trouble, a peer that returned, the deadline.
  void check_post(p2p_post& post, threads_context& ctx) {
    if (post.state.load(std::memory_order_seq_cst) != post_state::posted) {
      return;
    }
    if (!ctx.due) {
      ctx.due = deadline::after(config_.timeout);
    }
    const int peer = post.source == rank_ ? post.dest : post.source;
    const int peer_world = group_->world_ranks[static_cast<std::size_t>(peer)];
    const bool trouble = world_->trouble() != 0;
    const bool gone = this->gone(peer);
    const bool late = ctx.due->expired();
    if (!(trouble || gone || late) || !withdraw(post)) {
      return;
    }
    try {
      if (trouble) {
        raise_trouble(ctx, 0);
      }
      if (gone) {
        raise(comm_error_kind::peer_failed, ctx.signature,
              describe_rank(peer_world) + " is gone (returned or destroyed its communicator) " +
                  "without a matching " + (post.source == rank_ ? "recv" : "send") + " (tag " +
                  std::to_string(post.tag) + ")",
              {rank_}, {peer});
      }
      const std::string what =
          "rank " + std::to_string(rank_) + " waited " + seconds_text(config_.timeout) + " s in " +
          std::string(to_string(ctx.signature.op)) + " #" + std::to_string(ctx.signature.sequence) +
          " for rank " + std::to_string(peer) + " (tag " + std::to_string(post.tag) + ")";
      world_->abort({.what = what});
      raise(comm_error_kind::timeout, ctx.signature, what + "; the world is aborted", {rank_},
            {peer});
    } catch (...) {
      note_thrown();
      throw;
    }
  }

  [[noreturn]] void raise_message_mismatch(const p2p_post& post, const op_signature& sig) {
    const bool sending = post.source == rank_;
    const auto side = [](const char* what, std::size_t count, dtype type) {
      return std::string(what) + " of " + std::to_string(count) + " x " +
             std::string(strata::to_string(type));
    };
    raise(comm_error_kind::mismatch, sig,
          (sending ? side("send", post.count, post.type) + " to rank " + std::to_string(post.dest)
                   : side("recv", post.count, post.type) + " from rank " +
                         std::to_string(post.source)) +
              " (tag " + std::to_string(post.tag) + ") matched a " +
              side(sending ? "recv" : "send", post.other_count, post.other_type));
  }

  // ---- records and the progress thread ---------------------------------------------------------

  static bool record_complete(const threads_record& r) noexcept {
    const record_state s = r.state.load(std::memory_order_seq_cst);
    if (s == record_state::done || s == record_state::failed) {
      return true;
    }
    if (s != record_state::posted) {
      return false;
    }
    const post_state p = r.post.state.load(std::memory_order_seq_cst);
    return p == post_state::done || p == post_state::mismatch || p == post_state::withdrawn;
  }

  void finish_record(threads_record& r, std::exception_ptr& error) {
    const record_state s = r.state.load(std::memory_order_seq_cst);
    if (s == record_state::failed) {
      error = r.error;
      return;
    }
    if (s != record_state::posted) {
      return;
    }
    const post_state p = r.post.state.load(std::memory_order_seq_cst);
    if (p == post_state::done) {
      history_.finish(r.history_slot, op_status::completed);
      return;
    }
    history_.finish(r.history_slot, op_status::failed);
    if (p == post_state::withdrawn) {
      error = r.error;
      return;
    }
    try {
      raise_message_mismatch(r.post, signature_of(r.op));
    } catch (...) {
      note_thrown();
      error = std::current_exception();
    }
  }

  threads_record* acquire_record() {
    const std::lock_guard lock(queue_mutex_);
    if (free_ == nullptr) {
      for (auto& r : pool_) {
        if (r->abandoned && record_complete(*r)) {
          r->abandoned = false;
          r->next = free_;
          free_ = r.get();
        }
      }
    }
    if (free_ == nullptr) {
      pool_.push_back(std::make_unique<threads_record>());
      return pool_.back().get();
    }
    threads_record* r = free_;
    free_ = r->next;
    r->next = nullptr;
    return r;
  }

  // Runs queued collectives in issue order. Counted as a busy thread (see world_state::crowded)
  // only while it runs one; idle, it spins briefly and then sleeps until the next is queued.
  void progress_loop() {
    const wait_budget idle{.spin = std::chrono::microseconds(2),
                           .yield = std::chrono::microseconds(50),
                           .sleep_slice = std::chrono::milliseconds(50)};
    std::uint64_t taken = 0;
    for (;;) {
      const auto ready = [&] {
        return enqueued_.load(std::memory_order_seq_cst) > taken ||
               stop_.load(std::memory_order_seq_cst);
      };
      wait_until(queue_bell_, idle, ready, [] {});
      threads_record* r = nullptr;
      {
        const std::lock_guard lock(queue_mutex_);
        r = queue_head_;
        if (r != nullptr) {
          queue_head_ = r->next;
          if (queue_head_ == nullptr) {
            queue_tail_ = nullptr;
          }
        } else if (stop_.load(std::memory_order_seq_cst)) {
          break;
        }
      }
      if (r == nullptr) {
        continue;
      }
      ++taken;
      world_->add_busy_thread(1);
      r->state.store(record_state::running, std::memory_order_seq_cst);
      try {
        execute(r->op, r->history_slot, r);
        r->state.store(record_state::done, std::memory_order_seq_cst);
      } catch (...) {
        r->error = std::current_exception();
        r->state.store(record_state::failed, std::memory_order_seq_cst);
      }
      world_->add_busy_thread(-1);
      dispatched_.fetch_add(1, std::memory_order_seq_cst);
      world_->bell.ring();
    }
  }

  // A blocking collective waits until every earlier non-blocking one has run.
  void drain_queue() {
    if (issued_ == 0) {
      return;
    }
    const auto ready = [this] { return dispatched_.load(std::memory_order_seq_cst) == issued_; };
    wait_until(world_->bell, budget(), ready, [] {});
  }

  wait_budget budget() const noexcept { return budget_for(world_->crowded()); }

  static int peer_of(const threads_op& op) noexcept {
    return is_point_to_point(op.kind) ? op.peer : -1;
  }
  static int tag_of(const threads_op& op) noexcept {
    return is_point_to_point(op.kind) ? op.tag : -1;
  }

  // ---- errors ----------------------------------------------------------------------------------

  comm_error make_error(comm_error_kind kind, const op_signature& sig, const std::string& what,
                        std::vector<int> arrived = {}, std::vector<int> missing = {}) const {
    return comm_error(
        comm_error_info{.kind = kind,
                        .op = std::string(to_string(sig.op)),
                        .sequence = sig.sequence,
                        .rank = rank_,
                        .arrived = std::move(arrived),
                        .missing = std::move(missing)},
        what + "\nlast operations of rank " + std::to_string(rank_) + ":\n" + history_.to_string());
  }

  [[noreturn]] void raise(comm_error_kind kind, const op_signature& sig, const std::string& what,
                          std::vector<int> arrived = {}, std::vector<int> missing = {}) const {
    throw make_error(kind, sig, what, std::move(arrived), std::move(missing));
  }

  // A rank that throws from an operation marks itself failed, so that its peers stop waiting.
  void note_thrown() noexcept {
    try {
      throw;
    } catch (const threads_killed&) {
    } catch (const comm_error& e) {
      const bool echo =
          e.kind() == comm_error_kind::peer_failed || e.kind() == comm_error_kind::aborted;
      try {
        world_->mark_failed(world_rank_, echo, e.what());
      } catch (...) {
      }
    } catch (const std::exception& e) {
      try {
        world_->mark_failed(world_rank_, false, e.what());
      } catch (...) {
      }
    } catch (...) {
      try {
        world_->mark_failed(world_rank_, false, "an unknown exception");
      } catch (...) {
      }
    }
  }

  std::shared_ptr<group_state> group_;
  world_state* world_;
  int rank_;
  int size_;
  int world_rank_;
  comm_config config_;
  op_history history_;
  std::unique_ptr<std::byte[]> pointers_;
  std::vector<std::byte> scratch_;
  std::uint64_t collective_sequence_ = 0;
  std::uint64_t p2p_sequence_ = 0;
  std::uint64_t phase_ = 0;  // phases done on the group (by whichever thread runs collectives)

  // Non-blocking operations.
  std::mutex queue_mutex_;
  threads_record* queue_head_ = nullptr;
  threads_record* queue_tail_ = nullptr;
  threads_record* free_ = nullptr;
  std::vector<std::unique_ptr<threads_record>> pool_;
  std::uint64_t issued_ = 0;  // the caller's thread only
  std::atomic<std::uint64_t> enqueued_{0};
  std::atomic<std::uint64_t> dispatched_{0};
  std::atomic<bool> stop_{false};
  doorbell queue_bell_;
  std::thread progress_;
};

}  // namespace detail

// N ranks as threads of one process. A communicator is one rank's handle; use it from that
// rank's thread only.
class threads {
 public:
  using policy_category = comm_backend_tag;

  // What a rank stopped by a `kill` fault ends with (try_run reports it; run does not rethrow it).
  using killed = detail::threads_killed;

  // The handle of a non-blocking operation: test() / wait() report its outcome once, rethrowing
  // its error; a default-constructed or finished request is complete. Destroying a pending
  // request lets the operation finish on its own (its buffers must stay alive until then).
  class request {
   public:
    request() noexcept = default;
    request(request&& other) noexcept
        : core_(std::move(other.core_)), record_(std::exchange(other.record_, nullptr)) {}
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        release();
        core_ = std::move(other.core_);
        record_ = std::exchange(other.record_, nullptr);
      }
      return *this;
    }
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    ~request() { release(); }

    // True once the operation is complete; rethrows its error.
    bool test() { return finish(false); }

    // Blocks until the operation is complete; rethrows its error.
    void wait() { finish(true); }

   private:
    friend class threads;
    request(std::shared_ptr<detail::threads_core> core, detail::threads_record* record) noexcept
        : core_(std::move(core)), record_(record) {}

    bool finish(bool block) {
      if (record_ == nullptr) {
        return true;
      }
      std::exception_ptr error;
      if (!core_->poll(*record_, error, block)) {
        return false;
      }
      release();
      if (error) {
        std::rethrow_exception(error);
      }
      return true;
    }

    void release() noexcept {
      if (record_ != nullptr) {
        core_->release(record_);
        record_ = nullptr;
      }
      core_.reset();
    }

    std::shared_ptr<detail::threads_core> core_{};
    detail::threads_record* record_ = nullptr;
  };
  using request_type = request;

  // Runs fn(comm) on n ranks, one thread each, and joins them all. When a rank failed, rethrows
  // the root cause: the first rank's error that is not an echo of another's (peer_failed,
  // aborted). Each rank's thread runs inside a host_account of its own ("host:rank<r>", inside
  // the caller's account if it has one), so host{}.memory() on a rank counts (and budgets) that
  // rank's allocations, like a GPU's tracker; the process tracker still counts them all.
  template <class F>
  static void run(int n, F&& fn, comm_config config = {}) {
    std::shared_ptr<detail::world_state> world;
    const auto outcomes = launch(n, fn, config, world);
    std::vector<int> order;
    for (const auto& f : world->failures()) {
      if (!f.echo) {
        order.push_back(f.world_rank);
      }
    }
    for (const auto& f : world->failures()) {
      if (f.echo) {
        order.push_back(f.world_rank);
      }
    }
    for (int r = 0; r < n; ++r) {
      order.push_back(r);
    }
    for (const int r : order) {
      const auto& e = outcomes[static_cast<std::size_t>(r)];
      if (e && !is_killed(e)) {
        std::rethrow_exception(e);
      }
    }
  }

  // Runs fn(comm) on n ranks like run, and returns every rank's outcome (null: it returned).
  template <class F>
  static std::vector<std::exception_ptr> try_run(int n, F&& fn, comm_config config = {}) {
    std::shared_ptr<detail::world_state> world;
    return launch(n, fn, config, world);
  }

  threads(threads&& other) noexcept = default;
  threads& operator=(threads&& other) noexcept {
    if (this != &other) {
      close();
      core_ = std::move(other.core_);
    }
    return *this;
  }
  threads(const threads&) = delete;
  threads& operator=(const threads&) = delete;
  // Runs what is still queued (each operation within its deadline), withdraws unmatched
  // messages, and stops the progress thread.
  ~threads() { close(); }

  int rank() const noexcept { return core_->rank(); }
  int size() const noexcept { return core_->size(); }
  const comm_config& config() const noexcept { return core_->config(); }
  // Every rank is a thread of this process, so all of them share its CPUs
  // (comm::ranks_sharing_cpus).
  int ranks_sharing_cpus() const noexcept { return world_size(); }
  // ... and its memory (comm::ranks_sharing_memory).
  int ranks_sharing_memory() const noexcept { return world_size(); }
  // The ranks of this communicator's threads::run (size() of a split is its group's).
  int world_size() const noexcept { return core_->group()->world->size(); }
  // This rank's index among all the ranks of its threads::run.
  int world_rank() const noexcept { return core_->world_rank(); }
  // The last operations of this rank on this communicator, oldest first.
  std::string history() const { return core_->history().to_string(); }

  // ---- blocking collectives -------------------------------------------------------------------

  void all_reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op) {
    blocking({.kind = op_kind::all_reduce,
              .send = send,
              .recv = recv,
              .count = count,
              .type = type,
              .reduction = op});
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, dtype type,
                      reduce_op op) {
    blocking({.kind = op_kind::reduce_scatter,
              .send = send,
              .recv = recv,
              .count = recv_count,
              .type = type,
              .reduction = op});
  }
  void all_gather(const void* send, void* recv, std::size_t send_count, dtype type) {
    blocking({.kind = op_kind::all_gather,
              .send = send,
              .recv = recv,
              .count = send_count,
              .type = type});
  }
  void broadcast(void* buffer, std::size_t count, dtype type, int root) {
    blocking({.kind = op_kind::broadcast,
              .send = buffer,
              .recv = buffer,
              .count = count,
              .type = type,
              .root = root});
  }
  void reduce(const void* send, void* recv, std::size_t count, dtype type, reduce_op op, int root) {
    blocking({.kind = op_kind::reduce,
              .send = send,
              .recv = recv,
              .count = count,
              .type = type,
              .reduction = op,
              .root = root});
  }
  void all_to_all(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    blocking({.kind = op_kind::all_to_all,
              .send = send,
              .recv = recv,
              .count = count_per_rank,
              .type = type});
  }
  void barrier() { blocking({.kind = op_kind::barrier}); }

  // ---- non-blocking collectives ---------------------------------------------------------------

  request all_reduce_async(const void* send, void* recv, std::size_t count, dtype type,
                           reduce_op op) {
    return async({.kind = op_kind::all_reduce,
                  .send = send,
                  .recv = recv,
                  .count = count,
                  .type = type,
                  .reduction = op});
  }
  request reduce_scatter_async(const void* send, void* recv, std::size_t recv_count, dtype type,
                               reduce_op op) {
    return async({.kind = op_kind::reduce_scatter,
                  .send = send,
                  .recv = recv,
                  .count = recv_count,
                  .type = type,
                  .reduction = op});
  }
  request all_gather_async(const void* send, void* recv, std::size_t send_count, dtype type) {
    return async({.kind = op_kind::all_gather,
                  .send = send,
                  .recv = recv,
                  .count = send_count,
                  .type = type});
  }
  request broadcast_async(void* buffer, std::size_t count, dtype type, int root) {
    return async({.kind = op_kind::broadcast,
                  .send = buffer,
                  .recv = buffer,
                  .count = count,
                  .type = type,
                  .root = root});
  }
  request reduce_async(const void* send, void* recv, std::size_t count, dtype type, reduce_op op,
                       int root) {
    return async({.kind = op_kind::reduce,
                  .send = send,
                  .recv = recv,
                  .count = count,
                  .type = type,
                  .reduction = op,
                  .root = root});
  }
  request all_to_all_async(const void* send, void* recv, std::size_t count_per_rank, dtype type) {
    return async({.kind = op_kind::all_to_all,
                  .send = send,
                  .recv = recv,
                  .count = count_per_rank,
                  .type = type});
  }
  request barrier_async() { return async({.kind = op_kind::barrier}); }

  // ---- messages -------------------------------------------------------------------------------

  // Returns when `peer` has received the data (a synchronous send).
  void send(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    blocking({.kind = op_kind::send,
              .send = buffer,
              .count = count,
              .type = type,
              .peer = peer,
              .tag = tag});
  }
  void recv(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    blocking({.kind = op_kind::recv,
              .recv = buffer,
              .count = count,
              .type = type,
              .peer = peer,
              .tag = tag});
  }
  request send_async(const void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return async({.kind = op_kind::send,
                  .send = buffer,
                  .count = count,
                  .type = type,
                  .peer = peer,
                  .tag = tag});
  }
  request recv_async(void* buffer, std::size_t count, dtype type, int peer, int tag) {
    return async({.kind = op_kind::recv,
                  .recv = buffer,
                  .count = count,
                  .type = type,
                  .peer = peer,
                  .tag = tag});
  }

  // ---- split ----------------------------------------------------------------------------------

  // Collective: a communicator over the ranks that passed the same color, ordered by
  // (key, rank), with its own shared state and sequence numbers.
  threads split(int color, int key) {
    int new_rank = 0;
    auto group = core_->split(color, key, core_->next_sequence(op_kind::split), new_rank);
    return threads(std::make_shared<detail::threads_core>(std::move(group), new_rank, config()));
  }

 private:
  explicit threads(std::shared_ptr<detail::threads_core> core) noexcept : core_(std::move(core)) {}

  void blocking(detail::threads_op op) {
    op.sequence = core_->next_sequence(op.kind);
    core_->run_blocking(op);
  }

  request async(detail::threads_op op) {
    op.sequence = core_->next_sequence(op.kind);
    return request(core_, core_->issue(op));
  }

  void close(detail::departure why = detail::departure::destroyed) noexcept {
    if (core_) {
      core_->close(why);
      core_.reset();
    }
  }

  static bool is_killed(const std::exception_ptr& e) noexcept {
    try {
      std::rethrow_exception(e);
    } catch (const killed&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  template <class F>
  static std::vector<std::exception_ptr> launch(int n, F& fn, const comm_config& config,
                                                std::shared_ptr<detail::world_state>& world) {
    static_assert(std::invocable<F&, threads&>,
                  "threads::run: fn must be callable as fn(strata::comm::threads&)");
    if (n < 1) {
      throw error("threads::run: the number of ranks must be at least 1 (got " + std::to_string(n) +
                  ")");
    }
    world = std::make_shared<detail::world_state>(n);
    std::vector<int> ranks(static_cast<std::size_t>(n));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto group = std::make_shared<detail::group_state>(world, std::move(ranks));
    std::vector<std::exception_ptr> outcomes(static_cast<std::size_t>(n));
    const host caller;  // the ranks' accounts sit inside the caller's (if it has one)
    const auto body = [&](int r) {
      std::optional<host_account> memory;
      std::optional<threads> comm;
      std::exception_ptr outcome;
      try {
        memory.emplace("host:rank" + std::to_string(r), caller);
        comm.emplace(threads(std::make_shared<detail::threads_core>(group, r, config)));
        fn(*comm);
      } catch (const killed&) {
        outcome = std::current_exception();
      } catch (const comm_error& e) {
        outcome = std::current_exception();
        const bool echo =
            e.kind() == comm_error_kind::peer_failed || e.kind() == comm_error_kind::aborted;
        world->mark_failed(r, echo, e.what());
      } catch (const std::exception& e) {
        outcome = std::current_exception();
        world->mark_failed(r, false, e.what());
      } catch (...) {
        outcome = std::current_exception();
        world->mark_failed(r, false, "an unknown exception");
      }
      if (comm) {
        comm->close(detail::departure::returned);
      }
      comm.reset();
      memory.reset();
      world->mark(r, detail::rank_state::exited);
      world->add_busy_thread(-1);
      outcomes[static_cast<std::size_t>(r)] = outcome;
    };
    std::vector<std::thread> pool;
    pool.reserve(static_cast<std::size_t>(n));
    try {
      for (int r = 0; r < n; ++r) {
        pool.emplace_back(body, r);
      }
    } catch (...) {
      world->abort({.what = "threads::run could not start every rank's thread"});
      for (auto& t : pool) {
        t.join();
      }
      throw;
    }
    for (auto& t : pool) {
      t.join();
    }
    return outcomes;
  }

  std::shared_ptr<detail::threads_core> core_;
};

}  // namespace strata::comm
