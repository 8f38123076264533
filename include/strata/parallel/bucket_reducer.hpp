// SPDX-License-Identifier: Apache-2.0
#pragma once

// Gradient buckets and the reducer that moves them while backward runs.
//
// make_buckets cuts the flat gradient buffer into buckets in the order backward produces them;
// bucket_reducer starts each bucket as soon as backward reports its floats final, through one of
// three strategies, each a type of its own:
//   - flat_reduce: one average all-reduce per bucket (in the wire type of compress::cast), or
//     with a shard size one reduce per shard the bucket overlaps, to the shard's owner (zero1);
//   - staged_reduce: the hierarchical stages (reduce within the group, all-reduce across the
//     groups, broadcast within the group), bucket after bucket (parallel::hierarchical);
//   - push_to_servers: each bucket's pieces pushed to the parameter servers whose shards they
//     overlap (parallel::parameter_server, co-located servers).
// The reducer keeps what they share: the readiness of the buckets from backward's reports, the
// rounding through the storage type, the wire copy of compress::cast, the launch order and the
// time spent in blocking calls. Each constructor makes its strategy.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "strata/comm/algorithms.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/round.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/ps/exchange.hpp"

namespace strata::parallel {

// A contiguous range of the flat gradient buffer: parameter groups [first_group, last_group], or
// one part of a group too large for one bucket.
struct grad_bucket {
  std::size_t offset = 0;  // floats
  std::size_t size = 0;    // floats
  std::size_t first_group = 0;
  std::size_t last_group = 0;
  // A part of a split group (first_group == last_group) other than its last: the bucket is ready
  // once the first `ready_at` floats of the group are (floats from the group's offset). The
  // default: once every group in it is complete.
  std::size_t ready_at = SIZE_MAX;

  friend bool operator==(const grad_bucket&, const grad_bucket&) = default;
};

// The buckets of a param_store in backward order (from the last group down), each at most
// `bucket_bytes`. Consecutive groups share a bucket while they fit; a group larger than that is
// cut into parts of exactly bucket_bytes from its start, the last part holding the rest (so a
// layer that reports its gradients in parts from the start, as linear does, lets each part go
// while it computes the next), parts in increasing order. A bucket's first_group is its lowest
// group with parameters, so groups without any never hold a bucket back. Buckets cover every
// float of the store exactly once (the padding after a group goes with it).
inline std::vector<grad_bucket> make_buckets(const model::param_store& params,
                                             std::size_t bucket_bytes) {
  std::vector<grad_bucket> buckets;
  const auto& groups = params.groups();
  const std::size_t limit = std::max<std::size_t>(bucket_bytes / sizeof(float), 1);
  std::size_t end = params.size();  // the open bucket is [begin of its lowest group, end)
  std::size_t open_first = 0;
  std::size_t open_last = 0;
  bool open = false;
  std::size_t next_begin = params.size();  // where the group above the current one begins
  std::size_t lowest = groups.size();      // the lowest group with parameters
  for (std::size_t g = groups.size(); g-- > 0;) {
    lowest = groups[g].elements != 0 ? g : lowest;
  }
  const auto close = [&] {
    if (open) {
      buckets.push_back({.offset = next_begin,
                         .size = end - next_begin,
                         .first_group = open_first,
                         .last_group = open_last});
      end = next_begin;
      open = false;
    }
  };
  for (std::size_t g = groups.size(); g-- > 0;) {
    if (groups[g].elements == 0) {
      continue;
    }
    // The lowest group also takes whatever lies below it (nothing in a param_store).
    const std::size_t begin = g == lowest ? 0 : groups[g].offset;
    if (open && end - begin > limit) {
      close();
    }
    if (end - begin > limit) {
      // Alone and still too large: parts of `limit` floats from its start, the rest last.
      for (std::size_t at = begin; at < end; at += limit) {
        const bool last = end - at <= limit;
        const std::size_t part_end = at + limit;
        buckets.push_back(
            {.offset = at,
             .size = last ? end - at : limit,
             .first_group = g,
             .last_group = g,
             .ready_at = last ? SIZE_MAX : part_end - std::min(part_end, groups[g].offset)});
      }
      end = begin;
      next_begin = begin;
      continue;
    }
    if (!open) {
      open_last = g;
      open = true;
    }
    open_first = g;
    next_begin = begin;
  }
  close();
  return buckets;
}

// The time of a step's blocking reductions, which count as communication.
class blocking_time {
 public:
  template <class Call>
  void run(Call&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  double seconds() const noexcept { return seconds_; }
  void reset() noexcept { seconds_ = 0.0; }

 private:
  double seconds_ = 0.0;
};

// How a bucket_reducer moves its buckets: one strategy per synchronisation.
class bucket_strategy {
 public:
  virtual ~bucket_strategy() = default;
  // Before a step's buckets: the gradients they cut.
  virtual void begin(std::span<float> grads, const std::vector<grad_bucket>& buckets) = 0;
  // Bucket b, whole and rounded through the storage type: `count` values of `type` at `data`
  // (the gradients themselves, or the bucket's copy in the wire type).
  virtual void launch(std::size_t b, const grad_bucket& bucket, void* data, std::size_t count,
                      dtype type) = 0;
  // The reductions completed so far, as bucket_reducer::poll() says.
  virtual std::size_t poll() = 0;
  // The reductions started so far this step.
  virtual std::size_t reductions() const noexcept = 0;
  // After every bucket started: wait for all.
  virtual void finish() = 0;
};

// One average all-reduce per bucket, or with `shard` floats per rank one average reduce per
// shard the bucket overlaps, to the shard's owner; blocking or non-blocking.
class flat_reduce final : public bucket_strategy {
 public:
  flat_reduce(comm::any_comm comm, std::size_t shard, bool blocking, blocking_time& time)
      : comm_(comm), shard_(shard), blocking_(blocking), time_(time) {}

  void begin(std::span<float> grads, const std::vector<grad_bucket>&) override {
    grads_ = grads;
    requests_.clear();
    polled_ = 0;
  }

  void launch(std::size_t, const grad_bucket& bucket, void* data, std::size_t count,
              dtype type) override {
    if (shard_ == 0) {
      if (blocking_) {
        time_.run([&] { comm_.all_reduce(data, data, count, type, comm::reduce_op::avg); });
      } else {
        requests_.push_back(comm_.all_reduce_async(data, data, count, type, comm::reduce_op::avg));
      }
      return;
    }
    // One reduce per shard the bucket overlaps, to the shard's owner.
    std::size_t at = bucket.offset;
    const std::size_t end = bucket.offset + bucket.size;
    while (at < end) {
      const std::size_t owner = at / shard_;
      const std::size_t piece = std::min(end, (owner + 1) * shard_) - at;
      float* from = grads_.data() + at;
      const auto root = static_cast<int>(owner);
      if (blocking_) {
        time_.run(
            [&] { comm_.reduce(from, from, piece, dtype::float32, comm::reduce_op::avg, root); });
      } else {
        requests_.push_back(
            comm_.reduce_async(from, from, piece, dtype::float32, comm::reduce_op::avg, root));
      }
      at += piece;
    }
  }

  std::size_t poll() override {
    while (polled_ < requests_.size() && requests_[polled_].test()) {
      ++polled_;
    }
    return polled_;
  }
  std::size_t reductions() const noexcept override { return requests_.size(); }

  void finish() override {
    for (auto& r : requests_) {
      r.wait();
    }
    requests_.clear();
    polled_ = 0;
  }

 private:
  comm::any_comm comm_;
  std::size_t shard_;
  bool blocking_;
  blocking_time& time_;
  std::span<float> grads_{};
  std::size_t polled_ = 0;  // requests_[0, polled_) are complete
  std::vector<comm::any_comm::request> requests_{};
};

// The hierarchical stages per bucket: each bucket is cut into g = local.size() parts and
// averaged in three stages: A, part j reduced (average) to local rank j; B, this rank's part
// averaged across the groups (`cross`); C, part j broadcast from local rank j. A bucket's next
// stage starts once its current one is complete and every earlier bucket has started it, so each
// communicator (A and C run on two of their own) sees the same operations in the same order on
// every rank. Stages move on from poll() and finish(). Blocking: the three stages run inside the
// launch. Collective over `local` (one split).
class staged_reduce final : public bucket_strategy {
 public:
  staged_reduce(comm::any_comm local, comm::any_comm cross, bool blocking, blocking_time& time)
      : local_(local),
        cross_(cross),
        share_(local_.split(0, local_.rank())),
        blocking_(blocking),
        time_(time) {}

  void begin(std::span<float>, const std::vector<grad_bucket>&) override { staged_.clear(); }

  void launch(std::size_t, const grad_bucket&, void* data, std::size_t count, dtype type) override {
    staged_bucket& e = staged_.emplace_back(
        staged_bucket{.data = static_cast<std::byte*>(data), .count = count, .type = type});
    if (blocking_) {
      for (int s = 0; s <= stage_done; ++s) {
        start_stage(e, s);
      }
      return;
    }
    advance();
  }

  // Moves each bucket's stages on as far as they can go; the buckets done.
  std::size_t poll() override {
    advance();
    std::size_t done = 0;
    while (done < staged_.size() && staged_[done].stage == stage_done) {
      ++done;
    }
    return done;
  }
  std::size_t reductions() const noexcept override { return staged_.size(); }

  // Waits for the oldest bucket's stage in flight, then moves every bucket on.
  void finish() override {
    for (std::size_t first = 0; first < staged_.size();) {
      advance();
      while (first < staged_.size() && staged_[first].stage == stage_done) {
        ++first;
      }
      if (first < staged_.size()) {
        for (auto& r : staged_[first].pending) {
          r.wait();
        }
      }
    }
  }

 private:
  static constexpr int stage_done = 3;

  struct staged_bucket {
    std::byte* data = nullptr;  // the bucket's values in the wire type
    std::size_t count = 0;
    dtype type = dtype::float32;
    int stage = -1;  // -1: not started; 0, 1, 2: A, B, C in flight; stage_done
    std::vector<comm::any_comm::request> pending{};
  };

  // Part j of a bucket of `count` elements over the g local ranks: [offset, offset + length).
  std::pair<std::size_t, std::size_t> part(std::size_t count, int j) const noexcept {
    const comm::even_partition parts{.count = count, .parts = local_.size()};
    return {parts.offset(j), parts.length(j)};
  }

  // Starts stage `s` of bucket `e` (blocking: runs it).
  void start_stage(staged_bucket& e, int s) {
    e.stage = s;
    e.pending.clear();
    if (s == stage_done) {
      return;
    }
    const std::size_t width = size_of(e.type);
    const auto at = [&](std::size_t offset) { return e.data + offset * width; };
    if (s == 1) {
      const auto [offset, length] = part(e.count, local_.rank());
      if (blocking_) {
        time_.run([&] {
          cross_.all_reduce(at(offset), at(offset), length, e.type, comm::reduce_op::avg);
        });
      } else {
        e.pending.push_back(
            cross_.all_reduce_async(at(offset), at(offset), length, e.type, comm::reduce_op::avg));
      }
      return;
    }
    for (int j = 0; j < local_.size(); ++j) {
      const auto [offset, length] = part(e.count, j);
      if (s == 0) {
        if (blocking_) {
          time_.run([&] {
            local_.reduce(at(offset), at(offset), length, e.type, comm::reduce_op::avg, j);
          });
        } else {
          e.pending.push_back(
              local_.reduce_async(at(offset), at(offset), length, e.type, comm::reduce_op::avg, j));
        }
      } else if (blocking_) {
        time_.run([&] { share_.broadcast(at(offset), length, e.type, j); });
      } else {
        e.pending.push_back(share_.broadcast_async(at(offset), length, e.type, j));
      }
    }
  }

  // Moves every bucket whose stage in flight is complete to its next stage, in bucket order: a
  // bucket never starts a stage before every earlier bucket has started it.
  void advance() {
    for (;;) {
      bool moved = false;
      int previous = stage_done;
      for (staged_bucket& e : staged_) {
        if (e.stage < stage_done) {
          bool complete = true;
          for (auto& r : e.pending) {
            complete = r.test() && complete;
          }
          if (complete && e.stage + 1 <= previous) {
            start_stage(e, e.stage + 1);
            moved = true;
          }
        }
        previous = e.stage;
      }
      if (!moved) {
        return;
      }
    }
  }

  comm::any_comm local_;  // stage A
  comm::any_comm cross_;  // stage B, across the groups
  comm::any_comm share_;  // stage C
  bool blocking_;
  blocking_time& time_;
  std::deque<staged_bucket> staged_{};  // this step's buckets, launch order
};

// Each bucket's pieces pushed to the parameter servers whose shards they overlap (a worker's
// send of each piece; a server posted its receives in begin()); finish() sends the rest, waits
// and leaves each server's shard of the gradients the average, as ps.push() would. `ps` must
// outlive the strategy; it is driven through begin_push / send_range / finish_push.
class push_to_servers final : public bucket_strategy {
 public:
  explicit push_to_servers(ps_exchange& ps) : ps_(ps) {}

  void begin(std::span<float> grads, const std::vector<grad_bucket>& buckets) override {
    std::vector<ps_exchange::push_range> ranges;
    ranges.reserve(buckets.size());
    for (const grad_bucket& b : buckets) {
      ranges.push_back({.offset = b.offset, .count = b.size});
    }
    ps_.begin_push(grads, ranges);
    pushed_ = 0;
  }
  void launch(std::size_t b, const grad_bucket&, void*, std::size_t, dtype) override {
    ps_.send_range(b);  // buckets launch in order, as begin() gave them to the push
    ++pushed_;
  }
  // ps_exchange::poll()'s count (transfers, not buckets: a server's receives for every bucket
  // are posted in begin()), for progress; finish() is what waits for them.
  std::size_t poll() override { return ps_.poll(); }
  std::size_t reductions() const noexcept override { return pushed_; }
  void finish() override { ps_.finish_push(); }

 private:
  ps_exchange& ps_;
  std::size_t pushed_ = 0;
};

// Runs one step's gradient synchronisation bucket by bucket as backward completes the groups,
// through its strategy (above).
//
//   reducer.begin(grads);            // before the step's last backward
//   ... reducer.group_done(i) ...    // from the model, groups in decreasing order
//   ... reducer.part_done(i, n) ...  // optional: group i's first n floats are final
//   reducer.finish();                // before the optimizer: launches the rest, waits for all
class bucket_reducer {
 public:
  // No buckets: begin, poll and finish do nothing (an executor's reducer before begin_fit).
  bucket_reducer() = default;
  // flat_reduce. storage: the type the gradients are kept in (mixed precision): each bucket is
  // rounded through it as it starts, since the rounding of the whole buffer after backward would
  // race with the buckets already in flight.
  // wire: the type the buckets travel in (float32, or float16 / bfloat16 for compress::cast).
  // shard: 0 for an all-reduce of every bucket, else the floats of each rank's shard (float32
  // on the wire only).
  // blocking: reduce each bucket with a blocking call as it becomes whole, instead of starting a
  // non-blocking one that finish() waits for (for backends whose non-blocking collectives
  // progress only when polled; see bucket_launch in config/).
  bucket_reducer(comm::any_comm comm, std::vector<grad_bucket> buckets,
                 dtype storage = dtype::float32, dtype wire = dtype::float32, std::size_t shard = 0,
                 bool blocking = false)
      : bucket_reducer(std::move(buckets), storage, wire, blocking,
                       !blocking && !comm.progresses_nonblocking()) {
    if (shard != 0 && wire != dtype::float32) {
      throw std::invalid_argument(
          "bucket_reducer: buckets reduced to shard owners travel as float32 only");
    }
    strategy_ = std::make_unique<flat_reduce>(comm, shard, blocking, *time_);
  }

  // staged_reduce over `h`'s groups, which must have equal size. Collective over h.local().
  bucket_reducer(comm::hierarchy<comm::any_comm>& h, std::vector<grad_bucket> buckets,
                 dtype storage = dtype::float32, dtype wire = dtype::float32, bool blocking = false)
      : bucket_reducer(std::move(buckets), storage, wire, blocking, !blocking) {
    if (!h.uniform()) {
      throw std::invalid_argument(
          "bucket_reducer: hierarchical buckets need groups of equal size (hierarchy::uniform)");
    }
    strategy_ = std::make_unique<staged_reduce>(h.local(), h.cross(), blocking, *time_);
    hierarchical_ = true;
  }

  // push_to_servers (parallel::data<parameter_server>, co-located servers).
  bucket_reducer(comm::any_comm comm, ps_exchange& ps, std::vector<grad_bucket> buckets,
                 dtype storage = dtype::float32)
      : bucket_reducer(std::move(buckets), storage, dtype::float32, false,
                       !comm.progresses_nonblocking()) {
    strategy_ = std::make_unique<push_to_servers>(ps);
    parameter_server_ = true;
  }

  dtype wire() const noexcept { return wire_; }
  bool blocking() const noexcept { return blocking_; }
  bool hierarchical() const noexcept { return hierarchical_; }
  bool parameter_server() const noexcept { return parameter_server_; }

  const std::vector<grad_bucket>& buckets() const noexcept { return buckets_; }

  // The part size to ask the layers for (backward_args::progress::chunk), in floats: the size of
  // the parts of the groups split over several buckets; 0 when no group is split. Blocking or
  // not, the layers compute their gradients in the same parts, so that both launches give the
  // same numbers bit for bit.
  std::size_t part_elements() const noexcept {
    for (const grad_bucket& b : buckets_) {
      if (b.ready_at != SIZE_MAX) {
        return b.size;
      }
    }
    return 0;
  }

  void begin(std::span<float> grads) {
    grads_ = grads;
    if (time_) {
      time_->reset();
    }
    next_ = 0;
    lowest_done_ = SIZE_MAX;
    part_group_ = SIZE_MAX;
    part_floats_ = 0;
    launched_.clear();
    if (strategy_) {
      strategy_->begin(grads, buckets_);
    }
  }

  // Every group >= `group` is complete: start each bucket that is now whole.
  void group_done(std::size_t group) {
    lowest_done_ = std::min(lowest_done_, group);
    launch_ready();
    if (polls_) {
      poll();
    }
  }

  // Every group > `group` is complete and group `group`'s first `n` floats are final: start each
  // part of it that is now whole.
  void part_done(std::size_t group, std::size_t n) {
    part_group_ = group;
    part_floats_ = n;
    launch_ready();
    if (polls_) {
      poll();
    }
  }

  // Tests the step's reductions in flight, oldest first, and returns how many have completed
  // (in launch order; a bucket reduced by shards is several). On a backend whose non-blocking
  // collectives advance only inside its own calls (nonblocking_progresses = false: comm::mpi),
  // this is what moves them while backward computes, so group_done and part_done call it after
  // each report there; elsewhere it only looks. A reduction that failed throws its comm_error
  // here, so on such a backend it can come out of backward (from the layer's report) rather
  // than from finish(); either way the step is lost. Hierarchical buckets: moves each bucket's
  // stages on and returns how many buckets are done. Parameter-server buckets: the push's
  // transfers done (push_to_servers).
  std::size_t poll() { return strategy_ ? strategy_->poll() : 0; }

  // The non-blocking reductions started so far this step (hierarchical: the buckets;
  // parameter-server buckets: the buckets pushed).
  std::size_t reductions() const noexcept { return strategy_ ? strategy_->reductions() : 0; }

  // Starts the buckets not started yet and waits for all (the trainer times this itself).
  void finish() {
    while (next_ < buckets_.size()) {
      launch(next_++);
    }
    if (strategy_) {
      strategy_->finish();
    }
    if (!staging_.empty()) {
      // The averages come back from the wire type into the float32 gradients.
      for (const std::size_t b : launched_) {
        const grad_bucket& bucket = buckets_[b];
        convert_floats(staging_.data() + staging_offsets_[b], grads_.data() + bucket.offset,
                       bucket.size, wire_);
      }
    }
  }

  // Seconds this step spent in blocking reductions so far (0 unless blocking).
  double blocked_seconds() const noexcept { return time_ ? time_->seconds() : 0.0; }

  // The buckets in the order the last step started them (tests check the backward order).
  const std::vector<std::size_t>& launch_order() const noexcept { return launched_; }

 private:
  bucket_reducer(std::vector<grad_bucket> buckets, dtype storage, dtype wire, bool blocking,
                 bool polls)
      : buckets_(std::move(buckets)),
        storage_(storage),
        wire_(wire),
        blocking_(blocking),
        polls_(polls),
        time_(std::make_unique<blocking_time>()) {
    if (wire_ == dtype::float16 || wire_ == dtype::bfloat16) {
      std::size_t total = 0;
      for (const grad_bucket& b : buckets_) {
        staging_offsets_.push_back(total);
        total += b.size;
      }
      staging_.resize(total);
    }
  }

  void launch_ready() {
    while (next_ < buckets_.size()) {
      const grad_bucket& b = buckets_[next_];
      const bool ready =
          b.first_group >= lowest_done_ ||
          (b.first_group == part_group_ && b.ready_at != SIZE_MAX && part_floats_ >= b.ready_at);
      if (!ready) {
        break;
      }
      launch(next_++);
    }
  }

  // Rounds bucket b through the storage type and hands it to the strategy (compress::cast: its
  // copy in the wire type).
  void launch(std::size_t b) {
    const grad_bucket& bucket = buckets_[b];
    float* data = grads_.data() + bucket.offset;
    round_through(std::span<float>(data, bucket.size), storage_);
    if (staging_.empty()) {
      strategy_->launch(b, bucket, data, bucket.size, dtype::float32);
    } else {
      std::uint16_t* wire = staging_.data() + staging_offsets_[b];
      convert_floats(data, wire, bucket.size, wire_);
      strategy_->launch(b, bucket, wire, bucket.size, wire_);
    }
    launched_.push_back(b);
  }

  std::vector<grad_bucket> buckets_{};
  dtype storage_ = dtype::float32;
  dtype wire_ = dtype::float32;
  bool blocking_ = false;
  bool polls_ = false;  // poll() after each report: the backend progresses only when called
  bool hierarchical_ = false;
  bool parameter_server_ = false;
  std::unique_ptr<blocking_time> time_{};  // shared with the strategy; stays put on a move
  std::unique_ptr<bucket_strategy> strategy_{};
  std::vector<std::uint16_t> staging_{};        // compress::cast: the buckets in the wire type
  std::vector<std::size_t> staging_offsets_{};  // where each bucket starts in staging_
  std::span<float> grads_{};
  std::size_t next_ = 0;
  std::size_t lowest_done_ = SIZE_MAX;  // every group from this one up is complete
  std::size_t part_group_ = SIZE_MAX;   // the group whose first part_floats_ floats are final
  std::size_t part_floats_ = 0;
  std::vector<std::size_t> launched_{};
};

}  // namespace strata::parallel
