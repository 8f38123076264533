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
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/types.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/policy.hpp"
#include "strata/parallel/bucket_reducer.hpp"
#include "strata/parallel/concepts.hpp"

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

// Whether a parallel policy compresses by top-k.
template <class P>
inline constexpr bool is_topk = false;
template <class Sync>
inline constexpr bool is_topk<data<Sync, compress::topk>> = true;

// The wire type of a data-parallel policy's compressor (float32 without one).
template <class P>
inline constexpr dtype wire_dtype = dtype::float32;
template <class Sync, class T>
inline constexpr dtype wire_dtype<data<Sync, compress::cast<T>>> = dtype_of<T>;

}  // namespace strata::parallel
