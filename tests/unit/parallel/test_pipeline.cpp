// SPDX-License-Identifier: Apache-2.0
// parallel::pipeline<Schedule> through the trainer on thread ranks: one rank == pp 2 == pp 4 ==
// dp 2 x pp 2 for every shipped schedule (losses of 20 steps, parameters after); a bit-exact
// resume; an fp16 overflow on one stage skips the step on every stage; the executor alone with
// passes of the wrong shape; the configuration errors.
#include "strata/parallel/pipeline.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/comm/threads.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/pipeline.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/trainer.hpp"

#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sm = strata::model;
namespace st = strata::train;
namespace par = strata::parallel;
namespace pl = strata::pipeline;
using strata::comm::threads;
using strata::test::blobs;

namespace {

// Eight layers, so that 4 stages of 2 chunks each get one.
auto deep_mlp() {
  return sm::sequential(
      strata::sample_shape{.channels = 1, .height = 1, .width = 8}, sm::linear{.in = 8, .out = 32},
      sm::relu{}, sm::dropout{.rate = 0.1}, sm::linear{.in = 32, .out = 24}, sm::relu{},
      sm::linear{.in = 24, .out = 16}, sm::gelu{}, sm::linear{.in = 16, .out = 4});
}
using model_t = decltype(deep_mlp());

strata::config::train_config base_config(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "pipeline" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  strata::config::train_config cfg;
  cfg.epochs = 2;
  cfg.batch_size_per_gpu = 64;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  cfg.warmup_epochs = 0.5;
  return cfg;
}

// What a run left: rank 0's step losses and every parameter tensor by name (gathered from the
// stages).
struct outcome {
  std::vector<double> losses;
  std::vector<std::size_t> samples;
  std::map<std::string, std::vector<float>> tensors;
  double test_accuracy = 0.0;
  std::uint64_t skipped = 0;
};

void keep_tensors(const sm::param_store& p, std::map<std::string, std::vector<float>>& into) {
  for (const auto& e : p.entries()) {
    const auto v = p.value(e.name);
    into[e.name].assign(v.begin(), v.end());
  }
}

// 600 training samples: 9 full batches and one of 24 per epoch.
template <class Trainer>
void fit(Trainer& t, outcome& out, bool record_steps) {
  if (record_steps) {
    t.on_step([&](const st::step_metrics& m) {
      out.losses.push_back(m.loss);
      out.samples.push_back(m.samples);
    });
  }
  const auto summary = t.fit(blobs{.n = 600}, strata::data::identity{}, blobs{.n = 256, .salt = 1},
                             strata::data::identity{});
  if (record_steps) {
    out.test_accuracy = summary.test_accuracy;
    out.skipped = summary.skipped_steps;
  }
}

outcome one_rank(strata::config::train_config cfg) {
  outcome out;
  st::trainer<model_t> t(deep_mlp(), cfg, {.print_progress = false});
  fit(t, out, true);
  keep_tensors(t.params(), out.tensors);
  return out;
}

template <class Schedule, class... Extra, class Setup = std::nullptr_t>
outcome pipelined(int ranks, strata::config::train_config cfg, Setup setup = nullptr) {
  cfg.world_size = ranks;
  outcome out;
  std::mutex lock;
  threads::run(ranks, [&](threads& c) {
    st::trainer<model_t, par::pipeline<Schedule>, Extra...> t(
        deep_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false});
    if constexpr (!std::is_same_v<Setup, std::nullptr_t>) {
      setup(t, c.rank());
    }
    outcome mine;
    fit(t, mine, c.rank() == 0);
    const std::lock_guard guard(lock);
    if (c.rank() == 0) {
      out.losses = mine.losses;
      out.samples = mine.samples;
      out.test_accuracy = mine.test_accuracy;
      out.skipped = mine.skipped;
    }
    // Replicas of a stage end alike; keep the first's.
    for (const auto& e : t.params().entries()) {
      const auto v = t.params().value(e.name);
      auto [it, fresh] = out.tensors.try_emplace(e.name, v.begin(), v.end());
      if (!fresh) {
        CHECK(it->second == std::vector<float>(v.begin(), v.end()));
      }
    }
  });
  return out;
}

void check_same(const outcome& a, const outcome& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  CHECK(a.losses.size() == 20);
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    INFO("step " << i);
    CHECK(a.samples[i] == b.samples[i]);
    CHECK(a.losses[i] == doctest::Approx(b.losses[i]).epsilon(1e-5));
  }
  REQUIRE(a.tensors.size() == b.tensors.size());
  double worst = 0.0;
  for (const auto& [name, values] : a.tensors) {
    const auto it = b.tensors.find(name);
    REQUIRE(it != b.tensors.end());
    REQUIRE(it->second.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(values[i] - it->second[i])));
    }
  }
  CHECK(worst < 1e-4);
  CHECK(a.test_accuracy == doctest::Approx(b.test_accuracy).epsilon(1e-6));
}

template <class Schedule>
void equals_one_rank() {
  INFO(par::pipeline<Schedule>::name);
  auto cfg = base_config(std::string(pl::one_f_one_b::name));
  cfg.micro_batches = 5;  // pieces of 13 and a last of 12; the short batch: 5, 5, 5, 5, 4
  cfg.pipeline_schedule =
      Schedule::chunks > 1 ? strata::config::pipeline_schedule_kind::interleaved_1f1b
      : std::string_view(Schedule::name) == "gpipe" ? strata::config::pipeline_schedule_kind::gpipe
      : std::string_view(Schedule::name) == "zero_bubble_h1"
          ? strata::config::pipeline_schedule_kind::zero_bubble_h1
          : strata::config::pipeline_schedule_kind::one_f_one_b;
  const outcome reference = one_rank(base_config("one_rank"));
  for (const int stages : {2, 4}) {
    INFO("pp " << stages);
    auto c = cfg;
    c.pipeline_parallel_size = stages;
    check_same(pipelined<Schedule>(stages, c), reference);
  }
  // dp 2 x pp 2: two replicas read half the samples each, as one rank with twice the batch.
  auto twice = base_config("one_rank_twice");
  twice.batch_size_per_gpu = 128;
  const outcome wide = one_rank(twice);
  auto c = cfg;
  c.pipeline_parallel_size = 2;
  const outcome mixed = pipelined<Schedule>(4, c);
  REQUIRE(mixed.losses.size() == wide.losses.size());
  for (std::size_t i = 0; i < wide.losses.size(); ++i) {
    INFO("dp 2 x pp 2, step " << i);
    CHECK(mixed.samples[i] == wide.samples[i]);
    CHECK(mixed.losses[i] == doctest::Approx(wide.losses[i]).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("gpipe: one rank == pp 2 == pp 4, and dp 2 x pp 2 == one rank with twice the batch") {
  equals_one_rank<pl::gpipe>();
}
TEST_CASE("1f1b: one rank == pp 2 == pp 4, and dp 2 x pp 2 == one rank with twice the batch") {
  equals_one_rank<pl::one_f_one_b>();
}
TEST_CASE("interleaved 1f1b (v = 2): one rank == pp 2 == pp 4, and dp 2 x pp 2") {
  equals_one_rank<pl::interleaved_1f1b<2>>();
}
TEST_CASE("zero bubble h1: one rank == pp 2 == pp 4, and dp 2 x pp 2") {
  equals_one_rank<pl::zero_bubble_h1>();
}

TEST_CASE("dp 2 x pp 2 ends with the parameters of one rank with twice the batch") {
  auto c = base_config("dp_params");
  c.pipeline_parallel_size = 2;
  c.micro_batches = 4;
  auto twice = base_config("dp_params_one");
  twice.batch_size_per_gpu = 128;
  const outcome wide = one_rank(twice);
  const outcome mixed = pipelined<pl::one_f_one_b>(4, c);
  REQUIRE(mixed.tensors.size() == wide.tensors.size());
  double worst = 0.0;
  for (const auto& [name, values] : wide.tensors) {
    const auto& other = mixed.tensors.at(name);
    REQUIRE(other.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(values[i] - other[i])));
    }
  }
  CHECK(worst < 1e-4);
}

TEST_CASE("float16: an overflow on the first stage skips the step on every stage") {
  auto c = base_config("fp16");
  c.pipeline_parallel_size = 4;
  c.micro_batches = 4;
  c.mixed_precision_dtype = strata::config::precision_dtype::float16;
  std::vector<std::uint64_t> skipped(4);
  std::vector<std::vector<bool>> skips(4);
  std::mutex lock;
  threads::run(4, [&](threads& comm) {
    auto cfg = c;
    cfg.world_size = 4;
    st::trainer<model_t, par::pipeline<pl::one_f_one_b>, strata::precision::fp16> t(
        deep_mlp(), cfg, strata::comm::any_comm(comm), {.print_progress = false});
    if (comm.rank() == 0) {
      t.on_gradients([](std::uint64_t step, std::span<float> g) {
        if (step == 3) {
          g[0] = std::numeric_limits<float>::infinity();
        }
      });
    }
    std::vector<bool> mine;
    t.on_step([&](const st::step_metrics& m) { mine.push_back(m.skipped); });
    t.fit(blobs{.n = 600}, strata::data::identity{}, blobs{.n = 256, .salt = 1},
          strata::data::identity{});
    const std::lock_guard guard(lock);
    skipped[static_cast<std::size_t>(comm.rank())] = t.skipped_steps();
    skips[static_cast<std::size_t>(comm.rank())] = mine;
  });
  REQUIRE(skips[0].size() > 3);
  CHECK(skips[0][3]);
  for (int r = 1; r < 4; ++r) {
    CHECK(skips[static_cast<std::size_t>(r)] == skips[0]);
    CHECK(skipped[static_cast<std::size_t>(r)] == skipped[0]);
  }
}

TEST_CASE("pipeline_split puts the layers where the user says; bad splits and keys are refused") {
  auto c = base_config("split");
  c.pipeline_parallel_size = 2;
  c.world_size = 2;
  c.policy["pipeline_split"] = "3,5";
  std::vector<std::size_t> groups(2);
  threads::run(2, [&](threads& comm) {
    st::trainer<model_t, par::pipeline<pl::gpipe>> t(
        deep_mlp(),
        [&] {
          auto k = c;
          k.pipeline_schedule = strata::config::pipeline_schedule_kind::gpipe;
          return k;
        }(),
        strata::comm::any_comm(comm), {.print_progress = false});
    groups[static_cast<std::size_t>(comm.rank())] = t.params().groups().size();
    if (comm.rank() == 0) {
      CHECK(t.params().groups().back().name == "2");
    } else {
      CHECK(t.params().groups().front().name == "3");
    }
  });
  CHECK(groups == std::vector<std::size_t>{3, 5});

  const auto error_of = [](strata::config::train_config k, int ranks) {
    k.world_size = ranks;
    std::string what;
    threads::run(ranks, [&](threads& comm) {
      try {
        st::trainer<model_t, par::pipeline<pl::one_f_one_b>> t(
            deep_mlp(), k, strata::comm::any_comm(comm), {.print_progress = false});
      } catch (const strata::config_error& e) {
        if (comm.rank() == 0) {
          what = e.what();
        }
      }
    });
    return what;
  };
  auto k = base_config("split_errors");
  k.pipeline_parallel_size = 2;
  k.policy["pipeline_split"] = "3,4";
  CHECK(error_of(k, 2).find("policy.pipeline_split") != std::string::npos);
  CHECK(error_of(k, 2).find("the split holds 7 layers, the model has 8") != std::string::npos);
  k.policy["pipeline_split"] = "3;5";
  CHECK(error_of(k, 2).find("not a comma-separated list of layer counts") != std::string::npos);
  k.policy.clear();
  k.policy["pipeline_balance"] = "guess";
  CHECK(error_of(k, 2).find("policy.pipeline_balance") != std::string::npos);
  k.policy["pipeline_balance"] = "estimated";
  k.policy["pipeline_memory_cap_mb"] = "0";
  CHECK(error_of(k, 2).empty());
  k.policy.clear();
  k.policy["pipeline_memory_cap_mb"] = "0";
  k.pipeline_parallel_size = 3;
  CHECK(error_of(k, 4).find("pipeline_parallel_size = 3 does not divide world_size = 4") !=
        std::string::npos);
  k.pipeline_parallel_size = 2;
  k.pipeline_schedule = strata::config::pipeline_schedule_kind::gpipe;
  CHECK(error_of(k, 2).find("pipeline_schedule = gpipe, but the trainer's parallel policy is "
                            "pipeline<one_f_one_b>") != std::string::npos);
  // Pipeline keys under a policy that has no stages.
  auto d = base_config("foreign");
  d.world_size = 2;
  d.micro_batches = 4;
  std::string foreign;
  threads::run(2, [&](threads& comm) {
    try {
      st::trainer<model_t, par::data<>> t(deep_mlp(), d, strata::comm::any_comm(comm),
                                          {.print_progress = false});
    } catch (const strata::config_error& e) {
      if (comm.rank() == 0) {
        foreign = e.what();
      }
    }
  });
  CHECK(foreign.find("micro_batches configures pipeline stages") != std::string::npos);
}

namespace {

// Stage passes of fixed shapes that compute nothing: for the executor alone.
struct shaped_passes final : par::stage_passes {
  std::size_t in = 4;
  std::size_t out = 4;
  std::vector<float> data = std::vector<float>(64, 1.0f);
  std::size_t input_elements(int) const override { return in; }
  std::size_t first_group(int) const override { return 0; }
  std::size_t output_elements(int) const override { return out; }
  std::span<const float> forward(int, std::size_t, std::span<const float>,
                                 const par::micro_batch& b, bool) override {
    return std::span<const float>(data).first(b.size * out);
  }
  sm::loss_result loss(std::span<const float>, const par::micro_batch& b,
                       std::span<float> grad) override {
    std::fill(grad.begin(), grad.end(), 0.0f);
    return {.loss_sum = 1.0, .correct = 0, .samples = b.size};
  }
  std::span<const float> backward(int, std::size_t, std::span<const float>, bool,
                                  par::bucket_reducer*) override {
    return std::span<const float>(data).first(2 * in);
  }
  void backward_weight(int, std::size_t, par::bucket_reducer*) override {}
};

}  // namespace

TEST_CASE("stages that disagree on the shape at their boundary: an error naming both") {
  strata::config::train_config cfg;
  cfg.world_size = 2;
  cfg.pipeline_parallel_size = 2;
  const auto outcomes = threads::try_run(2, [&](threads& comm) {
    sm::param_store store({"0"}, {{sm::param_spec{.name = "w", .rows = 1, .cols = 4}}});
    auto opt = strata::optim::make_optimizer({});
    auto precision = strata::precision::fp32(cfg);
    strata::comm::any_comm any(comm);
    par::pipeline_executor<par::pipeline<pl::one_f_one_b>> e(
        {.comm = &any,
         .master = store,
         .compute = store,
         .optimizer = opt,
         .cfg = cfg,
         .precision = par::precision_ops_of(precision)});
    shaped_passes passes;
    if (comm.rank() == 0) {
      passes.out = 3;  // stage 1 reads 4 floats per sample
    }
    const std::vector<std::int32_t> labels = {0, 1};
    const std::vector<std::uint64_t> ids = {0, 1};
    const std::vector<par::micro_batch> batches = {
        {.inputs = std::span<const float>(passes.data).first(8),
         .labels = labels,
         .indices = ids,
         .size = 2}};
    (void)e.run_step(batches, passes);
  });
  REQUIRE(outcomes[1] != nullptr);
  try {
    std::rethrow_exception(outcomes[1]);
  } catch (const std::exception& ex) {
    const std::string what = ex.what();
    CHECK(what.find("pipeline<one_f_one_b>: stage 0 (rank 0 of the pipeline) sent micro-batch 0's "
                    "activation as") != std::string::npos);
    CHECK(what.find("stage 1 expects 2 samples x 4 floats") != std::string::npos);
  }
}

namespace {

// Blobs that count the samples read (each rank its own counter).
struct counted_blobs {
  using dataset_category = strata::data::dataset_tag;
  blobs inner{};
  std::shared_ptr<std::atomic<std::size_t>> reads = std::make_shared<std::atomic<std::size_t>>(0);
  std::size_t size() const { return inner.size(); }
  strata::sample_shape shape() const { return inner.shape(); }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    ++*reads;
    return inner.read(i, out);
  }
};

}  // namespace

TEST_CASE("only the first stage reads samples; the last gets their labels from it") {
  auto cfg = base_config("reads");
  cfg.pipeline_parallel_size = 4;
  cfg.world_size = 4;
  cfg.micro_batches = 4;
  cfg.epochs = 1;
  std::vector<std::size_t> reads(4);
  std::vector<std::size_t> test_reads(4);
  std::vector<double> losses;
  double accuracy = 0.0;
  // snippet-begin: pipeline
  // pipeline_parallel_size = 4, world_size = 4, micro_batches = 4 (pieces of each batch)
  threads::run(4, [&](threads& comm) {
    st::trainer<model_t, par::pipeline<pl::one_f_one_b>> t(
        deep_mlp(), cfg, strata::comm::any_comm(comm), {.print_progress = false});
    // snippet-end: pipeline
    std::vector<double> mine;
    t.on_step([&](const st::step_metrics& m) { mine.push_back(m.loss); });
    const counted_blobs train{.inner = blobs{.n = 600}};
    const counted_blobs test{.inner = blobs{.n = 256, .salt = 1}};
    const auto summary = t.fit(train, strata::data::identity{}, test, strata::data::identity{});
    reads[static_cast<std::size_t>(comm.rank())] = *train.reads;
    test_reads[static_cast<std::size_t>(comm.rank())] = *test.reads;
    if (comm.rank() == 0) {
      losses = mine;
      accuracy = summary.test_accuracy;
    }
  });
  CHECK(reads[0] >= 600);
  CHECK(test_reads[0] >= 256);
  for (std::size_t r = 1; r < 4; ++r) {
    CHECK(reads[r] == 0);
    CHECK(test_reads[r] == 0);
  }
  // The labels are right: the same losses as one rank.
  auto one = base_config("reads_one");
  one.epochs = 1;
  const outcome reference = one_rank(one);
  REQUIRE(losses.size() == reference.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    CHECK(losses[i] == doctest::Approx(reference.losses[i]).epsilon(1e-5));
  }
  CHECK(accuracy == doctest::Approx(reference.test_accuracy).epsilon(1e-6));
}

namespace {

// 1 x 6 x 6 images of four classes: class c brightens quadrant c.
struct quadrants {
  using dataset_category = strata::data::dataset_tag;
  std::size_t n = 384;
  std::uint64_t salt = 0;
  std::size_t size() const { return n; }
  strata::sample_shape shape() const { return {.channels = 1, .height = 6, .width = 6}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    const auto label = static_cast<std::int32_t>(i % 4);
    strata::rng_stream rng = strata::rng_stream::for_sample(7 + salt, 0, i);
    for (std::size_t y = 0; y < 6; ++y) {
      for (std::size_t x = 0; x < 6; ++x) {
        const auto quadrant = static_cast<std::int32_t>((y / 3) * 2 + x / 3);
        out[y * 6 + x] = (quadrant == label ? 1.5f : 0.0f) + 0.5f * rng.normal_float();
      }
    }
    return label;
  }
};

auto tiny_cnn() {
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 6, .width = 6},
                        sm::conv2d{.in_channels = 1, .out_channels = 4}, sm::relu{},
                        sm::max_pool2d{}, sm::flatten{}, sm::linear{.in = 36, .out = 4});
}

}  // namespace

TEST_CASE("the CNN: one rank == pp 2 with 1f1b and zb-h1 (conv2d's backward does not split)") {
  auto cfg = base_config("cnn");
  cfg.batch_size_per_gpu = 32;
  cfg.micro_batches = 4;
  cfg.policy["pipeline_balance"] = "measured";  // the probe of each layer (no resume here)
  using cnn_t = decltype(tiny_cnn());
  const auto run_one = [&] {
    auto c = base_config("cnn_one");
    c.batch_size_per_gpu = 32;
    st::trainer<cnn_t> u(tiny_cnn(), c, {.print_progress = false});
    std::vector<double> mine;
    u.on_step([&](const st::step_metrics& m) { mine.push_back(m.loss); });
    u.fit(quadrants{}, strata::data::identity{}, quadrants{.n = 128, .salt = 1},
          strata::data::identity{});
    return mine;
  };
  const std::vector<double> reference = run_one();
  REQUIRE(reference.size() == 24);
  const auto staged = [&]<class Schedule>(std::type_identity<Schedule>,
                                          strata::config::pipeline_schedule_kind kind) {
    auto c = cfg;
    c.world_size = 2;
    c.pipeline_parallel_size = 2;
    c.pipeline_schedule = kind;
    std::vector<double> losses;
    threads::run(2, [&](threads& comm) {
      st::trainer<cnn_t, par::pipeline<Schedule>> t(tiny_cnn(), c, strata::comm::any_comm(comm),
                                                    {.print_progress = false});
      std::vector<double> mine;
      t.on_step([&](const st::step_metrics& m) { mine.push_back(m.loss); });
      t.fit(quadrants{}, strata::data::identity{}, quadrants{.n = 128, .salt = 1},
            strata::data::identity{});
      if (comm.rank() == 0) {
        losses = mine;
      }
    });
    return losses;
  };
  for (const auto& losses : {staged(std::type_identity<pl::one_f_one_b>{},
                                    strata::config::pipeline_schedule_kind::one_f_one_b),
                             staged(std::type_identity<pl::zero_bubble_h1>{},
                                    strata::config::pipeline_schedule_kind::zero_bubble_h1)}) {
    REQUIRE(losses.size() == reference.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      INFO("step " << i);
      CHECK(losses[i] == doctest::Approx(reference[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("layer-wise model parallelism is a pipeline of one micro-batch") {
  auto cfg = base_config("layerwise");
  cfg.pipeline_parallel_size = 4;
  cfg.micro_batches = 1;
  check_same(pipelined<pl::gpipe>(4,
                                  [&] {
                                    auto c = cfg;
                                    c.pipeline_schedule =
                                        strata::config::pipeline_schedule_kind::gpipe;
                                    return c;
                                  }()),
             one_rank(base_config("layerwise_one")));
}

TEST_CASE(
    "a checkpoint of stages of other layers: cut anew, or refused by name when it cannot be") {
  // Written before checkpoints carried a tensor manifest: refused by name.
  strata::train::loaded_checkpoint c;
  c.info.path = "/ckpt/run-1/epoch-1";
  c.state = nlohmann::json{{"layers_per_stage", "3,5"}};
  CHECK_NOTHROW(st::detail::check_layer_split(c, "3,5"));
  CHECK_NOTHROW(st::detail::check_layer_split(c, ""));  // no pipeline: nothing to compare
  try {
    st::detail::check_layer_split(c, "4,4");
    FAIL("a different split was accepted");
  } catch (const strata::config_error& e) {
    const std::string m = e.what();
    CHECK(m.find("policy.pipeline_split") != std::string::npos);
    CHECK(m.find("/ckpt/run-1/epoch-1 was written by stages of 3,5 layers") != std::string::npos);
    CHECK(m.find("split is 4,4") != std::string::npos);
  }
  // Through the trainer: a pipeline's checkpoint records its split.
  auto cfg = base_config("split_recorded");
  cfg.epochs = 1;
  cfg.pipeline_parallel_size = 2;
  cfg.micro_batches = 2;
  cfg.pipeline_schedule = strata::config::pipeline_schedule_kind::one_f_one_b;
  cfg.policy["pipeline_split"] = "3,5";
  (void)pipelined<pl::one_f_one_b>(2, cfg);
  bool found = false;
  for (const auto& entry : fs::recursive_directory_iterator(cfg.checkpoint_dir)) {
    if (entry.path().filename() == "manifest.json") {
      std::ifstream in(entry.path());
      const auto manifest = nlohmann::json::parse(in);
      CHECK(manifest.at("state").at("layers_per_stage") == "3,5");
      found = true;
    }
  }
  CHECK(found);
  // With its manifest, a named run stopped under 3,5 goes on under 6,2 as one rank trains.
  auto named = base_config("split_changed");
  named.pipeline_parallel_size = 2;
  named.micro_batches = 2;
  named.pipeline_schedule = strata::config::pipeline_schedule_kind::one_f_one_b;
  named.run_name = "deep";
  named.policy["pipeline_split"] = "3,5";
  named.max_steps = 13;  // epoch 2, its third step
  (void)pipelined<pl::one_f_one_b>(2, named);
  named.max_steps = 0;
  named.policy["pipeline_split"] = "6,2";
  named.resume = strata::config::resume_mode::required;
  const outcome rest = pipelined<pl::one_f_one_b>(2, named);
  const outcome one = one_rank(base_config("split_changed_one"));
  REQUIRE(rest.losses.size() + 13 == one.losses.size());
  for (std::size_t i = 0; i < rest.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(rest.losses[i] == doctest::Approx(one.losses[13 + i]).epsilon(1e-5));
  }
  for (const auto& [name, values] : one.tensors) {
    CAPTURE(name);
    const auto& got = rest.tensors.at(name);
    REQUIRE(got.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      CHECK(got[i] == doctest::Approx(values[i]).epsilon(1e-4).scale(1.0));
    }
  }
}
