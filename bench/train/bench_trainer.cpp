// SPDX-License-Identifier: Apache-2.0
// How fast does the trainer train, and what does its machinery cost? The Fashion-MNIST MLP of
// example 01 (784-1024-1024-10, ReLU, dropout 0.1, SGD with Nesterov momentum) at batch 256:
//   - strata's trainer (trainer::fit) against a hand-written loop over the same loader, layers,
//     loss and optimizer (the policy and bookkeeping overhead);
//   - both against PyTorch on CPU at the same batch and thread count, measured in the same run
//     by bench/train/torch_mlp.py when `import torch` works.
//
//   build/bench/bench_trainer [--data-dir DIR] [--batch 256] [--steps 60] [--threads 1,2]
//                             [--repeats 3] [--no-torch] [--json FILE]
//
// Formulas: docs/benchmarks.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"

#include "strata/data/idx.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/optim/any_optimizer.hpp"
#include "strata/train/trainer.hpp"

namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string data_dir{sd::fashion_mnist_default_dir};
  std::string self;
  std::size_t batch = 256;
  std::size_t steps = 60;
  std::size_t warmup = 3;
  std::vector<int> threads{1, 2};
  std::size_t repeats = 3;
  bool torch = true;
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  o.self = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, "bench_trainer"); };
    if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--batch") {
      o.batch = std::stoul(value());
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--threads") {
      o.threads = bench::comma_list<int>(value());
    } else if (a == "--repeats") {
      o.repeats = std::max<std::size_t>(1, std::stoul(value()));
    } else if (a == "--no-torch") {
      o.torch = false;
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_trainer [--data-dir DIR] [--batch N] [--steps N] [--threads a,b] "
                   "[--repeats N] [--no-torch] [--json FILE]\n");
      std::exit(2);
    }
  }
  return o;
}

auto make_mlp() {
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 28, .width = 28},
                        sm::flatten{}, sm::linear{.in = 784, .out = 1024}, sm::relu{},
                        sm::dropout{.rate = 0.1}, sm::linear{.in = 1024, .out = 1024}, sm::relu{},
                        sm::dropout{.rate = 0.1}, sm::linear{.in = 1024, .out = 10});
}

auto augmentation() {
  return sd::compose{sd::horizontal_flip{.probability = 0.5}, sd::fashion_mnist_normalize()};
}

strata::config::train_config run_config(const options& o, const std::filesystem::path& dir) {
  strata::config::train_config cfg;
  cfg.blas_threads = strata::model::blas_threads();  // the row's thread count, set before
  cfg.epochs = 1;
  cfg.batch_size_per_gpu = static_cast<std::int64_t>(o.batch);
  cfg.loader_workers = 0;
  cfg.max_train_samples = static_cast<std::int64_t>((o.steps + o.warmup) * o.batch);
  cfg.max_eval_samples = static_cast<std::int64_t>(o.batch);
  cfg.checkpoint_dir = dir.string();
  cfg.checkpoint_interval = 0;
  cfg.resume = strata::config::resume_mode::never;
  cfg.lr_schedule = strata::config::lr_schedule_kind::constant;
  cfg.warmup_epochs = 0.0;
  return cfg;
}

// Samples/s over the steps after the warm-up, from the time each step ended.
double rate_of(const std::vector<clock_type::time_point>& ends, const options& o) {
  const double seconds =
      std::chrono::duration<double>(ends[o.warmup + o.steps - 1] - ends[o.warmup - 1]).count();
  return static_cast<double>(o.steps * o.batch) / seconds;
}

double run_trainer(const sd::idx_dataset& train, const options& o) {
  const auto dir = std::filesystem::temp_directory_path() / "strata_bench_trainer";
  std::filesystem::remove_all(dir);
  st::trainer t(make_mlp(), run_config(o, dir), {.print_progress = false});
  std::vector<clock_type::time_point> ends;
  t.on_step([&](const st::step_metrics&) { ends.push_back(clock_type::now()); });
  t.fit(train, augmentation(), train, sd::fashion_mnist_normalize());
  std::filesystem::remove_all(dir);
  return rate_of(ends, o);
}

// The same steps written by hand over the same pieces.
double run_loop(const sd::idx_dataset& train, const options& o) {
  const auto cfg = run_config(o, "unused");
  const sd::subset<sd::idx_dataset> view(train, static_cast<std::size_t>(cfg.max_train_samples));
  sd::prefetch_loader loader(view, augmentation(),
                             sd::distributed_sampler({.dataset_size = view.size(), .seed = 42}),
                             {.batch_size = o.batch, .workers = 0, .seed = 42});
  const auto model = make_mlp();
  auto params = model.make_params();
  params.initialize(42);
  auto work = model.make_workspace(o.batch);
  strata::optim::any_optimizer optimizer = strata::optim::make_optimizer(
      {.kind = strata::optim::optimizer_choice::kind_type::sgd,
       .sgd = {.momentum = 0.9, .nesterov = true, .weight_decay = 5e-4},
       .adamw = {}});
  std::vector<float> state(params.size() * optimizer.state_per_parameter());
  std::vector<float> grad(o.batch * 10);
  const sm::softmax_cross_entropy loss;
  std::vector<clock_type::time_point> ends;
  loader.start_epoch(0);
  std::uint32_t step = 0;
  while (auto b = loader.next()) {
    params.zero_grads();
    const auto logits = model.forward(work, params, b->inputs, b->size,
                                      {.training = true,
                                       .seed = 42,
                                       .step = step,
                                       .sample_ids = std::span<const std::uint64_t>(b->indices)});
    loss.evaluate({.batch = b->size,
                   .classes = 10,
                   .logits = logits,
                   .labels = b->labels,
                   .grad_logits = std::span<float>(grad.data(), b->size * 10),
                   .grad_scale = 1.0f / static_cast<float>(b->size)});
    model.backward(work, params, std::span<const float>(grad.data(), b->size * 10));
    optimizer.begin_step();
    const std::size_t per = optimizer.state_per_parameter();
    for (const auto& e : params.entries()) {
      const std::size_t n = e.spec.elements();
      optimizer.update({.params = params.values().subspan(e.offset, n),
                        .grads = std::as_const(params).grads().subspan(e.offset, n),
                        .state = std::span<float>(state).subspan(e.offset * per, n * per),
                        .lr = 0.05,
                        .weight_decay = e.spec.weight_decay});
    }
    ++step;
    ends.push_back(clock_type::now());
  }
  return rate_of(ends, o);
}

std::optional<nlohmann::json> run_torch(const options& o, int threads) {
  const std::filesystem::path script =
      std::filesystem::path(STRATA_SOURCE_DIR) / "bench" / "train" / "torch_mlp.py";
  // Debian's interpreter first: python3-torch installs into /usr/lib/python3.
  const std::string python =
      std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string command = python + " " + script.string() + " --threads " +
                              std::to_string(threads) + " --batch " + std::to_string(o.batch) +
                              " --steps " + std::to_string(o.steps) + " --repeats " +
                              std::to_string(o.repeats) + " 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) {
    return std::nullopt;
  }
  std::string out;
  char chunk[256];
  while (std::fgets(chunk, sizeof chunk, pipe.get()) != nullptr) {
    out += chunk;
  }
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const sd::idx_dataset train = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
  std::printf(
      "# MLP 784-1024-1024-10 training on Fashion-MNIST, batch %zu, %zu timed steps after "
      "%zu, median of %zu runs; BLAS: %s\n",
      o.batch, o.steps, o.warmup, o.repeats, std::string(sm::blas_backend()).c_str());
  std::printf("%8s %14s %14s %9s %14s %9s\n", "threads", "trainer(s/s)", "hand loop", "overhead",
              "pytorch(s/s)", "ratio");
  nlohmann::json rows = nlohmann::json::array();
  for (int t : o.threads) {
    strata::model::set_blas_threads(t);
    // Alternate the two so that drift on a shared machine hits both alike.
    std::vector<double> trainer_rates;
    std::vector<double> loop_rates;
    for (std::size_t r = 0; r < o.repeats; ++r) {
      loop_rates.push_back(run_loop(train, o));
      trainer_rates.push_back(run_trainer(train, o));
    }
    std::sort(trainer_rates.begin(), trainer_rates.end());
    std::sort(loop_rates.begin(), loop_rates.end());
    const double trainer_rate = trainer_rates[trainer_rates.size() / 2];
    const double loop_rate = loop_rates[loop_rates.size() / 2];
    const double overhead = loop_rate / trainer_rate - 1.0;
    const auto torch = o.torch ? run_torch(o, t) : std::nullopt;
    nlohmann::json row{{"threads", t},
                       {"trainer_samples_per_s", trainer_rate},
                       {"loop_samples_per_s", loop_rate},
                       {"overhead", overhead}};
    if (torch) {
      const double torch_rate = torch->at("samples_per_s").get<double>();
      row["pytorch_samples_per_s"] = torch_rate;
      row["pytorch_version"] = torch->at("torch");
      row["ratio"] = trainer_rate / torch_rate;
      std::printf("%8d %14.0f %14.0f %8.1f%% %14.0f %8.2fx\n", t, trainer_rate, loop_rate,
                  overhead * 100.0, torch_rate, trainer_rate / torch_rate);
    } else {
      std::printf("%8d %14.0f %14.0f %8.1f%% %14s %9s\n", t, trainer_rate, loop_rate,
                  overhead * 100.0, "n/a", "n/a");
    }
    rows.push_back(row);
  }
  if (!o.torch || rows.empty() || !rows[0].contains("pytorch_samples_per_s")) {
    std::printf("# PyTorch baseline: not run (%s)\n",
                o.torch ? "python3 cannot import torch; Debian: python3-torch" : "--no-torch");
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << nlohmann::json{{"batch", o.batch}, {"rows", rows}}.dump(2)
                               << "\n";
  }
  return 0;
}
