// expect-error: ParallelPolicy: missing 'using executor = \.\.\.;'
// SPDX-License-Identifier: Apache-2.0
// A user's parallel policy that names no step executor: the trainer names the family and the
// requirement.
#include <string_view>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct local_sgd_without_executor {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "local_sgd";
  static constexpr bool distributed = true;
  static void check_config(const strata::config::train_config& cfg, int world, int rank) {
    strata::parallel::refuse_foreign_keys({.distributed = true, .parallel = name}, cfg, world,
                                          rank);
  }
};

int main() {
  const auto model =
      strata::model::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 4},
                                strata::model::linear{.in = 4, .out = 2});
  using trainer_t = strata::train::trainer<decltype(model), local_sgd_without_executor>;
  static_assert(sizeof(trainer_t) > 0);
}
