// SPDX-License-Identifier: Apache-2.0
#pragma once

// The step executors (parallel/executor.hpp) of the shipped data-parallel policies, one per
// synchronisation, on the shared base synced_executor (parallel/synced_executor.hpp):
//   - all_reduce_executor: data<all_reduce> (also cast<T>): buckets all-reduced as backward
//     completes them; zero1: buckets reduced to the ranks that own their shards, likewise; each
//     rank updates its shard with its shard of the optimizer state, then an all-gather of the
//     parameters;
//   - hierarchical_executor: data<hierarchical>: buckets through the hierarchical stages as
//     backward completes them, with groups of equal size and non-blocking launches; else the
//     whole gradient once backward is done;
//   - topk_gather_executor: data<all_gather, topk>: top-k with error feedback over the whole
//     gradient after backward, every rank's pairs all-gathered.
// parallel::data<parameter_server, ...>'s is ps_executor (parallel/ps/executor.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/algorithms.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/round.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/ps/executor.hpp"
#include "strata/parallel/synced_executor.hpp"
#include "strata/parallel/topk.hpp"

namespace strata::parallel {

template <class Policy>
class all_reduce_executor : public synced_executor {
 public:
  static constexpr bool sharded = std::is_same_v<Policy, zero1>;
  // The 16-bit wire type of compress::cast<T> (float32 without one).
  static constexpr dtype wire = wire_dtype<Policy>;

  // zero1: the optimizer state in one shard per rank; else 1.
  static int shards(const config::train_config&, int world) { return sharded ? world : 1; }

  // Collective over the job's communicator (every rank already holds rank 0's parameters).
  explicit all_reduce_executor(const step_context& c) : synced_executor(c, Policy::name) {
    allocate_state(shard_size());
  }

  // The buckets, all-reduced (zero1: reduced to their shards' owners) as backward completes
  // them.
  bucket_reducer* begin_fit() {
    in_buckets_ = true;
    reducer_ = bucket_reducer(
        *group_, make_buckets(ctx_.compute, static_cast<std::size_t>(cfg().bucket_size_mb) << 20),
        ctx_.precision.compute, wire, sharded ? shard_size() : 0, blocking_buckets());
    return reducer_or_null();
  }

  sync_result synchronize(const sync_args& a) {
    return synchronize_with(a, [] {});
  }

  // This rank's shard of the flat parameters (all of them unless zero1).
  std::pair<std::size_t, std::size_t> owned() const noexcept {
    return {shard_begin(), shard_size()};
  }

  void update(double lr) {
    update_shard(ctx_.optimizer, ctx_.master, state_.span(), shard_begin(), shard_size(), lr);
    if constexpr (sharded) {
      const std::span<float> values = ctx_.master.values();
      group_->all_gather(values.data() + shard_begin(), values.data(), shard_size(),
                         dtype::float32);
    }
  }

  // Collective. The optimizer state as one blob; zero1: every rank's shard, in rank order.
  std::vector<state_blob> state_blobs(std::uint64_t step) {
    if constexpr (sharded) {
      all_shards_ = buffer<float>(state_.size() * static_cast<std::size_t>(group_->size()));
      group_->all_gather(state_.data(), all_shards_.data(), state_.size(), dtype::float32);
      return {{.name = "optimizer.shards.bin",
               .bytes = std::as_bytes(std::as_const(all_shards_).span())}};
    } else {
      return local_executor::state_blobs(step);
    }
  }

  void restore(const blob_reader& read) {
    if constexpr (sharded) {
      // Each rank takes its own shard.
      buffer<float> all(state_.size() * static_cast<std::size_t>(group_->size()));
      read("optimizer.shards.bin", all.span());
      const std::span<const float> mine = std::as_const(all).span().subspan(
          static_cast<std::size_t>(group_->rank()) * state_.size(), state_.size());
      std::copy(mine.begin(), mine.end(), state_.span().begin());
    } else {
      local_executor::restore(read);
    }
  }
  std::vector<optimizer_blob> optimizer_blobs() const {
    if constexpr (sharded) {
      optimizer_blob b{.name = "optimizer.shards.bin", .shards = {}};
      for (int r = 0; r < group_->size(); ++r) {
        b.shards.emplace_back(static_cast<std::size_t>(r) * shard_size(), shard_size());
      }
      return {b};
    } else {
      return local_executor::optimizer_blobs();
    }
  }

 private:
  std::size_t shard_size() const noexcept {
    return sharded ? ctx_.master.size() / static_cast<std::size_t>(group_->size())
                   : ctx_.master.size();
  }
  std::size_t shard_begin() const noexcept {
    return sharded ? static_cast<std::size_t>(group_->rank()) * shard_size() : 0;
  }

  buffer<float> all_shards_{};  // zero1's state_blobs: every rank's shard
};

template <class Policy>
class hierarchical_executor : public synced_executor {
 public:
  static constexpr dtype wire = wire_dtype<Policy>;

  explicit hierarchical_executor(const step_context& c) : synced_executor(c, Policy::name) {}

  // Collective: local groups of hierarchy_group_size consecutive ranks, and the ranks of equal
  // position across them. The stages run per bucket, non-blocking, over groups of equal size;
  // blocking launches (bucket_launch = blocking, or auto over MPI) and unequal groups take the
  // whole gradient through hierarchical_all_reduce (rings over point-to-point) after backward.
  bucket_reducer* begin_fit() {
    const int g = cfg().hierarchy_group_size > 0 ? static_cast<int>(cfg().hierarchy_group_size)
                                                 : comm::default_group_size(group_->size());
    groups_.emplace(comm::make_hierarchy(*group_, g));
    in_buckets_ = groups_->uniform() && !blocking_buckets();
    wire_copy_ = buffer<std::uint16_t>(
        !in_buckets_ && wire != dtype::float32 ? ctx_.compute.grads().size() : 0);
    if (in_buckets_) {
      reducer_ = bucket_reducer(
          *groups_,
          make_buckets(ctx_.compute, static_cast<std::size_t>(cfg().bucket_size_mb) << 20),
          ctx_.precision.compute, wire, /*blocking=*/false);
    }
    return reducer_or_null();
  }

  sync_result synchronize(const sync_args& a) {
    return synchronize_with(a, [this] { reduce_whole(); });
  }

 private:
  // The whole gradient through hierarchical_all_reduce, after backward.
  void reduce_whole() {
    const std::span<float> grads = ctx_.compute.grads();
    if constexpr (wire == dtype::float32) {
      comm::hierarchical_all_reduce(*groups_, grads, comm::reduce_op::avg);
    } else {
      // compress::cast<T>: the average travels as T (every hop adds in float and rounds to T),
      // and comes back into float32.
      std::uint16_t* w = wire_copy_.data();
      convert_floats(grads.data(), w, grads.size(), wire);
      comm::hierarchical_all_reduce(*groups_, w, w, grads.size(), wire, comm::reduce_op::avg,
                                    {.narrow_floats = comm::narrow_float_mode::in_type});
      convert_floats(w, grads.data(), grads.size(), wire);
    }
  }

  std::optional<comm::hierarchy<comm::any_comm>> groups_{};
  buffer<std::uint16_t> wire_copy_{};  // cast<T>, whole gradient: T's copy
};

template <class Policy>
class topk_gather_executor : public synced_executor {
 public:
  explicit topk_gather_executor(const step_context& c) : synced_executor(c, Policy::name) {
    topk_.emplace(ctx_.master, cfg().topk_ratio);
  }

  // No buckets: the top-k of the whole gradient after backward.
  bool blocking_buckets() const noexcept { return false; }

  // Every rank's top-k pairs all-gathered: every rank's gradients become the average.
  sync_result synchronize(const sync_args& a) {
    return synchronize_with(a, [&] {
      const std::span<float> grads = ctx_.compute.grads();
      ctx_.precision.round(grads);
      topk_.back_up(ctx_.precision.skips_steps);
      topk_all_gather(*group_, topk_.compressor(), grads, static_cast<float>(a.loss_scale),
                      pairs_mine_, pairs_all_);
    });
  }

  void skipped() { topk_.put_back(ctx_.precision.skips_steps); }

  // Collective. The optimizer state and every rank's top-k residual.
  std::vector<state_blob> state_blobs(std::uint64_t step) {
    std::vector<state_blob> blobs = local_executor::state_blobs(step);
    blobs.push_back(topk_.blob(*group_));
    return blobs;
  }
  void restore(const blob_reader& read) {
    local_executor::restore(read);
    topk_.restore(read, group_->rank(), group_->size());
  }

  // This rank's error-feedback residual (unscaled; what was not sent yet).
  std::span<const float> topk_residual() const noexcept { return topk_.residual(); }

 private:
  topk_state topk_{};
  std::vector<std::int32_t> pairs_mine_{}, pairs_all_{};
};

static_assert(check_parallel_policy<data<>>());
static_assert(check_parallel_policy<data<hierarchical>>());
static_assert(check_parallel_policy<data<all_gather, compress::topk>>());
static_assert(check_parallel_policy<data<parameter_server>>());
static_assert(check_parallel_policy<zero1>());

}  // namespace strata::parallel
