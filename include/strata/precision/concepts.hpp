// SPDX-License-Identifier: Apache-2.0
#pragma once

// The precision_policy contract: the parameters the model runs on, the gradients' storage type,
// the loss scale, and the decision to apply or skip a step. The trainer keeps the float32 master
// parameters and the optimizer; a precision policy owns what lies between them and the model.
//
// A precision policy P
//   1. opts in with `using policy_category = strata::precision_policy_tag;` and names itself
//      with `static constexpr std::string_view name`;
//   2. says what it is: `static constexpr dtype compute_dtype` (the storage type of activations
//      and gradients), `static constexpr bool has_compute_copy` (it keeps a copy of the
//      parameters besides the master; estimate_memory counts it), `static constexpr bool
//      scales_loss` (loss_scale() may differ from 1) and `static constexpr bool skips_steps`
//      (it checks the gradients and finish() may return false);
//   3. is made from the configuration, `explicit P(const config::train_config&)`, and checks
//      its keys with `static void check_config(const config::train_config&)` (config_error
//      naming the key; refuse_foreign_keys helps with the shipped policies' keys);
//   4. holds the parameters forward sees: `void prepare(Make&& make_copy)` once, where
//      make_copy() returns a store laid out like the master (call it only to keep a copy);
//      `model::param_store& compute(model::param_store& master)` (the master itself without a
//      copy); `void refresh(const model::param_store& master)` (the compute parameters take the
//      master's values, before a step and before an evaluation);
//   5. stores gradients: `void store(std::span<float> grads) const` rounds them as the compute
//      type holds them (after each backward and after each reduction; idempotent);
//      `double loss_scale() const` multiplies the loss gradient;
//   6. decides a step: `bool finish(std::uint64_t step, std::span<const float> compute_grads,
//      std::span<float> master_grads, Vote&& vote)` puts the step's gradients, unscaled, into
//      master_grads (the same memory as compute_grads when there is no copy) and returns whether
//      to apply them. A policy that checks them calls `bool vote(bool local_nonfinite)` exactly
//      once, on every rank alike, and follows its answer (whether any rank found a non-finite
//      gradient), so that every rank skips together; `bool to_master(std::span<float> grads,
//      double scale) const` does the same unscale and check for gradients another rank scaled
//      (a parameter server's shard) and `bool finite(std::span<const float>) const` checks
//      without changing (true when the policy does not check). finish may take a fifth
//      argument, `gradient_facts facts`: the trainer passes it where the policy takes it, with
//      facts.certainly_finite when it knows every compute gradient finite (on one rank, the
//      layers bounded them all: model::param_store::grad_bound); a policy whose only check is
//      for NaN and inf may then skip reading them (and still votes);
//   7. keeps its state across a checkpoint: `nlohmann::json state() const` and
//      `void restore(const nlohmann::json&)` (restore(null): a checkpoint without it).
//
// Semantics (tests/conformance/precision_policy.hpp checks them): after refresh() the compute
// parameters are the master's rounded through compute_dtype; store() leaves values compute_dtype
// can hold; finish() with finite gradients and a vote of "none" returns true with master_grads =
// compute_grads / loss_scale(); when the vote says some rank found a non-finite gradient, it
// returns false whatever its own gradients were; a restored policy has the writer's loss scale
// and decides as it does.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/policy.hpp"
#include "strata/model/param_store.hpp"

namespace strata::precision {

// What the trainer knows of a step's gradients besides their values (requirement 6's optional
// fifth argument of finish).
struct gradient_facts {
  // Every compute gradient is finite: the layers that wrote them bounded them far below
  // float's largest (model::param_store::grads_certainly_finite), on one rank, and nothing
  // wrote them since (store() of a float32 policy aside).
  bool certainly_finite = false;
};

// Whether P's finish takes gradient_facts.
template <class P, class Vote>
concept takes_gradient_facts = requires(P& p, std::uint64_t step, std::span<const float> from,
                                        std::span<float> to, Vote&& vote, gradient_facts facts) {
  { p.finish(step, from, to, std::forward<Vote>(vote), facts) } -> std::same_as<bool>;
};

// Requirement 6 as the trainer calls it: p.finish with the facts where p takes them, without
// where it does not.
template <class P, class Vote>
bool finish(P& p, std::uint64_t step, std::span<const float> compute_grads,
            std::span<float> master_grads, Vote&& vote, gradient_facts facts) {
  if constexpr (takes_gradient_facts<P, Vote>) {
    return p.finish(step, compute_grads, master_grads, std::forward<Vote>(vote), facts);
  } else {
    return p.finish(step, compute_grads, master_grads, std::forward<Vote>(vote));
  }
}

// The callables the contract's checks call a policy with.
using copy_maker_archetype = model::param_store (*)();
using vote_archetype = bool (*)(bool);

// 1.
template <class P>
concept precision_policy_tagged = policy_of<P, precision_policy_tag>;
template <class P>
concept precision_policy_named = requires {
  { P::name } -> std::convertible_to<std::string_view>;
};
// 2.
template <class P>
concept precision_policy_describes = requires {
  { P::compute_dtype } -> std::convertible_to<dtype>;
  { P::has_compute_copy } -> std::convertible_to<bool>;
  { P::scales_loss } -> std::convertible_to<bool>;
  { P::skips_steps } -> std::convertible_to<bool>;
};
// 3.
template <class P>
concept precision_policy_configured = std::constructible_from<P, const config::train_config&> &&
    requires(const config::train_config& c) {
  P::check_config(c);
};
// 4.
template <class P>
concept precision_policy_parameters = requires(P& p, model::param_store& master,
                                               copy_maker_archetype make) {
  p.prepare(make);
  { p.compute(master) } -> std::same_as<model::param_store&>;
  p.refresh(std::as_const(master));
};
// 5.
template <class P>
concept precision_policy_gradients = requires(const P& p, std::span<float> g) {
  p.store(g);
  { p.loss_scale() } -> std::convertible_to<double>;
};
// 6.
template <class P>
concept precision_policy_decides = requires(P& p, const P& cp, std::uint64_t step,
                                            std::span<const float> from, std::span<float> to,
                                            vote_archetype vote) {
  { p.finish(step, from, to, vote) } -> std::same_as<bool>;
  { cp.to_master(to, 1.0) } -> std::same_as<bool>;
  { cp.finite(from) } -> std::same_as<bool>;
};
// 7.
template <class P>
concept precision_policy_state = requires(const P& p, P& m, const nlohmann::json& j) {
  { p.state() } -> std::same_as<nlohmann::json>;
  m.restore(j);
};

template <class P>
concept precision_policy =
    precision_policy_tagged<P> && precision_policy_named<P> && precision_policy_describes<P> &&
    precision_policy_configured<P> && precision_policy_parameters<P> &&
    precision_policy_gradients<P> && precision_policy_decides<P> && precision_policy_state<P>;

// One readable error per missing requirement, where the policy meets the trainer.
template <class P>
constexpr bool check_precision_policy() {
  static_assert(precision_policy_tagged<P>,
                "PrecisionPolicy: missing 'using policy_category = strata::precision_policy_tag;'");
  static_assert(precision_policy_named<P>,
                "PrecisionPolicy: missing 'static constexpr std::string_view name'");
  static_assert(precision_policy_describes<P>,
                "PrecisionPolicy: missing 'static constexpr dtype compute_dtype', 'bool "
                "has_compute_copy', 'bool scales_loss' or 'bool skips_steps'");
  static_assert(precision_policy_configured<P>,
                "PrecisionPolicy: missing 'explicit P(const config::train_config&)' or 'static "
                "void check_config(const config::train_config&)'");
  static_assert(precision_policy_parameters<P>,
                "PrecisionPolicy: missing 'void prepare(Make&&)', 'model::param_store& "
                "compute(model::param_store&)' or 'void refresh(const model::param_store&)'");
  static_assert(precision_policy_gradients<P>,
                "PrecisionPolicy: missing 'void store(std::span<float>) const' or 'double "
                "loss_scale() const'");
  static_assert(precision_policy_decides<P>,
                "PrecisionPolicy: missing 'bool finish(std::uint64_t, std::span<const float>, "
                "std::span<float>, Vote&&)', 'bool to_master(std::span<float>, double) const' or "
                "'bool finite(std::span<const float>) const'");
  static_assert(precision_policy_state<P>,
                "PrecisionPolicy: missing 'nlohmann::json state() const' or 'void restore(const "
                "nlohmann::json&)'");
  return precision_policy<P>;
}

// Throws config_error for a key of the shipped precision policies that `policy` does not use,
// when the configuration sets it: mixed_precision_dtype other than `computes` (every policy),
// the loss scaler's keys (precision::fp16) unless `scaler`, and loss_scale_max_skips unless
// `stops_after_skips` (a policy that skips steps and stops after that many in a row).
struct precision_keys {
  dtype computes = dtype::float32;
  bool scaler = false;
  bool stops_after_skips = false;
};
inline void refuse_foreign_keys(const config::train_config& cfg, std::string_view policy,
                                precision_keys uses) {
  const auto refuse = [](const char* key, const std::string& text) {
    throw config_error({.key = key, .file = {}, .line = 0, .column = 0}, text);
  };
  const auto names = config::enum_names<config::precision_dtype>::names;
  const config::precision_dtype wanted =
      uses.computes == dtype::float16    ? config::precision_dtype::float16
      : uses.computes == dtype::bfloat16 ? config::precision_dtype::bfloat16
                                         : config::precision_dtype::float32;
  if (cfg.mixed_precision_dtype != wanted) {
    refuse("mixed_precision_dtype",
           "the trainer's precision policy is " + std::string(policy) + ", which computes in " +
               std::string(names[static_cast<std::size_t>(wanted)]) +
               "; give the trainer the policy for " +
               std::string(names[static_cast<std::size_t>(cfg.mixed_precision_dtype)]) +
               " (precision::fp32, precision::fp16, precision::bf16)");
  }
  const config::train_config d{};
  if (!uses.scaler) {
    const std::pair<const char*, bool> scaler_keys[] = {
        {"loss_scale_initial", cfg.loss_scale_initial != d.loss_scale_initial},
        {"loss_scale_growth_factor", cfg.loss_scale_growth_factor != d.loss_scale_growth_factor},
        {"loss_scale_backoff_factor", cfg.loss_scale_backoff_factor != d.loss_scale_backoff_factor},
        {"loss_scale_growth_interval",
         cfg.loss_scale_growth_interval != d.loss_scale_growth_interval},
        {"loss_scale_hysteresis", cfg.loss_scale_hysteresis != d.loss_scale_hysteresis},
        {"loss_scale_min", cfg.loss_scale_min != d.loss_scale_min},
        {"loss_scale_max_skips",
         !uses.stops_after_skips && cfg.loss_scale_max_skips != d.loss_scale_max_skips}};
    for (const auto& [key, set] : scaler_keys) {
      if (set) {
        refuse(key, std::string(key) +
                        " configures a loss scaler; the trainer's precision policy " +
                        std::string(policy) + " has none (precision::fp16 has one)");
      }
    }
  }
}

}  // namespace strata::precision
