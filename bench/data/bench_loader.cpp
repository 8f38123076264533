// SPDX-License-Identifier: Apache-2.0
// Does the prefetching loader keep the step fed? Fashion-MNIST training images through the full
// augmentation chain.
//
//   build/bench/bench_loader [--data-dir DIR] [--batch 256] [--depth 4] [--workers 1,2,4]
//                            [--batches 60] [--repeats 3] [--json FILE]
//
// Part 1, throughput: samples/s with no work in the step, against the worker count; baseline:
// workers = 0 (the step augments its own batch). Part 2, wait share: each step spins for a fixed
// compute time c = (augmentation time of one batch) / workers x factor; the share of step time
// the step waits for data, against the synchronous baseline whose step is augmentation + c.
// The #wrong column counts batches whose contents differ from the synchronous run's.
// Formulas: docs/benchmarks.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "strata/data/idx.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/transforms.hpp"

namespace sd = strata::data;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string data_dir{sd::fashion_mnist_default_dir};
  std::size_t batch = 256;
  std::size_t depth = 4;
  std::vector<std::size_t> workers{1, 2, 4};
  std::vector<double> factors{1.0, 1.5};
  std::size_t batches = 60;  // timed batches per measurement
  std::size_t repeats = 3;   // measurements per row; the median is reported
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, "bench_loader"); };
    if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--batch") {
      o.batch = std::stoul(value());
    } else if (a == "--depth") {
      o.depth = std::stoul(value());
    } else if (a == "--workers") {
      o.workers = bench::comma_list<std::size_t>(value());
    } else if (a == "--batches") {
      o.batches = std::stoul(value());
    } else if (a == "--repeats") {
      o.repeats = std::max<std::size_t>(1, std::stoul(value()));
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_loader [--data-dir DIR] [--batch N] [--depth N] [--workers a,b] "
                   "[--batches N] [--repeats N] [--json FILE]\n");
      std::exit(2);
    }
  }
  return o;
}

void spin_for(double seconds) {
  const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                             std::chrono::duration<double>(seconds));
  while (clock_type::now() < until) {
  }
}

// xxh3 of the batch's bytes: exact, and about 40 us for a 256 x 784 batch.
std::uint64_t checksum(std::span<const float> values) {
  return XXH3_64bits(values.data(), values.size_bytes());
}

struct run_result {
  double seconds = 0.0;       // wall time of the timed batches
  double wait_seconds = 0.0;  // time next() waited over the timed batches
  std::size_t samples = 0;
  std::size_t wrong = 0;  // batches differing from the reference sums
  std::vector<std::uint64_t> sums;
};

// Runs `o.batches` timed batches (after two untimed ones) with `workers` and a step of
// `compute` seconds; epoch 1 so that every run sees the same samples.
template <class Dataset, class Transform>
run_result measure(const Dataset& data, const Transform& augment, const options& o,
                   std::size_t workers, double compute,
                   const std::vector<std::uint64_t>* reference) {
  const std::size_t warm = 2;
  const std::size_t total = std::min(o.batches + warm, data.size() / o.batch);
  sd::prefetch_loader loader(
      data, augment, sd::distributed_sampler({.dataset_size = data.size(), .seed = 1}),
      {.batch_size = o.batch, .workers = workers, .prefetch_depth = o.depth, .seed = 2});
  loader.start_epoch(1);
  run_result r;
  clock_type::time_point begin{};
  for (std::size_t k = 0; k < total; ++k) {
    if (k == warm) {
      begin = clock_type::now();
    }
    auto batch = loader.next();
    if (!batch) {
      break;
    }
    const std::uint64_t sum = checksum(batch->inputs);
    r.sums.push_back(sum);
    if (reference != nullptr && (k >= reference->size() || (*reference)[k] != sum)) {
      ++r.wrong;
    }
    if (compute > 0.0) {
      spin_for(compute);
    }
    if (k >= warm) {
      r.wait_seconds += batch->wait_seconds;
      r.samples += batch->size;
    }
  }
  r.seconds = std::chrono::duration<double>(clock_type::now() - begin).count();
  return r;
}

// The run with the median wall time of o.repeats runs.
template <class Dataset, class Transform>
run_result median_of(const Dataset& data, const Transform& augment, const options& o,
                     std::size_t workers, double compute,
                     const std::vector<std::uint64_t>* reference) {
  std::vector<run_result> runs;
  for (std::size_t i = 0; i < o.repeats; ++i) {
    runs.push_back(measure(data, augment, o, workers, compute, reference));
  }
  std::sort(runs.begin(), runs.end(),
            [](const run_result& a, const run_result& b) { return a.seconds < b.seconds; });
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const sd::idx_dataset train = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
  const auto augment = sd::fashion_mnist_augmentation();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  // Baseline: the step augments its own batches.
  const run_result sync = median_of(train, augment, o, 0, 0.0, nullptr);
  const double sync_rate = static_cast<double>(sync.samples) / sync.seconds;
  const double augment_per_batch = sync.seconds / static_cast<double>(o.batches);

  nlohmann::json json{{"batch", o.batch},
                      {"depth", o.depth},
                      {"cores", cores},
                      {"baseline_samples_per_s", sync_rate},
                      {"augment_ms_per_batch", augment_per_batch * 1e3}};

  std::printf("# loader throughput, Fashion-MNIST train, batch %zu, depth %zu, %u cores\n", o.batch,
              o.depth, cores);
  std::printf("# baseline: workers 0 (augmentation in the step) %.0f samples/s, %.2f ms/batch\n",
              sync_rate, augment_per_batch * 1e3);
  std::printf("%8s %14s %8s %7s\n", "workers", "samples/s", "ratio", "#wrong");
  std::printf("%8d %14.0f %7.2fx %7zu\n", 0, sync_rate, 1.0, std::size_t{0});
  nlohmann::json throughput = nlohmann::json::array();
  for (std::size_t w : o.workers) {
    const run_result r = median_of(train, augment, o, w, 0.0, &sync.sums);
    const double rate = static_cast<double>(r.samples) / r.seconds;
    std::printf("%8zu %14.0f %7.2fx %7zu\n", w, rate, rate / sync_rate, r.wrong);
    throughput.push_back(
        {{"workers", w}, {"samples_per_s", rate}, {"ratio", rate / sync_rate}, {"wrong", r.wrong}});
  }
  json["throughput"] = throughput;

  std::printf("\n# wait share with a fixed compute per step c = augment/workers x factor\n");
  std::printf("# baseline: workers 0, step = augmentation + c\n");
  std::printf("%8s %7s %10s %10s %9s %11s %9s %8s %7s\n", "workers", "factor", "c(ms)", "step(ms)",
              "wait%", "base-step", "base-wt%", "speedup", "#wrong");
  nlohmann::json waits = nlohmann::json::array();
  for (std::size_t w : o.workers) {
    for (double factor : o.factors) {
      const double compute = augment_per_batch / static_cast<double>(w) * factor;
      const run_result base = median_of(train, augment, o, 0, compute, nullptr);
      const run_result r = median_of(train, augment, o, w, compute, &sync.sums);
      const double steps = static_cast<double>(o.batches);
      const double step = r.seconds / steps;
      const double base_step = base.seconds / steps;
      const double share = r.wait_seconds / r.seconds;
      const double base_share = base.wait_seconds / base.seconds;
      std::printf("%8zu %7.2f %10.2f %10.2f %8.1f%% %11.2f %8.1f%% %7.2fx %7zu%s\n", w, factor,
                  compute * 1e3, step * 1e3, share * 100.0, base_step * 1e3, base_share * 100.0,
                  base_step / step, r.wrong, w + 1 > cores ? "  (workers + step > cores)" : "");
      waits.push_back({{"workers", w},
                       {"factor", factor},
                       {"compute_ms", compute * 1e3},
                       {"step_ms", step * 1e3},
                       {"wait_share", share},
                       {"baseline_step_ms", base_step * 1e3},
                       {"baseline_wait_share", base_share},
                       {"speedup", base_step / step},
                       {"oversubscribed", w + 1 > cores},
                       {"wrong", r.wrong}});
    }
  }
  json["wait_share"] = waits;
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << json.dump(2) << "\n";
  }
  return 0;
}
