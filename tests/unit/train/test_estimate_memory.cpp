// SPDX-License-Identifier: Apache-2.0
#include "strata/train/estimate_memory.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>

#include "strata/core/host.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

namespace sm = strata::model;
namespace sp = strata::precision;
namespace st = strata::train;

namespace {

auto mlp() {
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 100},
                        sm::linear{.in = 100, .out = 300}, sm::relu{},
                        sm::linear{.in = 300, .out = 10});
}

// Bytes the host tracker holds for what `make` constructs (and keeps alive in `out`).
template <class F>
std::size_t held_by(F&& make) {
  const std::size_t before = strata::host{}.memory().stats().in_use;
  auto object = make();
  const std::size_t after = strata::host{}.memory().stats().in_use;
  return after - before;
}

strata::config::train_config config_for(strata::config::precision_dtype type,
                                        strata::config::optimizer_kind opt) {
  strata::config::train_config cfg;
  cfg.mixed_precision_dtype = type;
  cfg.optimizer = opt;
  cfg.momentum = 0.9;
  cfg.checkpoint_dir = std::string(STRATA_TEST_WORK_DIR) + "/estimate";
  return cfg;
}

}  // namespace

TEST_CASE("the per-parameter formula of each precision policy and layout") {
  const auto model = mlp();
  // Groups: 100x300 + 300 = 30300 (a multiple of 4 floats, padded to 16: 30304), relu none,
  // 300x10 + 10 = 3010.
  const std::size_t p = 30304 + 3010;
  const auto fp32 = st::estimate_memory(model, 64, {.optimizer_state_per_parameter = 2});
  CHECK(fp32.parameter_count == p);
  CHECK(fp32.bytes_per_parameter() == doctest::Approx(16.0).epsilon(0.01));
  CHECK(fp32.master_weights == 0);
  const auto bf16_device = st::estimate_memory<sp::bf16>(
      model, 64, {.optimizer_state_per_parameter = 2, .layout = st::memory_layout::device});
  CHECK(bf16_device.bytes_per_parameter() == doctest::Approx(20.0).epsilon(0.01));
  CHECK(bf16_device.parameters == (2 * p + 63) / 64 * 64);
  const auto bf16_host =
      st::estimate_memory<sp::bf16>(model, 64, {.optimizer_state_per_parameter = 2});
  CHECK(bf16_host.bytes_per_parameter() == doctest::Approx(24.0).epsilon(0.01));
  const auto sgd = st::estimate_memory(model, 64, {.optimizer_state_per_parameter = 1});
  CHECK(sgd.bytes_per_parameter() == doctest::Approx(12.0).epsilon(0.01));
  // Activations grow with the batch; model state does not; device activations are half.
  const auto big = st::estimate_memory(model, 128, {.optimizer_state_per_parameter = 2});
  CHECK(big.model_state() == fp32.model_state());
  CHECK(big.activations > 1.9 * static_cast<double>(fp32.activations));
  CHECK(bf16_device.activations < fp32.activations);
  CHECK(to_string(fp32).find("bytes/parameter") != std::string::npos);
}

TEST_CASE("the host estimate equals what the trainer and the workspace allocate") {
  const auto model = mlp();
  using cfg_dtype = strata::config::precision_dtype;
  using opt = strata::config::optimizer_kind;
  {
    const auto cfg = config_for(cfg_dtype::float32, opt::sgd);
    const std::size_t held =
        held_by([&] { return st::trainer(mlp(), cfg, {.print_progress = false}); });
    CHECK(held ==
          st::estimate_memory(model, 64, {.optimizer_state_per_parameter = 1}).model_state());
  }
  {
    const auto cfg = config_for(cfg_dtype::bfloat16, opt::adamw);
    const std::size_t held = held_by([&] {
      return st::trainer<decltype(mlp()), sp::bf16>(mlp(), cfg, {.print_progress = false});
    });
    CHECK(held == st::estimate_memory<sp::bf16>(model, 64, {.optimizer_state_per_parameter = 2})
                      .model_state());
  }
  {
    const auto cfg = config_for(cfg_dtype::float16, opt::adamw);
    const std::size_t held = held_by([&] {
      return st::trainer<decltype(mlp()), sp::fp16>(mlp(), cfg, {.print_progress = false});
    });
    CHECK(held == st::estimate_memory<sp::fp16>(model, 64, {.optimizer_state_per_parameter = 2})
                      .model_state());
  }
  for (const std::size_t every : {std::size_t{0}, std::size_t{2}}) {
    const std::size_t held = held_by(
        [&] { return model.make_workspace(96, sm::workspace_config{.checkpoint_every = every}); });
    const auto e = st::estimate_memory(model, 96, {.checkpoint_every = every});
    const std::size_t loss_gradient = (96 * 10 * 4 + 63) / 64 * 64;
    INFO("checkpoint_every ", every);
    CHECK(held <= e.activations - loss_gradient + 64 * 8);
    CHECK(held + 64 * 8 >= e.activations - loss_gradient);
  }
}
