// SPDX-License-Identifier: Apache-2.0
#pragma once

// The optim family's contracts: an optimizer updates parameters from gradients with its state
// in flat buffers laid out like the parameters; an lr_schedule gives the learning rate of a
// step.
//
// An optimizer O, with `O& o`, `const O& co`, must:
//   1. opt in with `using optimizer_category = strata::optim::optimizer_tag;`;
//   2. size its state: `co.state_per_parameter()` returns std::size_t, the floats of state it
//      keeps per parameter element (SGD with momentum 1, AdamW 2, plain SGD 0). The caller
//      keeps them in one buffer: state slot s of parameter element i is state[s * n + i] for a
//      range of n elements (so a shard of the parameters owns the matching shard of the state);
//   3. update a range: `o.update(args)` with `const update_args& args`: params, grads and
//      state views of one contiguous range, the learning rate and whether weight decay applies;
//      elementwise, so any split of the parameters into ranges gives the same bits;
//   4. count steps: `o.begin_step()` once before the ranges of a step, and
//      `co.step_count()` (std::uint64_t), which a checkpoint saves and `o.set_step_count(n)`
//      restores (AdamW's bias correction depends on it);
//   5. describe itself: `co.describe()` returns std::string (its numbers, for logs and the
//      checkpoint manifest).
//
// An lr_schedule S, with `const S& s`, must:
//   1. opt in with `using lr_schedule_category = strata::optim::lr_schedule_tag;`;
//   2. give the rate of an optimizer step: `s.lr(step)` returns double for step = 0, 1, ...;
//      a pure function of the step, so resuming needs only the step count;
//   3. describe itself: `s.describe()` returns std::string.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace strata::optim {

struct optimizer_tag {};
struct lr_schedule_tag {};

struct update_args {
  std::span<float> params{};
  std::span<const float> grads{};
  std::span<float> state{};  // state_per_parameter() x params.size() floats
  double lr = 0.0;
  bool weight_decay = true;  // false for ranges whose param_spec says so (biases, norms)
};

// 1.
template <class O>
concept optimizer_tagged = requires {
  typename O::optimizer_category;
  requires std::same_as<typename O::optimizer_category, optimizer_tag>;
};
// 2.
template <class O>
concept optimizer_sizes_state = requires(const O& co) {
  { co.state_per_parameter() } -> std::same_as<std::size_t>;
};
// 3.
template <class O>
concept optimizer_updates = requires(O& o, const update_args& a) {
  o.update(a);
};
// 4.
template <class O>
concept optimizer_counts_steps = requires(O& o, const O& co, std::uint64_t n) {
  o.begin_step();
  { co.step_count() } -> std::same_as<std::uint64_t>;
  o.set_step_count(n);
};
// 5.
template <class O>
concept optimizer_describes = requires(const O& co) {
  { co.describe() } -> std::convertible_to<std::string>;
};

template <class O>
concept optimizer = optimizer_tagged<O> && optimizer_sizes_state<O> && optimizer_updates<O> &&
    optimizer_counts_steps<O> && optimizer_describes<O>;

template <class O>
constexpr bool check_optimizer() {
  static_assert(optimizer_tagged<O>,
                "optim: an optimizer declares 'using optimizer_category = "
                "strata::optim::optimizer_tag;'");
  static_assert(optimizer_sizes_state<O>,
                "optim: an optimizer needs 'std::size_t state_per_parameter() const'");
  static_assert(optimizer_updates<O>,
                "optim: an optimizer needs 'void update(const strata::optim::update_args&)'");
  static_assert(optimizer_counts_steps<O>,
                "optim: an optimizer needs 'begin_step()', 'std::uint64_t step_count() const' and "
                "'set_step_count(std::uint64_t)'");
  static_assert(optimizer_describes<O>, "optim: an optimizer needs 'std::string describe() const'");
  return true;
}

// 1.
template <class S>
concept lr_schedule_tagged = requires {
  typename S::lr_schedule_category;
  requires std::same_as<typename S::lr_schedule_category, lr_schedule_tag>;
};
// 2.
template <class S>
concept lr_schedule_rates = requires(const S& s, std::uint64_t step) {
  { s.lr(step) } -> std::same_as<double>;
};
// 3.
template <class S>
concept lr_schedule_describes = requires(const S& s) {
  { s.describe() } -> std::convertible_to<std::string>;
};

template <class S>
concept lr_schedule = lr_schedule_tagged<S> && lr_schedule_rates<S> && lr_schedule_describes<S>;

template <class S>
constexpr bool check_lr_schedule() {
  static_assert(lr_schedule_tagged<S>,
                "optim: an lr schedule declares 'using lr_schedule_category = "
                "strata::optim::lr_schedule_tag;'");
  static_assert(lr_schedule_rates<S>,
                "optim: an lr schedule needs 'double lr(std::uint64_t) const'");
  static_assert(lr_schedule_describes<S>,
                "optim: an lr schedule needs 'std::string describe() const'");
  return true;
}

}  // namespace strata::optim
