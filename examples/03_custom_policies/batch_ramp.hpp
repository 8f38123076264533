// SPDX-License-Identifier: Apache-2.0
#pragma once

// A user's batch policy: the global batch grows linearly from [policy] ramp_start micro-batches
// per step to gradient_accumulation_steps over the first ramp_steps steps (batch_ramp.hpp).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "strata/batch/concepts.hpp"
#include "strata/config/policy_keys.hpp"

// snippet-begin: ramp
struct batch_ramp {
  using policy_category = strata::batch_policy_tag;
  static constexpr std::string_view name = "ramp";
  static constexpr bool frees_evaluation_memory = false;
  using key = strata::config::policy_key;
  static constexpr auto integer = strata::config::policy_value::integer;
  static constexpr std::array config_keys{
      key{"ramp_start", integer, "1", 1, 1 << 16, "Micro-batches per step at step 0."},
      key{"ramp_steps", integer, "100", 1, 1e9, "Steps until the full batch."}};

  explicit batch_ramp(const strata::config::train_config& c)
      : micro_(static_cast<std::size_t>(c.batch_size_per_gpu)),
        full_(static_cast<std::size_t>(c.gradient_accumulation_steps)),
        start_(static_cast<std::size_t>(strata::config::policy_int(c, config_keys[0]))),
        steps_(static_cast<std::size_t>(strata::config::policy_int(c, config_keys[1]))) {}
  static void check_config(const strata::config::train_config& c) {
    strata::batch::refuse_foreign_keys(c, name, {.accumulation = true});
    if (strata::config::policy_int(c, config_keys[0]) > c.gradient_accumulation_steps) {
      throw strata::config_error({.key = "policy.ramp_start"},
                                 "the ramp cannot start above gradient_accumulation_steps");
    }
  }

  std::size_t loader_batch() const { return micro_; }
  std::size_t loader_batches(std::uint64_t step) const {
    return step >= steps_ ? full_ : start_ + (full_ - start_) * step / steps_;
  }
  std::size_t micro_batch() const { return micro_; }

  template <strata::batch::step_runner R>
  void begin(R& runner) {
    runner.set_workspace(micro_);
  }
  template <strata::batch::step_runner R>
  strata::model::loss_result run(R& runner, const strata::batch::samples& b, bool last) {
    return runner.micro_step(b, last);  // one micro-batch per loader batch
  }

  nlohmann::json state() const { return nullptr; }  // the ramp follows the step alone
  void restore(const nlohmann::json&) {}

 private:
  std::size_t micro_, full_, start_, steps_;
};
// snippet-end: ramp
