// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the shipped data-parallel executors share (data_executor.hpp, ps/executor.hpp):
//   - synced_executor: the base over local_executor. It needs a communicator, resolves
//     bucket_launch for the backend (blocking_buckets), and frames synchronize(): the buckets
//     that backward started (or all of them now), else the executor's whole-gradient exchange;
//     then the average rounded through the compute type and the step's totals over group();
//   - topk_state: compress::topk's error-feedback residual as an executor keeps it: backed up
//     before a push and put back on a skipped step, saved as every rank's residual in rank order.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/memory.hpp"
#include "strata/model/param_store.hpp"
#include "strata/parallel/bucket_reducer.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/topk.hpp"

namespace strata::parallel {

class synced_executor : public local_executor {
  using clock = std::chrono::steady_clock;

 public:
  // `policy` names the parallel policy in the error without a communicator.
  synced_executor(const step_context& c, std::string_view policy) : local_executor(c) {
    if (c.comm == nullptr) {
      throw std::invalid_argument(std::string(policy) + ": needs a communicator");
    }
  }

  synced_executor(const synced_executor&) = delete;
  synced_executor& operator=(const synced_executor&) = delete;

  // Whether the gradient buckets are reduced by blocking calls inside backward: bucket_launch,
  // with auto resolved for the backend (comm::nonblocking_progresses).
  bool blocking_buckets() const noexcept {
    return cfg().bucket_launch == config::bucket_launch_kind::blocking ||
           (cfg().bucket_launch == config::bucket_launch_kind::automatic &&
            !group_->progresses_nonblocking());
  }

 protected:
  // After a step's last backward: the buckets (when begin_fit() made the reducer), else
  // `whole()`; the average stored in the compute type; the step's totals over group() unless
  // `own_totals` (a worker that does not wait for the others).
  template <class Whole>
  sync_result synchronize_with(const sync_args& a, Whole&& whole, bool own_totals = false) {
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
    } else {
      whole();
    }
    ctx_.precision.round(ctx_.compute.grads());  // the average, stored in the compute type
    if (!own_totals) {
      r.all = local_executor::synchronize(a).all;
    }
    r.comm_seconds =
        std::chrono::duration<double>(clock::now() - begin).count() + r.blocked_in_backward;
    return r;
  }

  // begin_fit()'s result: the reducer when the buckets go during backward, else null.
  bucket_reducer* reducer_or_null() noexcept { return in_buckets_ ? &reducer_ : nullptr; }

  bucket_reducer reducer_{};
  bool in_buckets_ = false;  // begin_fit() made reducer_ and backward starts it
};

// compress::topk's residual, as an executor keeps it.
class topk_state {
 public:
  // k counts the parameters, not the padding of a store cut into equal shards.
  void emplace(const model::param_store& master, double ratio) {
    std::size_t used = 0;
    for (const model::param_entry& e : master.entries()) {
      used = std::max(used, e.offset + e.spec.elements());
    }
    compressor_.emplace(master.size(), ratio, used);
  }
  topk_compressor& compressor() noexcept { return *compressor_; }
  std::span<const float> residual() const noexcept {
    return std::as_const(*compressor_).residual();
  }

  // Before a push: a skipped step must not consume the residual (`skips`: the precision policy
  // skips steps).
  void back_up(bool skips) {
    if (skips) {
      const std::span<const float> r = residual();
      backup_.assign(r.begin(), r.end());
    }
  }
  // On a skipped step: the residual as it was before the push.
  void put_back(bool skips) {
    if (skips) {
      std::copy(backup_.begin(), backup_.end(), compressor_->residual().begin());
    }
  }

  // Collective over `group`: every rank's residual, in rank order, as a checkpoint blob.
  state_blob blob(comm::any_comm& group) {
    const std::span<const float> mine = residual();
    all_ = buffer<float>(mine.size() * static_cast<std::size_t>(group.size()));
    group.all_gather(mine.data(), all_.data(), mine.size(), dtype::float32);
    return {.name = "topk_residual.ranks.bin", .bytes = std::as_bytes(std::as_const(all_).span())};
  }
  // This rank's residual from the blob of every rank's (rank `rank` of `ranks`).
  void restore(const blob_reader& read, int rank, int ranks) {
    const std::span<float> mine = compressor_->residual();
    buffer<float> all(mine.size() * static_cast<std::size_t>(ranks));
    read("topk_residual.ranks.bin", all.span());
    const std::span<const float> saved = std::as_const(all).span().subspan(
        static_cast<std::size_t>(rank) * mine.size(), mine.size());
    std::copy(saved.begin(), saved.end(), mine.begin());
  }

 private:
  std::optional<topk_compressor> compressor_{};
  std::vector<float> backup_{};
  buffer<float> all_{};  // blob(): every rank's residual
};

}  // namespace strata::parallel
