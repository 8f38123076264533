// expect-error: Loss: missing 'loss_result evaluate\(const loss_args&\) const'
// SPDX-License-Identifier: Apache-2.0
// A user's loss that does not evaluate: the trainer names the family and the requirement.
#include <string_view>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct loss_without_evaluate {
  using policy_category = strata::loss_tag;
  static constexpr std::string_view name = "loss_without_evaluate";
  void check_output(const strata::sample_shape&) const {}
};

int main() {
  const auto model =
      strata::model::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 4},
                                strata::model::linear{.in = 4, .out = 2});
  using trainer_t = strata::train::trainer<decltype(model), loss_without_evaluate>;
  static_assert(sizeof(trainer_t) > 0);
}
