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

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "strata/comm/concepts.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/policy.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/loss_scaler.hpp"

namespace strata::precision {

// "No loss scaler": the default second argument of mixed.
struct no_loss_scaler {};

template <class T, class Scaler = no_loss_scaler>
struct mixed {
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

  using policy_category = precision_policy_tag;
  using compute_type = T;
  using scaler_type = Scaler;
  static constexpr bool has_scaler = !std::is_same_v<Scaler, no_loss_scaler>;
  static constexpr dtype compute_dtype = dtype_of<T>;
  static constexpr std::string_view name = std::is_same_v<T, float16>
                                               ? std::string_view("mixed<float16>")
                                               : std::string_view("mixed<bfloat16>");
};

using fp16 = mixed<float16, dynamic_loss_scaler>;
using bf16 = mixed<bfloat16>;

// What the trainer asks of a precision policy.
template <class P>
struct precision_traits {
  static constexpr bool is_mixed = false;
  static constexpr bool has_scaler = false;
  static constexpr dtype compute_dtype = dtype::float32;
};

template <class T, class Scaler>
struct precision_traits<mixed<T, Scaler>> {
  static constexpr bool is_mixed = true;
  static constexpr bool has_scaler = mixed<T, Scaler>::has_scaler;
  static constexpr dtype compute_dtype = mixed<T, Scaler>::compute_dtype;
};

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
