// SPDX-License-Identifier: Apache-2.0
// fashion_mnist_mlp: an MLP 784-1024-1024-10 trained on Fashion-MNIST with augmentation (mlp.hpp),
// on one rank or several (data<all_reduce>). Configuration: fashion_mnist_mlp.toml beside the
// binary (or --config FILE), then command-line overrides (--epochs 5, --lr 0.1, ...);
// --print-config shows the result.
//
// Prints the progress, a summary (test accuracy, samples/s, wall time) and, with
// metrics_file set, one JSON row per step and per epoch.

#include "mlp.hpp"

int main(int argc, char** argv) {
  return examples::run(argc, argv, "fashion_mnist_mlp: an MLP on Fashion-MNIST (strata example 01)",
                       "fashion_mnist_mlp.toml", [](const strata::config::train_config& cfg) {
                         return examples::mlp::train(cfg);
                       });
}
