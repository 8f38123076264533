// expect-error: ParallelPolicy executor: optimizer_blobs\(\) must be const and return
// SPDX-License-Identifier: Apache-2.0
// A user's executor that describes its optimizer blobs by name only: the description of a
// checkpoint that resumes under another layout needs the shards each blob holds, so the trainer
// names the requirement instead of ignoring the member.
#include <string>
#include <string_view>
#include <vector>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct described_by_name {
  using policy_category = strata::parallel_policy_tag;
  static constexpr std::string_view name = "described_by_name";
  static constexpr bool distributed = true;
  static void check_config(const strata::config::train_config& cfg, int world, int rank) {
    strata::parallel::refuse_foreign_keys({.distributed = true, .parallel = name}, cfg, world,
                                          rank);
  }
  class executor : public strata::parallel::local_executor {
   public:
    using local_executor::local_executor;
    std::vector<std::string> optimizer_blobs() const { return {"rank-0.optimizer.bin"}; }
  };
};

int main() {
  const auto model =
      strata::model::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 4},
                                strata::model::linear{.in = 4, .out = 2});
  using trainer_t = strata::train::trainer<decltype(model), described_by_name>;
  static_assert(sizeof(trainer_t) > 0);
}
