// SPDX-License-Identifier: Apache-2.0
// Does the adaptive micro-batch fill a memory budget without overflowing it, and what does each
// precision policy hold per parameter?
//
//   build/bench/bench_memory [--room-mib 8] [--start 8] [--global 512] [--steps 20]
//                            [--data-dir DIR] [--json FILE]
//
// 1. Adaptive trace. The Fashion-MNIST MLP of example 01 (784-1024-1024-10) trains under
//    batch::adaptive with a global batch of `global` samples per step, starting from micro-batch
//    `start`, with a budget of what the process holds before training plus `room` MiB. Per step:
//    the micro-batch, the step's peak of host memory accounted by strata, and peak / budget.
//    Goal: within 10 steps the peak settles in [90%, 100%] of the budget, and no step exceeds
//    it. The baseline is the budget itself (set in this run from what is in use).
// 2. Bytes per parameter. For fp32, bf16 and fp16 with SGD (momentum) and AdamW: what the trainer
//    allocates for parameters, gradients, master weights and optimizer state, divided by the
//    parameter count, against estimate_memory's formula (host layout), and the device layout a
//    CUDA rank would hold. Formulas: docs/benchmarks.md and
//    include/strata/train/estimate_memory.hpp.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"

#include "strata/batch/adaptive.hpp"
#include "strata/core/host.hpp"
#include "strata/data.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/trainer.hpp"

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;
namespace sp = strata::precision;
namespace st = strata::train;

namespace {

struct options {
  std::size_t room_mib = 8;
  std::size_t start = 8;
  std::size_t global = 512;
  std::size_t steps = 20;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, "bench_memory"); };
    if (a == "--room-mib") {
      o.room_mib = std::stoul(value());
    } else if (a == "--start") {
      o.start = std::stoul(value());
    } else if (a == "--global") {
      o.global = std::stoul(value());
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_memory [--room-mib N] [--start N] [--global N] [--steps N] "
                   "[--data-dir DIR] [--json FILE]\n");
      std::exit(2);
    }
  }
  if (o.start == 0 || o.global == 0 || o.global % o.start != 0) {
    std::fprintf(stderr, "bench_memory: --global must be a positive multiple of --start\n");
    std::exit(2);
  }
  return o;
}

auto make_mlp() {
  return sm::sequential({.channels = 1, .height = 28, .width = 28}, sm::flatten{},
                        sm::linear{.in = 784, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 1024, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 1024, .out = 10});
}

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

sc::train_config base_config(const std::string& data_dir) {
  sc::train_config cfg;
  cfg.data_dir = data_dir;
  cfg.loader_workers = 1;
  cfg.resume = strata::config::resume_mode::never;
  cfg.checkpoint_interval = 0;
  cfg.checkpoint_dir = (std::filesystem::temp_directory_path() / "strata_bench_memory").string();
  cfg.epochs = 1;
  cfg.lr = 0.05;
  cfg.momentum = 0.9;
  cfg.warmup_epochs = 0.0;
  return cfg;
}

nlohmann::json adaptive_trace(const options& o, const sd::idx_dataset& train,
                              const sd::idx_dataset& test) {
  sc::train_config cfg = base_config(o.data_dir);
  cfg.adaptive_batch = true;
  cfg.adaptive_batch_min = 1;
  cfg.adaptive_batch_max = static_cast<std::int64_t>(o.global);
  cfg.batch_size_per_gpu = static_cast<std::int64_t>(o.start);
  cfg.gradient_accumulation_steps = static_cast<std::int64_t>(o.global / o.start);
  cfg.max_train_samples = static_cast<std::int64_t>(o.global * o.steps);
  cfg.max_eval_samples = 500;
  // What is held now, what the trainer will hold before its first step (model state from
  // estimate_memory, the loader's prefetch_depth + 1 batches), plus the room for activations.
  const std::size_t held = strata::host{}.memory().stats().in_use;
  const std::size_t model_state =
      st::estimate_memory(make_mlp(), 1, {.optimizer_state_per_parameter = 1}).model_state();
  const std::size_t loader = static_cast<std::size_t>(cfg.prefetch_depth + 1) * o.global *
                             (784 * sizeof(float) + sizeof(std::int32_t) + sizeof(std::size_t));
  const std::size_t before = held + model_state + loader;
  cfg.memory_budget_mb =
      static_cast<std::int64_t>((before + (o.room_mib << 20) + (1u << 20) - 1) >> 20);
  const std::size_t budget = static_cast<std::size_t>(cfg.memory_budget_mb) << 20;
  std::printf(
      "# adaptive trace: MLP 784-1024-1024-10, global batch %zu, start %zu, budget %.1f "
      "MiB (%.1f MiB expected before the first step + %zu MiB room)\n",
      o.global, o.start, mib(budget), mib(before), o.room_mib);
  std::printf("%5s %8s %10s %8s\n", "step", "micro", "peak(MiB)", "of_budget");
  st::trainer<decltype(make_mlp()), strata::batch::adaptive> run(make_mlp(), cfg,
                                                                 {.print_progress = false});
  std::vector<st::step_metrics> steps;
  run.on_step([&](const st::step_metrics& m) { steps.push_back(m); });
  run.fit(train, sd::fashion_mnist_normalize(), test, sd::fashion_mnist_normalize());
  std::filesystem::remove_all(run.run().directory);  // a measurement keeps no checkpoints
  nlohmann::json rows = nlohmann::json::array();
  double worst = 0.0;
  std::size_t settled = steps.size();  // first step from which every peak is in [90%, 100%]
  for (std::size_t i = steps.size(); i-- > 0;) {
    const double share = static_cast<double>(steps[i].peak_bytes) / static_cast<double>(budget);
    if (share >= 0.9 && share <= 1.0) {
      settled = i;
    } else {
      break;
    }
  }
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const double share = static_cast<double>(steps[i].peak_bytes) / static_cast<double>(budget);
    worst = std::max(worst, share);
    std::printf("%5zu %8zu %10.2f %7.1f%%\n", i, steps[i].micro_batch, mib(steps[i].peak_bytes),
                100.0 * share);
    rows.push_back({{"step", i},
                    {"micro_batch", steps[i].micro_batch},
                    {"peak_bytes", steps[i].peak_bytes},
                    {"share", share}});
  }
  const bool settle_ok = settled <= 10 && settled < steps.size();
  std::printf("# settled in [90%%, 100%%] of the budget from step %zu (goal <= 10): %s\n", settled,
              settle_ok ? "met" : "NOT met");
  std::printf("# largest peak %.1f%% of the budget (goal <= 100%%): %s\n", 100.0 * worst,
              worst <= 1.0 ? "met" : "NOT met");
  return {{"budget_bytes", budget},
          {"held_before", held},
          {"settled_step", settled},
          {"worst_share", worst},
          {"rows", rows}};
}

// Bytes the host tracker holds for what `make` returns.
template <class F>
std::size_t held_by(F&& make) {
  const std::size_t before = strata::host{}.memory().stats().in_use;
  auto object = make();
  return strata::host{}.memory().stats().in_use - before;
}

template <class Precision>
nlohmann::json per_parameter_row(const char* label, sc::precision_dtype type,
                                 sc::optimizer_kind optimizer) {
  sc::train_config cfg = base_config("");
  cfg.mixed_precision_dtype = type;
  cfg.optimizer = optimizer;
  const auto model = make_mlp();
  const std::size_t held = held_by([&] {
    return st::trainer<decltype(make_mlp()), Precision>(make_mlp(), cfg, {.print_progress = false});
  });
  const std::size_t state = optimizer == sc::optimizer_kind::sgd ? 1 : 2;
  const auto host =
      st::estimate_memory<Precision>(model, 256, {.optimizer_state_per_parameter = state});
  const auto device = st::estimate_memory<Precision>(
      model, 256, {.optimizer_state_per_parameter = state, .layout = st::memory_layout::device});
  const double p = static_cast<double>(host.parameter_count);
  const char* opt = optimizer == sc::optimizer_kind::sgd ? "sgd+momentum" : "adamw";
  const double measured = static_cast<double>(held) / p;
  std::printf("%-8s %-13s %12.2f %12.2f %12.2f %8s %14.2f %14.2f\n", label, opt, measured,
              host.bytes_per_parameter(), device.bytes_per_parameter(),
              held == host.model_state() ? "yes" : "NO", mib(host.activations),
              mib(device.activations));
  return {{"precision", label},
          {"optimizer", opt},
          {"measured_bytes_per_parameter", measured},
          {"host_formula", host.bytes_per_parameter()},
          {"device_formula", device.bytes_per_parameter()},
          {"exact", held == host.model_state()},
          {"host_activation_bytes_256", host.activations},
          {"device_activation_bytes_256", device.activations}};
}

nlohmann::json per_parameter_table() {
  std::printf(
      "\n# bytes per parameter (MLP, %zu parameters with padding); activations for a "
      "micro-batch of 256\n",
      st::estimate_memory(make_mlp(), 1).parameter_count);
  std::printf("%-8s %-13s %12s %12s %12s %8s %14s %14s\n", "policy", "optimizer", "measured",
              "host_formula", "device", "equal", "host_act(MiB)", "dev_act(MiB)");
  using dt = sc::precision_dtype;
  using ok = sc::optimizer_kind;
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back(per_parameter_row<sp::fp32>("fp32", dt::float32, ok::sgd));
  rows.push_back(per_parameter_row<sp::fp32>("fp32", dt::float32, ok::adamw));
  rows.push_back(per_parameter_row<sp::bf16>("bf16", dt::bfloat16, ok::sgd));
  rows.push_back(per_parameter_row<sp::bf16>("bf16", dt::bfloat16, ok::adamw));
  rows.push_back(per_parameter_row<sp::fp16>("fp16", dt::float16, ok::sgd));
  rows.push_back(per_parameter_row<sp::fp16>("fp16", dt::float16, ok::adamw));
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    const sd::idx_dataset train =
        sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
    const sd::idx_dataset test = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::test);
    nlohmann::json out;
    out["adaptive"] = adaptive_trace(o, train, test);
    out["per_parameter"] = per_parameter_table();
    if (!o.json_path.empty()) {
      std::ofstream(o.json_path) << out.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory: %s\n", e.what());
    return 1;
  }
  return 0;
}
