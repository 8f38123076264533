// SPDX-License-Identifier: Apache-2.0
#pragma once

// Learning-rate schedules: the rate of optimizer step 0, 1, ... as a pure function of the step,
// so resuming needs only the optimizer's step count.
//
//   constant_lr  base_lr
//   step_lr      base_lr * gamma^floor(step / step_size)
//   cosine_lr    min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total_steps)) / 2 for
//                step < total_steps, min_lr from total_steps on
//   warmup<S>    for step < warmup_steps: after.lr(0) * (step + 1) / warmup_steps, a linear ramp
//                whose last warmup step reaches the schedule's first rate; then
//                after.lr(step - warmup_steps): the schedule starts after the warmup, shifted,
//                so a cosine's total_steps count the steps after the warmup.
//
// The schedule's rate field is base_lr rather than lr because lr(step) is the member function
// the lr_schedule concept asks for. any_lr_schedule is the runtime choice among these (each
// optionally with warmup), built and validated from an lr_schedule_config by make_lr_schedule.

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "strata/core/format.hpp"
#include "strata/optim/concepts.hpp"

namespace strata::optim {

namespace detail {

// The shortest text that reads back as the same double ("0.1", "1e-08").
inline std::string format_schedule_number(double value) {
  return format_shortest(value);
}

[[noreturn]] inline void throw_schedule_error(std::string_view field, std::string_view rule,
                                              const std::string& value) {
  throw std::invalid_argument(std::string(field) + " must be " + std::string(rule) + ", got " +
                              value);
}

inline void check_base_lr(std::string_view field, double value) {
  if (!(value >= 0.0 && std::isfinite(value))) {
    throw_schedule_error(field, "finite and >= 0", format_schedule_number(value));
  }
}

inline void check_step_size(std::string_view field, std::uint64_t value) {
  if (value == 0) {
    throw_schedule_error(field, "> 0", std::to_string(value));
  }
}

inline void check_gamma(std::string_view field, double value) {
  if (!(value > 0.0 && value <= 1.0)) {
    throw_schedule_error(field, "in (0, 1]", format_schedule_number(value));
  }
}

inline void check_total_steps(std::string_view field, std::uint64_t value) {
  if (value == 0) {
    throw_schedule_error(field, "> 0", std::to_string(value));
  }
}

inline void check_min_lr(std::string_view field, double value, double base_lr) {
  if (!(value >= 0.0 && value <= base_lr)) {
    throw_schedule_error(field, "in [0, " + format_schedule_number(base_lr) + "] (the base rate)",
                         format_schedule_number(value));
  }
}

}  // namespace detail

struct constant_lr {
  using lr_schedule_category = lr_schedule_tag;

  double base_lr = 0.1;

  double lr(std::uint64_t /*step*/) const noexcept { return base_lr; }
  void validate() const { detail::check_base_lr("constant_lr.base_lr", base_lr); }
  std::string describe() const;

  friend bool operator==(const constant_lr&, const constant_lr&) = default;
};

inline std::string to_string(const constant_lr& s) {
  return "constant_lr{.base_lr = " + detail::format_schedule_number(s.base_lr) + "}";
}

inline std::string constant_lr::describe() const {
  return to_string(*this);
}

struct step_lr {
  using lr_schedule_category = lr_schedule_tag;

  double base_lr = 0.1;
  std::uint64_t step_size = 1;  // optimizer steps between decays, > 0
  double gamma = 0.1;           // factor of each decay, in (0, 1]

  // An unvalidated step_size of 0 acts as 1 here instead of dividing by zero.
  double lr(std::uint64_t step) const noexcept {
    const std::uint64_t decays = step / (step_size == 0 ? 1 : step_size);
    return base_lr * std::pow(gamma, static_cast<double>(decays));
  }
  void validate() const {
    detail::check_base_lr("step_lr.base_lr", base_lr);
    detail::check_step_size("step_lr.step_size", step_size);
    detail::check_gamma("step_lr.gamma", gamma);
  }
  std::string describe() const;

  friend bool operator==(const step_lr&, const step_lr&) = default;
};

inline std::string to_string(const step_lr& s) {
  return "step_lr{.base_lr = " + detail::format_schedule_number(s.base_lr) +
         ", .step_size = " + std::to_string(s.step_size) +
         ", .gamma = " + detail::format_schedule_number(s.gamma) + "}";
}

inline std::string step_lr::describe() const {
  return to_string(*this);
}

struct cosine_lr {
  using lr_schedule_category = lr_schedule_tag;

  double base_lr = 0.1;
  std::uint64_t total_steps = 1;  // steps from base_lr down to min_lr, > 0
  double min_lr = 0.0;            // in [0, base_lr]; the rate from total_steps on

  double lr(std::uint64_t step) const noexcept {
    if (step >= total_steps) {
      return min_lr;
    }
    const double phase =
        std::numbers::pi * static_cast<double>(step) / static_cast<double>(total_steps);
    return min_lr + (base_lr - min_lr) * (1.0 + std::cos(phase)) / 2.0;
  }
  void validate() const {
    detail::check_base_lr("cosine_lr.base_lr", base_lr);
    detail::check_total_steps("cosine_lr.total_steps", total_steps);
    detail::check_min_lr("cosine_lr.min_lr", min_lr, base_lr);
  }
  std::string describe() const;

  friend bool operator==(const cosine_lr&, const cosine_lr&) = default;
};

inline std::string to_string(const cosine_lr& s) {
  return "cosine_lr{.base_lr = " + detail::format_schedule_number(s.base_lr) +
         ", .total_steps = " + std::to_string(s.total_steps) +
         ", .min_lr = " + detail::format_schedule_number(s.min_lr) + "}";
}

inline std::string cosine_lr::describe() const {
  return to_string(*this);
}

// A linear warmup of warmup_steps steps before `after` (see the top of this file).
template <class Schedule>
struct warmup {
  static_assert(check_lr_schedule<Schedule>());

  using lr_schedule_category = lr_schedule_tag;

  std::uint64_t warmup_steps = 0;  // 0 = no warmup
  Schedule after{};

  double lr(std::uint64_t step) const {
    if (step < warmup_steps) {
      return after.lr(0) * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    }
    return after.lr(step - warmup_steps);
  }
  void validate() const {
    if constexpr (requires { after.validate(); }) {
      after.validate();
    }
  }
  std::string describe() const {
    return "warmup{.warmup_steps = " + std::to_string(warmup_steps) +
           ", .after = " + std::string(after.describe()) + "}";
  }

  friend bool operator==(const warmup&, const warmup&) = default;
};

template <class Schedule>
std::string to_string(const warmup<Schedule>& s) {
  return s.describe();
}

static_assert(check_lr_schedule<constant_lr>());
static_assert(check_lr_schedule<step_lr>());
static_assert(check_lr_schedule<cosine_lr>());
static_assert(check_lr_schedule<warmup<cosine_lr>>());

// The schedule a run's configuration names, chosen at run time.
class any_lr_schedule {
 public:
  using lr_schedule_category = lr_schedule_tag;
  using variant_type = std::variant<constant_lr, step_lr, cosine_lr, warmup<constant_lr>,
                                    warmup<step_lr>, warmup<cosine_lr>>;

  any_lr_schedule() = default;

  // Throws std::invalid_argument naming the field if the schedule's numbers are out of range.
  explicit any_lr_schedule(variant_type schedule) : schedule_(std::move(schedule)) {
    std::visit([](const auto& s) { s.validate(); }, schedule_);
  }

  double lr(std::uint64_t step) const {
    return std::visit([step](const auto& s) { return s.lr(step); }, schedule_);
  }
  std::string describe() const {
    return std::visit([](const auto& s) { return s.describe(); }, schedule_);
  }

  const variant_type& schedule() const noexcept { return schedule_; }

  friend bool operator==(const any_lr_schedule&, const any_lr_schedule&) = default;

 private:
  variant_type schedule_{};
};

inline std::string to_string(const any_lr_schedule& s) {
  return s.describe();
}

static_assert(check_lr_schedule<any_lr_schedule>());

struct lr_schedule_config {
  enum class kind_type { constant, step, cosine };

  kind_type kind = kind_type::constant;
  double lr = 0.1;                // the base rate, finite and >= 0
  double warmup_steps = 0.0;      // rounded to the nearest whole step; 0 = no warmup
  std::uint64_t step_size = 1;    // step: optimizer steps between decays, > 0
  double gamma = 0.1;             // step: factor of each decay, in (0, 1]
  double min_lr = 0.0;            // cosine: the floor, in [0, lr]
  std::uint64_t total_steps = 1;  // cosine: steps after the warmup from lr to min_lr, > 0

  friend bool operator==(const lr_schedule_config&, const lr_schedule_config&) = default;
};

inline std::string to_string(lr_schedule_config::kind_type kind) {
  switch (kind) {
    case lr_schedule_config::kind_type::constant:
      return "constant";
    case lr_schedule_config::kind_type::step:
      return "step";
    case lr_schedule_config::kind_type::cosine:
      return "cosine";
  }
  return "kind_type(" + std::to_string(static_cast<int>(kind)) + ")";
}

inline std::string to_string(const lr_schedule_config& c) {
  using detail::format_schedule_number;
  return "lr_schedule_config{.kind = " + to_string(c.kind) +
         ", .lr = " + format_schedule_number(c.lr) +
         ", .warmup_steps = " + format_schedule_number(c.warmup_steps) +
         ", .step_size = " + std::to_string(c.step_size) +
         ", .gamma = " + format_schedule_number(c.gamma) +
         ", .min_lr = " + format_schedule_number(c.min_lr) +
         ", .total_steps = " + std::to_string(c.total_steps) + "}";
}

// Builds the configured schedule, wrapped in warmup<> when warmup_steps rounds to more than 0.
// Checks only the fields the kind uses; throws std::invalid_argument naming the field and value.
inline any_lr_schedule make_lr_schedule(const lr_schedule_config& c) {
  constexpr double max_warmup_steps = 9007199254740992.0;  // 2^53: whole numbers stay exact
  detail::check_base_lr("lr_schedule_config.lr", c.lr);
  if (!(c.warmup_steps >= 0.0 && c.warmup_steps <= max_warmup_steps)) {
    detail::throw_schedule_error("lr_schedule_config.warmup_steps", "in [0, 2^53]",
                                 detail::format_schedule_number(c.warmup_steps));
  }
  const auto warmup_steps = static_cast<std::uint64_t>(std::llround(c.warmup_steps));

  const auto build = [warmup_steps](auto schedule) {
    if (warmup_steps == 0) {
      return any_lr_schedule(schedule);
    }
    return any_lr_schedule(
        warmup<decltype(schedule)>{.warmup_steps = warmup_steps, .after = schedule});
  };
  switch (c.kind) {
    case lr_schedule_config::kind_type::constant:
      return build(constant_lr{.base_lr = c.lr});
    case lr_schedule_config::kind_type::step:
      detail::check_step_size("lr_schedule_config.step_size", c.step_size);
      detail::check_gamma("lr_schedule_config.gamma", c.gamma);
      return build(step_lr{.base_lr = c.lr, .step_size = c.step_size, .gamma = c.gamma});
    case lr_schedule_config::kind_type::cosine:
      detail::check_total_steps("lr_schedule_config.total_steps", c.total_steps);
      detail::check_min_lr("lr_schedule_config.min_lr", c.min_lr, c.lr);
      return build(cosine_lr{.base_lr = c.lr, .total_steps = c.total_steps, .min_lr = c.min_lr});
  }
  throw std::invalid_argument("lr_schedule_config.kind must be constant, step or cosine, got " +
                              to_string(c.kind));
}

}  // namespace strata::optim
