// SPDX-License-Identifier: Apache-2.0
#pragma once

// The parallel_policy contract: what a parallel policy is, the configuration it runs, and the
// executor that does its part of each step (parallel/executor.hpp).
//
// A parallel policy P
//   1. opts in with `using policy_category = strata::parallel_policy_tag;` and names itself
//      with `static constexpr std::string_view name` (in logs, checkpoints and the run's
//      fingerprint);
//   2. says whether it spans ranks: `static constexpr bool distributed` (true: the trainer
//      takes this rank's communicator);
//   3. checks its keys: `static void check_config(const config::train_config& cfg, int world,
//      int rank)` throws config_error naming the key of a configuration it does not run: a
//      world_size other than the communicator's (1 without one), and the keys of other parallel
//      policies when the configuration sets them (refuse_foreign_keys does both for the keys of
//      the shipped policies; `rank` goes into the messages);
//   4. names its step executor: `using executor = E;` where E meets executor.hpp's requirements
//      (constructed from a step_context; shards; group, data_shard, serves and serve; begin_fit,
//      synchronize and any_rank_nonfinite; owned, update and skipped; state_blobs, restore and
//      end_fit). Deriving E from parallel::local_executor gives the one-rank behaviour of each.
//
// check_parallel_policy<P>() names each requirement P misses in its own static_assert.

#include <concepts>
#include <string>
#include <string_view>
#include <utility>

#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/policy.hpp"
#include "strata/parallel/executor.hpp"

namespace strata::parallel {

// 1.
template <class P>
concept parallel_policy_tagged = policy_of<P, parallel_policy_tag>;
template <class P>
concept parallel_policy_named = requires {
  { P::name } -> std::convertible_to<std::string_view>;
};
// 2.
template <class P>
concept parallel_policy_describes = requires {
  { P::distributed } -> std::convertible_to<bool>;
};
// 3.
template <class P>
concept parallel_policy_configured = requires(const config::train_config& cfg, int n) {
  P::check_config(cfg, n, n);
};

// 4.
template <class P>
concept parallel_policy_executes = requires {
  typename P::executor;
};

template <class P>
concept parallel_policy = parallel_policy_tagged<P> && parallel_policy_named<P> &&
    parallel_policy_describes<P> && parallel_policy_configured<P> && parallel_policy_executes<P> &&
    step_executor<typename P::executor>;

// One readable error per missing requirement, where the policy meets the trainer.
template <class P>
constexpr bool check_parallel_policy() {
  static_assert(parallel_policy_tagged<P>,
                "ParallelPolicy: missing 'using policy_category = strata::parallel_policy_tag;'");
  static_assert(parallel_policy_named<P>,
                "ParallelPolicy: missing 'static constexpr std::string_view name'");
  static_assert(parallel_policy_describes<P>,
                "ParallelPolicy: missing 'static constexpr bool distributed'");
  static_assert(parallel_policy_configured<P>,
                "ParallelPolicy: missing 'static void check_config(const config::train_config&, "
                "int world, int rank)'");
  static_assert(parallel_policy_executes<P>,
                "ParallelPolicy: missing 'using executor = ...;' (its step executor, "
                "parallel/executor.hpp; derive it from parallel::local_executor)");
  if constexpr (parallel_policy_executes<P>) {
    using E = typename P::executor;
    static_assert(executor_constructible<E>,
                  "ParallelPolicy executor: not constructible from a 'const "
                  "parallel::step_context&'");
    static_assert(executor_lays_out<E>,
                  "ParallelPolicy executor: missing 'static int shards(const "
                  "config::train_config&, int world)'");
    static_assert(executor_has_roles<E>,
                  "ParallelPolicy executor: missing group(), data_shard(), serves() or "
                  "serve(std::uint64_t)");
    static_assert(executor_synchronizes<E>,
                  "ParallelPolicy executor: missing begin_fit(), synchronize(const sync_args&) "
                  "returning sync_result, or any_rank_nonfinite(bool)");
    static_assert(executor_updates<E>,
                  "ParallelPolicy executor: missing owned() const, update(double lr) or "
                  "skipped()");
    static_assert(executor_checkpoints<E>,
                  "ParallelPolicy executor: missing state_blobs(std::uint64_t), restore(const "
                  "blob_reader&) or end_fit(std::uint64_t)");
    static_assert(executor_describes_state<E>,
                  "ParallelPolicy executor: optimizer_blobs() must be const and return "
                  "std::vector<parallel::optimizer_blob> (the blobs of this rank's optimizer "
                  "state, parallel/executor.hpp)");
  }
  return parallel_policy<P>;
}

// What refuse_foreign_keys needs to know of a policy: which of the shipped policies' keys it
// uses.
struct parallel_keys {
  bool distributed = false;              // takes a communicator: world_size must match it
  bool topk = false;                     // compress::topk (topk_ratio)
  bool ps = false;                       // the parameter server (parameter_servers, its async keys)
  bool hierarchical = false;             // hierarchy_group_size
  bool sharded = false;                  // zero1 (zero_stage = 1)
  bool bucketed = false;                 // gradient buckets (bucket_launch)
  bool pipeline = false;                 // pipeline stages (pipeline_* keys, micro_batches)
  dtype wire = dtype::float32;           // compress::cast<T>: T (gradient_compression)
  std::string_view parallel{};           // the policy's name, for the messages
  std::string_view sync = "all_reduce";  // its gradient synchronisation (gradient_sync)
};

// Throws config_error naming the key of a configuration a policy with keys `k` does not run: the
// world size, and the parallel keys it does not match or does not hold (set, not ignored).
inline void refuse_foreign_keys(const parallel_keys& k, const config::train_config& cfg, int world,
                                int rank) {
  auto refuse = [](std::string key, std::string text) {
    throw config_error({.key = std::move(key), .file = {}, .line = 0, .column = 0},
                       std::move(text));
  };
  if (k.distributed) {
    if (cfg.world_size != world) {
      refuse("world_size", "rank " + std::to_string(rank) + ": the communicator has " +
                               std::to_string(world) + " ranks, world_size is " +
                               std::to_string(cfg.world_size));
    }
  } else if (cfg.world_size != 1) {
    refuse("world_size", "this trainer runs one rank (parallel::single_rank); world_size is " +
                             std::to_string(cfg.world_size) +
                             "; several ranks need strata::parallel::data and a communicator");
  }
  // Keys of policies this trainer does not run are refused when set, not ignored.
  const config::train_config d{};
  // Gradient synchronisation and compression must be the parallel policy's.
  {
    std::string sync = "all_reduce";
    std::string compression = "none";
    if (k.distributed) {
      sync = std::string(k.sync);
      if (k.topk) {
        compression = "topk";
      } else if (k.wire == dtype::float16) {
        compression = "float16";
      } else if (k.wire == dtype::bfloat16) {
        compression = "bfloat16";
      }
    }
    const auto& sync_names = config::enum_names<config::gradient_sync_kind>::names;
    const auto& compression_names = config::enum_names<config::compression_kind>::names;
    const std::string wanted_sync(sync_names[static_cast<std::size_t>(cfg.gradient_sync)]);
    const std::string wanted_compression(
        compression_names[static_cast<std::size_t>(cfg.gradient_compression)]);
    if (wanted_sync != sync) {
      refuse("gradient_sync", "gradient_sync = " + wanted_sync +
                                  ", but the trainer's parallel "
                                  "policy is " +
                                  std::string(k.parallel) + " (give it parallel::data<parallel::" +
                                  wanted_sync + "> to match, where that exists)");
    }
    if (wanted_compression != compression) {
      refuse("gradient_compression",
             "gradient_compression = " + wanted_compression +
                 ", but the trainer's parallel policy is " + std::string(k.parallel) +
                 (k.distributed ? "; give it parallel::data<parallel::all_reduce | hierarchical, "
                                  "parallel::compress::cast<float16 | bfloat16>> or "
                                  "parallel::data<parallel::all_gather | parameter_server, "
                                  "parallel::compress::topk> to match"
                                : "; compression needs several ranks (parallel::data)"));
    }
    if (cfg.tensor_parallel_size != d.tensor_parallel_size) {
      refuse(
          "tensor_parallel_size",
          "tensor_parallel_size = " + std::to_string(cfg.tensor_parallel_size) +
              " splits layers over ranks (parallel::tensor<Inner>, parallel/tensor_parallel.hpp); "
              "the trainer's parallel policy is " +
              std::string(k.parallel));
    }
    if (!k.pipeline) {
      const char* set = cfg.pipeline_parallel_size != d.pipeline_parallel_size
                            ? "pipeline_parallel_size"
                        : cfg.pipeline_schedule != d.pipeline_schedule ? "pipeline_schedule"
                        : cfg.micro_batches != d.micro_batches         ? "micro_batches"
                                                                       : nullptr;
      if (set != nullptr) {
        refuse(set, std::string(set) +
                        " configures pipeline stages (parallel::pipeline<Schedule>); the trainer's "
                        "parallel policy is " +
                        std::string(k.parallel));
      }
    }
    if (!k.topk && cfg.topk_ratio != d.topk_ratio) {
      refuse("topk_ratio",
             "topk_ratio configures parallel::compress::topk; the trainer's parallel policy "
             "is " +
                 std::string(k.parallel));
    }
    if (!k.ps && cfg.parameter_servers != d.parameter_servers) {
      refuse("parameter_servers",
             "parameter_servers configures parallel::data<parallel::parameter_server>; the "
             "trainer's parallel policy is " +
                 std::string(k.parallel));
    }
    if (!k.ps && (cfg.parameter_server_async ||
                  cfg.parameter_server_staleness != d.parameter_server_staleness)) {
      refuse(cfg.parameter_server_async ? "parameter_server_async" : "parameter_server_staleness",
             "the asynchronous parameter server needs parallel::data<parallel::parameter_server>; "
             "the trainer's parallel policy is " +
                 std::string(k.parallel));
    }
    if (k.ps && cfg.parameter_server_async) {
      if (!cfg.dedicated_parameter_servers) {
        refuse("parameter_server_async",
               "parameter_server_async needs dedicated_parameter_servers = true (a co-located "
               "server would stop serving while its rank trains)");
      }
      if (k.topk) {
        refuse("gradient_compression",
               "the asynchronous parameter server runs dense gradients only in this version");
      }
    }
    if (k.ps && !cfg.parameter_server_async &&
        cfg.parameter_server_staleness != d.parameter_server_staleness) {
      refuse("parameter_server_staleness",
             "parameter_server_staleness configures parameter_server_async = true");
    }
    if (!k.ps && cfg.dedicated_parameter_servers) {
      refuse("dedicated_parameter_servers",
             "dedicated_parameter_servers configures parallel::data<parallel::parameter_server>; "
             "the trainer's parallel policy is " +
                 std::string(k.parallel));
    }
    if (k.ps && cfg.dedicated_parameter_servers &&
        (cfg.parameter_servers < 1 || cfg.parameter_servers >= world)) {
      refuse("parameter_servers",
             "rank " + std::to_string(rank) +
                 ": dedicated_parameter_servers needs 1 .. world_size - 1 servers (the other "
                 "ranks train); parameter_servers = " +
                 std::to_string(cfg.parameter_servers) + ", world_size = " + std::to_string(world));
    }
    if (k.ps && cfg.parameter_servers > world) {
      refuse("parameter_servers", "rank " + std::to_string(rank) + ": parameter_servers = " +
                                      std::to_string(cfg.parameter_servers) + " is more than the " +
                                      std::to_string(world) + " ranks");
    }
    if (!k.hierarchical && cfg.hierarchy_group_size != d.hierarchy_group_size) {
      refuse("hierarchy_group_size",
             "hierarchy_group_size configures "
             "parallel::data<parallel::hierarchical>; the trainer's "
             "parallel policy is " +
                 std::string(k.parallel));
    }
    if (!k.distributed && cfg.bucket_size_mb != d.bucket_size_mb) {
      refuse("bucket_size_mb",
             "bucket_size_mb configures parallel::data; the trainer's "
             "parallel policy is " +
                 std::string(k.parallel));
    }
    if (k.sharded != (cfg.zero_stage == 1)) {
      refuse("zero_stage",
             k.sharded ? std::string("the trainer's parallel policy is parallel::zero1, which "
                                     "shards the optimizer state; set zero_stage = 1")
                       : "zero_stage = " + std::to_string(cfg.zero_stage) +
                             " needs parallel::zero1; the trainer's parallel policy is " +
                             std::string(k.parallel));
    }
    if (!k.bucketed && cfg.bucket_launch != d.bucket_launch) {
      refuse("bucket_launch",
             "bucket_launch configures the gradient buckets of parallel::data<all_reduce>, "
             "data<hierarchical>, data<parameter_server> and parallel::zero1; the trainer's "
             "parallel policy is " +
                 std::string(k.parallel) + ", which has none");
    }
  }
}

}  // namespace strata::parallel
