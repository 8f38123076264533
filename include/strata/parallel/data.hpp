// SPDX-License-Identifier: Apache-2.0
#pragma once

// parallel::data<all_reduce>: data parallelism. Every rank holds the whole model and trains on
// its shard of each global batch (the distributed sampler's strided shards: rank r's batch k is
// its share of one rank's batch k of world_size x batch_size_per_gpu); the gradients are
// averaged over the ranks before every optimizer step, so every rank applies the same update and
// the parameters stay identical.
//
//   strata::comm::threads::run(2, [&](strata::comm::threads& comm) {
//     strata::train::trainer<decltype(model), strata::parallel::data<>> run(
//         model, cfg, strata::comm::any_comm(comm));   // cfg.world_size = 2
//     run.fit(train, augment, test, test_transform);
//   });
//
// Buckets overlap the all-reduce with backward. The flat gradient buffer is cut into buckets of
// at most bucket_size_mb MiB along the parameter groups (a group larger than that is cut into
// parts), in the order backward produces them: the last layer's group first. During the step's
// last backward (with accumulation, the earlier micro-steps do not communicate at all), the
// model reports each layer as done, and a layer that computes its gradients in parts (linear)
// reports each part; once every float of a bucket is final, that bucket's non-blocking average
// all-reduce starts, while backward goes on. The trainer waits for all of them only before the
// optimizer step. A model without the per-layer report gets one all-reduce per bucket after its
// backward.
//
// The other gradient synchronisations (hierarchical all-reduce, all-gather of top-k pairs,
// parameter server), compression and sharded optimizer state are further policies of this family
// (docs/parallel.md).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/algorithms.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/types.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/policy.hpp"
#include "strata/core/round.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/ps/exchange.hpp"

namespace strata::parallel {

// Gradient synchronisation of parallel::data: average by (bucketed, overlapped) all-reduce.
struct all_reduce {
  static constexpr std::string_view name = "all_reduce";
};

// Gradient synchronisation of parallel::data: a hierarchical average over groups of
// hierarchy_group_size consecutive ranks (reduce inside the group, all-reduce of each share across
// the groups, broadcast inside). Pays off when the links between groups are the slow ones. With
// groups of equal size and non-blocking launches it runs per bucket, overlapped with backward like
// all_reduce: bucket_reducer takes each bucket through the three stages as backward completes it.
// Groups of unequal size (hierarchy_group_size not dividing world_size) and blocking launches
// (bucket_launch = blocking; auto over MPI) use comm::hierarchical_all_reduce once backward is
// done. With compress::cast<T> the gradients travel as T at every hop (each hop adds in float
// and rounds to T), half the bytes on the slow links too.
struct hierarchical {
  static constexpr std::string_view name = "hierarchical";
};

// Gradient synchronisation of parallel::data with compress::topk: every rank's selected
// (index, value) pairs are all-gathered and added up in rank order on every rank
// (parallel/topk.hpp), once the step's backward is done.
struct all_gather {
  static constexpr std::string_view name = "all_gather";
};

// Gradient synchronisation of parallel::data: a synchronous parameter server over send / recv
// (parallel/ps/exchange.hpp). Ranks 0 .. parameter_servers - 1 (config; 0 = every rank)
// each hold a shard of the parameters' optimizer state; every rank pushes its gradient shards to
// their servers, the servers average and update, every rank pulls the updated shards. Same
// numbers as all_reduce; the optimizer state is spread over the servers as in zero1.
struct parameter_server {
  static constexpr std::string_view name = "parameter_server";
};

// Gradient compressors: what goes over the wire.
namespace compress {

// The float32 gradients as they are.
struct none {
  static constexpr std::string_view name = "none";
};

// Each bucket travels and is summed as T (float16 or bfloat16; the backends accumulate 16-bit
// floats in float and round once), half the bytes; the average comes back into the float32
// gradients. float16 overflows above 65504: with precision::fp32 gradients that large are rare,
// and an overflow shows as inf, which a mixed-precision policy's check catches.
template <class T>
struct cast {
  static_assert(std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>,
                "parallel::compress::cast<T>: T must be strata::float16 or strata::bfloat16");
  using wire_type = T;
  static constexpr std::string_view name = std::is_same_v<T, float16>
                                               ? std::string_view("cast<float16>")
                                               : std::string_view("cast<bfloat16>");
};

// Top-k sparsification with error feedback (parallel/topk.hpp): each rank sends the
// floor(topk_ratio x n) gradient entries of largest magnitude (config topk_ratio) and keeps the
// rest as a residual for the next step; the residual is saved in checkpoints. Its output is a
// set of (index, value) pairs per rank, which a summing all-reduce cannot add up: it travels by
// parallel::all_gather or through a parallel::parameter_server.
struct topk {
  static constexpr std::string_view name = "topk";
};

template <class C>
inline constexpr bool is_cast = false;
template <class T>
inline constexpr bool is_cast<cast<T>> = true;

// What travels: T for cast<T>, else float32.
template <class C>
constexpr dtype wire_of() {
  if constexpr (is_cast<C>) {
    return dtype_of<typename C::wire_type>;
  } else {
    return dtype::float32;
  }
}

}  // namespace compress

namespace detail {
template <class Sync, class Compressor>
constexpr std::string_view data_policy_name() {
  if constexpr (std::is_same_v<Sync, hierarchical>) {
    if constexpr (std::is_same_v<Compressor, compress::none>) {
      return "data<hierarchical>";
    } else if constexpr (std::is_same_v<Compressor, compress::cast<float16>>) {
      return "data<hierarchical, cast<float16>>";
    } else {
      return "data<hierarchical, cast<bfloat16>>";
    }
  } else if constexpr (std::is_same_v<Sync, all_gather>) {
    return "data<all_gather, topk>";
  } else if constexpr (std::is_same_v<Sync, parameter_server>) {
    return std::is_same_v<Compressor, compress::topk> ? "data<parameter_server, topk>"
                                                      : "data<parameter_server>";
  } else if constexpr (std::is_same_v<Compressor, compress::none>) {
    return "data<all_reduce>";
  } else if constexpr (std::is_same_v<Compressor, compress::cast<float16>>) {
    return "data<all_reduce, cast<float16>>";
  } else {
    return "data<all_reduce, cast<bfloat16>>";
  }
}
}  // namespace detail

// The shipped policies' step executors, one per synchronisation (defined in
// parallel/data_executor.hpp and parallel/ps/executor.hpp, which train/trainer.hpp includes).
template <class Policy>
class all_reduce_executor;  // all_reduce (with cast<T>) and zero1
template <class Policy>
class hierarchical_executor;
template <class Policy>
class topk_gather_executor;  // all_gather of top-k pairs
template <class Policy>
class ps_executor;  // parameter_server

namespace detail {
template <class Sync, class Policy>
using data_executor_for = std::conditional_t<
    std::is_same_v<Sync, parameter_server>, ps_executor<Policy>,
    std::conditional_t<
        std::is_same_v<Sync, hierarchical>, hierarchical_executor<Policy>,
        std::conditional_t<std::is_same_v<Sync, all_gather>, topk_gather_executor<Policy>,
                           all_reduce_executor<Policy>>>>;
}  // namespace detail

template <class Sync = all_reduce, class Compressor = compress::none>
struct data {
  static_assert(std::is_same_v<Sync, all_reduce> || std::is_same_v<Sync, hierarchical> ||
                    std::is_same_v<Sync, all_gather> || std::is_same_v<Sync, parameter_server>,
                "parallel::data<Sync>: Sync must be parallel::all_reduce, hierarchical, "
                "all_gather or parameter_server");
  static_assert(!std::is_same_v<Sync, hierarchical> || std::is_same_v<Compressor, compress::none> ||
                    compress::is_cast<Compressor>,
                "parallel::data<hierarchical, Compressor>: the hierarchical all-reduce sums, so it "
                "takes compress::none or compress::cast<float16 | bfloat16>, not top-k");
  static_assert(!std::is_same_v<Sync, all_reduce> || !std::is_same_v<Compressor, compress::topk>,
                "parallel::data<all_reduce, compress::topk>: top-k output is not summable (each "
                "rank sends different indices), so a summing all-reduce cannot carry it; it needs "
                "an all-gather (parallel::all_gather) or a parameter server "
                "(parallel::parameter_server)");
  static_assert(!std::is_same_v<Sync, all_gather> || std::is_same_v<Compressor, compress::topk>,
                "parallel::data<all_gather, Compressor>: the all-gather carries top-k pairs "
                "(compress::topk); dense gradients are cheaper by parallel::all_reduce");
  static_assert(!std::is_same_v<Sync, parameter_server> ||
                    std::is_same_v<Compressor, compress::none> ||
                    std::is_same_v<Compressor, compress::topk>,
                "parallel::data<parameter_server, Compressor>: the parameter server takes "
                "compress::none or compress::topk");
  static_assert(std::is_same_v<Compressor, compress::none> || compress::is_cast<Compressor> ||
                    std::is_same_v<Compressor, compress::topk>,
                "parallel::data<Sync, Compressor>: Compressor must be compress::none, "
                "compress::cast<float16 | bfloat16> or compress::topk");
  using policy_category = parallel_policy_tag;
  using sync_type = Sync;
  using compressor_type = Compressor;
  static constexpr std::string_view name = detail::data_policy_name<Sync, Compressor>();
  static constexpr bool distributed = true;
  using executor = detail::data_executor_for<Sync, data>;
  // world_size = the communicator's; gradient_sync and gradient_compression as Sync and
  // Compressor name them; the keys of the synchronisation and compressor in use, not the others'.
  static void check_config(const config::train_config& cfg, int world, int rank) {
    constexpr bool topk = std::is_same_v<Compressor, compress::topk>;
    refuse_foreign_keys({.distributed = true,
                         .topk = topk,
                         .ps = std::is_same_v<Sync, parameter_server>,
                         .hierarchical = std::is_same_v<Sync, hierarchical>,
                         .bucketed = !topk,
                         .wire = compress::wire_of<Compressor>(),
                         .parallel = name,
                         .sync = Sync::name},
                        cfg, world, rank);
  }
};

// parallel::zero1: data parallelism with the optimizer state sharded over the ranks (ZeRO stage
// 1). The flat parameter and gradient buffers are padded to n equal shards; as backward
// completes each gradient bucket, its pieces are reduced (averaged) to the ranks that own them
// (bucket_reducer with a shard size), so each rank ends with the average gradient of its shard;
// each rank updates its shard's parameters with its shard of the optimizer state (1/n of it per
// rank, 1/n of the update's work); an all-gather gives every rank the whole updated parameters.
// Same numbers as data<all_reduce> (the update is elementwise), 1/n of the optimizer memory per
// rank. Checkpoints hold every rank's shard (optimizer.shards.bin).
struct zero1 {
  using policy_category = parallel_policy_tag;
  using sync_type = all_reduce;
  using compressor_type = compress::none;
  static constexpr std::string_view name = "zero1";
  static constexpr bool distributed = true;
  using executor = all_reduce_executor<zero1>;
  // world_size = the communicator's, zero_stage = 1, gradient_sync = all_reduce without
  // compression.
  static void check_config(const config::train_config& cfg, int world, int rank) {
    refuse_foreign_keys({.distributed = true, .sharded = true, .bucketed = true, .parallel = name},
                        cfg, world, rank);
  }
};

template <class P>
inline constexpr bool is_data_parallel = false;
template <>
inline constexpr bool is_data_parallel<zero1> = true;
template <class Sync, class Compressor>
inline constexpr bool is_data_parallel<data<Sync, Compressor>> = true;

// Whether a parallel policy synchronises by the hierarchical all-reduce.
template <class P>
inline constexpr bool is_hierarchical = false;
template <class Compressor>
inline constexpr bool is_hierarchical<data<hierarchical, Compressor>> = true;

// Whether a parallel policy synchronises through a parameter server / by top-k compression.
template <class P>
inline constexpr bool is_parameter_server = false;
template <class Compressor>
inline constexpr bool is_parameter_server<data<parameter_server, Compressor>> = true;
template <class P>
inline constexpr bool is_topk = false;
template <class Sync>
inline constexpr bool is_topk<data<Sync, compress::topk>> = true;

// The wire type of a data-parallel policy's compressor (float32 without one).
template <class P>
inline constexpr dtype wire_dtype = dtype::float32;
template <class Sync, class T>
inline constexpr dtype wire_dtype<data<Sync, compress::cast<T>>> = dtype_of<T>;

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

// Runs one step's gradient all-reduce bucket by bucket as backward completes the groups.
// With a shard size (parallel::zero1), each bucket is instead cut at the shard boundaries and
// each piece reduced (averaged) to the rank that owns it, rank q owning floats [q x shard,
// (q + 1) x shard): afterwards only a rank's own shard of the gradients holds the average.
//
//   reducer.begin(grads);            // before the step's last backward
//   ... reducer.group_done(i) ...    // from the model, groups in decreasing order
//   ... reducer.part_done(i, n) ...  // optional: group i's first n floats are final
//   reducer.finish();                // before the optimizer: launches the rest, waits for all
class bucket_reducer {
 public:
  bucket_reducer() = default;
  // storage: the type the gradients are kept in (mixed precision): each bucket is rounded
  // through it as it starts, since the rounding of the whole buffer after backward would race
  // with the buckets already in flight.
  // wire: the type the buckets travel in (float32, or float16 / bfloat16 for compress::cast).
  // shard: 0 for an all-reduce of every bucket, else the floats of each rank's shard (float32
  // on the wire only).
  // blocking: reduce each bucket with a blocking call as it becomes whole, instead of starting a
  // non-blocking one that finish() waits for (for backends whose non-blocking collectives
  // progress only when polled; see bucket_launch in config/).
  bucket_reducer(comm::any_comm comm, std::vector<grad_bucket> buckets,
                 dtype storage = dtype::float32, dtype wire = dtype::float32, std::size_t shard = 0,
                 bool blocking = false)
      : comm_(comm),
        buckets_(std::move(buckets)),
        storage_(storage),
        wire_(wire),
        shard_(shard),
        blocking_(blocking),
        polls_(!blocking && !comm_->progresses_nonblocking()) {
    if (shard_ != 0 && wire_ != dtype::float32) {
      throw std::invalid_argument(
          "bucket_reducer: buckets reduced to shard owners travel as float32 only");
    }
    if (wire_ == dtype::float16 || wire_ == dtype::bfloat16) {
      std::size_t total = 0;
      for (const grad_bucket& b : buckets_) {
        staging_offsets_.push_back(total);
        total += b.size;
      }
      staging_.resize(total);
    }
  }

  // Hierarchical buckets (parallel::hierarchical over groups of equal size): each bucket is cut
  // into g = h.local().size() parts and averaged in three stages: A, part j reduced (average) to
  // local rank j; B, this rank's part averaged across the groups (h.cross()); C, part j
  // broadcast from local rank j. A bucket's next stage starts once its current one is complete
  // and every earlier bucket has started it, so each communicator (A and C run on two of their
  // own) sees the same operations in the same order on every rank. Stages move on from poll(),
  // which the reports from backward call, and from finish(). Blocking: the three stages run
  // inside the launch. Collective over h.local() (one split).
  bucket_reducer(comm::hierarchy<comm::any_comm>& h, std::vector<grad_bucket> buckets,
                 dtype storage = dtype::float32, dtype wire = dtype::float32, bool blocking = false)
      : bucket_reducer(h.local(), std::move(buckets), storage, wire, 0, blocking) {
    if (!h.uniform()) {
      throw std::invalid_argument(
          "bucket_reducer: hierarchical buckets need groups of equal size (hierarchy::uniform)");
    }
    cross_ = h.cross();
    share_ = comm_->split(0, comm_->rank());
    polls_ = !blocking;
  }

  // Parameter-server buckets (parallel::data<parameter_server>, co-located servers): each
  // bucket, as backward completes it, is pushed to the servers whose shards it overlaps (a
  // worker's send of each piece; a server posted its receives in begin()); finish() sends the
  // rest, waits and leaves each server's shard of the gradients the average, as ps.push() would.
  // `ps` must outlive the reducer; it is driven through begin_push / send_range / finish_push.
  bucket_reducer(comm::any_comm comm, ps_exchange& ps, std::vector<grad_bucket> buckets,
                 dtype storage = dtype::float32)
      : bucket_reducer(comm, std::move(buckets), storage) {
    ps_ = &ps;
  }

  dtype wire() const noexcept { return wire_; }
  bool blocking() const noexcept { return blocking_; }
  bool hierarchical() const noexcept { return cross_.has_value(); }
  bool parameter_server() const noexcept { return ps_ != nullptr; }

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
    blocked_seconds_ = 0.0;
    next_ = 0;
    lowest_done_ = SIZE_MAX;
    part_group_ = SIZE_MAX;
    part_floats_ = 0;
    polled_ = 0;
    requests_.clear();
    launched_.clear();
    staged_.clear();
    if (ps_ != nullptr) {
      std::vector<ps_exchange::push_range> ranges;
      ranges.reserve(buckets_.size());
      for (const grad_bucket& b : buckets_) {
        ranges.push_back({.offset = b.offset, .count = b.size});
      }
      ps_->begin_push(grads, ranges);
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
  // than from finish(); either way the step is lost.
  // Hierarchical buckets: moves each bucket's stages on as far as they can go, and returns how
  // many buckets are done. Parameter-server buckets: tests the push's transfers and returns
  // ps_exchange::poll()'s count (transfers, not buckets: a server's receives for every bucket
  // are posted in begin()), for progress; finish() is what waits for them.
  std::size_t poll() {
    if (ps_ != nullptr) {
      return ps_->poll();
    }
    if (hierarchical()) {
      advance();
      std::size_t done = 0;
      while (done < staged_.size() && staged_[done].stage == stage_done) {
        ++done;
      }
      return done;
    }
    while (polled_ < requests_.size() && requests_[polled_].test()) {
      ++polled_;
    }
    return polled_;
  }

  // The non-blocking reductions started so far this step (hierarchical: the buckets).
  // (Parameter-server buckets: the buckets pushed.)
  std::size_t reductions() const noexcept {
    if (ps_ != nullptr) {
      return launched_.size();
    }
    return hierarchical() ? staged_.size() : requests_.size();
  }

  // Starts the buckets not started yet and waits for all (the trainer times this itself).
  void finish() {
    while (next_ < buckets_.size()) {
      launch(next_++);
    }
    // Hierarchical: wait for the oldest bucket's stage in flight, then move every bucket on.
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
    for (auto& r : requests_) {
      r.wait();
    }
    requests_.clear();
    polled_ = 0;
    if (ps_ != nullptr) {
      ps_->finish_push();
    }
    if (!staging_.empty()) {
      // The averages come back from the wire type into the float32 gradients.
      for (const std::size_t b : launched_) {
        const grad_bucket& bucket = buckets_[b];
        const std::uint16_t* from = staging_.data() + staging_offset(b);
        float* to = grads_.data() + bucket.offset;
        convert_floats(from, to, bucket.size, wire_);
      }
    }
  }

  // Seconds this step spent in blocking reductions so far (0 unless blocking).
  double blocked_seconds() const noexcept { return blocked_seconds_; }

  // The buckets in the order the last step started them (tests check the backward order).
  const std::vector<std::size_t>& launch_order() const noexcept { return launched_; }

 private:
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

  void launch(std::size_t b) {
    const grad_bucket& bucket = buckets_[b];
    float* data = grads_.data() + bucket.offset;
    round_through(std::span<float>(data, bucket.size), storage_);
    if (ps_ != nullptr) {
      ps_->send_range(b);  // buckets launch in order, as begin() gave them to the push
    } else if (shard_ != 0) {
      // One reduce per shard the bucket overlaps, to the shard's owner.
      std::size_t at = bucket.offset;
      const std::size_t end = bucket.offset + bucket.size;
      while (at < end) {
        const std::size_t owner = at / shard_;
        const std::size_t piece = std::min(end, (owner + 1) * shard_) - at;
        float* from = grads_.data() + at;
        const auto root = static_cast<int>(owner);
        if (blocking_) {
          blocked([&] {
            comm_->reduce(from, from, piece, dtype::float32, comm::reduce_op::avg, root);
          });
        } else {
          requests_.push_back(
              comm_->reduce_async(from, from, piece, dtype::float32, comm::reduce_op::avg, root));
        }
        at += piece;
      }
    } else if (staging_.empty()) {
      all_reduce(data, bucket.size, dtype::float32);
    } else {
      std::uint16_t* wire = staging_.data() + staging_offset(b);
      convert_floats(data, wire, bucket.size, wire_);
      all_reduce(wire, bucket.size, wire_);
    }
    launched_.push_back(b);
  }

  // ---- hierarchical buckets ----

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
    const comm::even_partition parts{.count = count, .parts = comm_->size()};
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
    const int g = comm_->size();
    if (s == 1) {
      const auto [offset, length] = part(e.count, comm_->rank());
      if (blocking_) {
        blocked([&] {
          cross_->all_reduce(at(offset), at(offset), length, e.type, comm::reduce_op::avg);
        });
      } else {
        e.pending.push_back(
            cross_->all_reduce_async(at(offset), at(offset), length, e.type, comm::reduce_op::avg));
      }
      return;
    }
    for (int j = 0; j < g; ++j) {
      const auto [offset, length] = part(e.count, j);
      if (s == 0) {
        if (blocking_) {
          blocked([&] {
            comm_->reduce(at(offset), at(offset), length, e.type, comm::reduce_op::avg, j);
          });
        } else {
          e.pending.push_back(
              comm_->reduce_async(at(offset), at(offset), length, e.type, comm::reduce_op::avg, j));
        }
      } else if (blocking_) {
        blocked([&] { share_->broadcast(at(offset), length, e.type, j); });
      } else {
        e.pending.push_back(share_->broadcast_async(at(offset), length, e.type, j));
      }
    }
  }

  // Starts bucket `data` through the stages (blocking: all three now).
  void launch_staged(void* data, std::size_t count, dtype type) {
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

  // Averages `count` elements in place: now (blocking) or by a request finish() waits for
  // (hierarchical: through the stages).
  void all_reduce(void* data, std::size_t count, dtype type) {
    if (hierarchical()) {
      launch_staged(data, count, type);
    } else if (blocking_) {
      blocked([&] { comm_->all_reduce(data, data, count, type, comm::reduce_op::avg); });
    } else {
      requests_.push_back(comm_->all_reduce_async(data, data, count, type, comm::reduce_op::avg));
    }
  }

  // Runs a blocking reduction, adding its time to the step's communication seconds.
  template <class Call>
  void blocked(Call&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    blocked_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Where bucket b's wire copy starts in staging_ (buckets in order, packed).
  std::size_t staging_offset(std::size_t b) const noexcept { return staging_offsets_[b]; }

  std::optional<comm::any_comm> comm_{};
  std::vector<grad_bucket> buckets_{};
  dtype storage_ = dtype::float32;
  dtype wire_ = dtype::float32;
  std::size_t shard_ = 0;
  bool blocking_ = false;
  bool polls_ = false;  // poll() after each report: the backend progresses only when called
  double blocked_seconds_ = 0.0;                // this step's blocking reductions
  std::vector<std::uint16_t> staging_{};        // compress::cast: the buckets in the wire type
  std::vector<std::size_t> staging_offsets_{};  // where each bucket starts in staging_
  std::span<float> grads_{};
  std::size_t next_ = 0;
  std::size_t lowest_done_ = SIZE_MAX;  // every group from this one up is complete
  std::size_t part_group_ = SIZE_MAX;   // the group whose first part_floats_ floats are final
  std::size_t part_floats_ = 0;
  std::size_t polled_ = 0;  // requests_[0, polled_) are complete
  std::vector<comm::any_comm::request> requests_{};
  std::vector<std::size_t> launched_{};
  std::optional<comm::any_comm> cross_{};  // hierarchical: stage B, across the groups
  std::optional<comm::any_comm> share_{};  // hierarchical: stage C (A runs on comm_)
  std::deque<staged_bucket> staged_{};     // hierarchical: this step's buckets, launch order
  ps_exchange* ps_ = nullptr;              // parameter-server buckets
};

}  // namespace strata::parallel
