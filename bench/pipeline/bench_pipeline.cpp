// SPDX-License-Identifier: Apache-2.0
// How close do strata's pipeline schedules come to their textbook bubble, and what does a
// pipeline give real training on this machine?
//
// 1. Schedules over stages of controlled work: parallel::pipeline's executor replays each
//    schedule over thread ranks whose passes sleep (forward 1 unit, backward 2: input and weight
//    passes 1 each; interleaved chunks 1/v of that), so that the machine's 2 cores do not decide
//    the result, for p = 2, 4, 8 stages and m = p, 2p, 4p, 8p micro-batches. Per row: the
//    bubble measured (1 - time in passes / (p x makespan)), the textbook bubble and the one the
//    schedule's own lists give in the simulator, and the most micro-batches a stage held.
// 2. Real compute: the Fashion-MNIST MLP of example 01 (784-1024-1024-10) trained by the trainer
//    on 1 rank, and on 2 stages (2 thread ranks, 1 BLAS thread each) with 1F1B and ZB-H1 at 4
//    micro-batches per batch of 256: samples per second, the ratio to 1 rank, and the bubble
//    measured on each stage. Then an unbalanced MLP (784-2048-2048-256-10) on 2 stages split by
//    the partitioner against an even split of its layers.
//
//   build/bench/bench_pipeline [--stages 2,4,8] [--unit-ms 2] [--repeats 3] [--data-dir DIR]
//                              [--steps 30] [--warmup 5] [--no-compute] [--json FILE]
//
// The sleep rows take the median bubble of --repeats runs. Formulas: docs/benchmarks.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"
#include "../common/machine.hpp"
#include "strata/comm/threads.hpp"
#include "strata/data/idx.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/pipeline.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/train/trainer.hpp"

namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;
namespace sc = strata::config;
namespace par = strata::parallel;
namespace pl = strata::pipeline;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::vector<int> stages{2, 4, 8};
  double unit_ms = 2.0;
  std::size_t repeats = 3;
  std::string data_dir = sc::train_config{}.data_dir;
  std::size_t steps = 30;
  std::size_t warmup = 5;
  bool compute = true;
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return bench::next_value(argc, argv, i, "bench_pipeline"); };
    if (a == "--stages") {
      o.stages = bench::comma_list<int>(value());
    } else if (a == "--unit-ms") {
      o.unit_ms = std::stod(value());
    } else if (a == "--repeats") {
      o.repeats = std::stoul(value());
    } else if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoul(value());
    } else if (a == "--no-compute") {
      o.compute = false;
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_pipeline [--stages 2,4,8] [--unit-ms 2] [--repeats 3] "
                   "[--data-dir DIR] [--steps 30] [--warmup 5] [--no-compute] [--json FILE]\n");
      std::exit(2);
    }
  }
  if (o.repeats < 1 || o.unit_ms <= 0.0 || o.steps < 1) {
    std::fprintf(stderr, "bench_pipeline: --repeats and --steps >= 1, --unit-ms > 0\n");
    std::exit(2);
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Passes that sleep: forward `unit`, a whole backward 2 units, its input and weight passes 1 each
// (all divided by the chunks). Activations of 1 float per sample cross the stages.
struct sleeping_passes final : par::stage_passes {
  std::chrono::duration<double> unit{};
  std::vector<float> data = std::vector<float>(64, 0.0f);
  std::size_t input_elements(int) const override { return 1; }
  std::size_t first_group(int) const override { return 0; }
  std::size_t output_elements(int) const override { return 1; }
  void sleep(double units) const {
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(unit * units));
  }
  std::span<const float> forward(int, std::size_t, std::span<const float>,
                                 const par::micro_batch& b, bool) override {
    sleep(1.0);
    return std::span<const float>(data).first(b.size);
  }
  sm::loss_result loss(std::span<const float>, const par::micro_batch& b,
                       std::span<float> grad) override {
    std::fill(grad.begin(), grad.end(), 0.0f);
    return {.loss_sum = 0.0, .correct = 0, .samples = b.size};
  }
  std::span<const float> backward(int, std::size_t, std::span<const float>, bool split,
                                  par::bucket_reducer*) override {
    sleep(split ? 1.0 : 2.0);
    return std::span<const float>(data).first(1);
  }
  void backward_weight(int, std::size_t, par::bucket_reducer*) override { sleep(1.0); }
};

struct schedule_row {
  std::string schedule;
  int stages = 0;
  int micro_batches = 0;
  double bubble_measured = 0.0;
  double bubble_theory = 0.0;
  double bubble_simulated = 0.0;
  std::size_t peak_in_flight = 0;  // the most any stage held (micro-batches x chunks)
  std::size_t peak_theory = 0;     // m for gpipe, p for 1f1b and zb-h1, the simulator's else
  double makespan_ms = 0.0;
};

// One step of `m` micro-batches through schedule S on p thread ranks whose passes sleep.
template <class S>
schedule_row run_sleeping(int p, int m, const options& o, std::string_view label) {
  sc::train_config cfg;
  cfg.world_size = p;
  cfg.pipeline_parallel_size = p;
  cfg.micro_batches = m;
  cfg.batch_size_per_gpu = m;
  const double v = S::chunks;
  std::vector<double> bubbles;
  std::vector<double> makespans;
  std::size_t peak = 0;
  for (std::size_t rep = 0; rep < o.repeats; ++rep) {
    std::vector<double> busy(static_cast<std::size_t>(p));
    std::vector<clock_type::time_point> begin(static_cast<std::size_t>(p));
    std::vector<clock_type::time_point> end(static_cast<std::size_t>(p));
    std::mutex lock;
    strata::comm::threads::run(p, [&](strata::comm::threads& comm) {
      sm::param_store store({"0"}, {{sm::param_spec{.name = "w", .rows = 1, .cols = 1}}});
      auto opt = strata::optim::make_optimizer({});
      strata::precision::fp32 precision(cfg);
      strata::comm::any_comm any(comm);
      par::pipeline_executor<par::pipeline<S>> e({.comm = &any,
                                                  .master = store,
                                                  .compute = store,
                                                  .optimizer = opt,
                                                  .cfg = cfg,
                                                  .precision = par::precision_ops_of(precision)});
      sleeping_passes passes;
      passes.unit = std::chrono::duration<double>(o.unit_ms / 1000.0 / v);
      std::vector<float> inputs(static_cast<std::size_t>(m), 0.0f);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(m), 0);
      std::vector<std::uint64_t> ids(static_cast<std::size_t>(m), 0);
      const std::vector<par::micro_batch> batch = {{.inputs = inputs,
                                                    .labels = labels,
                                                    .indices = ids,
                                                    .size = static_cast<std::size_t>(m)}};
      any.barrier();
      const auto t0 = clock_type::now();
      (void)e.run_step(batch, passes);
      const auto t1 = clock_type::now();
      const std::lock_guard guard(lock);
      const auto r = static_cast<std::size_t>(comm.rank());
      begin[r] = t0;
      end[r] = t1;
      busy[r] = e.timing().busy;
      peak = std::max(peak, e.timing().peak_in_flight);
    });
    const auto first = *std::min_element(begin.begin(), begin.end());
    const auto last = *std::max_element(end.begin(), end.end());
    const double makespan = std::chrono::duration<double>(last - first).count();
    double work = 0.0;
    for (double b : busy) {
      work += b;
    }
    bubbles.push_back(1.0 - work / (p * makespan));
    makespans.push_back(makespan);
  }
  schedule_row row{.schedule = std::string(label), .stages = p, .micro_batches = m};
  row.bubble_measured = median(bubbles);
  row.makespan_ms = 1000.0 * median(makespans);
  const double pp = p;
  const double mm = m;
  const auto lists = S{}.lists(pl::shape_for<S>(p, m));
  const auto sim = pl::simulate(
      lists, {.forward = 1.0 / v, .backward_input = 1.0 / v, .backward_weight = 1.0 / v});
  row.bubble_simulated = sim.bubble();
  if constexpr (S::splits_backward) {
    row.bubble_theory = (pp - 1) / (3 * mm + pp - 1);
  } else {
    row.bubble_theory = (pp - 1) / (v * mm + pp - 1);
  }
  row.peak_in_flight = peak;
  row.peak_theory = static_cast<std::size_t>(
      *std::max_element(sim.peak_in_flight.begin(), sim.peak_in_flight.end()));
  return row;
}

// The real-compute rows.
struct compute_row {
  std::string config;
  std::string split;
  double samples_per_s = 0.0;
  double ratio = 0.0;  // to 1 rank
  std::vector<double> bubble_per_stage{};
};

auto make_mlp() {
  return sm::sequential({.channels = 1, .height = 28, .width = 28}, sm::flatten{},
                        sm::linear{.in = 784, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 1024, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 1024, .out = 10});
}
auto make_unbalanced() {
  return sm::sequential(
      {.channels = 1, .height = 28, .width = 28}, sm::flatten{}, sm::linear{.in = 784, .out = 2048},
      sm::relu{}, sm::linear{.in = 2048, .out = 2048}, sm::relu{},
      sm::linear{.in = 2048, .out = 256}, sm::relu{}, sm::linear{.in = 256, .out = 10});
}

sc::train_config compute_config(const options& o, int ranks) {
  sc::train_config cfg;
  cfg.data_dir = o.data_dir;
  cfg.world_size = ranks;
  cfg.blas_threads = 1;
  cfg.batch_size_per_gpu = 256;
  cfg.epochs = 1;
  cfg.max_train_samples = static_cast<std::int64_t>(256 * (o.steps + o.warmup));
  cfg.max_eval_samples = 100;
  cfg.loader_workers = 1;
  cfg.checkpoint_interval = 0;
  cfg.checkpoint_dir = (std::filesystem::temp_directory_path() / "strata_bench_pipeline").string();
  cfg.resume = sc::resume_mode::never;
  cfg.lr = 0.05;
  cfg.momentum = 0.9;
  cfg.warmup_epochs = 0.0;
  cfg.log_every = 1000000;
  return cfg;
}

template <class Trainer>
double timed_fit(Trainer& t, const options& o, const sd::idx_dataset& train,
                 const sd::idx_dataset& test) {
  clock_type::time_point begin{};
  clock_type::time_point end{};
  std::size_t samples = 0;
  t.on_step([&](const st::step_metrics& m) {
    if (m.step + 1 == o.warmup) {
      begin = clock_type::now();
      if constexpr (requires { t.executor().reset_timing(); }) {
        t.executor().reset_timing();
      }
    } else if (m.step >= o.warmup) {
      samples += m.samples;
      end = clock_type::now();
    }
  });
  t.fit(train, sd::fashion_mnist_normalize(), test, sd::fashion_mnist_normalize());
  std::error_code ignored;
  std::filesystem::remove_all(t.run().directory, ignored);
  return static_cast<double>(samples) / std::chrono::duration<double>(end - begin).count();
}

template <class Model>
compute_row one_rank(Model model, const options& o, const sd::idx_dataset& train,
                     const sd::idx_dataset& test, const std::string& name) {
  st::trainer<Model> t(std::move(model), compute_config(o, 1), {.print_progress = false});
  return {.config = name, .split = "-", .samples_per_s = timed_fit(t, o, train, test)};
}

template <class Schedule, class Model>
compute_row two_stages(Model model, const options& o, const sd::idx_dataset& train,
                       const sd::idx_dataset& test, const std::string& name,
                       const std::string& split, sc::pipeline_schedule_kind kind) {
  sc::train_config cfg = compute_config(o, 2);
  cfg.pipeline_parallel_size = 2;
  cfg.micro_batches = 4;
  cfg.pipeline_schedule = kind;
  if (!split.empty()) {
    cfg.policy["pipeline_split"] = split;
  }
  compute_row row{.config = name, .split = split.empty() ? "balanced" : split};
  std::mutex lock;
  row.bubble_per_stage.resize(2);
  strata::comm::threads::run(2, [&](strata::comm::threads& comm) {
    st::trainer<Model, par::pipeline<Schedule>> t(model, cfg, strata::comm::any_comm(comm),
                                                  {.print_progress = false});
    const double rate = timed_fit(t, o, train, test);
    const auto& timing = t.executor().timing();
    const std::lock_guard guard(lock);
    if (comm.rank() == 0) {
      row.samples_per_s = rate;
      std::string layers;
      for (const auto& g : t.params().groups()) {
        layers += (layers.empty() ? "" : ",") + g.name;
      }
      if (split.empty()) {
        row.split = "balanced (stage 0: layers with parameters " + layers + ")";
      }
    }
    row.bubble_per_stage[static_cast<std::size_t>(comm.rank())] =
        timing.wall > 0.0 ? 1.0 - timing.busy / timing.wall : 0.0;
  });
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  std::printf(
      "# pipeline schedules over sleeping stages (unit %.1f ms: F 1, B 1, W 1; whole "
      "backward 2), median of %zu runs\n",
      o.unit_ms, o.repeats);
  std::printf("# CPU: %s, %u hardware threads\n", bench::cpu_model().c_str(),
              std::thread::hardware_concurrency());
  std::printf("%-16s %6s %6s %10s %10s %10s %8s %10s %10s %12s\n", "schedule", "p", "m", "measured",
              "theory", "simulated", "diff", "peak", "peak_thy", "makespan_ms");
  std::vector<schedule_row> rows;
  int misses = 0;
  for (const int p : o.stages) {
    for (const int k : {1, 2, 4, 8}) {
      const int m = k * p;
      const schedule_row set[] = {run_sleeping<pl::gpipe>(p, m, o, "gpipe"),
                                  run_sleeping<pl::one_f_one_b>(p, m, o, "1f1b"),
                                  run_sleeping<pl::interleaved_1f1b<2>>(p, m, o, "interleaved_v2"),
                                  run_sleeping<pl::zero_bubble_h1>(p, m, o, "zero_bubble_h1")};
      for (const schedule_row& r : set) {
        const double diff = r.bubble_measured - r.bubble_theory;
        misses += std::abs(diff) > 0.03 ? 1 : 0;
        std::printf("%-16s %6d %6d %10.4f %10.4f %10.4f %+8.4f %10zu %10zu %12.1f\n",
                    r.schedule.c_str(), r.stages, r.micro_batches, r.bubble_measured,
                    r.bubble_theory, r.bubble_simulated, diff, r.peak_in_flight, r.peak_theory,
                    r.makespan_ms);
        rows.push_back(r);
      }
    }
  }
  std::printf("# rows more than 3 points from theory: %d of %zu\n", misses, rows.size());

  std::vector<compute_row> compute;
  if (o.compute) {
    const auto train = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
    const auto test = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::test);
    std::printf("\n# real compute: batch 256, %zu timed steps after %zu, 1 BLAS thread per rank\n",
                o.steps, o.warmup);
    const compute_row one = one_rank(make_mlp(), o, train, test, "mlp 1 rank");
    compute.push_back(one);
    compute.push_back(two_stages<pl::one_f_one_b>(make_mlp(), o, train, test, "mlp pp2 1f1b", "",
                                                  sc::pipeline_schedule_kind::one_f_one_b));
    compute.push_back(two_stages<pl::zero_bubble_h1>(make_mlp(), o, train, test, "mlp pp2 zb_h1",
                                                     "",
                                                     sc::pipeline_schedule_kind::zero_bubble_h1));
    const compute_row uone = one_rank(make_unbalanced(), o, train, test, "unbalanced 1 rank");
    compute.push_back(uone);
    compute.push_back(two_stages<pl::one_f_one_b>(make_unbalanced(), o, train, test,
                                                  "unbalanced pp2 1f1b", "",
                                                  sc::pipeline_schedule_kind::one_f_one_b));
    compute.push_back(two_stages<pl::one_f_one_b>(make_unbalanced(), o, train, test,
                                                  "unbalanced pp2 1f1b", "4,4",
                                                  sc::pipeline_schedule_kind::one_f_one_b));
    std::printf("%-22s %12s %8s %9s %9s  %s\n", "config", "samples/s", "ratio", "bubble0",
                "bubble1", "split");
    for (compute_row& r : compute) {
      const double base = r.config.starts_with("mlp") ? one.samples_per_s : uone.samples_per_s;
      r.ratio = r.samples_per_s / base;
      const double b0 = r.bubble_per_stage.empty() ? 0.0 : r.bubble_per_stage[0];
      const double b1 = r.bubble_per_stage.size() < 2 ? 0.0 : r.bubble_per_stage[1];
      std::printf("%-22s %12.0f %8.3f %9.3f %9.3f  %s\n", r.config.c_str(), r.samples_per_s,
                  r.ratio, b0, b1, r.split.c_str());
    }
  }

  if (!o.json_path.empty()) {
    nlohmann::json out_rows = nlohmann::json::array();
    for (const schedule_row& r : rows) {
      out_rows.push_back({{"schedule", r.schedule},
                          {"stages", r.stages},
                          {"micro_batches", r.micro_batches},
                          {"bubble_measured", r.bubble_measured},
                          {"bubble_theory", r.bubble_theory},
                          {"bubble_simulated", r.bubble_simulated},
                          {"peak_in_flight", r.peak_in_flight},
                          {"peak_theory", r.peak_theory},
                          {"makespan_ms", r.makespan_ms}});
    }
    nlohmann::json compute_rows = nlohmann::json::array();
    for (const compute_row& r : compute) {
      compute_rows.push_back({{"config", r.config},
                              {"split", r.split},
                              {"samples_per_s", r.samples_per_s},
                              {"ratio", r.ratio},
                              {"bubble_per_stage", r.bubble_per_stage}});
    }
    std::ofstream(o.json_path) << nlohmann::json{{"cpu", bench::cpu_model()},
                                                 {"unit_ms", o.unit_ms},
                                                 {"rows", out_rows},
                                                 {"compute", compute_rows}}
                                      .dump(2)
                               << "\n";
  }
  return 0;
}
