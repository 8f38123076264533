// SPDX-License-Identifier: Apache-2.0
#pragma once

// Shared state of the threads comm backend (not API): the world every communicator of one
// threads::run belongs to, the group state of one communicator, the mailboxes of point-to-point
// messages, and the wait loop (spin with a pause instruction, then yield, then sleep on a
// doorbell) that every blocking wait of the backend goes through.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/comm/fingerprint.hpp"
#include "strata/core/dtype.hpp"

namespace strata::comm::detail {

inline constexpr std::size_t threads_cache_line = 64;

// Tells the core that this is a spin loop (lower power, no memory-order speculation penalty).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Where waiting threads sleep. A thread that changes something another may wait for rings the
// bell; the ring costs one load while nobody sleeps. Sleepers register before their last check
// and every access is sequentially consistent, so a ring is never lost; a sleep is also bounded
// by the caller, so that deadlines are checked.
class doorbell {
 public:
  void ring() {
    if (sleepers_.load(std::memory_order_seq_cst) != 0) {
      { const std::lock_guard lock(mutex_); }
      cv_.notify_all();
    }
  }

  template <class Ready>
  void sleep(Ready&& ready, std::chrono::nanoseconds at_most) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock lock(mutex_);
      if (!ready()) {
        cv_.wait_for(lock, at_most);
      }
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }

 private:
  std::atomic<int> sleepers_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
};

// How long a waiter spins and yields before it sleeps. With more busy threads than cores,
// spinning only steals time from the thread being waited for, so a crowded wait spins briefly.
struct wait_budget {
  std::chrono::nanoseconds spin{std::chrono::microseconds(30)};
  std::chrono::nanoseconds yield{std::chrono::microseconds(200)};
  std::chrono::nanoseconds sleep_slice{std::chrono::milliseconds(20)};
};

inline wait_budget budget_for(bool crowded) noexcept {
  if (crowded) {
    return {.spin = std::chrono::microseconds(1),
            .yield = std::chrono::microseconds(20),
            .sleep_slice = std::chrono::milliseconds(20)};
  }
  return {};
}

// Returns once ready() holds. Spins, then yields, then sleeps on `bell`; calls check() (which
// may throw, or make ready() true) before each yield and sleep.
template <class Ready, class Check>
void wait_until(doorbell& bell, const wait_budget& budget, Ready&& ready, Check&& check) {
  if (ready()) {
    return;
  }
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (unsigned i = 1;; ++i) {
    cpu_relax();
    if (ready()) {
      return;
    }
    if (i % 32 == 0 && clock::now() - start >= budget.spin) {
      break;
    }
  }
  for (;;) {
    check();
    if (ready()) {
      return;
    }
    if (clock::now() - start < budget.spin + budget.yield) {
      std::this_thread::yield();
    } else {
      bell.sleep(ready, budget.sleep_slice);
    }
  }
}

// A lock for critical sections of a few instructions (a mailbox's lists), which two ranks may
// enter at once: a sleeping mutex would make the loser wait for a wake-up, tens of
// microseconds, for a section that takes tens of nanoseconds.
class spin_lock {
 public:
  void lock() noexcept {
    for (unsigned i = 0; locked_.exchange(true, std::memory_order_acquire); ++i) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++i < 128) {
          cpu_relax();
        } else {
          std::this_thread::yield();  // the holder may have been preempted
        }
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// ---- the world: every communicator of one threads::run ----------------------------------------

enum class rank_state : std::uint8_t {
  running,
  exited,  // returned from its function; it will not join any further operation
  killed,  // stopped by fault injection, silently
  failed,  // threw (from its function or from an operation)
};

struct rank_failure {
  int world_rank = -1;
  bool echo = false;  // a consequence of another failure (peer_failed, aborted)
  std::string what{};
};

struct world_abort {
  std::uint64_t group = 0;  // the group and phase whose wait timed out (0: not a timeout)
  std::uint64_t phase = 0;
  std::string what{};
  std::vector<int> arrived{};  // of that phase, as the rank that timed out saw them
  std::vector<int> missing{};
};

class world_state {
 public:
  static constexpr int failed_bit = 1;
  static constexpr int aborted_bit = 2;

  explicit world_state(int size)
      : size_(size),
        states_(std::make_unique<std::atomic<rank_state>[]>(static_cast<std::size_t>(size))) {
    for (int r = 0; r < size; ++r) {
      states_[static_cast<std::size_t>(r)].store(rank_state::running, std::memory_order_relaxed);
    }
    busy_threads_.store(size, std::memory_order_relaxed);
  }

  int size() const noexcept { return size_; }

  // Non-zero once a rank failed or the world was aborted; never goes back to zero.
  int trouble() const noexcept { return trouble_.load(std::memory_order_seq_cst); }

  rank_state state(int world_rank) const noexcept {
    return states_[static_cast<std::size_t>(world_rank)].load(std::memory_order_seq_cst);
  }

  // Records that `world_rank` failed (once; later calls keep the first record).
  void mark_failed(int world_rank, bool echo, std::string what) {
    {
      const std::lock_guard lock(mutex_);
      auto& s = states_[static_cast<std::size_t>(world_rank)];
      if (s.load(std::memory_order_relaxed) == rank_state::failed) {
        return;
      }
      s.store(rank_state::failed, std::memory_order_seq_cst);
      failures_.push_back({.world_rank = world_rank, .echo = echo, .what = std::move(what)});
      trouble_.fetch_or(failed_bit, std::memory_order_seq_cst);
    }
    bell.ring();
  }

  void mark(int world_rank, rank_state state) {
    {
      const std::lock_guard lock(mutex_);
      auto& s = states_[static_cast<std::size_t>(world_rank)];
      if (s.load(std::memory_order_relaxed) == rank_state::running) {
        s.store(state, std::memory_order_seq_cst);
      }
    }
    bell.ring();
  }

  // Aborts the world (once; the first reason is kept).
  void abort(world_abort reason) {
    {
      const std::lock_guard lock(mutex_);
      if ((trouble_.load(std::memory_order_relaxed) & aborted_bit) != 0) {
        return;
      }
      abort_ = std::move(reason);
      trouble_.fetch_or(aborted_bit, std::memory_order_seq_cst);
    }
    bell.ring();
  }

  std::optional<world_abort> abort_reason() const {
    const std::lock_guard lock(mutex_);
    return abort_;
  }

  // The first failure that is not an echo of another, else the first failure.
  std::optional<rank_failure> first_failure() const {
    const std::lock_guard lock(mutex_);
    for (const auto& f : failures_) {
      if (!f.echo) {
        return f;
      }
    }
    if (!failures_.empty()) {
      return failures_.front();
    }
    return std::nullopt;
  }

  std::vector<rank_failure> failures() const {
    const std::lock_guard lock(mutex_);
    return failures_;
  }

  bool all_others_gone(int world_rank) const noexcept {
    for (int r = 0; r < size_; ++r) {
      if (r != world_rank && state(r) == rank_state::running) {
        return false;
      }
    }
    return true;
  }

  std::uint64_t next_group_id() noexcept {
    return next_group_id_.fetch_add(1, std::memory_order_relaxed);
  }

  void add_busy_thread(int delta) noexcept {
    busy_threads_.fetch_add(delta, std::memory_order_relaxed);
  }

  // True when the world has more threads that may spin than the machine has cores.
  bool crowded() const noexcept {
    return busy_threads_.load(std::memory_order_relaxed) > static_cast<int>(hardware_threads_);
  }

  doorbell bell;

 private:
  int size_;
  std::unique_ptr<std::atomic<rank_state>[]> states_;
  std::atomic<int> trouble_{0};
  std::atomic<int> busy_threads_{0};
  std::atomic<std::uint64_t> next_group_id_{1};
  unsigned hardware_threads_ = std::max(1u, std::thread::hardware_concurrency());
  mutable std::mutex mutex_;
  std::vector<rank_failure> failures_;
  std::optional<world_abort> abort_;
};

// ---- point to point ----------------------------------------------------------------------------

enum class post_state : std::uint8_t {
  idle,
  posted,     // in a mailbox, unmatched
  matched,    // taken by the other side, being copied
  handoff,    // matched by the other side, which left the copy to this post's waiting owner
  done,       // copied
  mismatch,   // matched with a message of another size or dtype; nothing copied
  withdrawn,  // taken back by its owner (timeout, failure, communicator destroyed)
};

// One side of a message: a send (reads `send`) or a receive (writes `recv`).
struct p2p_post {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  dtype type = dtype::uint8;
  int source = -1;  // group ranks
  int dest = -1;
  int tag = 0;
  bool sending = false;
  // Its owner is blocked waiting for it (a blocking send or recv), so it may be handed the copy.
  bool waiting = false;
  p2p_post* partner = nullptr;  // the other side, when the state is handoff
  std::atomic<post_state> state{post_state::idle};
  // What the other side had, when the state is mismatch.
  std::size_t other_count = 0;
  dtype other_type = dtype::uint8;
  p2p_post* next = nullptr;
};

// Unmatched sends addressed to one rank and unmatched receives posted by it, oldest first.
struct mailbox {
  spin_lock lock;
  p2p_post* sends = nullptr;
  p2p_post* recvs = nullptr;
};

inline void append(p2p_post*& head, p2p_post* post) noexcept {
  post->next = nullptr;
  p2p_post** at = &head;
  while (*at != nullptr) {
    at = &(*at)->next;
  }
  *at = post;
}

// Unlinks and returns the first post of `head` from `source` with `tag`, or nullptr.
inline p2p_post* take_first(p2p_post*& head, int source, int dest, int tag) noexcept {
  for (p2p_post** at = &head; *at != nullptr; at = &(*at)->next) {
    p2p_post* p = *at;
    if (p->source == source && p->dest == dest && p->tag == tag) {
      *at = p->next;
      p->next = nullptr;
      return p;
    }
  }
  return nullptr;
}

inline bool unlink(p2p_post*& head, p2p_post* post) noexcept {
  for (p2p_post** at = &head; *at != nullptr; at = &(*at)->next) {
    if (*at == post) {
      *at = post->next;
      post->next = nullptr;
      return true;
    }
  }
  return false;
}

// ---- a group: the ranks of one communicator ----------------------------------------------------

class group_state;

// What a rank publishes for one collective. Two per rank, used by alternate collectives, so that
// a rank may publish its next call while a slower peer still reads the previous one.
struct collective_entry {
  const void* send = nullptr;
  void* recv = nullptr;
  op_signature signature{};
  int color = 0;  // split
  int key = 0;
  std::shared_ptr<group_state> split_result{};  // split: published by each new group's first rank
};

// Why a rank left a group for good (a killed rank leaves silently: its peers time out).
enum class departure : std::uint8_t { none, destroyed, returned };

struct alignas(threads_cache_line) rank_slot {
  std::atomic<std::uint64_t> arrived_phase{0};  // the last phase this rank arrived at
  std::atomic<departure> left{departure::none};
  collective_entry entries[2];
};

class group_state {
 public:
  group_state(std::shared_ptr<world_state> world, std::vector<int> world_ranks)
      : world(std::move(world)),
        id(this->world->next_group_id()),
        world_ranks(std::move(world_ranks)),
        slots(std::make_unique<rank_slot[]>(this->world_ranks.size())),
        mailboxes(std::make_unique<mailbox[]>(this->world_ranks.size())) {}

  int size() const noexcept { return static_cast<int>(world_ranks.size()); }

  std::shared_ptr<world_state> world;
  std::uint64_t id;
  std::vector<int> world_ranks;  // member i's rank in the world
  // Arrivals at phases of collectives: phase p is complete when it reaches p * size().
  alignas(2 * threads_cache_line) std::atomic<std::uint64_t> arrivals{0};
  alignas(2 * threads_cache_line) std::unique_ptr<rank_slot[]> slots;
  std::unique_ptr<mailbox[]> mailboxes;
};

}  // namespace strata::comm::detail
