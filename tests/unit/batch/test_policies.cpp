// SPDX-License-Identifier: Apache-2.0
// The batch_policy contract: the conformance suite on every shipped policy and on a user's (the
// batch ramp of examples/03_custom_policies), the suite failing policies that break it, and the
// user's ramp trained by the trainer (its steps grow; at full size it is batch::accumulate bit
// for bit; it resumes exactly).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "conformance/batch_policy.hpp"
#include "strata/batch/accumulate.hpp"
#include "strata/batch/adaptive.hpp"
#include "strata/batch/fixed.hpp"
#include "strata/data/transforms.hpp"
#include "strata/train/trainer.hpp"

#include "../../../examples/03_custom_policies/batch_ramp.hpp"
#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sb = strata::batch;
namespace st = strata::train;

namespace {

strata::config::train_config policy_config(std::int64_t per_rank, std::int64_t accumulation) {
  strata::config::train_config cfg;
  cfg.batch_size_per_gpu = per_rank;
  cfg.gradient_accumulation_steps = accumulation;
  return cfg;
}

template <class B>
void expect_conformant(const strata::config::train_config& cfg) {
  const strata::conformance::batch_report rep =
      strata::conformance::check_batch_policy_semantics<B>(cfg);
  for (const std::string& f : rep.failures) {
    FAIL_CHECK(f);
  }
  CHECK(rep.checks > 100);
}

// Wrong policies: each breaks one written rule, and the suite must say so.
struct runs_twice : sb::fixed {  // runs its samples twice without a restart in between
  using sb::fixed::fixed;
  template <sb::step_runner R>
  strata::model::loss_result run(R& runner, const sb::samples& b, bool last) {
    runner.micro_step(b, false);
    return runner.micro_step(b, last);
  }
};
struct last_too_early : sb::accumulate {  // says last = true on every loader batch
  using sb::accumulate::accumulate;
  template <sb::step_runner R>
  strata::model::loss_result run(R& runner, const sb::samples& b, bool) {
    return runner.micro_step(b, true);
  }
};
struct forgets_state : sb::fixed {  // decides from a count that state() does not keep
  using sb::fixed::fixed;
  std::size_t loader_batches(std::uint64_t) const { return 1 + calls_ % 5; }
  template <sb::step_runner R>
  strata::model::loss_result run(R& runner, const sb::samples& b, bool last) {
    calls_ += last ? 1 : 0;
    return runner.micro_step(b, last);
  }

 private:
  std::size_t calls_ = 0;
};

fs::path work_dir(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "batch_policies" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The ramp's keys: from `start` micro-batches per step to 4 over `steps` steps.
strata::config::train_config training_config(const fs::path& dir, int start = 1, int steps = 6) {
  strata::config::train_config cfg;
  cfg.policy["ramp_start"] = std::to_string(start);
  cfg.policy["ramp_steps"] = std::to_string(steps);
  cfg.epochs = 2;
  cfg.batch_size_per_gpu = 16;
  cfg.gradient_accumulation_steps = 4;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  return cfg;
}

}  // namespace

TEST_CASE("every batch policy keeps the batch_policy contract (conformance suite)") {
  SUBCASE("batch::fixed") {
    expect_conformant<sb::fixed>(policy_config(16, 1));
  }
  SUBCASE("batch::accumulate") {
    expect_conformant<sb::accumulate>(policy_config(16, 3));
  }
  SUBCASE("batch::adaptive") {
    auto cfg = policy_config(8, 8);
    cfg.adaptive_batch = true;
    cfg.adaptive_batch_min = 1;
    cfg.adaptive_batch_max = 64;
    expect_conformant<sb::adaptive>(cfg);
  }
  SUBCASE("a user's batch ramp (examples/03_custom_policies)") {
    auto cfg = policy_config(16, 6);
    cfg.policy = {{"ramp_start", "2"}, {"ramp_steps", "10"}};
    expect_conformant<batch_ramp>(cfg);
  }
}

TEST_CASE("the batch_policy conformance suite fails policies that break the contract") {
  using strata::conformance::check_batch_policy_semantics;
  const auto twice = check_batch_policy_semantics<runs_twice>(policy_config(16, 1));
  CHECK_FALSE(twice.ok());
  CHECK(twice.failures.front().find("once each") != std::string::npos);
  const auto early = check_batch_policy_semantics<last_too_early>(policy_config(16, 3));
  CHECK_FALSE(early.ok());
  const auto forgets = check_batch_policy_semantics<forgets_state>(policy_config(16, 1));
  CHECK_FALSE(forgets.ok());
  bool named_state = false;
  for (const std::string& f : forgets.failures) {
    named_state = named_state || f.find("restored from state()") != std::string::npos;
  }
  CHECK(named_state);
}

TEST_CASE(
    "a user's batch ramp in the trainer: steps grow, full size equals batch::accumulate, "
    "exact resume") {
  using model_type = decltype(strata::test::blobs_mlp());
  // At full size from the start, the ramp is batch::accumulate, bit for bit.
  {
    const fs::path dir = work_dir("full");
    auto cfg = training_config(dir / "accumulate");
    cfg.policy.clear();  // batch::accumulate declares no [policy] key
    st::trainer<model_type, sb::accumulate> acc(strata::test::blobs_mlp(), cfg,
                                                {.print_progress = false});
    const auto a = strata::test::record(acc);
    cfg = training_config(dir / "ramp", 4, 10);
    st::trainer<model_type, batch_ramp> ramp(strata::test::blobs_mlp(), cfg,
                                             {.print_progress = false});
    const auto r = strata::test::record(ramp);
    REQUIRE(r.steps.size() == a.steps.size());
    CHECK(r.params == a.params);
  }
  using ramp_trainer_t = st::trainer<model_type, batch_ramp>;
  // From 1 micro-batch of 16 to 4 over 6 steps: 16, 16, 32, 32, 48, 48, then 64 samples.
  const fs::path dir = work_dir("ramp");
  const auto cfg = training_config(dir / "straight");
  st::trainer<model_type, batch_ramp> straight_trainer(strata::test::blobs_mlp(), cfg,
                                                       {.print_progress = false});
  const auto straight = strata::test::record(straight_trainer);
  const std::size_t expected[] = {16, 16, 32, 32, 48, 48, 64, 64};
  REQUIRE(straight.steps.size() > 8);
  for (std::size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(straight.steps[i].samples == expected[i]);
  }
  // 512 samples, 32 loader batches an epoch: 6 ramp steps take 12, 5 full steps the other 20;
  // the second epoch is 8 full steps.
  CHECK(straight.steps.size() == 11 + 8);

  // Stopped mid-ramp and resumed by a new trainer: the same parameters, bit for bit.
  auto first_cfg = training_config(dir / "resumed");
  first_cfg.max_steps = 5;
  {
    st::trainer<model_type, batch_ramp> first(strata::test::blobs_mlp(), first_cfg,
                                              {.print_progress = false});
    CHECK(strata::test::record(first).summary.stopped_by_max_steps);
  }
  st::trainer<model_type, batch_ramp> second(
      strata::test::blobs_mlp(), training_config(dir / "resumed"), {.print_progress = false});
  const auto resumed = strata::test::record(second);
  CHECK_FALSE(resumed.summary.resumed_from.empty());
  CHECK(resumed.summary.params_xxh3 == straight.summary.params_xxh3);

  // Its own keys are checked: a start above the full size, a zero length.
  auto high = training_config(dir / "high", 5, 6);
  CHECK_THROWS_WITH_AS(ramp_trainer_t(strata::test::blobs_mlp(), high, {.print_progress = false}),
                       doctest::Contains("key 'policy.ramp_start'"), strata::config_error);
  auto zero = training_config(dir / "zero", 1, 0);
  CHECK_THROWS_WITH_AS(ramp_trainer_t(strata::test::blobs_mlp(), zero, {.print_progress = false}),
                       doctest::Contains("key 'policy.ramp_steps'"), strata::config_error);

  // The keys of a policy the ramp is not are refused, naming the key.
  auto wrong = training_config(dir / "wrong");
  wrong.adaptive_batch_max = 64;
  using ramp_trainer = st::trainer<model_type, batch_ramp>;
  CHECK_THROWS_WITH_AS(ramp_trainer(strata::test::blobs_mlp(), wrong, {.print_progress = false}),
                       doctest::Contains("adaptive_batch_max configures batch::adaptive"),
                       strata::config_error);
}
