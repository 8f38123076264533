// SPDX-License-Identifier: Apache-2.0
// fashion_mnist_vit: a small vision transformer on Fashion-MNIST, on one rank or on a data x
// tensor x pipeline mesh of thread ranks or MPI processes, chosen by the configuration
// (world_size, tensor_parallel_size, pipeline_parallel_size; data_parallel_size follows).
// Configuration: fashion_mnist_vit.toml beside the binary (or --config FILE), then command-line
// overrides; --print-config shows the result.
//
//   fashion_mnist_vit                                                  # one rank
//   fashion_mnist_vit --world_size 2 --tensor_parallel_size 2          # heads and MLP split
//   fashion_mnist_vit --world_size 4 --tensor_parallel_size 2 --pipeline_parallel_size 2
//       --micro_batches 4                                              # tp 2 x pp 2 (one line)

#include <cstdio>
#include <string>

#include <strata/config.hpp>
#include <strata/data.hpp>
#include <strata/model/layers.hpp>
#include <strata/model/sequential.hpp>
#include <strata/parallel/tensor.hpp>
#include <strata/train/trainer.hpp>

#include "../common/example_main.hpp"

namespace {

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;
namespace sp = strata::parallel;

// snippet-begin: model
// 7 x 7 patches: 16 tokens of 64 features; four blocks of attention (4 heads) and an MLP (128
// hidden), each behind a layer norm with a residual connection; the tokens' mean classified.
// Under tensor parallelism each rank runs heads / tp heads and hidden / tp MLP units.
constexpr std::size_t dim = 64;

auto attention() {
  return sm::residual{sm::layer_norm{.features = dim}, sm::self_attention{.dim = dim, .heads = 4}};
}
auto mlp() {
  return sm::residual{sm::layer_norm{.features = dim}, sp::parallel_mlp{.dim = dim, .hidden = 128}};
}

auto make_vit() {
  return sm::sequential({.channels = 1, .height = 28, .width = 28},
                        sm::patch_embedding{.patch = 7, .dim = dim},  // 16 tokens x 64
                        attention(), mlp(), attention(), mlp(), attention(), mlp(), attention(),
                        mlp(), sm::layer_norm{.features = dim}, sm::token_mean{},
                        sm::linear{.in = dim, .out = 10});
}
// snippet-end: model

// Horizontal flips, then random erasing (a rectangle of 2-33% of the image set to the mean
// pixel, half of the time). Shifts of up to 2 pixels (a crop of the padded image) learned slower
// (docs/tensor.md, "Example 04, measured").
auto vit_augmentation(bool augment) {
  return sd::compose{sd::horizontal_flip{.probability = augment ? 0.5 : 0.0},
                     sd::fashion_mnist_normalize(),
                     sd::random_erasing{.probability = augment ? 0.5 : 0.0}};
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run(
      argc, argv, "fashion_mnist_vit: a vision transformer on Fashion-MNIST (strata example 04)",
      "fashion_mnist_vit.toml", [](const sc::train_config& cfg) {
        const sd::idx_dataset train =
            sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::train);
        const sd::idx_dataset test =
            sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::test);
        // One rank, or the mesh's policy: data<>, pipeline<one_f_one_b>, tensor<data<>> or
        // tensor<pipeline<one_f_one_b>> (strata::train::parallel_menus::mesh), every precision,
        // a fixed batch.
        return examples::train_as_configured<examples::parallel_menus::mesh,
                                             strata::train::every_precision,
                                             strata::train::batch_menu<strata::batch::accumulate>>(
            make_vit(), cfg, [&](auto& run) {
              if (run.rank() == 0) {
                std::printf(
                    "fashion_mnist_vit: %zu parameters on rank 0, %zu training / %zu test "
                    "samples, %d rank(s): data %lld x tensor %lld x pipeline %lld\n",
                    run.params().parameter_count(), train.size(), test.size(), run.world_size(),
                    static_cast<long long>(sc::effective_data_parallel_size(cfg)),
                    static_cast<long long>(cfg.tensor_parallel_size),
                    static_cast<long long>(cfg.pipeline_parallel_size));
              }
              return run.fit(train, vit_augmentation(cfg.augment), test,
                             sd::fashion_mnist_normalize());
            });
      });
}
