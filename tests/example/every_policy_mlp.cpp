// SPDX-License-Identifier: Apache-2.0
// Example 01's MLP with every parallel policy and pipeline schedule the configuration can name,
// in float32: what the tests of those policies run end to end (example 01 itself compiles in
// data<all_reduce> alone, so that it compiles in seconds rather than minutes).

#include "../../examples/01_fashion_mnist_mlp/mlp.hpp"

int main(int argc, char** argv) {
  return examples::run(
      argc, argv, "fashion_mnist_mlp_every_policy: example 01 with every parallel policy",
      "fashion_mnist_mlp.toml", [](const strata::config::train_config& cfg) {
        return examples::mlp::train<examples::parallel_menus::every_policy,
                                    strata::train::precision_menu<strata::precision::fp32>>(cfg);
      });
}
