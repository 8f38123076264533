// SPDX-License-Identifier: Apache-2.0
#pragma once

// A precision policy written outside the library: float32 that guards against a bad batch. A
// step whose gradients are not finite on any rank is skipped on every rank (the parameters and
// the optimizer state stay as they were), and loss_scale_max_skips such steps in a row stop
// training with an error. The model runs on the master parameters. It behaves as the shipped
// precision::fp32 does, written from the contract alone, as a user would.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "strata/precision/concepts.hpp"
#include "strata/precision/loss_scaler.hpp"

// snippet-begin: guarded
struct guarded_fp32 {
  using policy_category = strata::precision_policy_tag;
  static constexpr std::string_view name = "guarded_fp32";
  static constexpr strata::dtype compute_dtype = strata::dtype::float32;
  static constexpr bool has_compute_copy = false;
  static constexpr bool scales_loss = false;
  static constexpr bool skips_steps = true;

  explicit guarded_fp32(const strata::config::train_config& c)
      : max_skips_(static_cast<std::uint64_t>(c.loss_scale_max_skips)) {}
  static void check_config(const strata::config::train_config& c) {
    strata::precision::refuse_foreign_keys(c, name, {.stops_after_skips = true});
  }

  template <class Make>
  void prepare(Make&&) {}
  strata::model::param_store& compute(strata::model::param_store& master) { return master; }
  void refresh(const strata::model::param_store&) {}
  void store(std::span<float>) const {}
  double loss_scale() const { return 1.0; }

  template <class Vote>
  bool finish(std::uint64_t step, std::span<const float> grads, std::span<float>, Vote&& vote) {
    if (!vote(!strata::precision::all_finite(grads))) {  // every rank follows the vote
      in_a_row_ = 0;
      return true;
    }
    if (++in_a_row_ >= max_skips_) {
      throw strata::error("guarded_fp32: gradients not finite on " + std::to_string(in_a_row_) +
                          " steps in a row, up to step " + std::to_string(step));
    }
    return false;
  }
  bool to_master(std::span<float> grads, double) const {
    return strata::precision::all_finite(grads);
  }
  bool finite(std::span<const float> grads) const { return strata::precision::all_finite(grads); }

  nlohmann::json state() const { return {{"in_a_row", in_a_row_}}; }
  void restore(const nlohmann::json& j) {
    in_a_row_ = j.is_object() ? j.at("in_a_row").get<std::uint64_t>() : 0;
  }

 private:
  std::uint64_t max_skips_;
  std::uint64_t in_a_row_ = 0;
};
// snippet-end: guarded
