// SPDX-License-Identifier: Apache-2.0
#pragma once

// precision::fp32: parameters, activations and gradients in float32; the model runs on the
// master parameters, no loss scale, every step applied. The trainer's default precision policy
// (the contract: precision/concepts.hpp).

#include <cstdint>
#include <span>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/policy.hpp"
#include "strata/model/param_store.hpp"
#include "strata/precision/concepts.hpp"

namespace strata::precision {

struct fp32 {
  using policy_category = precision_policy_tag;
  static constexpr std::string_view name = "fp32";
  static constexpr dtype compute_dtype = dtype::float32;
  static constexpr bool has_compute_copy = false;
  static constexpr bool scales_loss = false;
  static constexpr bool skips_steps = false;

  explicit fp32(const config::train_config&) noexcept {}
  static void check_config(const config::train_config& cfg) {
    refuse_foreign_keys(cfg, name, {.computes = dtype::float32});
  }

  template <class Make>
  void prepare(Make&&) noexcept {}
  model::param_store& compute(model::param_store& master) const noexcept { return master; }
  void refresh(const model::param_store&) const noexcept {}

  void store(std::span<float>) const noexcept {}
  double loss_scale() const noexcept { return 1.0; }

  // Every step applies; the gradients are the master's already.
  template <class Vote>
  bool finish(std::uint64_t, std::span<const float>, std::span<float>, Vote&&) const noexcept {
    return true;
  }
  bool to_master(std::span<float>, double) const noexcept { return true; }
  bool finite(std::span<const float>) const noexcept { return true; }

  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) noexcept {}
};

}  // namespace strata::precision
