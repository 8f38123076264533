// SPDX-License-Identifier: Apache-2.0
#pragma once

// A batch policy written outside the library: a batch-size ramp. The global batch grows from
// `Start` micro-batches per step to the configured gradient_accumulation_steps over the first
// `Steps` optimizer steps, linearly; each micro-batch has batch_size_per_gpu samples.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "strata/batch/concepts.hpp"

// snippet-begin: ramp
template <std::size_t Start = 1, std::uint64_t Steps = 100>
struct batch_ramp {
  using policy_category = strata::batch_policy_tag;
  static constexpr std::string_view name = "ramp";
  static constexpr bool frees_evaluation_memory = false;

  explicit batch_ramp(const strata::config::train_config& c)
      : micro_(static_cast<std::size_t>(c.batch_size_per_gpu)),
        full_(static_cast<std::size_t>(c.gradient_accumulation_steps)) {}
  static void check_config(const strata::config::train_config& c) {
    strata::batch::refuse_foreign_keys(c, name, {.accumulation = true});
    if (Start < 1 || static_cast<std::int64_t>(Start) > c.gradient_accumulation_steps) {
      throw strata::config_error({.key = "gradient_accumulation_steps"},
                                 "the ramp starts at " + std::to_string(Start) +
                                     " micro-batches per step and cannot grow to fewer");
    }
  }

  std::size_t loader_batch() const { return micro_; }
  std::size_t loader_batches(std::uint64_t step) const {
    return step >= Steps ? full_ : Start + (full_ - Start) * step / Steps;
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

  // The ramp follows the step number alone: nothing to keep.
  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) {}

 private:
  std::size_t micro_;
  std::size_t full_;
};
// snippet-end: ramp
