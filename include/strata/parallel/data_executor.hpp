// SPDX-License-Identifier: Apache-2.0
#pragma once

// data_executor<Policy>: the step executor (parallel/executor.hpp) of the shipped data-parallel
// policies, parallel::data<Sync, Compressor> and parallel::zero1.
//   - all_reduce (also cast<T>): buckets all-reduced as backward completes them;
//   - zero1: buckets reduced to the ranks that own their shards, likewise; each rank updates its
//     shard with its shard of the optimizer state, then an all-gather of the parameters;
//   - hierarchical: buckets through the hierarchical stages, likewise, with groups of equal size
//     and non-blocking launches; else the whole gradient once backward is done;
//   - parameter_server: buckets pushed to co-located servers, likewise (dedicated servers, or
//     blocking launches: the whole gradient after backward); servers hold shards of the state;
//   - compress::topk: top-k with error feedback over the whole gradient after backward (by
//     all-gather, or through the servers).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/algorithms.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/round.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/parameter_server.hpp"
#include "strata/parallel/ps_server.hpp"
#include "strata/parallel/topk.hpp"

namespace strata::parallel {

template <class Policy>
class data_executor : public local_executor {
  using clock = std::chrono::steady_clock;

 public:
  static constexpr bool sharded = std::is_same_v<Policy, zero1>;
  static constexpr bool hierarchical = is_hierarchical<Policy>;
  static constexpr bool ps = is_parameter_server<Policy>;
  static constexpr bool topk = is_topk<Policy>;
  // The optimizer state is sharded: zero1 over every rank, parameter_server over its servers.
  static constexpr bool state_sharded = sharded || ps;
  // The 16-bit wire type of compress::cast<T> (float32 without one).
  static constexpr dtype wire = wire_dtype<Policy>;

  // How many shards the optimizer state is cut into: every rank's (zero1), the servers'
  // (parameter_server; parameter_servers = 0 means every rank), else 1.
  static int shards(const config::train_config& c, int world) {
    if constexpr (sharded) {
      return world;
    } else if constexpr (ps) {
      if (c.dedicated_parameter_servers) {
        return static_cast<int>(std::clamp<std::int64_t>(c.parameter_servers, 1, world));
      }
      return c.parameter_servers > 0
                 ? static_cast<int>(std::min<std::int64_t>(c.parameter_servers, world))
                 : world;
    } else {
      return 1;
    }
  }

  // Collective over the job's communicator (every rank already holds rank 0's parameters).
  explicit data_executor(const step_context& c) : local_executor(c) {
    if (c.comm == nullptr) {
      throw std::invalid_argument(std::string(Policy::name) + ": needs a communicator");
    }
    if constexpr (ps) {
      dedicated_ = cfg().dedicated_parameter_servers;
      async_ = dedicated_ && cfg().parameter_server_async;
      dedicated_server_ =
          dedicated_ && group_->rank() >= group_->size() - shards(cfg(), group_->size());
    }
    allocate_state(shard_size());
    if constexpr (ps) {
      const int servers = shards(cfg(), group_->size());
      if (dedicated_) {
        // The servers are the last ranks; the workers' own collectives (metrics, checkpoints,
        // the sampler's shards) run over the workers only, the exchange over every rank.
        const int workers = group_->size() - servers;
        world_ = *group_;
        group_ = world_->split(dedicated_server_ ? 1 : 0, world_->rank());
        ps_.emplace(*world_, ctx_.master.size(), servers, workers);
      } else {
        ps_.emplace(*group_, ctx_.master.size(), servers);
      }
    }
    if constexpr (topk) {
      // k counts the parameters, not the padding of a store cut into equal shards.
      std::size_t used = 0;
      for (const model::param_entry& e : ctx_.master.entries()) {
        used = std::max(used, e.offset + e.spec.elements());
      }
      topk_.emplace(ctx_.master.size(), cfg().topk_ratio, used);
    }
  }

  data_executor(const data_executor&) = delete;
  data_executor& operator=(const data_executor&) = delete;

  // Whether the gradient buckets are reduced by blocking calls inside backward: bucket_launch,
  // with auto resolved for the backend (comm::nonblocking_progresses). False without buckets.
  // hierarchical uses buckets only when this is false (and its groups have equal size),
  // parameter_server only when this is false (and its servers are co-located); else they reduce
  // the whole gradient after backward.
  bool blocking_buckets() const noexcept {
    if constexpr (!topk) {
      return cfg().bucket_launch == config::bucket_launch_kind::blocking ||
             (cfg().bucket_launch == config::bucket_launch_kind::automatic &&
              !group_->progresses_nonblocking());
    } else {
      return false;
    }
  }

  bool serves() const noexcept { return dedicated_server_; }

  // A dedicated server: apply each step's average gradient to its shard and send the workers
  // the new values, until worker 0 says finish. Returns the steps done.
  std::uint64_t serve(std::uint64_t step) {
    if constexpr (ps) {
      server_context context{
          .world = *world_,
          .ps = *ps_,
          .topk = topk_ ? &*topk_ : nullptr,
          .master = ctx_.master,
          .pushed = ctx_.compute.grads(),
          .optimizer = ctx_.optimizer,
          .state = state_.span(),
          .first = shard_begin(),
          .shard = shard_size(),
          .staleness = static_cast<std::uint64_t>(cfg().parameter_server_staleness),
          .to_master = ctx_.precision.to_master};
      const server_result served =
          async_ ? serve_async(context, step) : parallel::serve(context, step);
      max_lead_ = served.max_lead;
      return served.step;
    } else {
      return local_executor::serve(step);
    }
  }

  // The reducer that backward starts as it completes buckets, or null when the gradients are
  // reduced whole after backward.
  bucket_reducer* begin_fit() {
    if constexpr (hierarchical) {
      // Collective: local groups of hierarchy_group_size consecutive ranks, and the ranks of
      // equal position across them.
      const int g = cfg().hierarchy_group_size > 0 ? static_cast<int>(cfg().hierarchy_group_size)
                                                   : comm::default_group_size(group_->size());
      groups_.emplace(comm::make_hierarchy(*group_, g));
    }
    // The hierarchical stages run per bucket, non-blocking, over groups of equal size; blocking
    // launches (bucket_launch = blocking, or auto over MPI) and unequal groups take the whole
    // gradient through hierarchical_all_reduce (rings over point-to-point) after backward. The
    // parameter-server push goes per bucket to co-located servers with non-blocking launches;
    // else whole, after backward.
    in_buckets_ = !topk;
    if constexpr (hierarchical) {
      in_buckets_ = groups_->uniform() && !blocking_buckets();
    } else if constexpr (ps) {
      in_buckets_ = in_buckets_ && !dedicated_ && !blocking_buckets();
    }
    hierarchy_wire_ = buffer<std::uint16_t>(
        hierarchical && !in_buckets_ && wire != dtype::float32 ? ctx_.compute.grads().size() : 0);
    if (!in_buckets_) {
      return nullptr;
    }
    std::vector<grad_bucket> buckets =
        make_buckets(ctx_.compute, static_cast<std::size_t>(cfg().bucket_size_mb) << 20);
    const dtype compute = ctx_.precision.compute;
    if constexpr (hierarchical) {
      reducer_ = bucket_reducer(*groups_, std::move(buckets), compute, wire, /*blocking=*/false);
    } else if constexpr (ps) {
      reducer_ = bucket_reducer(*group_, *ps_, std::move(buckets), compute);
    } else {
      reducer_ = bucket_reducer(*group_, std::move(buckets), compute, wire,
                                sharded ? shard_size() : 0, blocking_buckets());
    }
    return &reducer_;
  }

  sync_result synchronize(const sync_args& a) {
    const auto begin = clock::now();
    sync_result r{.all = a.mine};
    if (in_buckets_) {
      if (!a.overlapped) {
        // No backward started the buckets (the batch policy ran none with last = true, as
        // batch::adaptive, whose re-runs after an allocation failure must not find them sent):
        // they all go out now.
        reducer_.begin(ctx_.compute.grads());
      }
      // Buckets reduced by blocking calls inside backward: their time is communication, not
      // compute (those that finish() starts fall in this window anyway).
      r.blocked_in_backward = reducer_.blocked_seconds();
      reducer_.finish();
    } else if constexpr (hierarchical) {
      reduce_hierarchical();
    } else if constexpr (ps || topk) {
      push(a);
    }
    ctx_.precision.round(ctx_.compute.grads());  // the average, stored in the compute type
    // The step's loss, accuracy and samples over every rank (asynchronous parameter server:
    // this worker's own, the workers do not wait for each other).
    if (!async_) {
      r.all = local_executor::synchronize(a).all;
    }
    r.comm_seconds =
        std::chrono::duration<double>(clock::now() - begin).count() + r.blocked_in_backward;
    return r;
  }

  bool any_rank_nonfinite(bool local) {
    if (dedicated_) {
      return !pending_finite_;  // the workers decided before the push
    }
    return local_executor::any_rank_nonfinite(local);
  }

  // This rank's shard of the flat parameters: all of them unless sharded; none on a rank that
  // is not a parameter server.
  std::pair<std::size_t, std::size_t> owned() const noexcept {
    return {shard_begin(), shard_size()};
  }

  void update(double lr) {
    update_shard(ctx_.optimizer, ctx_.master, state_.span(), shard_begin(), shard_size(), lr);
    const std::span<float> values = ctx_.master.values();
    if constexpr (sharded) {
      group_->all_gather(values.data() + shard_begin(), values.data(), shard_size(),
                         dtype::float32);
    } else if constexpr (ps) {
      ps_->pull(values);
    }
  }

  void skipped() {
    if (async_) {
      ps_->pull(ctx_.master.values());  // the servers answered the skip with the parameters
    }
    if constexpr (topk) {
      if (ctx_.precision.skips_steps) {
        std::copy(residual_backup_.begin(), residual_backup_.end(), topk_->residual().begin());
      }
    }
  }

  // Collective. The optimizer state as one blob (every rank's shard in rank order when sharded),
  // and top-k's residuals; dedicated servers send theirs to worker 0 (asynchronous: with the
  // parameters as they hold them now, into the master's values).
  std::vector<state_blob> state_blobs(std::uint64_t step) {
    std::span<const float> state_values = std::as_const(state_).span();
    if constexpr (sharded) {
      // Rank 0 writes every rank's shard of the optimizer state, in rank order.
      all_shards_ = buffer<float>(state_.size() * static_cast<std::size_t>(group_->size()));
      group_->all_gather(state_.data(), all_shards_.data(), state_.size(), dtype::float32);
      state_values = std::as_const(all_shards_).span();
    } else if constexpr (ps) {
      const int count = shards(cfg(), world_size());
      const std::size_t per = per_server();
      if (dedicated_) {
        if (group_->rank() == 0) {
          all_shards_ = gather_server_state(*world_, *ps_, step, per, async_, ctx_.master.values());
          state_values = std::as_const(all_shards_).span();
        }
      } else if (group_->rank() == 0) {
        // The servers send their shards of the optimizer state to rank 0 (a server).
        all_shards_ = buffer<float>(per * static_cast<std::size_t>(count));
        std::copy(state_.span().begin(), state_.span().end(), all_shards_.span().begin());
        for (int s = 1; s < count; ++s) {
          group_->recv(all_shards_.data() + static_cast<std::size_t>(s) * per, per, dtype::float32,
                       s, server_state_tag);
        }
        state_values = std::as_const(all_shards_).span();
      } else if (group_->rank() < count) {
        group_->send(state_.data(), per, dtype::float32, 0, server_state_tag);
      }
    }
    std::vector<state_blob> blobs = {
        {.name = state_sharded ? "optimizer.shards.bin" : "rank-0.optimizer.bin",
         .bytes = std::as_bytes(state_values)}};
    if constexpr (topk) {
      // Every rank's top-k residual, in rank order.
      const std::span<const float> mine = std::as_const(*topk_).residual();
      all_residuals_ = buffer<float>(mine.size() * static_cast<std::size_t>(group_->size()));
      group_->all_gather(mine.data(), all_residuals_.data(), mine.size(), dtype::float32);
      blobs.push_back({.name = "topk_residual.ranks.bin",
                       .bytes = std::as_bytes(std::as_const(all_residuals_).span())});
    }
    return blobs;
  }

  void restore(const blob_reader& read) {
    if constexpr (state_sharded) {
      // Each rank that holds a shard takes its own.
      const std::size_t per = per_server();
      buffer<float> all(per * static_cast<std::size_t>(shards(cfg(), world_size())));
      read("optimizer.shards.bin", all.span());
      if (state_.size() > 0) {  // not on a worker beside dedicated servers
        const std::span<const float> mine = std::as_const(all).span().subspan(
            static_cast<std::size_t>(group_->rank()) * per, state_.size());
        std::copy(mine.begin(), mine.end(), state_.span().begin());
      }
    } else {
      local_executor::restore(read);
    }
    if constexpr (topk) {
      if (!dedicated_server_) {
        const std::span<float> mine = topk_->residual();
        buffer<float> all(mine.size() * static_cast<std::size_t>(group_->size()));
        read("topk_residual.ranks.bin", all.span());
        const std::span<const float> saved = std::as_const(all).span().subspan(
            static_cast<std::size_t>(group_->rank()) * mine.size(), mine.size());
        std::copy(saved.begin(), saved.end(), mine.begin());
      }
    }
  }

  void end_fit(std::uint64_t step) {
    if constexpr (ps) {
      if (dedicated_ && (async_ || group_->rank() == 0)) {
        send_to_servers(*world_, *ps_, server_command::finish, step, 0.0, 1.0);
      }
    }
  }

  // An asynchronous parameter server: the most steps a worker was let lead the slowest by (at
  // most parameter_server_staleness); 0 elsewhere.
  std::uint64_t max_lead() const noexcept { return max_lead_; }

  // compress::topk: this rank's error-feedback residual (unscaled; what was not sent yet).
  std::span<const float> topk_residual() const noexcept requires topk {
    return std::as_const(*topk_).residual();
  }

 private:
  // Every rank of the job (the communicator before dedicated servers split it by role).
  int world_size() const noexcept { return world_ ? world_->size() : group_->size(); }

  std::size_t shard_size() const noexcept {
    if constexpr (state_sharded) {
      const int count = shards(cfg(), world_size());
      if (dedicated_) {
        // A dedicated server's group spans the servers: its rank there is its shard.
        return dedicated_server_ ? ctx_.master.size() / static_cast<std::size_t>(count) : 0;
      }
      return group_->rank() < count ? ctx_.master.size() / static_cast<std::size_t>(count) : 0;
    } else {
      return ctx_.master.size();
    }
  }
  std::size_t shard_begin() const noexcept {
    return state_sharded ? static_cast<std::size_t>(group_->rank()) * shard_size() : 0;
  }
  // The optimizer state of one shard (of a rank that holds one).
  std::size_t per_server() const noexcept {
    return ctx_.master.size() / static_cast<std::size_t>(shards(cfg(), world_size())) *
           ctx_.optimizer.state_per_parameter();
  }

  // The whole gradient through hierarchical_all_reduce, after backward.
  void reduce_hierarchical() {
    const std::span<float> grads = ctx_.compute.grads();
    if constexpr (wire == dtype::float32) {
      comm::hierarchical_all_reduce(*groups_, grads, comm::reduce_op::avg);
    } else {
      // compress::cast<T>: the average travels as T (every hop adds in float and rounds to T),
      // and comes back into float32.
      std::uint16_t* w = hierarchy_wire_.data();
      convert_floats(grads.data(), w, grads.size(), wire);
      comm::hierarchical_all_reduce(*groups_, w, w, grads.size(), wire, comm::reduce_op::avg,
                                    {.narrow_floats = comm::narrow_float_mode::in_type});
      convert_floats(w, grads.data(), grads.size(), wire);
    }
  }

  // Parameter server: each server's shard of the gradients becomes the average. All-gather of
  // top-k: every rank's gradients become the average.
  void push(const sync_args& a) {
    const std::span<float> grads = ctx_.compute.grads();
    ctx_.precision.round(grads);
    if constexpr (topk) {
      if (ctx_.precision.skips_steps) {
        // A skipped step must not consume the residual: kept to put back.
        const std::span<const float> r = std::as_const(*topk_).residual();
        residual_backup_.assign(r.begin(), r.end());
      }
    }
    bool send = true;
    if constexpr (ps) {
      if (dedicated_) {
        // Dedicated servers see only the average: the workers decide first whether the step
        // applies, and tell the servers what to do.
        bool finite = true;
        if (ctx_.precision.skips_steps) {
          finite = ctx_.precision.finite(grads);
          if (!async_) {
            finite = !precision::any_rank_overflowed(*group_, !finite);
          }
        }
        pending_finite_ = finite;
        send = finite;
        if (async_) {
          // Asynchronous: every worker announces its own step, a push or (its own gradients not
          // finite) a skip; either way the servers count the step and reply with the
          // parameters.
          send_to_servers(*world_, *ps_, finite ? server_command::step : server_command::skip,
                          a.step, a.lr, a.loss_scale);
        } else if (send && group_->rank() == 0) {
          send_to_servers(*world_, *ps_, server_command::step, a.step, a.lr, a.loss_scale);
        }
      }
    }
    if (!send) {
      return;
    }
    if constexpr (topk) {
      if constexpr (ps) {
        ps_->push_topk(*topk_, grads, static_cast<float>(a.loss_scale));
      } else {
        topk_all_gather(*group_, *topk_, grads, static_cast<float>(a.loss_scale), topk_mine_,
                        topk_all_);
      }
    } else {
      ps_->push(grads);
    }
  }

  std::optional<comm::any_comm> world_{};  // dedicated servers: every rank (group_ spans a role)
  std::optional<comm::hierarchy<comm::any_comm>> groups_{};  // hierarchical
  bucket_reducer reducer_{};
  bool in_buckets_ = false;
  buffer<std::uint16_t> hierarchy_wire_{};  // hierarchical, cast<T>, whole gradient: T's copy
  std::optional<ps_exchange> ps_{};         // parameter_server
  std::optional<topk_compressor> topk_{};   // compress::topk: the residual
  std::vector<float> residual_backup_{};    // topk: put back on a skipped step
  std::vector<std::int32_t> topk_mine_{}, topk_all_{};  // topk by all-gather: the pairs
  buffer<float> all_shards_{};     // state_blobs: every shard, on the rank that writes them
  buffer<float> all_residuals_{};  // state_blobs: every rank's top-k residual
  bool dedicated_ = false;         // parameter_server with dedicated_parameter_servers
  bool dedicated_server_ = false;  // ... and this rank is one of the servers
  bool pending_finite_ = true;     // dedicated: the workers' decision for the step being pushed
  bool async_ = false;             // dedicated and parameter_server_async
  std::uint64_t max_lead_ = 0;     // async server: the most steps a worker led the slowest by
};

static_assert(check_parallel_policy<data<>>());
static_assert(check_parallel_policy<zero1>());

}  // namespace strata::parallel
