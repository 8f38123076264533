// SPDX-License-Identifier: Apache-2.0
#include "strata/train/trainer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/batch/accumulate.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"

#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;

namespace {

using strata::test::blobs;

auto small_model() {
  return strata::test::blobs_mlp();
}

fs::path work_dir(const std::string& name) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "trainer" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

strata::config::train_config base_config(const fs::path& dir) {
  strata::config::train_config cfg;
  cfg.epochs = 3;
  cfg.batch_size_per_gpu = 32;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  cfg.warmup_epochs = 0.5;
  return cfg;
}

struct run_record {
  std::vector<double> losses;
  std::vector<st::epoch_metrics> epochs;
  st::fit_summary summary;
};

run_record run(const strata::config::train_config& cfg) {
  run_record r;
  // snippet-begin: fit
  const blobs train{.n = 512};  // any strata::data::dataset
  const blobs test{.n = 256, .salt = 1};
  st::trainer t(small_model(), cfg, {.print_progress = false});  // cfg: a train_config
  t.on_step([&](const st::step_metrics& m) { r.losses.push_back(m.loss); });
  t.on_epoch([&](const st::epoch_metrics& m) { r.epochs.push_back(m); });
  // training set, its augmentation, test set, its transform
  r.summary = t.fit(train, sd::identity{}, test, sd::identity{});
  // snippet-end: fit
  return r;
}

}  // namespace

TEST_CASE("the trainer learns, reports and checkpoints") {
  const fs::path dir = work_dir("learns");
  auto cfg = base_config(dir);
  cfg.metrics_file = (dir / "metrics.jsonl").string();
  cfg.checkpoint_keep = 2;
  const run_record r = run(cfg);
  CHECK(r.summary.epochs_done == 3);
  CHECK(r.summary.steps == 3 * 16);
  CHECK(r.losses.size() == 48);
  CHECK(r.losses.back() < r.losses.front());
  CHECK(r.summary.test_accuracy > 0.9);
  CHECK(r.summary.params_xxh3.size() == 16);
  CHECK(r.summary.resumed_from.empty());

  // One row per step and per epoch, with the time split.
  std::ifstream in(cfg.metrics_file);
  std::size_t steps = 0;
  std::size_t epochs = 0;
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.at("type") == "step") {
      ++steps;
      CHECK(row.contains("data_s"));
      CHECK(row.contains("compute_s"));
      CHECK(row.contains("comm_s"));
      CHECK(row.at("peak_bytes").get<std::size_t>() > 0);
    } else {
      ++epochs;
      CHECK(row.at("test_accuracy").get<double>() > 0.0);
    }
  }
  CHECK(steps == 48);
  CHECK(epochs == 3);

  // Checkpoints after every epoch under checkpoint_dir/run-<fingerprint>, the newest two kept.
  const fs::path run_dir = r.summary.run_directory;
  CHECK(run_dir.parent_path() == dir / "ckpt");
  CHECK(run_dir.filename().string().starts_with("run-"));
  CHECK(run_dir.filename().string().size() == 12);
  CHECK_FALSE(fs::exists(run_dir / "epoch-1"));
  CHECK(fs::exists(run_dir / "epoch-2" / "manifest.json"));
  CHECK(fs::exists(run_dir / "epoch-3" / "manifest.json"));
}

TEST_CASE("a run stopped and resumed matches an uninterrupted run bit for bit") {
  const fs::path straight_dir = work_dir("straight");
  const run_record straight = run(base_config(straight_dir));
  REQUIRE(straight.losses.size() == 48);

  for (std::int64_t stop_at : {21, 32}) {  // mid-epoch 2, and the end of epoch 2
    CAPTURE(stop_at);
    const fs::path dir = work_dir("resumed-" + std::to_string(stop_at));
    auto first_cfg = base_config(dir);
    first_cfg.max_steps = stop_at;
    const run_record first = run(first_cfg);
    CHECK(first.summary.stopped_by_max_steps);
    CHECK(first.summary.steps == static_cast<std::uint64_t>(stop_at));

    const run_record second = run(base_config(dir));  // a new trainer, resuming
    CHECK_FALSE(second.summary.resumed_from.empty());
    std::vector<double> joined = first.losses;
    joined.insert(joined.end(), second.losses.begin(), second.losses.end());
    CHECK(joined == straight.losses);  // exact equality of every step's loss
    CHECK(second.summary.params_xxh3 == straight.summary.params_xxh3);
    CHECK(second.summary.test_accuracy == straight.summary.test_accuracy);
    // The epoch rows too: the resumed epoch counts the steps and samples before the stop.
    std::vector<st::epoch_metrics> rows = first.epochs;
    rows.insert(rows.end(), second.epochs.begin(), second.epochs.end());
    REQUIRE(rows.size() == straight.epochs.size());
    for (std::size_t e = 0; e < rows.size(); ++e) {
      CAPTURE(e);
      CHECK(rows[e].epoch == straight.epochs[e].epoch);
      CHECK(rows[e].steps == straight.epochs[e].steps);
      CHECK(rows[e].samples == straight.epochs[e].samples);
      CHECK(rows[e].skipped_steps == straight.epochs[e].skipped_steps);
      CHECK(rows[e].train_loss == straight.epochs[e].train_loss);
      CHECK(rows[e].train_accuracy == straight.epochs[e].train_accuracy);
      CHECK(rows[e].test_loss == straight.epochs[e].test_loss);
      CHECK(rows[e].test_accuracy == straight.epochs[e].test_accuracy);
      CHECK(rows[e].seconds > 0.0);
    }
  }
}

TEST_CASE("a corrupt newest checkpoint is reported and the previous one used") {
  const fs::path dir = work_dir("corrupt");
  auto cfg = base_config(dir);
  cfg.max_steps = 32;  // checkpoints epoch-1 and epoch-2
  // Damage the newest checkpoint's parameters.
  cfg.run_name = "corrupt";  // a name of its own: checkpoint_dir/corrupt
  run(cfg);
  const fs::path shard = dir / "ckpt" / "corrupt" / "epoch-2" / "rank-0.params.bin";
  REQUIRE(fs::exists(shard));
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  const blobs train{.n = 512};
  const blobs test{.n = 256, .salt = 1};
  cfg.max_steps = 0;
  std::string log_text;
  {
    const fs::path log = dir / "log.txt";
    std::FILE* out = std::fopen(log.c_str(), "w");
    st::trainer t(small_model(), cfg, {.print_progress = true, .progress_out = out, .terminal = 0});
    const auto summary = t.fit(train, sd::identity{}, test, sd::identity{});
    std::fclose(out);
    CHECK(summary.resumed_from == "epoch-1");
    CHECK(summary.steps == 48);
    std::ifstream in(log);
    log_text.assign(std::istreambuf_iterator<char>(in), {});
  }
  CHECK(log_text.find("rank-0.params.bin") != std::string::npos);
  CHECK(log_text.find("resumed from") != std::string::npos);
}

// The message of the config_error `f` throws (fails the test if it throws none).
template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const strata::config_error& e) {
    return e.what();
  }
  FAIL("no config_error");
  return {};
}

TEST_CASE("runs with other settings never share checkpoints; raising epochs continues") {
  const fs::path dir = work_dir("runs");
  auto cfg = base_config(dir);
  cfg.max_steps = 16;
  const run_record first = run(cfg);
  const fs::path first_dir = first.summary.run_directory;
  REQUIRE(fs::exists(first_dir / "epoch-1" / "manifest.json"));

  // Another learning rate is another run: it starts afresh in a directory of its own, and the
  // first run's checkpoints stay as they were.
  cfg.max_steps = 0;
  cfg.lr = 0.1;
  const run_record other = run(cfg);
  CHECK(other.summary.resumed_from.empty());
  CHECK(other.summary.run_directory != first.summary.run_directory);
  CHECK(other.summary.epochs_done == 3);
  CHECK(fs::exists(first_dir / "epoch-1" / "manifest.json"));

  // The first run's settings again, with more epochs: it continues (max_steps, epochs and where
  // files go may change), the schedule recomputed for 4 epochs.
  cfg.lr = 0.05;
  cfg.epochs = 4;
  cfg.resume = strata::config::resume_mode::required;
  const run_record longer = run(cfg);
  CHECK(longer.summary.resumed_from == "epoch-1");
  CHECK(longer.summary.run_directory == first.summary.run_directory);
  CHECK(longer.summary.epochs_done == 4);
  CHECK(longer.summary.steps == 4 * 16);

  // The same again: a finished run has nothing left to train and reports its evaluation; so
  // does a run asked for fewer epochs than it has done.
  const run_record again = run(cfg);
  CHECK(again.summary.resumed_from == "epoch-4");
  CHECK(again.summary.steps_this_run == 0);
  CHECK(again.summary.test_accuracy == longer.summary.test_accuracy);
  cfg.epochs = 2;
  const run_record fewer = run(cfg);
  CHECK(fewer.summary.resumed_from == "epoch-4");
  CHECK(fewer.summary.steps_this_run == 0);
  CHECK(fewer.summary.epochs_done == 4);
  CHECK(fewer.summary.test_accuracy == longer.summary.test_accuracy);
}

TEST_CASE("resume = true without a checkpoint of this run names the directory and what differs") {
  const fs::path dir = work_dir("required");
  auto cfg = base_config(dir);
  cfg.max_steps = 16;
  run(cfg);
  // Another model shape: a run of its own, and none of it to continue.
  cfg.resume = strata::config::resume_mode::required;
  const std::string message = config_error_of([&] {
    const auto wider = sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 8},
                                      sm::linear{.in = 8, .out = 16}, sm::relu{},
                                      sm::dropout{.rate = 0.1}, sm::linear{.in = 16, .out = 4});
    st::trainer t(wider, cfg, {.print_progress = false});
    t.fit(blobs{.n = 512}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});
  });
  CAPTURE(message);
  CHECK(message.find("resume") != std::string::npos);
  CHECK(message.find((dir / "ckpt").string()) != std::string::npos);
  CHECK(message.find("holds no checkpoint of this run") != std::string::npos);
  CHECK(message.find("model: 0.weight is 32x8 ") != std::string::npos);
  CHECK(message.find(" in the checkpoint, 16x8 ") != std::string::npos);

  // A named run continued with other settings is refused with the keys that differ.
  cfg = base_config(dir);
  cfg.run_name = "named";
  cfg.max_steps = 16;
  run(cfg);
  cfg.max_steps = 0;
  cfg.seed = 7;
  const std::string named = config_error_of([&] { run(cfg); });
  CAPTURE(named);
  CHECK(named.find("run_name") != std::string::npos);
  CHECK(named.find("seed: 42 in the checkpoint, 7 in this run") != std::string::npos);
  cfg.run_name = "../escape";
  CHECK(config_error_of([&] { run(cfg); }).find("run_name") != std::string::npos);
}

TEST_CASE("resume = false starts afresh and keeps the earlier checkpoints aside") {
  const fs::path dir = work_dir("afresh");
  auto cfg = base_config(dir);
  cfg.max_steps = 16;
  const run_record first = run(cfg);
  const fs::path run_dir = first.summary.run_directory;
  cfg.resume = strata::config::resume_mode::never;
  for (const char* aside : {".1", ".2"}) {
    const run_record fresh = run(cfg);
    CHECK(fresh.summary.resumed_from.empty());
    CHECK(fresh.losses == first.losses);
    fs::path kept = run_dir;
    kept += aside;
    CHECK(fs::exists(kept / "epoch-1" / "manifest.json"));
    CHECK(fs::exists(run_dir / "epoch-1" / "manifest.json"));
  }
}

TEST_CASE("configurations this trainer does not run are refused by key") {
  const fs::path dir = work_dir("refused");
  auto cfg = base_config(dir);
  cfg.world_size = 2;
  try {
    st::trainer t(small_model(), cfg, {.print_progress = false});
    FAIL("accepted world_size 2");
  } catch (const strata::config_error& e) {
    CHECK(std::string(e.what()).find("world_size") != std::string::npos);
  }
  cfg = base_config(dir);
  cfg.gradient_accumulation_steps = 2;
  CHECK_THROWS_AS(st::trainer(small_model(), cfg, {.print_progress = false}), strata::config_error);
  // A GEMM provider this build left out: Eigen's kernels, beside oneDNN or OpenBLAS (unit_train
  // is built with the defaults of model/gemm.hpp).
  namespace sm = strata::model;
  const bool other = sm::gemm_compiled(sm::gemm_provider::onednn) ||
                     sm::gemm_compiled(sm::gemm_provider::openblas);
  CHECK(sm::gemm_compiled(sm::gemm_provider::eigen) == !other);
  if (other) {
    cfg = base_config(dir);
    cfg.gemm = strata::config::gemm_kind::eigen;
    const std::string message =
        config_error_of([&] { st::trainer(small_model(), cfg, {.print_progress = false}); });
    CHECK(message.find("gemm") != std::string::npos);
    CHECK(message.find("STRATA_GEMM_EIGEN=1") != std::string::npos);
  }
  // A dataset whose samples do not fit the model.
  cfg = base_config(dir);
  st::trainer t(small_model(), cfg, {.print_progress = false});
  struct wide : blobs {
    strata::sample_shape shape() const { return {.channels = 1, .height = 1, .width = 9}; }
  };
  CHECK_THROWS_WITH_AS(t.fit(wide{}, sd::identity{}, blobs{}, sd::identity{}),
                       doctest::Contains("the model takes 1x1x8"), std::invalid_argument);
}

TEST_CASE("a launcher's processes: read from its variables, and a trainer that ignores them") {
  const auto env = [](std::vector<std::pair<std::string, std::string>> vars) {
    return [vars](const char* name) -> const char* {
      for (const auto& [key, value] : vars) {
        if (key == name) {
          return value.c_str();
        }
      }
      return nullptr;
    };
  };
  CHECK_FALSE(strata::detect_launch(env({})).has_value());
  const auto ompi =
      strata::detect_launch(env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}}));
  REQUIRE(ompi.has_value());
  CHECK(ompi->size == 4);
  CHECK(ompi->rank == 3);
  CHECK(ompi->variable == "OMPI_COMM_WORLD_SIZE");
  const auto pmi = strata::detect_launch(env({{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}}));
  REQUIRE(pmi.has_value());
  CHECK(pmi->launcher.find("PMI") != std::string::npos);
  CHECK(pmi->rank == 1);
  for (const char* bad : {"", "two", "2x", "-1"}) {
    CHECK_FALSE(strata::detect_launch(env({{"PMI_SIZE", bad}})).has_value());
  }

  // The trainer reads this process's environment: a made-up launch of 2 processes.
  REQUIRE(std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  const fs::path dir = work_dir("launch");
  auto cfg = base_config(dir);
  const std::string alone =
      config_error_of([&] { st::trainer t(small_model(), cfg, {.print_progress = false}); });
  CHECK(alone.find("world_size") != std::string::npos);
  CHECK(alone.find("rank 1 of 2") != std::string::npos);
  CHECK(alone.find("OMPI_COMM_WORLD_SIZE=2") != std::string::npos);
  // Nothing written: no run directory.
  CHECK_FALSE(fs::exists(fs::path(cfg.checkpoint_dir)));
  // Ranks as threads of each process.
  cfg.world_size = 2;
  cfg.batch_size_per_gpu = 32;
  std::vector<std::string> messages(2);
  strata::comm::threads::run(2, [&](strata::comm::threads& c) {
    messages[static_cast<std::size_t>(c.rank())] = config_error_of([&] {
      st::trainer<decltype(small_model()), strata::parallel::data<>> t(
          small_model(), cfg, strata::comm::any_comm(c), {.print_progress = false});
    });
  });
  for (const std::string& m : messages) {
    CHECK(m.find("communication_backend = \"threads\"") != std::string::npos);
  }
  // A process that means to train alone says so.
  cfg = base_config(dir);
  st::trainer t(small_model(), cfg, {.print_progress = false, .independent_processes = true});
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  // One process launched (mpiexec -n 1) is one rank.
  ::setenv("PMI_SIZE", "1", 1);
  st::trainer one(small_model(), cfg, {.print_progress = false});
  ::unsetenv("PMI_SIZE");
}

TEST_CASE("k micro-batches of B/k accumulate to the step of one batch of B") {
  const blobs train{.n = 512};
  const blobs test{.n = 256, .salt = 1};
  // 512 samples: 7 steps of 72 and a last step of 8, either way.
  auto whole_cfg = base_config(work_dir("accumulate-whole"));
  whole_cfg.batch_size_per_gpu = 72;
  whole_cfg.epochs = 2;
  st::trainer whole(small_model(), whole_cfg, {.print_progress = false});
  std::vector<st::step_metrics> whole_steps;
  whole.on_step([&](const st::step_metrics& m) { whole_steps.push_back(m); });
  const auto a = whole.fit(train, sd::identity{}, test, sd::identity{});

  auto split_cfg = base_config(work_dir("accumulate-split"));
  split_cfg.batch_size_per_gpu = 24;
  split_cfg.gradient_accumulation_steps = 3;
  split_cfg.epochs = 2;
  st::trainer<decltype(small_model()), strata::batch::accumulate> split(small_model(), split_cfg,
                                                                        {.print_progress = false});
  std::vector<st::step_metrics> split_steps;
  split.on_step([&](const st::step_metrics& m) { split_steps.push_back(m); });
  const auto b = split.fit(train, sd::identity{}, test, sd::identity{});

  REQUIRE(whole_steps.size() == 16);
  REQUIRE(split_steps.size() == 16);
  for (std::size_t i = 0; i < whole_steps.size(); ++i) {
    CAPTURE(i);
    CHECK(split_steps[i].samples == whole_steps[i].samples);
    CHECK(split_steps[i].lr == whole_steps[i].lr);
    CHECK(split_steps[i].loss == doctest::Approx(whole_steps[i].loss).epsilon(1e-5));
  }
  CHECK(whole_steps[7].samples == 8);
  const auto pa = whole.params().values();
  const auto pb = split.params().values();
  REQUIRE(pa.size() == pb.size());
  double largest = 0.0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::abs(pa[i] - pb[i])));
  }
  CHECK(largest < 1e-4);
  CHECK(b.test_accuracy == doctest::Approx(a.test_accuracy).epsilon(0.01));

  // batch::fixed refuses an accumulation count instead of ignoring it.
  CHECK_THROWS_WITH_AS(st::trainer(small_model(), split_cfg, {.print_progress = false}),
                       doctest::Contains("strata::batch::accumulate"), strata::config_error);
}

TEST_CASE("run identities: continuable keys exist, defaults stay out, set_aside numbers") {
  // Every continuable key is a configuration key (a typo would make it part of the fingerprint).
  for (const std::string_view key : st::continuable_keys) {
    CAPTURE(key);
    CHECK(std::find(strata::config::key_names.begin(), strata::config::key_names.end(), key) !=
          strata::config::key_names.end());
  }
  const auto model = small_model();
  const sm::param_store params = model.make_params();
  strata::config::train_config cfg;
  const st::run_identity a = st::make_run_identity(cfg, params, "in -> out", "policies");
  cfg.epochs = 99;  // continuable
  CHECK(st::make_run_identity(cfg, params, "in -> out", "policies").fingerprint == a.fingerprint);
  cfg.lr = 0.5;
  const st::run_identity b = st::make_run_identity(cfg, params, "in -> out", "policies");
  CHECK(b.fingerprint != a.fingerprint);
  CHECK(st::make_run_identity(cfg, params, "in -> out", "other").fingerprint != b.fingerprint);
  // A record without a key (an earlier version's) has it at its default there.
  nlohmann::json saved = a.to_json();
  saved["settings"].erase("lr");
  saved["settings"].erase("seed");
  const std::vector<std::string> d = st::run_differences(saved, b);
  REQUIRE(d.size() == 1);
  CHECK(d[0] == "lr: 0.05 in the checkpoint, 0.5 in this run");
  CHECK(st::run_differences(nlohmann::json{{"settings", 1}, {"model", 2}}, a).size() == 1);
  // set_aside: the first free .N, nothing for an empty directory.
  const fs::path dir = work_dir("aside") / "run";
  fs::create_directories(dir / "epoch-1");
  fs::create_directories(fs::path(dir.string() + ".1"));
  CHECK(st::set_aside(dir) == fs::path(dir.string() + ".2"));
  fs::create_directories(dir);
  CHECK_FALSE(st::set_aside(dir).has_value());
}

namespace {

// A user's loss (model/loss.hpp) for outputs of any shape: rows of 4 class scores (the blobs'
// classes), averaged over the rows and compared with the one-hot label by half the squared
// error; the prediction is the average's argmax.
struct one_hot_squared_error {
  using policy_category = strata::loss_tag;
  static constexpr std::string_view name = "one_hot_squared_error";
  static constexpr std::size_t classes = 4;
  void check_output(const strata::sample_shape& out) const {
    if (out.width != classes) {
      throw std::invalid_argument("one_hot_squared_error: needs rows of 4 class scores, got " +
                                  strata::to_string(out));
    }
  }
  sm::loss_result evaluate(const sm::loss_args& a) const {
    sm::loss_result r{.samples = a.batch};
    const std::size_t rows = a.classes / classes;
    for (std::size_t s = 0; s < a.batch; ++s) {
      const float* y = a.logits.data() + s * a.classes;
      std::size_t best = 0;
      std::vector<double> mean(classes, 0.0);
      for (std::size_t i = 0; i < a.classes; ++i) {
        mean[i % classes] += y[i] / static_cast<double>(rows);
      }
      for (std::size_t k = 0; k < classes; ++k) {
        const double error = mean[k] - (static_cast<std::int32_t>(k) == a.labels[s] ? 1.0 : 0.0);
        r.loss_sum += 0.5 * error * error;
        best = mean[k] > mean[best] ? k : best;
        for (std::size_t row = 0; !a.grad_logits.empty() && row < rows; ++row) {
          a.grad_logits[s * a.classes + row * classes + k] =
              static_cast<float>(error / static_cast<double>(rows) * a.grad_scale);
        }
      }
      r.correct += static_cast<std::int32_t>(best) == a.labels[s] ? 1 : 0;
    }
    return r;
  }
};
static_assert(sm::check_loss<one_hot_squared_error>());
struct loss_without_check {
  using policy_category = strata::loss_tag;
  static constexpr std::string_view name = "loss_without_check";
  sm::loss_result evaluate(const sm::loss_args&) const { return {}; }
};
static_assert(!sm::loss_checks_output<loss_without_check> && !sm::loss<loss_without_check>);

// The blobs' MLP ending in a 1x1 convolution with 2 output channels: a 2x1x4 output, two rows of
// class scores.
auto two_row_model() {
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 8},
                        sm::linear{.in = 8, .out = 32}, sm::relu{}, sm::linear{.in = 32, .out = 4},
                        sm::conv2d{.in_channels = 1, .out_channels = 2, .kernel = 1, .padding = 0});
}

}  // namespace

TEST_CASE("the loss is a policy: a user's loss trains a model whose output is not a vector") {
  const fs::path dir = work_dir("user_loss");
  auto cfg = base_config(dir);
  cfg.epochs = 4;
  cfg.optimizer = strata::config::optimizer_kind::adamw;  // the outputs start far off: large
  cfg.lr = 0.01;                                          // squared-error gradients
  // The default loss refuses the shape, naming it.
  CHECK_THROWS_WITH_AS(st::trainer(two_row_model(), cfg, {.print_progress = false}),
                       doctest::Contains("softmax_cross_entropy: the model's output 2x1x4"),
                       std::invalid_argument);
  st::trainer<decltype(two_row_model()), one_hot_squared_error> t(two_row_model(), cfg,
                                                                  {.print_progress = false});
  std::vector<double> losses;
  t.on_step([&](const st::step_metrics& m) { losses.push_back(m.loss); });
  const st::fit_summary s =
      t.fit(blobs{.n = 512}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});
  REQUIRE(losses.size() == 64);
  CHECK(losses.back() < 0.5 * losses.front());
  CHECK(s.test_accuracy > 0.9);
  // The loss is part of the run's identity: its checkpoints are not the default loss's.
  using user_loss_trainer = st::trainer<decltype(small_model()), one_hot_squared_error>;
  CHECK(user_loss_trainer(small_model(), cfg, {.print_progress = false}).run().name !=
        st::trainer(small_model(), cfg, {.print_progress = false}).run().name);
}
