// SPDX-License-Identifier: Apache-2.0
#pragma once

// batch::accumulate: each optimizer step sums the gradients of gradient_accumulation_steps
// micro-batches of batch_size_per_gpu samples, then applies one update; only that last
// micro-step communicates (on several ranks). The step's gradient is the mean over all of its
// samples, so k micro-batches of B/k give the update of one batch of B, up to the order of the
// additions. (The contract: batch/concepts.hpp.)

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/batch/concepts.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/policy.hpp"

namespace strata::batch {

struct accumulate {
  using policy_category = batch_policy_tag;
  static constexpr std::string_view name = "accumulate";
  static constexpr bool frees_evaluation_memory = false;

  explicit accumulate(const config::train_config& cfg)
      : batch_(static_cast<std::size_t>(cfg.batch_size_per_gpu)),
        steps_(static_cast<std::size_t>(cfg.gradient_accumulation_steps)) {}
  static void check_config(const config::train_config& cfg) {
    refuse_foreign_keys(cfg, name, {.accumulation = true});
  }

  std::size_t loader_batch() const noexcept { return batch_; }
  std::size_t loader_batches(std::uint64_t) const noexcept { return steps_; }
  std::size_t micro_batch() const noexcept { return batch_; }

  template <step_runner R>
  void begin(R& runner) {
    runner.set_workspace(batch_);
  }
  // Each loader batch is one micro-batch; the step's last one communicates.
  template <step_runner R>
  model::loss_result run(R& runner, const samples& b, bool last) {
    return runner.micro_step(b, last);
  }

  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) noexcept {}

 private:
  std::size_t batch_;
  std::size_t steps_;
};

}  // namespace strata::batch
