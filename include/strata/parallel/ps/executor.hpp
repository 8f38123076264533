// SPDX-License-Identifier: Apache-2.0
#pragma once

// ps_executor<Policy>: the step executor (parallel/executor.hpp) of
// parallel::data<parameter_server, Compressor>. Servers hold shards of the parameters and of the
// optimizer state (parameter_servers of them; 0 = every rank):
//   - co-located servers (every server also trains): buckets pushed to the servers whose shards
//     they overlap as backward completes them (non-blocking launches), else the whole gradient
//     after backward; each server applies its shard's average and the workers pull the values;
//   - dedicated servers (dedicated_parameter_servers): the last ranks serve and do not train;
//     the workers decide whether the step applies before they push, and worker 0 tells the
//     servers what comes next (ps/server.hpp); asynchronous (parameter_server_async), every
//     worker pushes its own steps and is held back only past parameter_server_staleness;
//   - compress::topk: the pushed gradients are each rank's top-k with error feedback.
// The exchange is ps/exchange.hpp, the dedicated servers' loop ps/server.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/core/memory.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/ps/exchange.hpp"
#include "strata/parallel/ps/server.hpp"
#include "strata/parallel/synced_executor.hpp"
#include "strata/parallel/topk.hpp"

namespace strata::parallel {

template <class Policy>
class ps_executor : public synced_executor {
 public:
  static constexpr bool topk = is_topk<Policy>;

  // The optimizer state is cut into one shard per server (parameter_servers = 0: every rank).
  static int shards(const config::train_config& c, int world) {
    if (c.dedicated_parameter_servers) {
      return static_cast<int>(std::clamp<std::int64_t>(c.parameter_servers, 1, world));
    }
    return c.parameter_servers > 0
               ? static_cast<int>(std::min<std::int64_t>(c.parameter_servers, world))
               : world;
  }

  // Collective over the job's communicator (every rank already holds rank 0's parameters).
  explicit ps_executor(const step_context& c) : synced_executor(c, Policy::name) {
    dedicated_ = cfg().dedicated_parameter_servers;
    async_ = dedicated_ && cfg().parameter_server_async;
    dedicated_server_ =
        dedicated_ && group_->rank() >= group_->size() - shards(cfg(), group_->size());
    allocate_state(shard_size());
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
    if constexpr (topk) {
      topk_.emplace(ctx_.master, cfg().topk_ratio);
    }
  }

  bool serves() const noexcept { return dedicated_server_; }

  // A dedicated server: apply each step's average gradient to its shard and send the workers
  // the new values, until worker 0 says finish. Returns the steps done.
  std::uint64_t serve(std::uint64_t step) {
    server_context context{
        .world = *world_,
        .ps = *ps_,
        .topk = topk ? &topk_.compressor() : nullptr,
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
  }

  // The push goes per bucket to co-located servers with non-blocking launches; else whole,
  // after backward.
  bucket_reducer* begin_fit() {
    in_buckets_ = !topk && !dedicated_ && !blocking_buckets();
    if (in_buckets_) {
      reducer_ = bucket_reducer(
          *group_, *ps_,
          make_buckets(ctx_.compute, static_cast<std::size_t>(cfg().bucket_size_mb) << 20),
          ctx_.precision.compute);
    }
    return reducer_or_null();
  }

  // Each server's shard of the gradients becomes the average; the step's totals over the
  // workers (asynchronous: this worker's own, the workers do not wait for each other).
  sync_result synchronize(const sync_args& a) {
    return synchronize_with(
        a, [&] { push(a); }, async_);
  }

  bool any_rank_nonfinite(bool local) {
    if (dedicated_) {
      return !pending_finite_;  // the workers decided before the push
    }
    return local_executor::any_rank_nonfinite(local);
  }

  // This rank's shard of the flat parameters; none on a rank that is not a server.
  std::pair<std::size_t, std::size_t> owned() const noexcept {
    return {shard_begin(), shard_size()};
  }

  void update(double lr) {
    update_shard(ctx_.optimizer, ctx_.master, state_.span(), shard_begin(), shard_size(), lr);
    ps_->pull(ctx_.master.values());
  }

  void skipped() {
    if (async_) {
      ps_->pull(ctx_.master.values());  // the servers answered the skip with the parameters
    }
    if constexpr (topk) {
      topk_.put_back(ctx_.precision.skips_steps);
    }
  }

  // Collective. The servers' shards of the optimizer state as one blob in server order, and
  // top-k's residuals; dedicated servers send theirs to worker 0 (asynchronous: with the
  // parameters as they hold them now, into the master's values).
  std::vector<state_blob> state_blobs(std::uint64_t step) {
    std::span<const float> state_values = std::as_const(state_).span();
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
        group_->recv(all_shards_.data() + static_cast<std::size_t>(s) * per, per, dtype::float32, s,
                     server_state_tag);
      }
      state_values = std::as_const(all_shards_).span();
    } else if (group_->rank() < count) {
      group_->send(state_.data(), per, dtype::float32, 0, server_state_tag);
    }
    std::vector<state_blob> blobs = {
        {.name = "optimizer.shards.bin", .bytes = std::as_bytes(state_values)}};
    if constexpr (topk) {
      blobs.push_back(topk_.blob(*group_));
    }
    return blobs;
  }

  void restore(const blob_reader& read) {
    // Each rank that holds a shard takes its own.
    const std::size_t per = per_server();
    buffer<float> all(per * static_cast<std::size_t>(shards(cfg(), world_size())));
    read("optimizer.shards.bin", all.span());
    if (state_.size() > 0) {  // not on a worker beside dedicated servers
      const std::span<const float> mine = std::as_const(all).span().subspan(
          static_cast<std::size_t>(group_->rank()) * per, state_.size());
      std::copy(mine.begin(), mine.end(), state_.span().begin());
    }
    if constexpr (topk) {
      if (!dedicated_server_) {
        topk_.restore(read, group_->rank(), group_->size());
      }
    }
  }

  // "optimizer.shards.bin": every server's shard in server order (top-k's residuals are per
  // rank: not described, so such a checkpoint resumes under its own layout only).
  std::vector<optimizer_blob> optimizer_blobs() const {
    const auto count = static_cast<std::size_t>(shards(cfg(), world_size()));
    const std::size_t size = ctx_.master.size() / count;
    optimizer_blob b{.name = "optimizer.shards.bin", .shards = {}};
    for (std::size_t s = 0; s < count; ++s) {
      b.shards.emplace_back(s * size, size);
    }
    return {b};
  }

  void end_fit(std::uint64_t step) {
    if (dedicated_ && (async_ || group_->rank() == 0)) {
      send_to_servers(*world_, *ps_, server_command::finish, step, 0.0, 1.0);
    }
  }

  // Asynchronous dedicated servers: the most steps a worker was let lead the slowest by (at
  // most parameter_server_staleness); 0 elsewhere.
  std::uint64_t max_lead() const noexcept { return max_lead_; }

  // compress::topk: this rank's error-feedback residual (unscaled; what was not sent yet).
  std::span<const float> topk_residual() const noexcept requires topk { return topk_.residual(); }

 private:
  // Every rank of the job (the communicator before dedicated servers split it by role).
  int world_size() const noexcept { return world_ ? world_->size() : group_->size(); }

  std::size_t shard_size() const noexcept {
    const int count = shards(cfg(), world_size());
    if (dedicated_) {
      // A dedicated server's group spans the servers: its rank there is its shard.
      return dedicated_server_ ? ctx_.master.size() / static_cast<std::size_t>(count) : 0;
    }
    return group_->rank() < count ? ctx_.master.size() / static_cast<std::size_t>(count) : 0;
  }
  std::size_t shard_begin() const noexcept {
    return static_cast<std::size_t>(group_->rank()) * shard_size();
  }
  // The optimizer state of one shard (of a rank that holds one).
  std::size_t per_server() const noexcept {
    return ctx_.master.size() / static_cast<std::size_t>(shards(cfg(), world_size())) *
           ctx_.optimizer.state_per_parameter();
  }

  // Each server's shard of the gradients becomes the average.
  void push(const sync_args& a) {
    const std::span<float> grads = ctx_.compute.grads();
    ctx_.precision.round(grads);
    if constexpr (topk) {
      topk_.back_up(ctx_.precision.skips_steps);
    }
    if (dedicated_ && !announce(a, grads)) {
      return;
    }
    if constexpr (topk) {
      ps_->push_topk(topk_.compressor(), grads, static_cast<float>(a.loss_scale));
    } else {
      ps_->push(grads);
    }
  }

  // Dedicated servers see only the average: the workers decide first whether the step applies,
  // and tell the servers what to do. Returns whether this worker pushes.
  bool announce(const sync_args& a, std::span<const float> grads) {
    bool finite = true;
    if (ctx_.precision.skips_steps) {
      finite = ctx_.precision.finite(grads);
      if (!async_) {
        finite = !precision::any_rank_overflowed(*group_, !finite);
      }
    }
    pending_finite_ = finite;
    if (async_) {
      // Every worker announces its own step, a push or (its own gradients not finite) a skip;
      // either way the servers count the step and reply with the parameters.
      send_to_servers(*world_, *ps_, finite ? server_command::step : server_command::skip, a.step,
                      a.lr, a.loss_scale);
    } else if (finite && group_->rank() == 0) {
      send_to_servers(*world_, *ps_, server_command::step, a.step, a.lr, a.loss_scale);
    }
    return finite;
  }

  std::optional<comm::any_comm> world_{};  // dedicated servers: every rank (group_ spans a role)
  std::optional<ps_exchange> ps_{};
  topk_state topk_{};              // compress::topk
  buffer<float> all_shards_{};     // state_blobs: every shard, on the rank that writes them
  bool dedicated_ = false;         // dedicated_parameter_servers
  bool dedicated_server_ = false;  // ... and this rank is one of the servers
  bool pending_finite_ = true;     // dedicated: the workers' decision for the step being pushed
  bool async_ = false;             // dedicated and parameter_server_async
  std::uint64_t max_lead_ = 0;     // async server: the most steps a worker led the slowest by
};

}  // namespace strata::parallel
