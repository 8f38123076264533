// SPDX-License-Identifier: Apache-2.0
#pragma once

// The batch_policy contract: how one optimizer step's samples are cut into micro-batches, and
// what happens when memory runs short. The trainer owns the loader, the model and the step; a
// batch policy decides how many loader batches a step takes and how each one runs, through the
// step_runner the trainer hands it.
//
// A batch policy B
//   1. opts in with `using policy_category = strata::batch_policy_tag;` and names itself with
//      `static constexpr std::string_view name`;
//   2. is made from the run's configuration, `explicit B(const config::train_config&)`, and
//      checks its own keys with `static void check_config(const config::train_config&)`, which
//      throws config_error naming a key it cannot run (refuse_foreign_keys helps with the keys
//      of the shipped policies it does not use);
//   3. sizes the loader and the steps:
//        std::size_t loader_batch() const                 samples per loader batch, > 0
//        std::size_t loader_batches(std::uint64_t step) const
//                                                          loader batches optimizer step `step`
//                                                          takes, >= 1 (the epoch's last step
//                                                          takes what is left)
//        std::size_t micro_batch() const noexcept         the micro-batch it ran last, for the
//                                                          step's metrics
//   4. runs: `void begin(R& runner)` once per fit() after a resume, before the first step, and
//      `model::loss_result run(R& runner, const batch::samples& b, bool last)` for each loader
//      batch of a step (`last`: the step's last one), for any step_runner R;
//   5. keeps its state across a checkpoint: `nlohmann::json state() const` and
//      `void restore(const nlohmann::json&)` (restore(null): a checkpoint without it);
//   6. says whether the trainer frees the evaluation workspace after each evaluation:
//      `static constexpr bool frees_evaluation_memory`.
//
// Semantics every policy keeps (tests/conformance/batch_policy.hpp checks them, through a
// recording runner):
//   - run() covers its samples exactly once, in order, by runner.micro_step on contiguous slices,
//     counting from the last runner.restart() it called; each slice fits the workspace the
//     policy asked for (set_workspace), or the policy asked for none and the runner grows it;
//   - only the step's last micro_step passes last = true (its backward may overlap the
//     communication of the gradients), and none follows it in that step;
//   - a memory_error that the policy does not recover from leaves run() (never a partial step
//     reported as done);
//   - decisions that differ between ranks (a micro-batch picked from local memory) go through
//     runner.agree_min, so every rank runs the same collectives;
//   - a restored copy makes the same decisions as the policy that wrote the state.
//
// The step_runner R, the trainer's side:
//   model::loss_result micro_step(const samples&, bool last)  forward, loss, backward; adds the
//                                                   slice's gradients into the step's
//   void restart()                                  the step's gradients back to zero (before
//                                                   running its samples again)
//   void set_workspace(std::size_t samples)         a training workspace of exactly that many
//                                                   samples (0 releases it)
//   std::size_t workspace_capacity() const
//   std::uint64_t step() const                      the optimizer step being run
//   std::size_t memory_budget() const               this rank's host memory budget, bytes
//   memory_tracker& memory()                        the host tracker the budget applies to
//   std::size_t activation_bytes(std::size_t micro) const
//                                                   estimate_memory's activations for a
//                                                   micro-batch of that many samples
//   std::size_t agree_min(std::size_t value)        the minimum over the ranks that step
//                                                   together (collective; the value on one rank)
//   void message(std::string)                       one line for the log (rank 0 prints it)

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/policy.hpp"
#include "strata/model/softmax_cross_entropy.hpp"

namespace strata::batch {

// A run of samples of one loader batch: `size` samples of `sample_elements` floats each.
struct samples {
  std::span<const float> inputs{};
  std::span<const std::int32_t> labels{};
  std::span<const std::size_t> indices{};
  std::size_t size = 0;

  // The n samples from `offset` on.
  samples slice(std::size_t offset, std::size_t n) const {
    const std::size_t per = size == 0 ? 0 : inputs.size() / size;
    return {.inputs = inputs.subspan(offset * per, n * per),
            .labels = labels.subspan(offset, n),
            .indices = indices.subspan(offset, n),
            .size = n};
  }
};

// The trainer's side of a step, as a batch policy sees it (the list above).
template <class R>
concept step_runner = requires(R& r, const R& cr, const samples& s, std::size_t n, std::string m) {
  { r.micro_step(s, true) } -> std::same_as<model::loss_result>;
  { r.restart() } -> std::same_as<void>;
  { r.set_workspace(n) } -> std::same_as<void>;
  { cr.workspace_capacity() } -> std::same_as<std::size_t>;
  { cr.step() } -> std::same_as<std::uint64_t>;
  { cr.memory_budget() } -> std::same_as<std::size_t>;
  { r.memory() } -> std::same_as<memory_tracker&>;
  { cr.activation_bytes(n) } -> std::same_as<std::size_t>;
  { r.agree_min(n) } -> std::same_as<std::size_t>;
  { r.message(m) } -> std::same_as<void>;
};

// A step_runner with nothing behind it: the type the contract's checks call a policy with.
struct runner_archetype {
  model::loss_result micro_step(const samples&, bool);
  void restart();
  void set_workspace(std::size_t);
  std::size_t workspace_capacity() const;
  std::uint64_t step() const;
  std::size_t memory_budget() const;
  memory_tracker& memory();
  std::size_t activation_bytes(std::size_t) const;
  std::size_t agree_min(std::size_t);
  void message(std::string);
};
static_assert(step_runner<runner_archetype>);

// 1.
template <class B>
concept batch_policy_tagged = policy_of<B, batch_policy_tag>;
template <class B>
concept batch_policy_named = requires {
  { B::name } -> std::convertible_to<std::string_view>;
};
// 2.
template <class B>
concept batch_policy_configured = std::constructible_from<B, const config::train_config&> &&
    requires(const config::train_config& c) {
  B::check_config(c);
};
// 3.
template <class B>
concept batch_policy_sizes = requires(const B& b, std::uint64_t step) {
  { b.loader_batch() } -> std::same_as<std::size_t>;
  { b.loader_batches(step) } -> std::same_as<std::size_t>;
  { b.micro_batch() } -> std::same_as<std::size_t>;
};
// 4.
template <class B>
concept batch_policy_runs = requires(B& b, runner_archetype& r, const samples& s) {
  b.begin(r);
  { b.run(r, s, true) } -> std::same_as<model::loss_result>;
};
// 5.
template <class B>
concept batch_policy_state = requires(const B& b, B& m, const nlohmann::json& j) {
  { b.state() } -> std::same_as<nlohmann::json>;
  m.restore(j);
};
// 6.
template <class B>
concept batch_policy_memory = requires {
  { B::frees_evaluation_memory } -> std::convertible_to<bool>;
};

template <class B>
concept batch_policy = batch_policy_tagged<B> && batch_policy_named<B> &&
    batch_policy_configured<B> && batch_policy_sizes<B> && batch_policy_runs<B> &&
    batch_policy_state<B> && batch_policy_memory<B>;

// One readable error per missing requirement, where the policy meets the trainer. Returns true
// so that it can sit in a static_assert of its own.
template <class B>
constexpr bool check_batch_policy() {
  static_assert(batch_policy_tagged<B>,
                "BatchPolicy: missing 'using policy_category = strata::batch_policy_tag;'");
  static_assert(batch_policy_named<B>,
                "BatchPolicy: missing 'static constexpr std::string_view name'");
  static_assert(batch_policy_configured<B>,
                "BatchPolicy: missing 'explicit B(const config::train_config&)' or 'static void "
                "check_config(const config::train_config&)'");
  static_assert(batch_policy_sizes<B>,
                "BatchPolicy: missing 'std::size_t loader_batch() const', 'std::size_t "
                "loader_batches(std::uint64_t) const' or 'std::size_t micro_batch() const'");
  static_assert(batch_policy_runs<B>,
                "BatchPolicy: missing 'void begin(Runner&)' or 'model::loss_result run(Runner&, "
                "const batch::samples&, bool last)' for any step_runner");
  static_assert(batch_policy_state<B>,
                "BatchPolicy: missing 'nlohmann::json state() const' or 'void restore(const "
                "nlohmann::json&)'");
  static_assert(batch_policy_memory<B>,
                "BatchPolicy: missing 'static constexpr bool frees_evaluation_memory'");
  return batch_policy<B>;
}

// Throws config_error for a key of a shipped batch policy that `policy` does not use, when the
// configuration sets it: gradient_accumulation_steps (batch::accumulate, batch::adaptive),
// adaptive_batch, memory_budget_mb, adaptive_batch_min and adaptive_batch_max
// (batch::adaptive). A policy passes what it uses.
struct batch_keys {
  bool accumulation = false;  // gradient_accumulation_steps
  bool adaptive = false;      // adaptive_batch and the adaptive keys
};
inline void refuse_foreign_keys(const config::train_config& cfg, std::string_view policy,
                                batch_keys uses) {
  const config::train_config d{};
  const auto refuse = [&](const char* key, const std::string& text) {
    throw config_error({.key = key, .file = {}, .line = 0, .column = 0}, text);
  };
  if (!uses.accumulation && cfg.gradient_accumulation_steps != d.gradient_accumulation_steps) {
    refuse("gradient_accumulation_steps",
           "the batch policy is batch::" + std::string(policy) +
               ", which runs one micro-batch per step; give the trainer strata::batch::accumulate "
               "to accumulate " +
               std::to_string(cfg.gradient_accumulation_steps) + " micro-batches");
  }
  if (!uses.adaptive) {
    if (cfg.adaptive_batch) {
      refuse("adaptive_batch", "the trainer's batch policy is batch::" + std::string(policy) +
                                   "; adaptive_batch = true needs strata::batch::adaptive");
    }
    const std::pair<const char*, bool> adaptive_keys[] = {
        {"memory_budget_mb", cfg.memory_budget_mb != d.memory_budget_mb},
        {"adaptive_batch_min", cfg.adaptive_batch_min != d.adaptive_batch_min},
        {"adaptive_batch_max", cfg.adaptive_batch_max != d.adaptive_batch_max}};
    for (const auto& [key, set] : adaptive_keys) {
      if (set) {
        refuse(key, std::string(key) +
                        " configures batch::adaptive; the trainer's batch policy is batch::" +
                        std::string(policy));
      }
    }
  }
}

}  // namespace strata::batch
