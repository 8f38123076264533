// SPDX-License-Identifier: Apache-2.0
#pragma once

// sgd: stochastic gradient descent with optional (Nesterov) momentum and coupled L2 weight
// decay, the update of PyTorch's torch.optim.SGD with dampening 0:
//
//   g = grad + weight_decay * p          (only for ranges with update_args::weight_decay)
//   v = momentum * v + g                 (only with momentum > 0; v is state slot 0)
//   u = nesterov ? g + momentum * v : (momentum > 0 ? v : g)
//   p = p - lr * u
//
// The momentum buffer starts at zero (the caller zero-fills a fresh state buffer), so the first
// step sets v = momentum * 0 + g = g exactly, which is PyTorch's first step (buffer = g).
// Arithmetic is in float with the coefficients rounded to float once per call. The update is
// elementwise and reads no mutable optimizer state, so any split of the parameters into ranges,
// updated in any order or concurrently, gives the same bits (within one build).

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

struct sgd_config {
  double momentum = 0.9;      // [0, 1); 0 = no momentum buffer
  bool nesterov = false;      // needs momentum > 0
  double weight_decay = 0.0;  // coupled L2 coefficient, >= 0

  friend bool operator==(const sgd_config&, const sgd_config&) = default;
};

inline std::string to_string(const sgd_config& c) {
  const auto number = [](double value) { return format_shortest(value); };
  return "sgd_config{.momentum = " + number(c.momentum) +
         ", .nesterov = " + (c.nesterov ? "true" : "false") +
         ", .weight_decay = " + number(c.weight_decay) + "}";
}

class sgd {
 public:
  using optimizer_category = optimizer_tag;

  explicit sgd(sgd_config config = {}) : config_(config) {
    if (!(config_.momentum >= 0.0 && config_.momentum < 1.0)) {
      throw std::invalid_argument("sgd: sgd_config.momentum must be in [0, 1), got " +
                                  to_string(config_));
    }
    if (!(config_.weight_decay >= 0.0 && std::isfinite(config_.weight_decay))) {
      throw std::invalid_argument("sgd: sgd_config.weight_decay must be finite and >= 0, got " +
                                  to_string(config_));
    }
    if (config_.nesterov && config_.momentum == 0.0) {
      throw std::invalid_argument("sgd: sgd_config.nesterov needs momentum > 0, got " +
                                  to_string(config_));
    }
  }

  const sgd_config& config() const noexcept { return config_; }

  // 1 float (the momentum buffer) per parameter with momentum, none without.
  std::size_t state_per_parameter() const noexcept { return config_.momentum > 0.0 ? 1 : 0; }

  void begin_step() noexcept { ++step_; }
  std::uint64_t step_count() const noexcept { return step_; }
  void set_step_count(std::uint64_t n) noexcept { step_ = n; }

  // Updates one range; throws std::invalid_argument if grads or state do not match params.
  void update(const update_args& args) const {
    const std::size_t n = args.params.size();
    if (args.grads.size() != n) {
      throw std::invalid_argument("sgd: update_args.grads has " +
                                  std::to_string(args.grads.size()) + " floats for " +
                                  std::to_string(n) + " params");
    }
    if (args.state.size() != state_per_parameter() * n) {
      throw std::invalid_argument("sgd: update_args.state has " +
                                  std::to_string(args.state.size()) + " floats, expected " +
                                  std::to_string(state_per_parameter() * n));
    }
    const bool decay = args.weight_decay && config_.weight_decay != 0.0;
    const auto wd = static_cast<float>(decay ? config_.weight_decay : 0.0);
    const auto momentum = static_cast<float>(config_.momentum);
    const auto lr = static_cast<float>(args.lr);
    // Blocks small enough for the level-1 cache: the momentum and parameter statements of a
    // block read what the first one just loaded, so parameters, gradients and momentum travel
    // from memory once per step instead of twice (the update is memory-bound).
    for (std::size_t begin = 0; begin < n; begin += update_block) {
      const auto count = static_cast<Eigen::Index>(std::min(update_block, n - begin));
      update_block_of(args.params.data() + begin, args.grads.data() + begin,
                      args.state.empty() ? nullptr : args.state.data() + begin, count, decay, wd,
                      momentum, lr);
    }
  }

  // "sgd{.momentum = ..., .nesterov = ..., .weight_decay = ...}".
  std::string describe() const {
    constexpr std::string_view prefix = "sgd_config";
    return "sgd" + to_string(config_).substr(prefix.size());
  }

 private:
  // Elements per block of update(): parameters, gradients and momentum of a block take 24 KiB.
  static constexpr std::size_t update_block = 2048;

  // Eigen array expressions: vectorized at any optimisation level, elementwise, and in the
  // order g = grad + wd * p; v = momentum * v + g; u = nesterov ? g + momentum * v : v;
  // p = p - lr * u (each operation rounded to float, as a scalar loop would).
  void update_block_of(float* params, const float* grads, float* state, Eigen::Index count,
                       bool decay, float wd, float momentum, float lr) const {
    Eigen::Map<Eigen::ArrayXf> p(params, count);
    const Eigen::Map<const Eigen::ArrayXf> grad(grads, count);
    if (config_.momentum > 0.0) {
      Eigen::Map<Eigen::ArrayXf> v(state, count);
      if (decay) {
        v = momentum * v + (grad + wd * p);
        if (config_.nesterov) {
          p = p - lr * ((grad + wd * p) + momentum * v);
        } else {
          p = p - lr * v;
        }
      } else {
        v = momentum * v + grad;
        if (config_.nesterov) {
          p = p - lr * (grad + momentum * v);
        } else {
          p = p - lr * v;
        }
      }
    } else if (decay) {
      p = p - lr * (grad + wd * p);
    } else {
      p = p - lr * grad;
    }
  }

  sgd_config config_;
  std::uint64_t step_ = 0;
};

static_assert(check_optimizer<sgd>());

}  // namespace strata::optim
