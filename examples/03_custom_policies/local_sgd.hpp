// SPDX-License-Identifier: Apache-2.0
#pragma once

// A user's parallel policy: local SGD. Each rank steps alone on its own copy of the parameters;
// every k steps ([policy] local_sgd_period) the ranks average them: one all-reduce per k steps.
// k = 1 with plain SGD trains like parallel::data<all_reduce>. Checkpoints hold every rank's
// parameters and optimizer state, so a resumed run continues each rank exactly.
#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "strata/config/policy_keys.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/executor.hpp"

struct local_sgd {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "local_sgd";
  static constexpr bool distributed = true;
  static constexpr std::array config_keys{strata::config::policy_key{
      "local_sgd_period", strata::config::policy_value::integer, "4", 1, 1e6,
      "Optimizer steps between two averages of the ranks' parameters."}};
  static void check_config(const strata::config::train_config& cfg, int world, int rank) {
    strata::parallel::refuse_foreign_keys({.distributed = true, .parallel = name}, cfg, world,
                                          rank);
  }

  class executor : public strata::parallel::local_executor {
   public:
    explicit executor(const strata::parallel::step_context& c)
        : local_executor(c),
          period_(static_cast<std::uint64_t>(strata::config::policy_int(c.cfg, config_keys[0]))) {}

    strata::parallel::sync_result synchronize(const strata::parallel::sync_args& a) {
      step_ = a.step;  // the gradients stay this rank's own; the totals are summed
      return local_executor::synchronize(a);
    }
    void update(double lr) {
      local_executor::update(lr);
      if ((step_ + 1) % period_ == 0) {
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
    std::uint64_t period_ = 1;
    std::uint64_t step_ = 0;
    std::vector<float> params_, states_;
  };
};
