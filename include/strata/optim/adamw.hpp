// SPDX-License-Identifier: Apache-2.0
#pragma once

// adamw: Adam with decoupled weight decay (Loshchilov & Hutter), the update of PyTorch's
// torch.optim.AdamW. With t = step_count() (begin_step() increments it before the ranges of a
// step, so the first step has t = 1):
//
//   p = p - lr * weight_decay * p        (only for ranges with update_args::weight_decay)
//   m = beta1 * m + (1 - beta1) * g      (state slot 0: state[i])
//   v = beta2 * v + (1 - beta2) * g^2    (state slot 1: state[n + i] for a range of n)
//   p = p - lr * mhat / (sqrt(vhat) + eps),  mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t)
//
// The moments start at zero (the caller zero-fills a fresh state buffer). The bias-correction
// factors, lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t), and the decay factor 1 - lr * wd are
// computed in double once per call and rounded to float; the per-element arithmetic is float,
// as p * decay - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps). The update is
// elementwise and reads no mutable optimizer state besides the step count, so any split of the
// parameters into ranges, updated in any order or concurrently, gives the same bits (within one
// build). Resuming needs the state buffer and step_count(): set_step_count() restores the count.

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <Eigen/Core>

#include "strata/core/format.hpp"
#include "strata/optim/concepts.hpp"

namespace strata::optim {

struct adamw_config {
  double beta1 = 0.9;          // [0, 1)
  double beta2 = 0.999;        // [0, 1)
  double eps = 1e-8;           // > 0, finite
  double weight_decay = 0.01;  // decoupled, >= 0, finite

  friend bool operator==(const adamw_config&, const adamw_config&) = default;
};

inline std::string to_string(const adamw_config& c) {
  const auto number = [](double value) { return format_shortest(value); };
  return "adamw_config{.beta1 = " + number(c.beta1) + ", .beta2 = " + number(c.beta2) +
         ", .eps = " + number(c.eps) + ", .weight_decay = " + number(c.weight_decay) + "}";
}

class adamw {
 public:
  using optimizer_category = optimizer_tag;

  explicit adamw(adamw_config config = {}) : config_(config) {
    if (!(config_.beta1 >= 0.0 && config_.beta1 < 1.0)) {
      throw std::invalid_argument("adamw: adamw_config.beta1 must be in [0, 1), got " +
                                  to_string(config_));
    }
    if (!(config_.beta2 >= 0.0 && config_.beta2 < 1.0)) {
      throw std::invalid_argument("adamw: adamw_config.beta2 must be in [0, 1), got " +
                                  to_string(config_));
    }
    if (!(config_.eps > 0.0 && std::isfinite(config_.eps))) {
      throw std::invalid_argument("adamw: adamw_config.eps must be finite and > 0, got " +
                                  to_string(config_));
    }
    if (!(config_.weight_decay >= 0.0 && std::isfinite(config_.weight_decay))) {
      throw std::invalid_argument("adamw: adamw_config.weight_decay must be finite and >= 0, got " +
                                  to_string(config_));
    }
  }

  const adamw_config& config() const noexcept { return config_; }

  // 2 floats per parameter: the first moment m (slot 0) and the second moment v (slot 1).
  std::size_t state_per_parameter() const noexcept { return 2; }

  void begin_step() noexcept { ++step_; }
  std::uint64_t step_count() const noexcept { return step_; }
  void set_step_count(std::uint64_t n) noexcept { step_ = n; }

  // Updates one range; throws std::invalid_argument if grads or state do not match params, and
  // std::logic_error before the first begin_step() (t = 0 has no bias correction).
  void update(const update_args& args) const {
    const std::size_t n = args.params.size();
    if (args.grads.size() != n) {
      throw std::invalid_argument("adamw: update_args.grads has " +
                                  std::to_string(args.grads.size()) + " floats for " +
                                  std::to_string(n) + " params");
    }
    if (args.state.size() != 2 * n) {
      throw std::invalid_argument("adamw: update_args.state has " +
                                  std::to_string(args.state.size()) + " floats, expected " +
                                  std::to_string(2 * n));
    }
    if (step_ == 0) {
      throw std::logic_error("adamw: update before the first begin_step()");
    }
    const auto t = static_cast<double>(step_);
    const double correction1 = 1.0 - std::pow(config_.beta1, t);
    const double correction2 = 1.0 - std::pow(config_.beta2, t);
    const auto step_size = static_cast<float>(args.lr / correction1);
    const auto inv_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(correction2));
    const auto decay =
        static_cast<float>(args.weight_decay ? 1.0 - args.lr * config_.weight_decay : 1.0);
    const auto beta1 = static_cast<float>(config_.beta1);
    const auto one_minus_beta1 = static_cast<float>(1.0 - config_.beta1);
    const auto beta2 = static_cast<float>(config_.beta2);
    const auto one_minus_beta2 = static_cast<float>(1.0 - config_.beta2);
    const auto eps = static_cast<float>(config_.eps);

    // The moments as Eigen array expressions (vectorized at any optimisation level); the
    // parameters in a scalar loop, because Eigen's vectorized sqrt is an approximation under
    // EIGEN_FAST_MATH and would make a range's bits depend on where it starts. Elementwise and in
    // the order m, v, then p = p * decay - step_size * (m / (sqrt(v) * c + eps)).
    // In blocks that fit the level-1 cache, so that the parameter loop reads the moments the
    // statements before it just wrote (the update is memory-bound).
    for (std::size_t begin = 0; begin < n; begin += update_block) {
      const std::size_t size = std::min(update_block, n - begin);
      const auto count = static_cast<Eigen::Index>(size);
      const Eigen::Map<const Eigen::ArrayXf> grad(args.grads.data() + begin, count);
      Eigen::Map<Eigen::ArrayXf> m(args.state.data() + begin, count);
      Eigen::Map<Eigen::ArrayXf> v(args.state.data() + n + begin, count);
      m = beta1 * m + one_minus_beta1 * grad;
      v = beta2 * v + one_minus_beta2 * (grad * grad);
      float* const p = args.params.data() + begin;
      const float* const m_data = args.state.data() + begin;
      const float* const v_data = args.state.data() + n + begin;
      for (std::size_t i = 0; i < size; ++i) {
        const float denominator = std::sqrt(v_data[i]) * inv_sqrt_correction2 + eps;
        p[i] = p[i] * decay - step_size * (m_data[i] / denominator);
      }
    }
  }

  // "adamw{.beta1 = ..., .beta2 = ..., .eps = ..., .weight_decay = ...}".
  std::string describe() const {
    constexpr std::string_view prefix = "adamw_config";
    return "adamw" + to_string(config_).substr(prefix.size());
  }

 private:
  // Elements per block of update(): parameters, gradients and both moments take 32 KiB.
  static constexpr std::size_t update_block = 2048;

  adamw_config config_;
  std::uint64_t step_ = 0;
};

static_assert(check_optimizer<adamw>());

}  // namespace strata::optim
