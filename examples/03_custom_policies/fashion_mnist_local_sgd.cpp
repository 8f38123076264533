// SPDX-License-Identifier: Apache-2.0
// fashion_mnist_local_sgd: an MLP on Fashion-MNIST trained by a parallel policy written outside
// the library, local SGD (local_sgd.hpp): each rank steps alone on its shard of the data and the
// ranks average their parameters every 4 steps. world_size ranks over communication_backend:
// threads of this process, or one process per rank under mpiexec. Configuration:
// fashion_mnist_local_sgd.toml beside the binary (or --config FILE), then command-line
// overrides; the run resumes from its newest checkpoint like the other examples.

#include <cstdio>
#include <string>

#include <strata/config.hpp>
#include <strata/data.hpp>
#include <strata/model/layers.hpp>
#include <strata/model/sequential.hpp>
#include <strata/train/configured.hpp>
#include <strata/train/trainer.hpp>

#include "../common/example_main.hpp"
#include "local_sgd.hpp"

namespace {

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;

auto make_mlp() {
  return sm::sequential({.channels = 1, .height = 28, .width = 28}, sm::flatten{},
                        sm::linear{.in = 784, .out = 256}, sm::relu{},
                        sm::linear{.in = 256, .out = 10});
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run(
      argc, argv,
      "fashion_mnist_local_sgd: local SGD, a user's parallel policy (strata example 03)",
      "fashion_mnist_local_sgd.toml", [](const sc::train_config& cfg) {
        const sd::idx_dataset train =
            sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::train);
        const sd::idx_dataset test =
            sd::load_fashion_mnist(cfg.data_dir, sd::fashion_mnist_split::test);
        using trainer_t = strata::train::trainer<decltype(make_mlp()), local_sgd>;
        return strata::train::train_on_ranks<trainer_t>(make_mlp(), cfg, [&](trainer_t& run) {
          examples::prepare(run, cfg);
          if (run.rank() == 0) {
            std::printf(
                "fashion_mnist_local_sgd: %zu parameters, %d rank(s), parameters averaged "
                "every %lld steps\n",
                run.params().parameter_count(), run.world_size(),
                static_cast<long long>(strata::config::policy_int(cfg, local_sgd::config_keys[0])));
          }
          // Horizontal flips (augment = true), then the dataset's normalisation.
          const sd::compose augmentation{
              sd::horizontal_flip{.probability = cfg.augment ? 0.5 : 0.0},
              sd::fashion_mnist_normalize()};
          return run.fit(train, augmentation, test, sd::fashion_mnist_normalize());
        });
      });
}
