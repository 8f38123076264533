// SPDX-License-Identifier: Apache-2.0
// A user's parallel policy through the trainer: local SGD (examples/03_custom_policies), whose
// executor derives from parallel::local_executor and is written outside the library.
#include "../../../examples/03_custom_policies/local_sgd.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "strata/comm/threads.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/data.hpp"
#include "strata/train/trainer.hpp"

#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sm = strata::model;
namespace par = strata::parallel;

namespace {

auto small_model() {
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 8},
                        sm::linear{.in = 8, .out = 32}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 32, .out = 4});
}

strata::config::train_config config(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "local_sgd" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  strata::config::train_config cfg;
  cfg.world_size = 2;
  cfg.epochs = 2;
  cfg.batch_size_per_gpu = 32;  // 512 samples over 2 ranks: 8 steps per epoch
  cfg.lr = 0.05;
  cfg.momentum = 0.0;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  return cfg;
}

}  // namespace

static_assert(par::check_parallel_policy<local_sgd<3>>());

TEST_CASE("local SGD averaging every step trains like data<all_reduce>") {
  const auto cfg = config("period-1");
  const auto local = strata::test::run_thread_ranks<local_sgd<1>>(2, cfg, small_model);
  auto dense_cfg = config("dense");
  const auto dense = strata::test::run_thread_ranks<par::data<>>(2, dense_cfg, small_model);
  // Averaging the parameters after plain SGD steps from equal parameters is averaging the
  // gradients, up to rounding.
  strata::test::check_same_training(local[0], dense[0], 1e-5);
}

TEST_CASE("local SGD ranks drift apart between averages and meet at them") {
  auto cfg = config("period-3");
  cfg.epochs = 1;
  cfg.max_steps = 7;  // not a multiple of 3: each rank holds its own parameters at the end
  const auto drift = strata::test::run_thread_ranks<local_sgd<3>>(2, cfg, small_model, nullptr,
                                                                  /*same_params=*/false);
  CHECK(drift[0].params != drift[1].params);
  cfg = config("period-3-met");
  cfg.epochs = 1;
  cfg.max_steps = 6;  // an average ends the run: every rank holds it
  const auto met = strata::test::run_thread_ranks<local_sgd<3>>(2, cfg, small_model);
  CHECK(met[0].summary.steps == 6);
}

TEST_CASE("a local SGD run stopped between averages resumes every rank exactly") {
  auto cfg = config("straight");
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  const auto straight = strata::test::run_thread_ranks<local_sgd<3>>(2, cfg, small_model, nullptr,
                                                                     /*same_params=*/false);
  cfg = config("split");
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  cfg.max_steps = 5;  // mid-epoch, two steps after an average: the ranks differ
  strata::test::run_thread_ranks<local_sgd<3>>(2, cfg, small_model, nullptr, false);
  cfg.max_steps = 0;
  const auto resumed = strata::test::run_thread_ranks<local_sgd<3>>(2, cfg, small_model, nullptr,
                                                                    /*same_params=*/false);
  REQUIRE(resumed.size() == 2);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank ", r);
    CHECK_FALSE(resumed[r].summary.resumed_from.empty());
    CHECK(resumed[r].params == straight[r].params);
  }
  CHECK(straight[0].params != straight[1].params);  // 16 steps: the last average was at 15
}

namespace {

// Ranks that share their samples (as the stages of one pipeline do): the executor's data_shard
// makes every rank read the whole training set.
struct shared_samples_sgd : local_sgd<1> {
  class executor : public local_sgd<1>::executor {
   public:
    using local_sgd<1>::executor::executor;
    par::data_shard_of data_shard() const noexcept { return {}; }
  };
};

}  // namespace

TEST_CASE("the executor decides which samples a rank reads") {
  auto cfg = config("shared-samples");
  cfg.epochs = 1;
  const auto sharded = strata::test::run_thread_ranks<local_sgd<1>>(2, cfg, small_model);
  cfg = config("shared-samples-2");
  cfg.epochs = 1;
  const auto shared = strata::test::run_thread_ranks<shared_samples_sgd>(2, cfg, small_model);
  // 512 samples in batches of 32: 8 steps each over half of them, 16 over all of them; every
  // rank then reads the same samples and ends with the same parameters (checked by the runner).
  CHECK(sharded[0].steps.size() == 8);
  CHECK(shared[0].steps.size() == 16);
  CHECK(shared[0].steps[0].samples == 64);  // both ranks' samples of the step
}
