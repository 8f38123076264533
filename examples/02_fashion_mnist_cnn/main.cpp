// SPDX-License-Identifier: Apache-2.0
// fashion_mnist_cnn: a convolutional network (two conv + two fully connected layers) trained on
// Fashion-MNIST with shifts and flips, on one rank. Configuration: fashion_mnist_cnn.toml
// beside the binary (or --config FILE), then command-line overrides (--epochs 5, --lr 0.1, ...);
// --print-config shows the result.
//
// Prints the progress, a summary (test accuracy, samples/s, wall time) and, with
// metrics_file set, one JSON row per step and per epoch.

#include <cstdio>
#include <string>

#include <strata/config.hpp>
#include <strata/data.hpp>
#include <strata/model/layers.hpp>
#include <strata/model/sequential.hpp>
#include <strata/train/configured.hpp>
#include <strata/train/gradient_fault.hpp>
#include <strata/train/trainer.hpp>

#include "../common/example_main.hpp"

namespace {

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;

// snippet-begin: model
auto make_cnn() {
  return sm::sequential(
      {.channels = 1, .height = 28, .width = 28},  // one Fashion-MNIST image
      sm::conv2d{.in_channels = 1, .out_channels = 32, .kernel = 5, .padding = 2},   // 32x28x28
      sm::relu{}, sm::max_pool2d{.kernel = 2, .stride = 2},                          // 32x14x14
      sm::conv2d{.in_channels = 32, .out_channels = 64, .kernel = 5, .padding = 2},  // 64x14x14
      sm::relu{}, sm::max_pool2d{.kernel = 2, .stride = 2},                          // 64x7x7
      sm::flatten{},                                                                 // 3136
      sm::linear{.in = 3136, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.3},
      sm::linear{.in = 1024, .out = 10});
}
// snippet-end: model

// The training augmentation: shifts of up to 2 pixels (a crop with padding 2), horizontal flips,
// then the dataset's normalisation. fashion_mnist_augmentation() adds an affine jitter and
// erasing on top; this example keeps the lighter chain of the benchmark row it is compared with
// (README.md).
auto cnn_augmentation(bool augment) {
  return sd::compose{
      sd::random_crop{.padding = augment ? std::size_t{2} : std::size_t{0}, .fill = 0.0f},
      sd::horizontal_flip{.probability = augment ? 0.5 : 0.0}, sd::fashion_mnist_normalize()};
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run(
      argc, argv, "fashion_mnist_cnn: a CNN on Fashion-MNIST (strata example 02)",
      "fashion_mnist_cnn.toml", [](const sc::train_config& cfg) {
        const sd::idx_dataset train =
            sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::train);
        const sd::idx_dataset test =
            sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::test);
        // The batch, precision and parallel policies follow the configuration (adaptive_batch,
        // gradient_accumulation_steps, mixed_precision_dtype, world_size,
        // communication_backend). With more than one rank it compiles in data<all_reduce> only
        // (the default menu, strata::train::parallel_menus::data_parallel): 12 trainer types.
        // snippet-begin: configured
        using menu = strata::train::parallel_menu<strata::parallel::data<>>;
        return strata::train::train_as_configured<menu>(make_cnn(), cfg, [&](auto& run) {
          strata::train::attach_gradient_fault(run);  // the fault suite's STRATA_GRADIENT_FAULT
          if (run.rank() == 0) {
            std::printf(
                "fashion_mnist_cnn: %zu parameters, %zu training / %zu test samples, GEMM: %s, "
                "%d rank(s)\n",
                run.params().parameter_count(), train.size(), test.size(),
                std::string(sm::blas_backend()).c_str(), run.world_size());
          }
          return run.fit(train, cnn_augmentation(cfg.augment), test, sd::fashion_mnist_normalize());
        });
        // snippet-end: configured
      });
}
