// expect-error: BatchPolicy: missing 'nlohmann::json state\(\) const' or 'void restore
// SPDX-License-Identifier: Apache-2.0
// A user's batch policy without the checkpoint state: the concept check names the requirement.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "strata/batch/concepts.hpp"

struct ramp_without_state {
  using policy_category = strata::batch_policy_tag;
  static constexpr std::string_view name = "ramp";
  static constexpr bool frees_evaluation_memory = false;
  explicit ramp_without_state(const strata::config::train_config&) {}
  static void check_config(const strata::config::train_config&) {}
  std::size_t loader_batch() const { return 16; }
  std::size_t loader_batches(std::uint64_t) const { return 1; }
  std::size_t micro_batch() const { return 16; }
  template <strata::batch::step_runner R>
  void begin(R&) {}
  template <strata::batch::step_runner R>
  strata::model::loss_result run(R& r, const strata::batch::samples& b, bool last) {
    return r.micro_step(b, last);
  }
};

static_assert(strata::batch::check_batch_policy<ramp_without_state>());
