// SPDX-License-Identifier: Apache-2.0
#pragma once

// batch::fixed: every step takes batch_size_per_gpu samples per rank in one micro-batch and
// applies the update. The trainer's default batch policy (the contract: batch/concepts.hpp).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/batch/concepts.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/policy.hpp"

namespace strata::batch {

struct fixed {
  using policy_category = batch_policy_tag;
  static constexpr std::string_view name = "fixed";
  static constexpr bool frees_evaluation_memory = false;

  explicit fixed(const config::train_config& cfg)
      : batch_(static_cast<std::size_t>(cfg.batch_size_per_gpu)) {}
  static void check_config(const config::train_config& cfg) { refuse_foreign_keys(cfg, name, {}); }

  std::size_t loader_batch() const noexcept { return batch_; }
  std::size_t loader_batches(std::uint64_t) const noexcept { return 1; }
  std::size_t micro_batch() const noexcept { return batch_; }

  template <step_runner R>
  void begin(R& runner) {
    runner.set_workspace(batch_);
  }
  template <step_runner R>
  model::loss_result run(R& runner, const samples& b, bool last) {
    return runner.micro_step(b, last);
  }

  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) noexcept {}

 private:
  std::size_t batch_;
};

}  // namespace strata::batch
