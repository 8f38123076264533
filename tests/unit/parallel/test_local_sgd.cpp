// SPDX-License-Identifier: Apache-2.0
// A user's parallel policy through the trainer: local SGD (examples/03_custom_policies), whose
// executor derives from parallel::local_executor and is written outside the library.
#include "../../../examples/03_custom_policies/byte_counter.hpp"
#include "../../../examples/03_custom_policies/local_sgd.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/observed.hpp"
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

strata::config::train_config config(const std::string& name, int period = 3) {
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
  cfg.policy["local_sgd_period"] = std::to_string(period);  // [policy] local_sgd_period
  return cfg;
}

}  // namespace

static_assert(par::check_parallel_policy<local_sgd>());

TEST_CASE("local SGD averaging every step trains like data<all_reduce>") {
  const auto cfg = config("period-1", 1);
  const auto local = strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model);
  auto dense_cfg = config("dense");
  dense_cfg.policy.clear();
  const auto dense = strata::test::run_thread_ranks<par::data<>>(2, dense_cfg, small_model);
  // Averaging the parameters after plain SGD steps from equal parameters is averaging the
  // gradients, up to rounding.
  strata::test::check_same_training(local[0], dense[0], 1e-5);
}

TEST_CASE("local SGD ranks drift apart between averages and meet at them") {
  auto cfg = config("period-3");
  cfg.epochs = 1;
  cfg.max_steps = 7;  // not a multiple of 3: each rank holds its own parameters at the end
  const auto drift = strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model, nullptr,
                                                               /*same_params=*/false);
  CHECK(drift[0].params != drift[1].params);
  cfg = config("period-3-met");
  cfg.epochs = 1;
  cfg.max_steps = 6;  // an average ends the run: every rank holds it
  const auto met = strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model);
  CHECK(met[0].summary.steps == 6);
}

TEST_CASE("a local SGD run stopped between averages resumes every rank exactly") {
  auto cfg = config("straight");
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  const auto straight = strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model, nullptr,
                                                                  /*same_params=*/false);
  cfg = config("split");
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  cfg.max_steps = 5;  // mid-epoch, two steps after an average: the ranks differ
  strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model, nullptr, false);
  cfg.max_steps = 0;
  const auto resumed = strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model, nullptr,
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
struct shared_samples_sgd : local_sgd {
  class executor : public local_sgd::executor {
   public:
    using local_sgd::executor::executor;
    par::data_shard_of data_shard() const noexcept { return {}; }
  };
};

}  // namespace

TEST_CASE("the executor decides which samples a rank reads") {
  auto cfg = config("shared-samples", 1);
  cfg.epochs = 1;
  const auto sharded = strata::test::run_thread_ranks<local_sgd>(2, cfg, small_model);
  cfg = config("shared-samples-2", 1);
  cfg.epochs = 1;
  const auto shared = strata::test::run_thread_ranks<shared_samples_sgd>(2, cfg, small_model);
  // 512 samples in batches of 32: 8 steps each over half of them, 16 over all of them; every
  // rank then reads the same samples and ends with the same parameters (checked by the runner).
  CHECK(sharded[0].steps.size() == 8);
  CHECK(shared[0].steps.size() == 16);
  CHECK(shared[0].steps[0].samples == 64);  // both ranks' samples of the step
}

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The config_error that constructing a local SGD trainer on one of 2 thread ranks throws.
std::string refusal(const strata::config::train_config& cfg) {
  std::vector<std::string> what(2);
  strata::comm::threads::run(2, [&](strata::comm::threads& c) {
    try {
      strata::train::trainer<decltype(small_model()), local_sgd> t(
          small_model(), cfg, strata::comm::any_comm(c), {.print_progress = false});
    } catch (const strata::config_error& e) {
      what[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  CHECK(what[0] == what[1]);
  return what[0];
}

// The bytes every rank's all_reduce calls handed to the backend over one fit() of Policy.
template <class Policy>
std::vector<std::uint64_t> all_reduce_bytes(const strata::config::train_config& cfg) {
  std::vector<std::uint64_t> bytes(2);
  strata::comm::threads::run(2, [&](strata::comm::threads& t) {
    counting<strata::comm::threads> c(std::move(t));
    strata::train::trainer<decltype(small_model()), Policy> run(
        small_model(), cfg, strata::comm::any_comm(c), {.print_progress = false});
    strata::test::record(run);
    bytes[static_cast<std::size_t>(c.rank())] =
        c.observer().counts->of(strata::comm::op_kind::all_reduce);
  });
  return bytes;
}

}  // namespace

TEST_CASE("local SGD reads its period from [policy]; the trainer checks the table") {
  auto cfg = config("keys", 0);
  CHECK(contains(refusal(cfg), "key 'policy.local_sgd_period'"));
  CHECK(contains(refusal(cfg), "value 0 is out of range; allowed: 1 .. 1000000"));
  CHECK(contains(refusal(cfg), "read by policy local_sgd"));
  cfg.policy["local_sgd_period"] = "often";
  CHECK(contains(refusal(cfg), "expected an integer, got 'often'"));
  cfg.policy["local_sgd_period"] = "2";
  cfg.policy["local_sgd_perod"] = "2";
  const std::string typo = refusal(cfg);
  CHECK(contains(typo, "key 'policy.local_sgd_perod'"));
  CHECK(contains(typo, "their keys: local_sgd_period"));
  // A data-parallel trainer declares no [policy] key: a local SGD key is refused there.
  auto dense = config("keys-dense");
  std::string dense_error;
  strata::comm::threads::run(2, [&](strata::comm::threads& c) {
    try {
      strata::train::trainer<decltype(small_model()), par::data<>> t(
          small_model(), dense, strata::comm::any_comm(c), {.print_progress = false});
    } catch (const strata::config_error& e) {
      dense_error = e.what();
    }
  });
  CHECK(contains(dense_error, "key 'policy.local_sgd_period'"));
  CHECK(contains(dense_error, "their keys: none"));
}

TEST_CASE("the period is part of the run's identity; its default spelled out is not") {
  const auto name_of = [](const strata::config::train_config& cfg) {
    std::string name;
    strata::comm::threads::run(2, [&](strata::comm::threads& c) {
      strata::train::trainer<decltype(small_model()), local_sgd> t(
          small_model(), cfg, strata::comm::any_comm(c), {.print_progress = false});
      name = t.run().name;
    });
    return name;
  };
  auto cfg = config("identity", 3);
  const std::string three = name_of(cfg);
  cfg.policy["local_sgd_period"] = "4";
  const std::string four = name_of(cfg);
  cfg.policy.clear();  // the default, 4
  CHECK(three != four);
  CHECK(name_of(cfg) == four);
  cfg.policy["local_sgd_period"] = "04";
  CHECK(name_of(cfg) == four);
}

TEST_CASE("local SGD averaging every 4 steps moves a quarter of data<all_reduce>'s bytes") {
  auto cfg = config("bytes-local", 4);
  cfg.epochs = 1;  // 8 steps: averages after steps 4 and 8
  const auto local = all_reduce_bytes<local_sgd>(cfg);
  auto dense_cfg = config("bytes-dense");
  dense_cfg.policy.clear();
  dense_cfg.epochs = 1;
  const auto dense = all_reduce_bytes<par::data<>>(dense_cfg);
  const std::uint64_t params = 8 * 32 + 32 + 32 * 4 + 4;
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank ", r);
    // Every step: the gradients (and the step's totals); local SGD: the parameters twice.
    CHECK(dense[r] >= 8 * params * 4);
    CHECK(local[r] >= 2 * params * 4);
    CHECK(local[r] < 2 * params * 4 + 8 * 64);  // plus each step's totals, a few doubles
    CHECK(static_cast<double>(local[r]) < 0.3 * static_cast<double>(dense[r]));
  }
}
