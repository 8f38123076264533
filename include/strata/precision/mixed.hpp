// SPDX-License-Identifier: Apache-2.0
#pragma once

// precision::mixed<T, Scaler>: mixed-precision training with float32 master weights.
//
//   strata::train::trainer<Model, strata::precision::bf16> run(model, config);
//   strata::train::trainer<Model, strata::precision::fp16> run(model, config);   // with scaler
//
// The parameters the optimizer updates stay float32 (the master copy). Every step:
//   1. the master parameters are cast to T into the compute copy the model runs on;
//   2. forward and backward store activations and input gradients in T (run_options.storage),
//      the loss is computed in float32 from the T logits, and its gradient is multiplied by the
//      loss scale (1 without a scaler);
//   3. the gradients are stored in T (float16: an overflow becomes inf), then unscaled into the
//      float32 master gradients and checked: an inf or NaN anywhere skips the step (parameters,
//      optimizer state and its step count stay bit for bit as they were) and backs the scale off;
//   4. the optimizer updates the master parameters in float32.
//
// T is strata::float16 or strata::bfloat16. float16's range ends at 65504 and its gradients
// underflow below 6e-8, so it needs a loss scaler: mixed<float16> without one does not compile.
// bfloat16 has float32's range and runs without one; a scaler may be given.
//
// On the host the layers get T as their storage type. bfloat16 products run in bfloat16 on
// oneDNN where the CPU has bfloat16 units (model/gemm.hpp, bf16_products); otherwise, and for
// float16, layers compute in float32 on values that hold exactly what T can hold, so the
// numerics are those of T storage with float32 accumulation. Memory is not saved on the host
// (it keeps the compute copy and its gradients in float buffers); estimate_memory reports both
// the host layout and a device's. On CUDA (its own issue) the same policy is for speed.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/policy.hpp"
#include "strata/core/round.hpp"
#include "strata/model/param_store.hpp"
#include "strata/precision/concepts.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/loss_scaler.hpp"

namespace strata::precision {

// "No loss scaler": the default second argument of mixed.
struct no_loss_scaler {};

template <class T, class Scaler = no_loss_scaler>
class mixed {
  static_assert(std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>,
                "precision::mixed<T>: T must be strata::float16 or strata::bfloat16");
  static_assert(!(std::is_same_v<T, float16> && std::is_same_v<Scaler, no_loss_scaler>),
                "precision::mixed<float16>: float16 needs a loss scaler (gradients overflow above "
                "65504 and underflow below 6e-8); write precision::mixed<strata::float16, "
                "precision::dynamic_loss_scaler> (precision::fp16), or use bfloat16");
  static_assert(std::is_same_v<Scaler, no_loss_scaler> ||
                    (std::is_constructible_v<Scaler, loss_scaler_config> &&
                     requires(Scaler & s, const loss_scaler_state& saved) {
                       { s.scale() } -> std::convertible_to<double>;
                       { s.update(true) } -> std::same_as<bool>;
                       { s.state() } -> std::convertible_to<loss_scaler_state>;
                       s.restore(saved);
                     }),
                "precision::mixed<T, Scaler>: Scaler must be constructible from a "
                "loss_scaler_config and offer scale(), update(bool) -> bool, state() and "
                "restore(loss_scaler_state), like precision::dynamic_loss_scaler");

 public:
  using policy_category = precision_policy_tag;
  using compute_type = T;
  using scaler_type = Scaler;
  static constexpr bool has_scaler = !std::is_same_v<Scaler, no_loss_scaler>;
  static constexpr dtype compute_dtype = dtype_of<T>;
  static constexpr bool has_compute_copy = true;
  static constexpr bool scales_loss = has_scaler;
  static constexpr bool skips_steps = true;
  static constexpr std::string_view name = std::is_same_v<T, float16>
                                               ? std::string_view("mixed<float16>")
                                               : std::string_view("mixed<bfloat16>");

  explicit mixed(const config::train_config& cfg)
      : max_skips_(static_cast<std::uint64_t>(cfg.loss_scale_max_skips)) {
    if constexpr (has_scaler) {
      scaler_.emplace(scaler_config(cfg));
    }
  }
  static void check_config(const config::train_config& cfg) {
    refuse_foreign_keys(
        cfg, name, {.computes = compute_dtype, .scaler = has_scaler, .stops_after_skips = true});
  }

  // The compute copy: a store laid out like the master (padded alike when sharded).
  template <class Make>
  void prepare(Make&& make_copy) {
    copy_ = std::forward<Make>(make_copy)();
  }
  model::param_store& compute(model::param_store&) noexcept { return copy_; }
  // The compute copy takes the master values rounded through T.
  void refresh(const model::param_store& master) {
    round_through(master.values(), copy_.values(), compute_dtype);
  }

  // The gradients as T holds them: accumulation over micro-steps rounds there, and a float16
  // gradient beyond 65504 becomes inf.
  void store(std::span<float> grads) const { round_through(grads, compute_dtype); }
  double loss_scale() const noexcept {
    if constexpr (has_scaler) {
      return scaler_->scale();
    } else {
      return 1.0;
    }
  }

  // Unscales the compute gradients into the master's and checks them; every rank follows the
  // vote. A skipped step leaves the master untouched; with a scaler the scale backs off (and
  // the scaler stops training after max_consecutive_skips), without one training stops after
  // loss_scale_max_skips non-finite steps in a row.
  template <class Vote>
  bool finish(std::uint64_t step, std::span<const float> compute_grads,
              std::span<float> master_grads, Vote&& vote) {
    const bool finite = unscale_and_check(compute_grads, master_grads, loss_scale());
    const bool overflow = std::forward<Vote>(vote)(!finite);
    bool apply = !overflow;
    if constexpr (has_scaler) {
      apply = scaler_->update(overflow);
    }
    if (!apply) {
      if constexpr (!has_scaler) {
        if (++nonfinite_in_a_row_ >= max_skips_) {
          throw error(std::string(name) + ": the gradients were not finite on " +
                      std::to_string(nonfinite_in_a_row_) + " consecutive steps (steps " +
                      std::to_string(step + 1 - nonfinite_in_a_row_) + " to " +
                      std::to_string(step) +
                      "), aborting (loss_scale_max_skips); lower the learning rate or check the "
                      "data and the loss for NaN");
        }
      }
      return false;
    }
    nonfinite_in_a_row_ = 0;
    return true;
  }
  // Gradients another rank computed at loss scale `scale` (a parameter server's shard): as T
  // holds them, unscaled and checked.
  bool to_master(std::span<float> grads, double scale) const {
    round_through(grads, compute_dtype);
    return unscale_and_check(grads, scale);
  }
  bool finite(std::span<const float> grads) const noexcept { return all_finite(grads); }

  nlohmann::json state() const {
    if constexpr (has_scaler) {
      return to_json(scaler_->state());
    } else {
      return nullptr;
    }
  }
  void restore(const nlohmann::json& j) {
    if constexpr (has_scaler) {
      if (!j.is_null()) {
        scaler_->restore(loss_scaler_state_from_json(j));
      }
    }
  }

  static loss_scaler_config scaler_config(const config::train_config& c) {
    return {.initial_scale = c.loss_scale_initial,
            .growth_factor = c.loss_scale_growth_factor,
            .backoff_factor = c.loss_scale_backoff_factor,
            .growth_interval = static_cast<std::uint64_t>(c.loss_scale_growth_interval),
            .hysteresis = static_cast<std::uint32_t>(c.loss_scale_hysteresis),
            .min_scale = c.loss_scale_min,
            .max_scale = loss_scaler_config{}.max_scale,
            .max_consecutive_skips = static_cast<std::uint32_t>(c.loss_scale_max_skips)};
  }

 private:
  struct no_scaler_state {};
  using scaler_slot =
      std::conditional_t<has_scaler, std::optional<Scaler>, std::optional<no_scaler_state>>;

  model::param_store copy_{};
  scaler_slot scaler_{};
  std::uint64_t max_skips_;
  std::uint64_t nonfinite_in_a_row_ = 0;
};

using fp16 = mixed<float16, dynamic_loss_scaler>;
using bf16 = mixed<bfloat16>;

// Whether any rank of `c` found an overflow: a max all-reduce of one int32 over every rank that
// holds parameters (data, tensor and pipeline groups alike), so that all of them take the same
// decision and call the scaler's update() with the same argument: they skip together and their
// scales stay equal.
template <comm::comm_backend_collectives Comm>
bool any_rank_overflowed(Comm& c, bool local_overflow) {
  std::int32_t flag = local_overflow ? 1 : 0;
  c.all_reduce(&flag, &flag, 1, dtype::int32, comm::reduce_op::max);
  return flag != 0;
}

}  // namespace strata::precision
