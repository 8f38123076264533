// SPDX-License-Identifier: Apache-2.0
#pragma once

// softmax_cross_entropy: the classification loss over a batch of logits, with its gradient.
// Not a layer: it ends the model, taking the last layer's output and the labels.
//
//   const strata::model::loss_result r = strata::model::softmax_cross_entropy{}.evaluate(
//       {.batch = b, .classes = 10, .logits = logits, .labels = labels,
//        .grad_logits = grad, .grad_scale = 1.0f / static_cast<float>(global_batch)});
//
// For sample s with logits z and label y: p = softmax(z), loss_s = -log p[y], computed stably
// as log(sum_j exp(z_j - max z)) - (z_y - max z) in double. The result sums loss_s over the
// batch and counts the samples whose argmax (the lowest index among ties) is the label. With
// grad_logits given it WRITES (p - onehot(y)) * grad_scale for every logit; grad_scale = 1 /
// global batch makes it the gradient of the mean loss. grad_logits may be the memory of logits
// (each logit is read before its gradient is written). Labels are checked before anything is
// written.

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "strata/core/policy.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/loss.hpp"

namespace strata::model {

struct softmax_cross_entropy {
  using policy_category = loss_tag;
  static constexpr std::string_view name = "softmax_cross_entropy";

  // The model's output must be a vector of class scores: 1 x 1 x classes.
  void check_output(const sample_shape& out) const {
    if (out.channels != 1 || out.height != 1) {
      throw std::invalid_argument("softmax_cross_entropy: the model's output " + to_string(out) +
                                  " is not a vector of class scores (1x1xclasses)");
    }
  }

  // Throws std::invalid_argument for classes == 0, spans of the wrong size, a non-finite
  // grad_scale, or a label outside [0, classes) (naming the sample and the label).
  loss_result evaluate(const loss_args& args) const {
    check(args);
    loss_result result{};
    result.samples = args.batch;
    const bool want_gradient = !args.grad_logits.empty();
    const double scale = args.grad_scale;
    for (std::size_t s = 0; s < args.batch; ++s) {
      const float* z = args.logits.data() + s * args.classes;
      const auto label = static_cast<std::size_t>(args.labels[s]);

      std::size_t argmax = 0;
      for (std::size_t j = 1; j < args.classes; ++j) {
        if (z[j] > z[argmax]) {
          argmax = j;
        }
      }
      const double top = z[argmax];
      double sum = 0.0;
      for (std::size_t j = 0; j < args.classes; ++j) {
        sum += std::exp(static_cast<double>(z[j]) - top);
      }
      const double log_sum = std::log(sum);
      result.loss_sum += log_sum - (static_cast<double>(z[label]) - top);
      if (argmax == label) {
        ++result.correct;
      }

      if (want_gradient) {
        float* g = args.grad_logits.data() + s * args.classes;
        for (std::size_t j = 0; j < args.classes; ++j) {
          const double p = std::exp(static_cast<double>(z[j]) - top - log_sum);
          const double onehot = j == label ? 1.0 : 0.0;
          g[j] = static_cast<float>((p - onehot) * scale);
        }
      }
    }
    return result;
  }

  friend bool operator==(const softmax_cross_entropy&, const softmax_cross_entropy&) = default;

 private:
  static void check(const loss_args& args) {
    if (args.classes == 0) {
      throw std::invalid_argument("softmax_cross_entropy: classes must be at least 1, got 0");
    }
    const std::size_t expected = args.batch * args.classes;
    if (args.logits.size() != expected) {
      throw std::invalid_argument(
          "softmax_cross_entropy: logits must hold batch x classes = " + std::to_string(expected) +
          " floats, got " + std::to_string(args.logits.size()));
    }
    if (args.labels.size() != args.batch) {
      throw std::invalid_argument(
          "softmax_cross_entropy: labels must hold batch = " + std::to_string(args.batch) +
          " values, got " + std::to_string(args.labels.size()));
    }
    if (!args.grad_logits.empty() && args.grad_logits.size() != expected) {
      throw std::invalid_argument(
          "softmax_cross_entropy: grad_logits must be empty or hold batch x classes = " +
          std::to_string(expected) + " floats, got " + std::to_string(args.grad_logits.size()));
    }
    if (!std::isfinite(args.grad_scale)) {
      throw std::invalid_argument("softmax_cross_entropy: grad_scale must be finite, got " +
                                  std::to_string(args.grad_scale));
    }
    for (std::size_t s = 0; s < args.batch; ++s) {
      const std::int32_t label = args.labels[s];
      if (label < 0 || static_cast<std::size_t>(label) >= args.classes) {
        throw std::invalid_argument("softmax_cross_entropy: label of sample " + std::to_string(s) +
                                    " is " + std::to_string(label) + ", outside [0, " +
                                    std::to_string(args.classes) + ")");
      }
    }
  }
};

inline std::string to_string(const softmax_cross_entropy&) {
  return "softmax_cross_entropy{}";
}

static_assert(check_loss<softmax_cross_entropy>());

}  // namespace strata::model
