// expect-error: PrecisionPolicy: missing 'bool finish\(std::uint64_t, std::span<const float>
// SPDX-License-Identifier: Apache-2.0
// A user's precision policy that forgot the step decision: the trainer names the family and the
// requirement.
#include <span>
#include <string_view>

#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct fp32_without_finish {
  using policy_category = strata::precision_policy_tag;
  static constexpr std::string_view name = "fp32_without_finish";
  static constexpr strata::dtype compute_dtype = strata::dtype::float32;
  static constexpr bool has_compute_copy = false;
  static constexpr bool scales_loss = false;
  static constexpr bool skips_steps = false;
  explicit fp32_without_finish(const strata::config::train_config&) {}
  static void check_config(const strata::config::train_config&) {}
  template <class Make>
  void prepare(Make&&) {}
  strata::model::param_store& compute(strata::model::param_store& master) { return master; }
  void refresh(const strata::model::param_store&) {}
  void store(std::span<float>) const {}
  double loss_scale() const { return 1.0; }
  nlohmann::json state() const { return nullptr; }
  void restore(const nlohmann::json&) {}
};

using model = strata::model::sequential<strata::model::linear>;
template class strata::train::trainer<model, fp32_without_finish>;
