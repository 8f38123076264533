// expect-error: ParallelPolicy: missing 'static void check_config\(const config::train_config&, int
// world, int rank\)' SPDX-License-Identifier: Apache-2.0 A user's parallel policy that does not
// check its configuration keys: the trainer names the family and the requirement.
#include <string_view>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct local_sgd_without_check {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "local_sgd";
  static constexpr bool distributed = true;
};

int main() {
  const auto model =
      strata::model::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 4},
                                strata::model::linear{.in = 4, .out = 2});
  using trainer_t = strata::train::trainer<decltype(model), local_sgd_without_check>;
  static_assert(sizeof(trainer_t) > 0);
}
