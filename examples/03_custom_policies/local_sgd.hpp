// SPDX-License-Identifier: Apache-2.0
#pragma once

// A user's parallel policy: local SGD. Each rank applies its own gradients to its own copy of
// the parameters; every Period steps the ranks average their parameters. Less communication than
// averaging gradients every step (one all-reduce of the parameters per Period steps); Period 1
// with plain SGD trains like parallel::data<all_reduce>. Checkpoints hold every rank's parameters
// and optimizer state, so a resumed run continues each rank exactly.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/policy.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/executor.hpp"

template <std::uint64_t Period = 4>
struct local_sgd {
  static_assert(Period >= 1, "local_sgd<Period>: Period must be at least 1");
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "local_sgd";
  static constexpr bool distributed = true;
  static void check_config(const strata::config::train_config& cfg, int world, int rank) {
    strata::parallel::refuse_foreign_keys({.distributed = true, .parallel = name}, cfg, world,
                                          rank);
  }

  class executor : public strata::parallel::local_executor {
   public:
    using local_executor::local_executor;

    strata::parallel::sync_result synchronize(const strata::parallel::sync_args& a) {
      step_ = a.step;  // the gradients stay this rank's own; the totals are summed
      return local_executor::synchronize(a);
    }
    void update(double lr) {
      local_executor::update(lr);
      if ((step_ + 1) % Period == 0) {
        const std::span<float> p = ctx_.master.values();
        group_->all_reduce(p.data(), p.data(), p.size(), strata::dtype::float32,
                           strata::comm::reduce_op::avg);
      }
    }
    // Every rank's parameters and optimizer state, in rank order (rank 0 writes them).
    std::vector<strata::parallel::state_blob> state_blobs(std::uint64_t) {
      gather(ctx_.master.values(), params_);
      gather(state_.span(), states_);
      return {
          {.name = "local_sgd.params.ranks.bin", .bytes = std::as_bytes(std::span(params_))},
          {.name = "local_sgd.optimizer.ranks.bin", .bytes = std::as_bytes(std::span(states_))}};
    }
    void restore(const strata::parallel::blob_reader& read) {
      scatter(read, "local_sgd.params.ranks.bin", ctx_.master.values(), params_);
      scatter(read, "local_sgd.optimizer.ranks.bin", state_.span(), states_);
    }

   private:
    void gather(std::span<const float> mine, std::vector<float>& all) {
      all.resize(mine.size() * static_cast<std::size_t>(group_->size()));
      group_->all_gather(mine.data(), all.data(), mine.size(), strata::dtype::float32);
    }
    void scatter(const strata::parallel::blob_reader& read, std::string_view blob,
                 std::span<float> mine, std::vector<float>& all) {
      all.resize(mine.size() * static_cast<std::size_t>(group_->size()));
      read(blob, all);
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(
                                           mine.size() * static_cast<std::size_t>(group_->rank()));
      std::copy(first, first + static_cast<std::ptrdiff_t>(mine.size()), mine.begin());
    }
    std::uint64_t step_ = 0;
    std::vector<float> params_, states_;
  };
};
