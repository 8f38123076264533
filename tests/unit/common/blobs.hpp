// SPDX-License-Identifier: Apache-2.0
#pragma once

// The small classification task the trainer tests share: four Gaussian blobs in 8 dimensions,
// one per class (class c is centred at 2 on dimensions c and c + 4), sample i fixed by (salt, i),
// and a small MLP with dropout that learns it in a few epochs.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/shape.hpp"
#include "strata/data/concepts.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/metrics.hpp"
#include "strata/train/trainer.hpp"

namespace strata::test {

struct blobs {
  using dataset_category = data::dataset_tag;
  std::size_t n = 512;
  std::uint64_t salt = 0;
  std::size_t size() const { return n; }
  sample_shape shape() const { return {.channels = 1, .height = 1, .width = 8}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const auto label = static_cast<std::int32_t>(i % 4);
    rng_stream rng = rng_stream::for_sample(99 + salt, 0, i);
    for (std::size_t e = 0; e < 8; ++e) {
      const float centre = (e % 4 == static_cast<std::size_t>(label)) ? 2.0f : 0.0f;
      out[e] = centre + 0.7f * rng.normal_float();
    }
    return label;
  }
};

// 8 -> 32 (ReLU, dropout 0.1) -> 4.
inline auto blobs_mlp() {
  return model::sequential(sample_shape{.channels = 1, .height = 1, .width = 8},
                           model::linear{.in = 8, .out = 32}, model::relu{},
                           model::dropout{.rate = 0.1}, model::linear{.in = 32, .out = 4});
}

// What one fit() did: every step's metrics, the summary and the final parameters.
struct run_record {
  std::vector<train::step_metrics> steps;
  train::fit_summary summary;
  std::vector<float> params;
};

// Trains `t` on `train_samples` blobs (tested on 256 others) and records the run.
template <class Trainer>
run_record record(Trainer& t, std::size_t train_samples = 512) {
  run_record r;
  t.on_step([&](const train::step_metrics& m) { r.steps.push_back(m); });
  r.summary = t.fit(blobs{.n = train_samples}, data::identity{}, blobs{.n = 256, .salt = 1},
                    data::identity{});
  r.params.assign(t.params().values().begin(), t.params().values().end());
  return r;
}

// Two runs trained alike: the same samples per step, losses within 1e-5 (relative), final
// parameters within `param_tolerance`.
inline void check_same_training(const run_record& a, const run_record& b,
                                double param_tolerance = 1e-4) {
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    INFO("step ", i);
    CHECK(a.steps[i].samples == b.steps[i].samples);
    CHECK(a.steps[i].loss == doctest::Approx(b.steps[i].loss).epsilon(1e-5));
  }
  REQUIRE(a.params.size() == b.params.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a.params[i] - b.params[i])));
  }
  CHECK(worst < param_tolerance);
}

// Runs `ranks` thread ranks of trainer<Model, Policy, Extra...> on make_model() and `cfg`
// (setup(trainer) first, when given); returns every rank's record. `same_params`: check that
// every rank ended with rank 0's parameters, bit for bit.
template <class Policy, class... Extra, class MakeModel, class Setup = std::nullptr_t>
std::vector<run_record> run_thread_ranks(int ranks, const config::train_config& cfg,
                                         MakeModel make_model, Setup setup = nullptr,
                                         bool same_params = true) {
  using model_type = std::invoke_result_t<MakeModel&>;
  std::vector<run_record> records(static_cast<std::size_t>(ranks));
  comm::threads::run(ranks, [&](comm::threads& c) {
    train::trainer<model_type, Policy, Extra...> t(make_model(), cfg, comm::any_comm(c),
                                                   {.print_progress = false});
    if constexpr (!std::is_same_v<Setup, std::nullptr_t>) {
      setup(t);
    }
    records[static_cast<std::size_t>(c.rank())] = record(t);
  });
  for (int r = 1; same_params && r < ranks; ++r) {
    INFO("rank ", r);
    CHECK(records[static_cast<std::size_t>(r)].params == records[0].params);
  }
  return records;
}

}  // namespace strata::test
