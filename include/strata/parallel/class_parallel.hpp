// SPDX-License-Identifier: Apache-2.0
#pragma once

// A class-parallel output (vocabulary parallelism, for a classifier): the last layer's weight
// split by classes over the tensor group, each rank computing the logits of its classes only,
// and a cross-entropy that reduces the softmax over the group instead of gathering the logits.
//
//   parallel::class_parallel_linear(in, classes)  column_parallel_linear without the gather:
//       rank r writes the logits of classes [r C / p, (r + 1) C / p) into those columns of the
//       model's output (the others stay zero)
//   parallel::class_parallel_cross_entropy        the loss that takes such output (the trainer's
//       loss slot: trainer<Model, parallel::tensor<...>, parallel::class_parallel_cross_entropy>)
//
// Per sample, the loss gathers each rank's largest logit and its class (2 floats per rank) for
// the maximum and the prediction (the lowest class among ties, as softmax_cross_entropy), then
// sums over the group each rank's sum of exp(z - max) and the label's logit where the rank holds
// it (one all-reduce of 2 floats per sample). The loss and the correct count are the same on
// every rank; the gradient (p - onehot) x grad_scale is written for this rank's classes, zero
// for the others, which the layer's backward does not read. Nothing of batch x classes crosses
// ranks. On a group of one both are linear and softmax_cross_entropy.
//
// Only this loss may follow class_parallel_linear: any other layer or loss after it would read
// the zeros of the other ranks' classes. The model's output (a prediction read by the user) holds
// this rank's classes only when tp > 1.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/policy.hpp"
#include "strata/core/shape.hpp"
#include "strata/model/loss.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "strata/parallel/tensor.hpp"

namespace strata::parallel {

// The classifier of a class-parallel output: `classes` outputs split by rows of the weight (and
// the bias by columns) over the tensor group, not gathered.
inline column_parallel_linear class_parallel_linear(std::size_t in, std::size_t classes,
                                                    bool bias = true) {
  return {.in = in, .out = classes, .bias = bias, .gather_output = false};
}

struct class_parallel_cross_entropy {
  using policy_category = loss_tag;
  static constexpr std::string_view name = "class_parallel_cross_entropy";

  void check_output(const sample_shape& out) const {
    model::softmax_cross_entropy{}.check_output(out);
  }

  // On a group of one, softmax_cross_entropy's result. Throws std::invalid_argument as it does
  // (sizes, labels, grad_scale), and when the classes do not split over the group.
  model::loss_result evaluate(const model::loss_args& args) const {
    const model::tensor_place place = args.tensor.place;
    if (place.size == 1) {
      return model::softmax_cross_entropy{}.evaluate(args);
    }
    check(args);
    const std::size_t part =
        detail::tensor_part("class_parallel_cross_entropy", "classes", args.classes, place);
    const std::size_t first = place.rank * part;
    const std::size_t n = args.batch;
    const bool want_gradient = !args.grad_logits.empty();

    // Each rank's largest logit and its class, gathered: the maximum and the prediction.
    std::vector<float> mine(2 * n);
    for (std::size_t s = 0; s < n; ++s) {
      const float* z = args.logits.data() + s * args.classes + first;
      std::size_t best = 0;
      for (std::size_t j = 1; j < part; ++j) {
        if (z[j] > z[best]) {
          best = j;
        }
      }
      mine[2 * s] = z[best];
      mine[2 * s + 1] = static_cast<float>(first + best);  // exact below 2^24 classes
    }
    std::vector<float> all(2 * n * place.size);
    args.tensor.all_gather(mine, all);
    std::vector<float> top(n);
    std::vector<std::size_t> predicted(n);
    for (std::size_t s = 0; s < n; ++s) {
      std::size_t from = 0;
      for (std::size_t r = 1; r < place.size; ++r) {  // ranks hold increasing classes
        if (all[r * 2 * n + 2 * s] > all[from * 2 * n + 2 * s]) {
          from = r;
        }
      }
      top[s] = all[from * 2 * n + 2 * s];
      predicted[s] = static_cast<std::size_t>(all[from * 2 * n + 2 * s + 1]);
    }

    // Sums over the group: exp(z - max) over the classes, and the label's shifted logit.
    std::vector<float> sums(2 * n, 0.0f);
    for (std::size_t s = 0; s < n; ++s) {
      const float* z = args.logits.data() + s * args.classes + first;
      double sum = 0.0;
      for (std::size_t j = 0; j < part; ++j) {
        sum += std::exp(static_cast<double>(z[j]) - top[s]);
      }
      sums[2 * s] = static_cast<float>(sum);
      const auto label = static_cast<std::size_t>(args.labels[s]);
      if (label >= first && label < first + part) {
        sums[2 * s + 1] = static_cast<float>(static_cast<double>(z[label - first]) - top[s]);
      }
    }
    args.tensor.all_reduce_sum(sums);

    model::loss_result result{.loss_sum = 0.0, .correct = 0, .samples = n};
    for (std::size_t s = 0; s < n; ++s) {
      const double log_sum = std::log(static_cast<double>(sums[2 * s]));
      const auto label = static_cast<std::size_t>(args.labels[s]);
      result.loss_sum += log_sum - static_cast<double>(sums[2 * s + 1]);
      if (predicted[s] == label) {
        ++result.correct;
      }
      if (!want_gradient) {
        continue;
      }
      const float* z = args.logits.data() + s * args.classes;
      float* g = args.grad_logits.data() + s * args.classes;
      std::fill(g, g + args.classes, 0.0f);
      for (std::size_t j = first; j < first + part; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - top[s] - log_sum);
        g[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) * args.grad_scale);
      }
    }
    return result;
  }

  friend bool operator==(const class_parallel_cross_entropy&,
                         const class_parallel_cross_entropy&) = default;

 private:
  static void check(const model::loss_args& args) {
    const std::size_t expected = args.batch * args.classes;
    const auto fail = [](const std::string& what) {
      throw std::invalid_argument("class_parallel_cross_entropy: " + what);
    };
    if (args.classes == 0) {
      fail("classes must be at least 1, got 0");
    }
    if (!std::isfinite(args.grad_scale)) {
      fail("grad_scale must be finite, got " + std::to_string(args.grad_scale));
    }
    if (args.logits.size() != expected) {
      fail("logits must hold batch x classes = " + std::to_string(expected) + " floats, got " +
           std::to_string(args.logits.size()));
    }
    if (args.labels.size() != args.batch) {
      fail("labels must hold batch = " + std::to_string(args.batch) + " values, got " +
           std::to_string(args.labels.size()));
    }
    if (!args.grad_logits.empty() && args.grad_logits.size() != expected) {
      fail("grad_logits must be empty or hold batch x classes = " + std::to_string(expected) +
           " floats, got " + std::to_string(args.grad_logits.size()));
    }
    for (std::size_t s = 0; s < args.batch; ++s) {
      const std::int32_t label = args.labels[s];
      if (label < 0 || static_cast<std::size_t>(label) >= args.classes) {
        fail("label of sample " + std::to_string(s) + " is " + std::to_string(label) +
             ", outside [0, " + std::to_string(args.classes) + ")");
      }
    }
  }
};

static_assert(model::check_loss<class_parallel_cross_entropy>());

}  // namespace strata::parallel
