// SPDX-License-Identifier: Apache-2.0
#pragma once

// precision::dynamic_loss_scaler: the dynamic loss scale of float16 mixed precision, with
// hysteresis and an abort after too many skipped steps, and the helpers that unscale and check
// a flat gradient buffer.
//
// The defaults are those of torch.cuda.amp.GradScaler: initial scale 2^16, growth x2 after 2000
// finite steps in a row, backoff x0.5 on an overflow, hysteresis 1 (back off on every overflow).
//
// State machine. The state is the scale s, growth_tracker g (finite steps since s last changed or
// since the last overflow), hysteresis_left h, consecutive_skips c, skipped_total k and steps n.
// update(found_overflow), once per optimizer step:
//   overflow: k += 1, c += 1, g = 0, h -= 1; when h reaches 0:
//             s = max(s * backoff_factor, min_scale) and h = hysteresis.
//             n += 1; when c reaches max_consecutive_skips, throw loss_scale_error;
//             return false (skip the step).
//   finite:   c = 0, h = hysteresis, g += 1; when g reaches growth_interval:
//             s = min(s * growth_factor, max_scale) and g = 0.
//             n += 1; return true.
// Every finite step refills h, so with hysteresis H the scale backs off after H overflows in a
// row (and after every H further ones), and overflows separated by finite steps never back it
// off; refilling h only when the scale grows would instead back off after H overflows anywhere
// within a growth interval. With hysteresis 1 the two rules agree with GradScaler.
//
// Use in a trainer, per optimizer step:
//   1. backward of loss * scale() (seed the loss gradient with scale_f());
//   2. unscale_and_check(grads, scale()) on the local flat gradient buffer, which gives "local
//      overflow" = !result; with gradient communication, reduce the flag with max over every
//      rank that holds parameters, so that every rank takes the same decision;
//   3. ok = update(found_overflow), the same call on every rank;
//   4. when ok is false, skip the optimizer step: parameters, optimizer state and the
//      optimizer's step count (Adam's bias correction) stay untouched; the learning-rate
//      schedule follows the trainer's step counter as usual;
//   5. save to_json(state()) in the checkpoint; on resume, restore(loss_scaler_state_from_json).
// Gradient clipping by norm, when used, runs after unscaling and only on finite steps.
//
// The finiteness checks read the float's bits: an element is finite when its exponent field is
// not all ones, i.e. (bits & 0x7fffffff) < 0x7f800000, which is when adding 2^23 to the masked
// bits leaves the top bit clear. The range is reduced by OR-ing those sums over 16 independent
// lanes and testing the top bit once at the end: no branches, integer and/add/or only, which GCC
// vectorizes at -O2 with the accumulators in registers. Unlike std::isfinite or x * 0 tests, it
// also holds under -ffast-math.

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "strata/core/error.hpp"
#include "strata/core/format.hpp"

namespace strata::precision {

namespace detail {

// The shortest text that reads back as the same double ("65536", "0.5", "1e-08").
inline std::string loss_scaler_number(double value) {
  return format_shortest(value);
}

}  // namespace detail

struct loss_scaler_config {
  double initial_scale = 65536.0;            // 2^16; finite, in [min_scale, max_scale]
  double growth_factor = 2.0;                // finite, > 1
  double backoff_factor = 0.5;               // in (0, 1)
  std::uint64_t growth_interval = 2000;      // finite steps in a row before growing, >= 1
  std::uint32_t hysteresis = 1;              // overflows in a row before backing off, >= 1
  double min_scale = 1.0;                    // >= the smallest normal float
  double max_scale = 1099511627776.0;        // 2^40; <= the largest float
  std::uint32_t max_consecutive_skips = 20;  // overflows in a row that abort training, >= 1

  friend bool operator==(const loss_scaler_config&, const loss_scaler_config&) = default;
};

inline std::string to_string(const loss_scaler_config& c) {
  using detail::loss_scaler_number;
  return "loss_scaler_config{.initial_scale = " + loss_scaler_number(c.initial_scale) +
         ", .growth_factor = " + loss_scaler_number(c.growth_factor) +
         ", .backoff_factor = " + loss_scaler_number(c.backoff_factor) +
         ", .growth_interval = " + std::to_string(c.growth_interval) +
         ", .hysteresis = " + std::to_string(c.hysteresis) +
         ", .min_scale = " + loss_scaler_number(c.min_scale) +
         ", .max_scale = " + loss_scaler_number(c.max_scale) +
         ", .max_consecutive_skips = " + std::to_string(c.max_consecutive_skips) + "}";
}

// What a checkpoint saves. The defaults are the start state of the default config.
struct loss_scaler_state {
  double scale = 65536.0;
  std::uint64_t growth_tracker = 0;     // finite steps since the scale changed or the last overflow
  std::uint32_t hysteresis_left = 1;    // overflows in a row still tolerated before backing off
  std::uint64_t consecutive_skips = 0;  // overflowed steps in a row, up to the last one
  std::uint64_t skipped_total = 0;      // overflowed steps since the start of training
  std::uint64_t steps = 0;              // update() calls since the start of training

  friend bool operator==(const loss_scaler_state&, const loss_scaler_state&) = default;
};

inline std::string to_string(const loss_scaler_state& s) {
  return "loss_scaler_state{.scale = " + detail::loss_scaler_number(s.scale) +
         ", .growth_tracker = " + std::to_string(s.growth_tracker) +
         ", .hysteresis_left = " + std::to_string(s.hysteresis_left) +
         ", .consecutive_skips = " + std::to_string(s.consecutive_skips) +
         ", .skipped_total = " + std::to_string(s.skipped_total) +
         ", .steps = " + std::to_string(s.steps) + "}";
}

namespace detail {

[[noreturn]] inline void throw_loss_scaler_error(std::string_view where, std::string_view field,
                                                 std::string_view rule, const std::string& value) {
  throw std::invalid_argument(std::string(where) + ": " + std::string(field) + " must be " +
                              std::string(rule) + ", got " + value);
}

// The checks that hold for a state of any config.
inline void check_loss_scaler_state(std::string_view where, const loss_scaler_state& s) {
  if (!(s.scale > 0.0 && std::isfinite(s.scale))) {
    throw_loss_scaler_error(where, "loss_scaler_state.scale", "finite and > 0",
                            loss_scaler_number(s.scale));
  }
  if (s.hysteresis_left == 0) {
    throw_loss_scaler_error(where, "loss_scaler_state.hysteresis_left", ">= 1", "0");
  }
  if (s.consecutive_skips > s.skipped_total) {
    throw_loss_scaler_error(where, "loss_scaler_state.consecutive_skips",
                            "<= skipped_total (" + std::to_string(s.skipped_total) + ")",
                            std::to_string(s.consecutive_skips));
  }
  if (s.skipped_total > s.steps) {
    throw_loss_scaler_error(where, "loss_scaler_state.skipped_total",
                            "<= steps (" + std::to_string(s.steps) + ")",
                            std::to_string(s.skipped_total));
  }
}

}  // namespace detail

// The state as a JSON object with one member per field, for a checkpoint manifest.
inline nlohmann::json to_json(const loss_scaler_state& s) {
  return nlohmann::json{{"scale", s.scale},
                        {"growth_tracker", s.growth_tracker},
                        {"hysteresis_left", s.hysteresis_left},
                        {"consecutive_skips", s.consecutive_skips},
                        {"skipped_total", s.skipped_total},
                        {"steps", s.steps}};
}

// Reads what to_json wrote. Throws std::invalid_argument naming the field when the value is not
// an object, a field is missing, unknown or of the wrong type or range, or the fields disagree
// (consecutive_skips <= skipped_total <= steps).
inline loss_scaler_state loss_scaler_state_from_json(const nlohmann::json& j) {
  constexpr std::string_view where = "loss_scaler_state_from_json";
  if (!j.is_object()) {
    throw std::invalid_argument(std::string(where) + ": expected a JSON object, got " +
                                std::string(j.type_name()));
  }
  constexpr std::array<std::string_view, 6> fields = {
      "scale", "growth_tracker", "hysteresis_left", "consecutive_skips", "skipped_total", "steps"};
  for (const auto& item : j.items()) {
    if (std::find(fields.begin(), fields.end(), item.key()) == fields.end()) {
      throw std::invalid_argument(std::string(where) + ": unknown field '" + item.key() + "'");
    }
  }
  const auto field = [&](std::string_view key) -> const nlohmann::json& {
    const auto it = j.find(std::string(key));
    if (it == j.end()) {
      throw std::invalid_argument(std::string(where) + ": field '" + std::string(key) +
                                  "' is missing");
    }
    return *it;
  };
  const auto count = [&](std::string_view key, std::uint64_t max) {
    const nlohmann::json& v = field(key);
    const bool in_range =
        (v.is_number_unsigned() && v.get<std::uint64_t>() <= max) ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() >= 0 &&
         static_cast<std::uint64_t>(v.get<std::int64_t>()) <= max);
    if (!in_range) {
      throw std::invalid_argument(std::string(where) + ": field '" + std::string(key) +
                                  "' must be an integer in [0, " + std::to_string(max) + "], got " +
                                  v.dump());
    }
    return v.is_number_unsigned() ? v.get<std::uint64_t>()
                                  : static_cast<std::uint64_t>(v.get<std::int64_t>());
  };
  const nlohmann::json& scale = field("scale");
  if (!scale.is_number()) {
    throw std::invalid_argument(std::string(where) + ": field 'scale' must be a number, got " +
                                scale.dump());
  }
  constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();
  const loss_scaler_state s{.scale = scale.get<double>(),
                            .growth_tracker = count("growth_tracker", u64_max),
                            .hysteresis_left = static_cast<std::uint32_t>(count(
                                "hysteresis_left", std::numeric_limits<std::uint32_t>::max())),
                            .consecutive_skips = count("consecutive_skips", u64_max),
                            .skipped_total = count("skipped_total", u64_max),
                            .steps = count("steps", u64_max)};
  detail::check_loss_scaler_state(where, s);
  return s;
}

// Thrown by update() when max_consecutive_skips steps in a row overflowed: the scale cannot
// recover, and training would otherwise spin without updating the parameters.
class loss_scale_error : public error {
 public:
  loss_scale_error(const loss_scaler_config& config, const loss_scaler_state& after)
      : error(compose(config, after)), state_(after) {}

  // The optimizer step (from 0, the index of the update() call) whose overflow aborted.
  std::uint64_t step() const noexcept { return state_.steps - 1; }
  // The scale after that step's backoff.
  double scale() const noexcept { return state_.scale; }
  std::uint64_t consecutive_skips() const noexcept { return state_.consecutive_skips; }
  // The scaler's state after the aborting step.
  const loss_scaler_state& state() const noexcept { return state_; }

 private:
  static std::string compose(const loss_scaler_config& c, const loss_scaler_state& s) {
    using detail::loss_scaler_number;
    const std::uint64_t last = s.steps - 1;
    const std::uint64_t first = s.steps - s.consecutive_skips;
    return "loss scaler: gradients overflowed on " + std::to_string(s.consecutive_skips) +
           " consecutive steps (steps " + std::to_string(first) + " to " + std::to_string(last) +
           "), aborting at step " + std::to_string(last) + " with loss scale " +
           loss_scaler_number(s.scale) + " (min_scale " + loss_scaler_number(c.min_scale) +
           ", max_consecutive_skips " + std::to_string(c.max_consecutive_skips) +
           "); the gradients are not finite at any scale: lower the learning rate, check the "
           "data and the loss for NaN, or train in bfloat16";
  }

  loss_scaler_state state_;
};

class dynamic_loss_scaler {
 public:
  // Throws std::invalid_argument naming the field and its value when the config is invalid.
  explicit dynamic_loss_scaler(loss_scaler_config config = {}) : config_(config) {
    check_config(config_);
    state_ = loss_scaler_state{.scale = config_.initial_scale,
                               .growth_tracker = 0,
                               .hysteresis_left = config_.hysteresis,
                               .consecutive_skips = 0,
                               .skipped_total = 0,
                               .steps = 0};
  }

  const loss_scaler_config& config() const noexcept { return config_; }

  double scale() const noexcept { return state_.scale; }
  // The scale as a float (exact for powers of two), to seed the loss gradient.
  float scale_f() const noexcept { return static_cast<float>(state_.scale); }

  // Records one optimizer step after the all-rank overflow check; returns whether to apply it.
  // Throws loss_scale_error when this is the max_consecutive_skips-th overflow in a row; the
  // state then includes this step.
  bool update(bool found_overflow) {
    if (found_overflow) {
      ++state_.skipped_total;
      ++state_.consecutive_skips;
      state_.growth_tracker = 0;
      --state_.hysteresis_left;
      if (state_.hysteresis_left == 0) {
        state_.scale = std::max(state_.scale * config_.backoff_factor, config_.min_scale);
        state_.hysteresis_left = config_.hysteresis;
      }
      ++state_.steps;
      if (state_.consecutive_skips >= config_.max_consecutive_skips) {
        throw loss_scale_error(config_, state_);
      }
      return false;
    }
    state_.consecutive_skips = 0;
    state_.hysteresis_left = config_.hysteresis;
    ++state_.growth_tracker;
    if (state_.growth_tracker >= config_.growth_interval) {
      state_.scale = std::min(state_.scale * config_.growth_factor, config_.max_scale);
      state_.growth_tracker = 0;
    }
    ++state_.steps;
    return true;
  }

  const loss_scaler_state& state() const noexcept { return state_; }

  // Continues from a saved state. Throws std::invalid_argument naming the field when the state
  // is one this scaler's config cannot reach: scale outside [min_scale, max_scale],
  // growth_tracker >= growth_interval, hysteresis_left outside [1, hysteresis],
  // consecutive_skips > max_consecutive_skips, or the fields disagree.
  void restore(const loss_scaler_state& s) {
    constexpr std::string_view where = "dynamic_loss_scaler::restore";
    using detail::loss_scaler_number;
    using detail::throw_loss_scaler_error;
    detail::check_loss_scaler_state(where, s);
    if (!(s.scale >= config_.min_scale && s.scale <= config_.max_scale)) {
      throw_loss_scaler_error(where, "loss_scaler_state.scale",
                              "in [min_scale, max_scale] = [" +
                                  loss_scaler_number(config_.min_scale) + ", " +
                                  loss_scaler_number(config_.max_scale) + "]",
                              loss_scaler_number(s.scale));
    }
    if (s.growth_tracker >= config_.growth_interval) {
      throw_loss_scaler_error(where, "loss_scaler_state.growth_tracker",
                              "< growth_interval (" + std::to_string(config_.growth_interval) + ")",
                              std::to_string(s.growth_tracker));
    }
    if (s.hysteresis_left > config_.hysteresis) {
      throw_loss_scaler_error(where, "loss_scaler_state.hysteresis_left",
                              "<= hysteresis (" + std::to_string(config_.hysteresis) + ")",
                              std::to_string(s.hysteresis_left));
    }
    if (s.consecutive_skips > config_.max_consecutive_skips) {
      throw_loss_scaler_error(
          where, "loss_scaler_state.consecutive_skips",
          "<= max_consecutive_skips (" + std::to_string(config_.max_consecutive_skips) + ")",
          std::to_string(s.consecutive_skips));
    }
    state_ = s;
  }

 private:
  static void check_config(const loss_scaler_config& c) {
    constexpr std::string_view where = "dynamic_loss_scaler";
    using detail::loss_scaler_number;
    using detail::throw_loss_scaler_error;
    if (!(c.initial_scale > 0.0 && std::isfinite(c.initial_scale))) {
      throw_loss_scaler_error(where, "loss_scaler_config.initial_scale", "finite and > 0",
                              loss_scaler_number(c.initial_scale));
    }
    if (!(c.growth_factor > 1.0 && std::isfinite(c.growth_factor))) {
      throw_loss_scaler_error(where, "loss_scaler_config.growth_factor", "finite and > 1",
                              loss_scaler_number(c.growth_factor));
    }
    if (!(c.backoff_factor > 0.0 && c.backoff_factor < 1.0)) {
      throw_loss_scaler_error(where, "loss_scaler_config.backoff_factor", "in (0, 1)",
                              loss_scaler_number(c.backoff_factor));
    }
    if (c.growth_interval == 0) {
      throw_loss_scaler_error(where, "loss_scaler_config.growth_interval", ">= 1", "0");
    }
    if (c.hysteresis == 0) {
      throw_loss_scaler_error(where, "loss_scaler_config.hysteresis", ">= 1", "0");
    }
    // The scale and its reciprocal stay nonzero finite floats (scale_f, unscale_and_check).
    constexpr double float_min = std::numeric_limits<float>::min();
    constexpr double float_max = std::numeric_limits<float>::max();
    if (!(c.min_scale >= float_min && c.min_scale <= float_max)) {
      throw_loss_scaler_error(where, "loss_scaler_config.min_scale",
                              "in [" + loss_scaler_number(float_min) + ", " +
                                  loss_scaler_number(float_max) + "] (normal floats)",
                              loss_scaler_number(c.min_scale));
    }
    if (!(c.max_scale >= float_min && c.max_scale <= float_max)) {
      throw_loss_scaler_error(where, "loss_scaler_config.max_scale",
                              "in [" + loss_scaler_number(float_min) + ", " +
                                  loss_scaler_number(float_max) + "] (normal floats)",
                              loss_scaler_number(c.max_scale));
    }
    if (!(c.min_scale <= c.initial_scale && c.initial_scale <= c.max_scale)) {
      throw_loss_scaler_error(where, "loss_scaler_config.initial_scale",
                              "in [min_scale, max_scale] = [" + loss_scaler_number(c.min_scale) +
                                  ", " + loss_scaler_number(c.max_scale) + "]",
                              loss_scaler_number(c.initial_scale));
    }
    if (c.max_consecutive_skips == 0) {
      throw_loss_scaler_error(where, "loss_scaler_config.max_consecutive_skips", ">= 1", "0");
    }
  }

  loss_scaler_config config_;
  loss_scaler_state state_{};
};

namespace detail {

inline constexpr std::size_t finite_check_lanes = 16;

// |x| + 2^23 as bits: the top bit is set exactly when the exponent field of x is all ones (inf,
// NaN), since |x| <= 0x7f7fffff for finite x and |x| <= 0x7fffffff always.
inline std::uint32_t nonfinite_top_bit(float x) noexcept {
  return (std::bit_cast<std::uint32_t>(x) & 0x7fffffffu) + 0x00800000u;
}

inline bool no_nonfinite_top_bit(std::uint32_t combined) noexcept {
  return (combined & 0x80000000u) == 0;
}

}  // namespace detail

// Whether every element is finite (no NaN, no +-inf). Branch-free over the range; reads every
// element, from the last to the first, so that a pass going forward right after it (the
// optimizer's update after the precision policy's check) finds the range's first part still in
// cache (about 4% off check and update together over 1.86 M gradients).
inline bool all_finite(std::span<const float> values) noexcept {
  constexpr std::size_t lanes = detail::finite_check_lanes;
  std::array<std::uint32_t, lanes> combined{};
  const float* p = values.data();
  const std::size_t n = values.size();
  const std::size_t whole = n - n % lanes;
  std::uint32_t all = 0;
  for (std::size_t i = whole; i < n; ++i) {
    all |= detail::nonfinite_top_bit(p[i]);
  }
  for (std::size_t i = whole; i > 0;) {
    i -= lanes;
    for (std::size_t j = 0; j < lanes; ++j) {
      combined[j] |= detail::nonfinite_top_bit(p[i + j]);
    }
  }
  for (const std::uint32_t c : combined) {
    all |= c;
  }
  return detail::no_nonfinite_top_bit(all);
}

// to[i] = from[i] * static_cast<float>(1 / scale), in one pass (to may be from; the second
// overload works in place), and returns whether every result is finite (a NaN or inf input, or a
// finite input that overflows, gives false). Processes the whole range either way; from and to
// must have the same size. Throws std::invalid_argument unless scale is finite, > 0 and its
// reciprocal is a nonzero finite float.
inline bool unscale_and_check(std::span<const float> from, std::span<float> to, double scale) {
  const float inv = static_cast<float>(1.0 / scale);
  if (!(scale > 0.0 && std::isfinite(scale) && inv > 0.0f && std::isfinite(inv))) {
    detail::throw_loss_scaler_error("unscale_and_check", "scale",
                                    "finite, > 0, with 1 / scale a nonzero finite float",
                                    detail::loss_scaler_number(scale));
  }
  if (from.size() != to.size()) {
    detail::throw_loss_scaler_error("unscale_and_check", "to",
                                    std::to_string(from.size()) + " floats, as from",
                                    std::to_string(to.size()) + " floats");
  }
  constexpr std::size_t lanes = detail::finite_check_lanes;
  std::array<std::uint32_t, lanes> combined{};
  const float* src = from.data();
  float* p = to.data();
  const std::size_t n = from.size();
  const std::size_t whole = n - n % lanes;
  std::size_t i = 0;
  for (; i < whole; i += lanes) {
    for (std::size_t j = 0; j < lanes; ++j) {
      const float g = src[i + j] * inv;
      p[i + j] = g;
      combined[j] |= detail::nonfinite_top_bit(g);
    }
  }
  std::uint32_t all = 0;
  for (i = whole; i < n; ++i) {
    const float g = src[i] * inv;
    p[i] = g;
    all |= detail::nonfinite_top_bit(g);
  }
  for (const std::uint32_t c : combined) {
    all |= c;
  }
  return detail::no_nonfinite_top_bit(all);
}

inline bool unscale_and_check(std::span<float> grads, double scale) {
  return unscale_and_check(std::span<const float>(grads), grads, scale);
}

}  // namespace strata::precision
