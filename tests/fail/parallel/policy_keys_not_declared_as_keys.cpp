// expect-error: Policy: 'config_keys' must be an array of strata::config::policy_key
// SPDX-License-Identifier: Apache-2.0
// A user's policy that lists its [policy] keys as plain names: the trainer says how to declare
// them.
#include <array>
#include <string_view>

#include "../../../examples/03_custom_policies/local_sgd.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct named_keys_sgd : local_sgd {
  static constexpr std::array<std::string_view, 1> config_keys{"local_sgd_period"};
};

int main() {
  const auto model =
      strata::model::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 4},
                                strata::model::linear{.in = 4, .out = 2});
  strata::config::train_config cfg;
  strata::config::check_policy_keys<named_keys_sgd>(cfg);
  using trainer_t = strata::train::trainer<decltype(model), named_keys_sgd>;
  static_assert(sizeof(trainer_t) > 0);
}
