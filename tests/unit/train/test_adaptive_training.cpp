// SPDX-License-Identifier: Apache-2.0
// batch::adaptive in the trainer: the micro-batch follows a real memory budget, an allocation
// failure re-runs the step's samples, and the optimisation is that of a fixed global batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "strata/batch/accumulate.hpp"
#include "strata/batch/adaptive.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/host.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/data.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/trainer.hpp"

#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;

namespace {

using strata::test::blobs;

// Identity that, like a layer with a temporary the estimate does not know of, allocates
// `floats_per_sample` floats per sample of host memory while it runs forward.
struct hungry {
  using layer_category = sm::layer_tag;
  std::size_t floats_per_sample = 0;
  strata::sample_shape output_shape(strata::sample_shape in) const { return in; }
  void forward(const sm::forward_args& a) const {
    strata::buffer<float> scratch(a.batch * floats_per_sample);
    std::copy(a.input.begin(), a.input.end(), a.output.begin());
  }
  void backward(const sm::backward_args& a) const {
    if (!a.grad_input.empty()) {
      std::copy(a.grad_output.begin(), a.grad_output.end(), a.grad_input.begin());
    }
  }
};

// About 64 KiB of workspace per sample.
auto wide_model(std::size_t hunger = 0) {
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 8},
                        sm::linear{.in = 8, .out = 4096}, hungry{.floats_per_sample = hunger},
                        sm::relu{}, sm::dropout{.rate = 0.1}, sm::linear{.in = 4096, .out = 4});
}

strata::config::train_config base_config(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "adaptive" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  strata::config::train_config cfg;
  cfg.epochs = 2;
  cfg.batch_size_per_gpu = 16;
  cfg.gradient_accumulation_steps = 8;  // 128 samples per step
  cfg.lr = 0.02;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 0;
  return cfg;
}

strata::config::train_config adaptive_config(const std::string& name) {
  auto cfg = base_config(name);
  cfg.adaptive_batch = true;
  cfg.adaptive_batch_min = 1;
  cfg.adaptive_batch_max = 512;
  return cfg;
}

// A budget `extra` bytes above what the host tracker holds now, in whole MiB.
std::int64_t budget_mb_above_now(std::size_t extra) {
  const std::size_t now = strata::host{}.memory().stats().in_use;
  return static_cast<std::int64_t>((now + extra + (1u << 20) - 1) >> 20);
}

using strata::test::check_same_training;
using strata::test::run_record;

}  // namespace

TEST_CASE("the adaptive micro-batch grows into a real budget and trains like a fixed batch") {
  auto cfg = base_config("grow");
  run_record reference;
  {
    st::trainer<decltype(wide_model()), strata::batch::accumulate> fixed(wide_model(), cfg,
                                                                         {.print_progress = false});
    reference = strata::test::record(fixed, 1024);
  }

  cfg = adaptive_config("grow");
  cfg.batch_size_per_gpu = 4;  // a small start
  cfg.gradient_accumulation_steps = 32;
  // Room for about 40 samples of workspace above what is held now (parameters, loader and
  // workspace of the trainer to come are inside that room too).
  cfg.memory_budget_mb = budget_mb_above_now(std::size_t{3} << 20);
  const std::size_t budget = static_cast<std::size_t>(cfg.memory_budget_mb) << 20;
  st::trainer<decltype(wide_model()), strata::batch::adaptive> adaptive(wide_model(), cfg,
                                                                        {.print_progress = false});
  const run_record r = strata::test::record(adaptive, 1024);
  check_same_training(r, reference);
  REQUIRE(r.steps.size() == 16);
  CHECK(r.steps.front().micro_batch == 4);
  std::size_t largest = 0;
  for (const auto& s : r.steps) {
    CHECK(s.samples == 128);
    largest = std::max(largest, s.micro_batch);
  }
  CHECK(largest > 8);
  CHECK(largest < 128);  // the budget, not the global batch, stopped it
  // Within 10 steps the step's peak is within [90%, 100%] of the budget.
  for (std::size_t i = 0; i < r.steps.size(); ++i) {
    INFO("step ", i, " micro-batch ", r.steps[i].micro_batch, " peak ", r.steps[i].peak_bytes,
         " budget ", budget);
    CHECK(r.steps[i].peak_bytes <= budget);
    if (i >= 9) {
      CHECK(static_cast<double>(r.steps[i].peak_bytes) >= 0.9 * static_cast<double>(budget));
    }
  }
}

TEST_CASE("an allocation failure inside a step re-runs its samples in smaller micro-batches") {
  // The hungry layer takes 16 KiB per sample that estimate_memory does not see, so the first
  // micro-batch (the estimate's choice) does not fit.
  auto cfg = base_config("oom");
  run_record reference;
  {
    st::trainer<decltype(wide_model(4096)), strata::batch::accumulate> fixed(
        wide_model(4096), cfg, {.print_progress = false});
    reference = strata::test::record(fixed, 1024);
  }

  cfg = adaptive_config("oom");
  cfg.batch_size_per_gpu = 128;
  cfg.gradient_accumulation_steps = 1;
  cfg.memory_budget_mb = budget_mb_above_now(std::size_t{5} << 20);
  st::trainer<decltype(wide_model(4096)), strata::batch::adaptive> adaptive(
      wide_model(4096), cfg, {.print_progress = false});
  const run_record r = strata::test::record(adaptive, 1024);
  check_same_training(r, reference);
  for (const auto& s : r.steps) {
    CHECK(s.samples == 128);
  }
  CHECK(r.steps.front().micro_batch < 128);
}

TEST_CASE("a step that does not fit at the smallest micro-batch names the budget keys") {
  auto cfg = adaptive_config("too-small");
  cfg.batch_size_per_gpu = 16;
  cfg.adaptive_batch_min = 8;
  cfg.memory_budget_mb = budget_mb_above_now(std::size_t{1} << 20);
  st::trainer<decltype(wide_model(1 << 20)), strata::batch::adaptive> t(wide_model(1 << 20), cfg,
                                                                        {.print_progress = false});
  CHECK_THROWS_WITH_AS(t.fit(blobs{.n = 1024}, sd::identity{}, blobs{.n = 64}, sd::identity{}),
                       doctest::Contains("memory_budget_mb"), strata::memory_error);
}

TEST_CASE("adaptive_batch and the batch policy must agree") {
  auto cfg = base_config("refused");
  cfg.gradient_accumulation_steps = 1;
  cfg.adaptive_batch = true;
  CHECK_THROWS_WITH_AS(st::trainer(wide_model(), cfg, {.print_progress = false}),
                       doctest::Contains("adaptive_batch"), strata::config_error);
  cfg.adaptive_batch = false;
  CHECK_THROWS_WITH_AS((st::trainer<decltype(wide_model()), strata::batch::adaptive>(
                           wide_model(), cfg, {.print_progress = false})),
                       doctest::Contains("adaptive_batch = true"), strata::config_error);
}

TEST_CASE("a batch policy goes into the trainer by name, beside another family's policy") {
  auto model = wide_model();
  auto cfg = base_config("by-name");  // 8 micro-batches of 16
  // snippet-begin: policies
  // k = gradient_accumulation_steps micro-batches of batch_size_per_gpu per step
  strata::train::trainer<decltype(model), strata::batch::accumulate> run(model, cfg);

  // the micro-batch follows memory, here with float16 storage; the configuration names both
  cfg.adaptive_batch = true;
  cfg.mixed_precision_dtype = strata::config::precision_dtype::float16;
  strata::train::trainer<decltype(model), strata::batch::adaptive, strata::precision::fp16> run16(
      model, cfg);
  // snippet-end: policies
  CHECK(run.config().gradient_accumulation_steps == 8);
  CHECK_FALSE(run.config().adaptive_batch);
  CHECK(run16.config().adaptive_batch);
  CHECK(run.loss_scale() == 1.0);                       // fp32: no loss scaler
  CHECK(run16.loss_scale() == cfg.loss_scale_initial);  // fp16: the dynamic loss scaler's start
  // Policies do not change where training starts.
  CHECK(std::ranges::equal(run.params().values(), run16.params().values()));
}

TEST_CASE("keys of policies the trainer does not run are refused, not ignored") {
  auto cfg = base_config("ignored");
  cfg.gradient_accumulation_steps = 1;
  cfg.memory_budget_mb = 100;
  CHECK_THROWS_WITH_AS(st::trainer(wide_model(), cfg, {.print_progress = false}),
                       doctest::Contains("memory_budget_mb configures batch::adaptive"),
                       strata::config_error);
  cfg = base_config("ignored");
  cfg.gradient_accumulation_steps = 1;
  cfg.loss_scale_initial = 1024.0;
  CHECK_THROWS_WITH_AS(st::trainer(wide_model(), cfg, {.print_progress = false}),
                       doctest::Contains("loss_scale_initial configures a loss scaler"),
                       strata::config_error);
}

TEST_CASE("a resumed adaptive run continues from the saved micro-batch") {
  auto cfg = adaptive_config("resume");
  cfg.batch_size_per_gpu = 4;
  cfg.gradient_accumulation_steps = 32;
  cfg.memory_budget_mb = budget_mb_above_now(std::size_t{3} << 20);
  cfg.checkpoint_interval = 1;
  cfg.max_steps = 6;
  run_record first;
  {
    st::trainer<decltype(wide_model()), strata::batch::adaptive> t(wide_model(), cfg,
                                                                   {.print_progress = false});
    first = strata::test::record(t, 1024);
  }
  REQUIRE(first.steps.size() == 6);
  CHECK(first.steps.back().micro_batch > 4);
  cfg.max_steps = 0;
  st::trainer<decltype(wide_model()), strata::batch::adaptive> t(wide_model(), cfg,
                                                                 {.print_progress = false});
  const run_record second = strata::test::record(t, 1024);
  CHECK_FALSE(second.summary.resumed_from.empty());
  REQUIRE_FALSE(second.steps.empty());
  CHECK(second.steps.front().step == 6);
  // Step 6 runs with what step 5 decided, not with the small start again.
  CHECK(second.steps.front().micro_batch > 4);
}

namespace {

// Runs 2 thread ranks of data<all_reduce> with `cfg` (rank 1 first holding `ballast` bytes of its
// own); returns both ranks' records.
template <class Batch>
std::vector<run_record> run_two_ranks(const strata::config::train_config& cfg,
                                      std::size_t ballast = 0) {
  std::vector<run_record> records(2);
  strata::comm::threads::run(2, [&](strata::comm::threads& c) {
    const strata::buffer<std::byte> held(c.rank() == 1 ? ballast : 0);
    st::trainer<decltype(wide_model()), Batch, strata::parallel::data<>> t(
        wide_model(), cfg, strata::comm::any_comm(c), {.print_progress = false});
    records[static_cast<std::size_t>(c.rank())] = strata::test::record(t, 1024);
  });
  CHECK(records[1].params == records[0].params);
  return records;
}

std::size_t largest_micro_batch(const run_record& r) {
  std::size_t largest = 0;
  for (const auto& s : r.steps) {
    largest = std::max(largest, s.micro_batch);
  }
  return largest;
}

}  // namespace

TEST_CASE("on thread ranks each rank adapts within its own budget, and the ranks agree") {
  auto cfg = base_config("ranks-fixed");
  cfg.world_size = 2;
  cfg.gradient_accumulation_steps = 4;  // 64 samples per rank and step, 128 in all
  const run_record reference = run_two_ranks<strata::batch::accumulate>(cfg)[0];

  cfg = adaptive_config("ranks");
  cfg.world_size = 2;
  cfg.batch_size_per_gpu = 4;
  cfg.gradient_accumulation_steps = 16;
  // Each rank's budget counts that rank's allocations alone (its host account), which start
  // from nothing: about 35 samples of workspace fit besides the parameters and the loader.
  cfg.memory_budget_mb = 3;
  const std::size_t budget = std::size_t{3} << 20;
  const std::vector<run_record> r = run_two_ranks<strata::batch::adaptive>(cfg);
  check_same_training(r[0], reference);
  REQUIRE(r[0].steps.size() == 16);
  REQUIRE(r[1].steps.size() == 16);
  for (std::size_t i = 0; i < r[0].steps.size(); ++i) {
    INFO("step ", i, " micro-batches ", r[0].steps[i].micro_batch, " and ",
         r[1].steps[i].micro_batch, " peaks ", r[0].steps[i].peak_bytes, " and ",
         r[1].steps[i].peak_bytes, " budget ", budget);
    CHECK(r[0].steps[i].samples == 128);
    CHECK(r[0].steps[i].micro_batch == r[1].steps[i].micro_batch);
    for (const run_record& rank : r) {
      CHECK(rank.steps[i].peak_bytes <= budget);
      if (i >= 9) {
        CHECK(static_cast<double>(rank.steps[i].peak_bytes) >= 0.9 * static_cast<double>(budget));
      }
    }
  }
  const std::size_t grown = largest_micro_batch(r[0]);
  CHECK(grown > 8);
  CHECK(grown < 64);  // the budget, not the rank's share of the global batch, stopped it

  // Rank 1 holds 1 MiB more: its smaller micro-batch is the one both ranks run, and rank 0
  // stays below its budget by what it does not use.
  cfg = adaptive_config("ranks-ballast");
  cfg.world_size = 2;
  cfg.batch_size_per_gpu = 4;
  cfg.gradient_accumulation_steps = 16;
  cfg.memory_budget_mb = 3;
  const std::vector<run_record> b = run_two_ranks<strata::batch::adaptive>(cfg, 1 << 20);
  check_same_training(b[0], reference);
  REQUIRE(b[0].steps.size() == b[1].steps.size());
  for (std::size_t i = 0; i < b[0].steps.size(); ++i) {
    INFO("step ", i);
    CHECK(b[0].steps[i].micro_batch == b[1].steps[i].micro_batch);
    CHECK(b[1].steps[i].peak_bytes <= budget);
  }
  CHECK(largest_micro_batch(b[0]) < grown);
  CHECK(b[0].steps.back().peak_bytes + (std::size_t{1} << 19) < budget);
}

TEST_CASE(
    "the default memory budget is shared by the thread ranks; memory_budget_mb is each rank's") {
  const std::size_t machine = strata::batch::default_memory_budget();
  auto cfg = adaptive_config("budget-shares");
  {
    const st::trainer<decltype(wide_model()), strata::batch::adaptive> one(
        wide_model(), adaptive_config("budget-one"), {.print_progress = false});
    CHECK(one.memory_budget() == machine);
  }
  for (const int n : {2, 3}) {
    cfg.world_size = n;
    std::vector<std::size_t> budgets(static_cast<std::size_t>(n));
    std::vector<std::size_t> set(static_cast<std::size_t>(n));
    strata::comm::threads::run(n, [&](strata::comm::threads& c) {
      auto own = cfg;
      const st::trainer<decltype(wide_model()), strata::batch::adaptive, strata::parallel::data<>>
          shared(wide_model(), own, strata::comm::any_comm(c), {.print_progress = false});
      budgets[static_cast<std::size_t>(c.rank())] = shared.memory_budget();
      own.memory_budget_mb = 7;
      const st::trainer<decltype(wide_model()), strata::batch::adaptive, strata::parallel::data<>>
          given(wide_model(), own, strata::comm::any_comm(c), {.print_progress = false});
      set[static_cast<std::size_t>(c.rank())] = given.memory_budget();
    });
    for (int r = 0; r < n; ++r) {
      INFO(n, " ranks, rank ", r);
      CHECK(budgets[static_cast<std::size_t>(r)] == machine / static_cast<std::size_t>(n));
      CHECK(set[static_cast<std::size_t>(r)] == std::size_t{7} << 20);
    }
  }
}
