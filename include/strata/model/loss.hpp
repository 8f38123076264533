// SPDX-License-Identifier: Apache-2.0
#pragma once

// The loss contract: what ends the model in training, taking the last layer's output and the
// labels. The trainer's loss slot (train/trainer.hpp) takes any loss; softmax_cross_entropy is
// the default.
//
// A loss L
//   1. opts in with `using policy_category = strata::loss_tag;` and names itself with
//      `static constexpr std::string_view name` (in the run's identity when not the default);
//   2. says which model outputs it takes: `void check_output(const sample_shape& out) const`
//      throws std::invalid_argument naming the shape when it cannot take `out` (the trainer
//      calls it at construction, so a model of any output shape trains with a loss that takes
//      it);
//   3. evaluates a batch: `loss_result evaluate(const loss_args& args) const` returns the loss
//      summed over the batch, the samples it counts as correct and the samples; when
//      args.grad_logits is not empty it WRITES the gradient of the summed loss with respect to
//      each output, times args.grad_scale (args.classes is the outputs per sample, the model's
//      output elements; args.labels holds one label per sample). A pure function of its
//      arguments: every rank and every recomputation gets the same numbers. args.tensor is the
//      tensor-parallel group of the model's last layer (requirement 10 of model/concepts.hpp);
//      a loss over whole outputs ignores it, one over outputs split by class reduces over it
//      (parallel::class_parallel_cross_entropy).
//
// check_loss<L>() names each requirement L misses in its own static_assert.

#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "strata/core/policy.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/concepts.hpp"

namespace strata::model {

struct loss_args {
  std::size_t batch = 0;
  std::size_t classes = 0;                 // outputs per sample (the model's output elements)
  std::span<const float> logits{};         // batch x classes: the model's output
  std::span<const std::int32_t> labels{};  // batch
  std::span<float> grad_logits{};          // batch x classes; empty: no gradient
  float grad_scale = 1.0f;                 // the gradient of the summed loss, times this
  tensor_context tensor{};                 // where the outputs are split by class (else one rank)
};

// What a batch (or, summed with +=, several) contributed.
struct loss_result {
  double loss_sum = 0.0;    // the loss summed over the samples
  std::size_t correct = 0;  // samples the loss counts as correct (the accuracy's numerator)
  std::size_t samples = 0;  // samples evaluated

  double mean_loss() const noexcept {
    return samples == 0 ? 0.0 : loss_sum / static_cast<double>(samples);
  }
  double accuracy() const noexcept {
    return samples == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(samples);
  }
  loss_result& operator+=(const loss_result& o) noexcept {
    loss_sum += o.loss_sum;
    correct += o.correct;
    samples += o.samples;
    return *this;
  }
  friend bool operator==(const loss_result&, const loss_result&) = default;
};

inline std::string to_string(const loss_result& r) {
  char text[64] = {};
  const auto printed = std::to_chars(text, text + sizeof(text), r.loss_sum);
  return "loss_result{.loss_sum = " + std::string(text, printed.ptr) +
         ", .correct = " + std::to_string(r.correct) + ", .samples = " + std::to_string(r.samples) +
         "}";
}

// 1.
template <class L>
concept loss_tagged = policy_of<L, loss_tag> && requires {
  { L::name } -> std::convertible_to<std::string_view>;
};
// 2.
template <class L>
concept loss_checks_output = requires(const L& l, const sample_shape& out) {
  l.check_output(out);
};
// 3.
template <class L>
concept loss_evaluates = requires(const L& l, const loss_args& a) {
  { l.evaluate(a) } -> std::same_as<loss_result>;
};

template <class L>
concept loss =
    loss_tagged<L> && loss_checks_output<L> && loss_evaluates<L> && std::default_initializable<L>;

// One readable error per missing requirement, where the loss meets the trainer.
template <class L>
constexpr bool check_loss() {
  static_assert(loss_tagged<L>,
                "Loss: missing 'using policy_category = strata::loss_tag;' or 'static constexpr "
                "std::string_view name'");
  static_assert(loss_checks_output<L>,
                "Loss: missing 'void check_output(const sample_shape&) const'");
  static_assert(loss_evaluates<L>, "Loss: missing 'loss_result evaluate(const loss_args&) const'");
  static_assert(std::default_initializable<L>, "Loss: must be default-constructible");
  return loss<L>;
}

}  // namespace strata::model
