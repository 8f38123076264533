// SPDX-License-Identifier: Apache-2.0
// The precision_policy contract: the conformance suite on every shipped policy and on a user's
// (guarded_fp32 of examples/03_custom_policies), the suite failing policies that break it, and
// the user's policy in the trainer (a non-finite step skipped bit for bit, on every rank when one
// rank's gradients are bad; its keys checked).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "conformance/precision_policy.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/data/transforms.hpp"
#include "strata/parallel/data.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/trainer.hpp"

#include "../../../examples/03_custom_policies/guarded_fp32.hpp"
#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sp = strata::precision;
namespace st = strata::train;

namespace {

template <class P>
void expect_conformant(const strata::config::train_config& cfg) {
  const auto rep = strata::conformance::check_precision_policy_semantics<P>(
      cfg, [] { return strata::test::blobs_mlp().make_params(); });
  for (const std::string& f : rep.failures) {
    FAIL_CHECK(f);
  }
  CHECK(rep.checks > 15);
}

template <class P>
strata::conformance::precision_report suite(const strata::config::train_config& cfg) {
  return strata::conformance::check_precision_policy_semantics<P>(
      cfg, [] { return strata::test::blobs_mlp().make_params(); });
}

strata::config::train_config with_dtype(strata::config::precision_dtype t) {
  strata::config::train_config cfg;
  cfg.mixed_precision_dtype = t;
  return cfg;
}

// Wrong policies: each breaks one written rule, and the suite must say so.
struct ignores_vote : guarded_fp32 {  // skips on its own gradients only: the ranks would part
  using guarded_fp32::guarded_fp32;
  template <class Vote>
  bool finish(std::uint64_t, std::span<const float> grads, std::span<float>, Vote&& vote) {
    const bool mine = !sp::all_finite(grads);
    vote(mine);
    return !mine;
  }
};
struct unrounded_bf16 : sp::bf16 {  // says bfloat16 but keeps float32 gradients
  using sp::bf16::mixed;
  void store(std::span<float>) const {}
};

// float32 that records what the trainer told it of each step's gradients (requirement 6's
// fifth argument) and otherwise decides as precision::fp32.
std::vector<bool>& told_finite() {
  static std::vector<bool> told;
  return told;
}
struct recording_fp32 : sp::fp32 {
  using sp::fp32::fp32;
  template <class Vote>
  bool finish(std::uint64_t step, std::span<const float> grads, std::span<float> master,
              Vote&& vote, sp::gradient_facts facts = {}) {
    told_finite().push_back(facts.certainly_finite);
    return sp::fp32::finish(step, grads, master, std::forward<Vote>(vote), facts);
  }
};

// Blobs whose sample 37 holds an inf: the step that draws it has non-finite gradients.
struct poisoned_blobs : strata::test::blobs {
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const std::int32_t label = blobs::read(i, out);
    if (i == 37) {
      out[2] = std::numeric_limits<float>::infinity();
    }
    return label;
  }
};

fs::path work_dir(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "precision_policies" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

strata::config::train_config training_config(const fs::path& dir) {
  strata::config::train_config cfg;
  cfg.epochs = 1;
  cfg.batch_size_per_gpu = 32;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  return cfg;
}

}  // namespace

TEST_CASE("every precision policy keeps the precision_policy contract (conformance suite)") {
  using strata::config::precision_dtype;
  SUBCASE("precision::fp32") {
    expect_conformant<sp::fp32>({});
  }
  SUBCASE("precision::bf16") {
    expect_conformant<sp::bf16>(with_dtype(precision_dtype::bfloat16));
  }
  SUBCASE("precision::fp16") {
    expect_conformant<sp::fp16>(with_dtype(precision_dtype::float16));
  }
  SUBCASE("a user's guarded_fp32 (examples/03_custom_policies)") {
    expect_conformant<guarded_fp32>({});
  }
}

TEST_CASE("the precision_policy conformance suite fails policies that break the contract") {
  const auto parted = suite<ignores_vote>({});
  CHECK_FALSE(parted.ok());
  bool named = false;
  for (const std::string& f : parted.failures) {
    named = named || f.find("the ranks would part") != std::string::npos;
  }
  CHECK(named);
  const auto unrounded =
      suite<unrounded_bf16>(with_dtype(strata::config::precision_dtype::bfloat16));
  CHECK_FALSE(unrounded.ok());
}

TEST_CASE("fp32 on one rank: bounded gradients are not read again; a bad sample is still skipped") {
  using model_type = decltype(strata::test::blobs_mlp());
  static_assert(sp::takes_gradient_facts<sp::fp32, bool (*)(bool)>);
  static_assert(!sp::takes_gradient_facts<guarded_fp32, bool (*)(bool)>);
  expect_conformant<recording_fp32>({});
  const strata::test::blobs test{.n = 64, .salt = 1};
  // Clean data: every step's gradients came bounded from the layers (the callbacks took none).
  {
    told_finite().clear();
    st::trainer<model_type, recording_fp32> t(
        strata::test::blobs_mlp(), training_config(work_dir("told")), {.print_progress = false});
    t.fit(strata::test::blobs{.n = 256}, strata::data::identity{}, test, strata::data::identity{});
    CHECK(told_finite() == std::vector<bool>(8, true));
    CHECK(t.skipped_steps() == 0);
  }
  // Sample 37 holds an inf: that step is not certain, is checked and skipped, the others apply;
  // a gradient callback that takes the gradients to write makes its step uncertain too.
  {
    told_finite().clear();
    st::trainer<model_type, recording_fp32> t(strata::test::blobs_mlp(),
                                              training_config(work_dir("poisoned")),
                                              {.print_progress = false});
    const std::string initial = st::xxh3_hex(t.params().values());
    std::vector<std::string> after;
    std::vector<bool> skipped;
    t.on_step([&](const st::step_metrics& m) {
      after.push_back(st::xxh3_hex(t.params().values()));
      skipped.push_back(m.skipped);
    });
    t.fit(poisoned_blobs{{.n = 256}}, strata::data::identity{}, test, strata::data::identity{});
    REQUIRE(skipped.size() == 8);
    CHECK(t.skipped_steps() == 1);
    for (std::size_t i = 0; i < 8; ++i) {
      INFO("step ", i);
      CHECK(told_finite()[i] == !skipped[i]);
      if (skipped[i]) {
        CHECK(after[i] == (i == 0 ? initial : after[i - 1]));
      }
    }
    told_finite().clear();
    st::trainer<model_type, recording_fp32> u(strata::test::blobs_mlp(),
                                              training_config(work_dir("callback")),
                                              {.print_progress = false});
    u.on_gradients([](std::uint64_t, std::span<float>) {});
    u.fit(strata::test::blobs{.n = 64}, strata::data::identity{}, test, strata::data::identity{});
    CHECK(told_finite() == std::vector<bool>(2, false));
  }
}

TEST_CASE("a user's guarded_fp32 in the trainer skips a non-finite step on every rank") {
  using model_type = decltype(strata::test::blobs_mlp());
  const strata::test::blobs train{.n = 256};
  const strata::test::blobs test{.n = 64, .salt = 1};
  // One rank: an inf at step 3 leaves the parameters as they were.
  {
    st::trainer<model_type, guarded_fp32> t(
        strata::test::blobs_mlp(), training_config(work_dir("one")), {.print_progress = false});
    std::vector<std::string> after;
    t.on_gradients([](std::uint64_t step, std::span<float> grads) {
      if (step == 3) {
        grads[5] = std::numeric_limits<float>::infinity();
      }
    });
    t.on_step([&](const st::step_metrics&) { after.push_back(st::xxh3_hex(t.params().values())); });
    t.fit(train, strata::data::identity{}, test, strata::data::identity{});
    REQUIRE(after.size() == 8);
    CHECK(after[3] == after[2]);
    CHECK(after[4] != after[3]);
    CHECK(t.skipped_steps() == 1);
  }
  // Two thread ranks, rank 1's gradients bad at steps 2 and 5: both ranks skip both steps and
  // end with the same parameters.
  std::vector<std::uint64_t> skipped(2);
  std::vector<std::string> params(2);
  const fs::path two = work_dir("two");
  strata::comm::threads::run(2, [&](strata::comm::threads& comm) {
    auto cfg = training_config(two);
    cfg.world_size = 2;
    cfg.epochs = 2;  // 4 steps an epoch
    st::trainer<model_type, guarded_fp32, strata::parallel::data<>> t(
        strata::test::blobs_mlp(), cfg, strata::comm::any_comm(comm), {.print_progress = false});
    const int r = comm.rank();
    t.on_gradients([r](std::uint64_t step, std::span<float> grads) {
      if (r == 1 && (step == 2 || step == 5)) {
        grads[1] = std::numeric_limits<float>::quiet_NaN();
      }
    });
    const st::fit_summary s =
        t.fit(train, strata::data::identity{}, test, strata::data::identity{});
    skipped[static_cast<std::size_t>(r)] = t.skipped_steps();
    params[static_cast<std::size_t>(r)] = s.params_xxh3;
  });
  CHECK(skipped[0] == 2);
  CHECK(skipped[1] == 2);
  CHECK(params[0] == params[1]);
  // A loss scaler's key with a policy that has none is refused, naming the key.
  auto wrong = training_config(work_dir("wrong"));
  wrong.loss_scale_initial = 1024.0;
  using guarded_trainer = st::trainer<model_type, guarded_fp32>;
  CHECK_THROWS_WITH_AS(guarded_trainer(strata::test::blobs_mlp(), wrong, {.print_progress = false}),
                       doctest::Contains("loss_scale_initial configures a loss scaler"),
                       strata::config_error);
}
