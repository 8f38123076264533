// SPDX-License-Identifier: Apache-2.0
#pragma once

// Example 01's model, augmentation and training (main.cpp runs it; the tests also build it with
// every parallel policy, tests/example/every_policy_mlp.cpp).

#include <cstdio>
#include <string>

#include <strata/config.hpp>
#include <strata/data.hpp>
#include <strata/model/layers.hpp>
#include <strata/model/sequential.hpp>
#include <strata/train/configured.hpp>
#include <strata/train/trainer.hpp>

#include "../common/example_main.hpp"

namespace examples::mlp {

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;

// snippet-begin: model
auto make_mlp() {
  // The hidden layers' ReLU runs inside their products and their dropout on the products'
  // output (the same as an sm::relu{} and an sm::dropout{.rate = 0.1} after each, three passes
  // fewer and no mask kept).
  constexpr auto relu = sm::fused_activation::relu;
  return sm::sequential({.channels = 1, .height = 28, .width = 28},  // one Fashion-MNIST image
                        sm::flatten{},                               // 784
                        sm::linear{.in = 784, .out = 1024, .activation = relu, .dropout = 0.1},
                        sm::linear{.in = 1024, .out = 1024, .activation = relu, .dropout = 0.1},
                        sm::linear{.in = 1024, .out = 10});
}
// snippet-end: model

// The augmentation this MLP gains from within 15 epochs: horizontal flips, then the dataset's
// normalisation (with augment = false, no flips). Shifts and erasing
// (fashion_mnist_augmentation()) suit convolutional models; an MLP has no translation invariance
// of its own and underfits with them (0.881 against 0.902 test accuracy after 15 epochs,
// measured).
auto mlp_augmentation(bool augment) {
  return sd::compose{sd::horizontal_flip{.probability = augment ? 0.5 : 0.0},
                     sd::fashion_mnist_normalize()};
}

// Trains the MLP on Fashion-MNIST as `cfg` says, with the policies the configuration names among
// those of the menus (by default data<all_reduce> for more than one rank, every precision).
template <class ParallelMenu = parallel_menus::data_parallel,
          class PrecisionMenu = strata::train::every_precision>
strata::train::fit_summary train(const sc::train_config& cfg) {
  const sd::idx_dataset train =
      sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::train);
  const sd::idx_dataset test = sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::test);
  // The batch, precision and parallel policies follow the configuration (adaptive_batch,
  // gradient_accumulation_steps, mixed_precision_dtype, world_size, communication_backend, and
  // for more than one rank the keys of the parallel policy).
  return examples::train_as_configured<ParallelMenu, PrecisionMenu>(
      make_mlp(), cfg, [&](auto& run) {
        if (run.rank() == 0) {
          std::printf(
              "fashion_mnist_mlp: %zu parameters, %zu training / %zu test samples, GEMM: %s, "
              "%d rank(s)\n",
              run.params().parameter_count(), train.size(), test.size(),
              std::string(sm::blas_backend()).c_str(), run.world_size());
        }
        return run.fit(train, mlp_augmentation(cfg.augment), test, sd::fashion_mnist_normalize());
      });
}

}  // namespace examples::mlp
