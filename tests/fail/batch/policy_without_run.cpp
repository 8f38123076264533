// expect-error: BatchPolicy: missing 'void begin\(Runner&\)' or 'model::loss_result run
// SPDX-License-Identifier: Apache-2.0
// A user's batch policy that forgot run(): the trainer names the family and the requirement.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct ramp_without_run {
  using policy_category = strata::batch_policy_tag;
  static constexpr std::string_view name = "ramp";
  static constexpr bool frees_evaluation_memory = false;
  explicit ramp_without_run(const strata::config::train_config&) {}
  static void check_config(const strata::config::train_config&) {}
  std::size_t loader_batch() const { return 16; }
  std::size_t loader_batches(std::uint64_t) const { return 1; }
  std::size_t micro_batch() const { return 16; }
  template <strata::batch::step_runner R>
  void begin(R&) {}
  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) {}
};

using model = strata::model::sequential<strata::model::linear>;
template class strata::train::trainer<model, ramp_without_run>;
