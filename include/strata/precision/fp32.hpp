// SPDX-License-Identifier: Apache-2.0
#pragma once

// precision::fp32: parameters, activations and gradients in float32; the model runs on the
// master parameters, no loss scale. A step whose gradients hold a NaN or an inf on any rank is
// skipped on every rank (parameters and optimizer state untouched), and training stops after
// loss_scale_max_skips such steps in a row. The trainer's default precision policy (the
// contract: precision/concepts.hpp).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/policy.hpp"
#include "strata/model/param_store.hpp"
#include "strata/precision/concepts.hpp"
#include "strata/precision/loss_scaler.hpp"

namespace strata::precision {

struct fp32 {
  using policy_category = precision_policy_tag;
  static constexpr std::string_view name = "fp32";
  static constexpr dtype compute_dtype = dtype::float32;
  static constexpr bool has_compute_copy = false;
  static constexpr bool scales_loss = false;
  static constexpr bool skips_steps = true;

  explicit fp32(const config::train_config& cfg) noexcept
      : max_skips_(static_cast<std::uint64_t>(cfg.loss_scale_max_skips)) {}
  static void check_config(const config::train_config& cfg) {
    refuse_foreign_keys(cfg, name, {.computes = dtype::float32, .stops_after_skips = true});
  }

  template <class Make>
  void prepare(Make&&) noexcept {}
  model::param_store& compute(model::param_store& master) const noexcept { return master; }
  void refresh(const model::param_store&) const noexcept {}

  void store(std::span<float>) const noexcept {}
  double loss_scale() const noexcept { return 1.0; }

  // The gradients are the master's already: checked (unless the trainer knows them finite),
  // and every rank follows the vote.
  template <class Vote>
  bool finish(std::uint64_t step, std::span<const float> grads, std::span<float>, Vote&& vote,
              gradient_facts facts = {}) {
    const bool local_nonfinite = !facts.certainly_finite && !all_finite(grads);
    if (!std::forward<Vote>(vote)(local_nonfinite)) {
      nonfinite_in_a_row_ = 0;
      return true;
    }
    if (++nonfinite_in_a_row_ >= max_skips_) {
      throw error("fp32: the gradients were not finite on " + std::to_string(nonfinite_in_a_row_) +
                  " consecutive steps (steps " + std::to_string(step + 1 - nonfinite_in_a_row_) +
                  " to " + std::to_string(step) +
                  "), aborting (loss_scale_max_skips); lower the learning rate or check the data "
                  "and the loss for NaN");
    }
    return false;
  }
  bool to_master(std::span<float> grads, double) const noexcept { return all_finite(grads); }
  bool finite(std::span<const float> grads) const noexcept { return all_finite(grads); }

  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) noexcept {}

 private:
  std::uint64_t max_skips_;
  std::uint64_t nonfinite_in_a_row_ = 0;
};

}  // namespace strata::precision
