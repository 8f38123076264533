// SPDX-License-Identifier: Apache-2.0
// How well does data parallelism scale on this machine, against PyTorch? The Fashion-MNIST MLP of
// example 01 (784-1024-1024-10, ReLU, dropout 0.1, SGD with Nesterov momentum, flips) at a global
// batch of 256, trained by strata's trainer:
//   - 1 rank, 1 BLAS thread (the baseline of the scaling efficiency);
//   - 1 rank, 2 BLAS threads (the single-process way to use both cores);
//   - 2 ranks as threads (parallel::data<all_reduce> over comm::threads), 1 BLAS thread each
//     (the trainer's automatic blas_threads on 2 cores);
//   - the same with the process's OpenBLAS at 2 threads, which both ranks share (one pool per
//     process: what the ranks got before the trainer chose the threads);
//   - the same with bucket_launch = blocking (each bucket all-reduced as backward completes it,
//     instead of non-blocking all-reduces waited for before the optimizer step);
//   - the same with parallel::zero1 (optimizer state and update sharded over the 2 ranks);
//   - 2 independent 1-rank trainers at half the batch each, at the same time, that never
//     communicate: what this machine gives two ranks' computation, the ceiling of the
//     efficiency here (the weight-sized work that every rank repeats and the two cores' shared
//     caches cost it; the gap to it is communication and waiting for each other);
//   - 2 ranks as MPI processes (the same over comm::mpi, under mpiexec), when built with MPI,
//     with bucket_launch = auto (each bucket reduced by a blocking MPI_Allreduce once backward
//     completes it) and = async (MPI_Iallreduce, waited for before the optimizer step);
// and PyTorch in the same run (bench/parallel/torch_ddp.py, when `import torch` works):
// DistributedDataParallel with gloo on 2 processes of 1 thread, and one process with 1 and 2
// threads, each at its best on its threads (bench/common/torch.hpp). The first lines name the
// CPU and the GEMM kernels.
//
//   build/bench/bench_data_parallel [--data-dir DIR] [--global 256] [--steps 60] [--warmup 5]
//                                   [--loader-workers 1] [--bucket-mb 25] [--repeats 3]
//                                   [--no-torch] [--no-mpi] [--json FILE]
//
// Throughput is global samples per second over the timed steps (the warmup steps, loading and
// evaluation excluded). The strata configurations in this process run --repeats times each,
// taking turns (so that a slow spell of the machine hits every configuration alike), and report
// the median; so do the two MPI jobs, in turns with each other. Scaling efficiency = rate(2 ranks)
// / (2 x rate(1 rank, 1 thread)). Formulas: docs/benchmarks.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"
#include "../common/machine.hpp"
#include "../common/spawn.hpp"
#include "../common/torch.hpp"

#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/config/toml_reader.hpp"
#include "strata/data.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/data.hpp"
#include "strata/train/trainer.hpp"

#ifdef STRATA_BENCH_MPI
#include "strata/comm/mpi.hpp"
#endif

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string data_dir{sd::fashion_mnist_default_dir};
  std::size_t global = 256;
  std::size_t steps = 60;
  std::size_t warmup = 5;
  bool torch = true;
  bool mpi = true;
  bool mpi_worker = false;
  std::size_t loader_workers = 1;
  std::size_t bucket_mb = 25;
  std::size_t repeats = 3;
  std::string bucket_launch = "auto";  // --mpi-worker: the config's bucket_launch
  std::string json_path;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, "bench_data_parallel"); };
    if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--global") {
      o.global = std::stoul(value());
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoul(value());
    } else if (a == "--no-torch") {
      o.torch = false;
    } else if (a == "--no-mpi") {
      o.mpi = false;
    } else if (a == "--loader-workers") {
      o.loader_workers = std::stoul(value());
    } else if (a == "--bucket-mb") {
      o.bucket_mb = std::stoul(value());
    } else if (a == "--repeats") {
      o.repeats = std::stoul(value());
    } else if (a == "--mpi-worker") {
      o.mpi_worker = true;
    } else if (a == "--bucket-launch") {
      o.bucket_launch = value();
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_data_parallel [--data-dir DIR] [--global N] [--steps N] "
                   "[--warmup N] [--loader-workers N] [--bucket-mb N] [--repeats N] [--no-torch] "
                   "[--no-mpi] [--json FILE]\n");
      std::exit(2);
    }
  }
  if (o.global % 2 != 0 || o.steps == 0 || o.warmup == 0 || o.repeats == 0) {
    std::fprintf(stderr,
                 "bench_data_parallel: --global must be even, --steps, --warmup and --repeats "
                 ">= 1\n");
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
using model_t = decltype(make_mlp());

auto augmentation() {
  return sd::compose{sd::horizontal_flip{.probability = 0.5}, sd::fashion_mnist_normalize()};
}

using strata::model::set_blas_threads;

sc::train_config config_for(const options& o, int ranks) {
  sc::train_config cfg;
  cfg.blas_threads = strata::model::blas_threads();  // the row's choice, made before
  cfg.data_dir = o.data_dir;
  cfg.world_size = ranks;
  cfg.batch_size_per_gpu = static_cast<std::int64_t>(o.global) / ranks;
  cfg.epochs = 1;
  cfg.max_train_samples = static_cast<std::int64_t>(o.global * (o.steps + o.warmup));
  cfg.max_eval_samples = 100;
  cfg.loader_workers = static_cast<std::int64_t>(o.loader_workers);
  if (ranks > 1) {
    cfg.bucket_size_mb = static_cast<std::int64_t>(o.bucket_mb);  // refused on one rank
  }
  cfg.checkpoint_interval = 0;
  cfg.checkpoint_dir =
      (std::filesystem::temp_directory_path() / "strata_bench_data_parallel").string();
  cfg.resume = strata::config::resume_mode::never;
  cfg.lr = 0.05;
  cfg.momentum = 0.9;
  cfg.nesterov = true;
  cfg.weight_decay = 5e-4;
  cfg.warmup_epochs = 0.0;
  cfg.log_every = 1000000;
  return cfg;
}

// Global samples per second over the steps after the warmup, from the step callbacks.
template <class Trainer>
double timed_fit(Trainer& t, const options& o, const sd::idx_dataset& train,
                 const sd::idx_dataset& test) {
  clock_type::time_point begin{};
  clock_type::time_point end{};
  std::size_t samples = 0;
  t.on_step([&](const st::step_metrics& m) {
    if (m.step + 1 == o.warmup) {
      begin = clock_type::now();
    } else if (m.step >= o.warmup) {
      samples += m.samples;
      end = clock_type::now();
    }
  });
  t.fit(train, augmentation(), test, sd::fashion_mnist_normalize());
  std::error_code ignored;  // a measurement keeps no checkpoints (every rank tries)
  std::filesystem::remove_all(t.run().directory, ignored);
  return static_cast<double>(samples) / std::chrono::duration<double>(end - begin).count();
}

double strata_one_rank(const options& o, int blas_threads, const sd::idx_dataset& train,
                       const sd::idx_dataset& test) {
  set_blas_threads(blas_threads);
  st::trainer<model_t> t(make_mlp(), config_for(o, 1), {.print_progress = false});
  return timed_fit(t, o, train, test);
}

// Two 1-rank trainers of o.global / 2 samples per step on two threads at once; the sum of
// their rates.
double strata_independent(const options& o, const sd::idx_dataset& train,
                          const sd::idx_dataset& test) {
  set_blas_threads(1);
  options half = o;
  half.global = o.global / 2;
  double rates[2] = {0.0, 0.0};
  std::exception_ptr failures[2];
  std::vector<std::thread> pool;
  for (int i = 0; i < 2; ++i) {
    pool.emplace_back([&, i] {
      try {
        auto cfg = config_for(half, 1);
        cfg.checkpoint_dir += "-independent-" + std::to_string(i);
        st::trainer<model_t> t(make_mlp(), cfg, {.print_progress = false});
        rates[i] = timed_fit(t, half, train, test);
      } catch (...) {
        failures[i] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) {
    t.join();
  }
  for (const auto& f : failures) {
    if (f) {
      std::rethrow_exception(f);
    }
  }
  return rates[0] + rates[1];
}

// `blas`: the process's BLAS threads, which all its ranks share (the trainer's automatic choice
// is 1 per rank here; 2 is what the ranks got before the trainer set it).
template <class Policy>
double strata_threads(const options& o, int ranks, const sd::idx_dataset& train,
                      const sd::idx_dataset& test, const char* bucket_launch = "auto",
                      int blas = 1) {
  set_blas_threads(blas);
  double rate = 0.0;
  auto cfg = config_for(o, ranks);
  sc::set_key(cfg, "bucket_launch", bucket_launch);
  cfg.zero_stage = std::is_same_v<Policy, strata::parallel::zero1> ? 1 : 0;
  strata::comm::threads::run(ranks, [&](strata::comm::threads& c) {
    st::trainer<model_t, Policy> t(make_mlp(), cfg, strata::comm::any_comm(c),
                                   {.print_progress = false});
    const double r = timed_fit(t, o, train, test);
    if (c.rank() == 0) {
      rate = r;
    }
  });
  return rate;
}

#ifdef STRATA_BENCH_MPI
// One rank of the mpiexec job; rank 0 prints {"samples_per_s": ...}.
int mpi_worker(const options& o) {
  strata::comm::mpi_environment environment;
  auto world = strata::comm::mpi::world();
  set_blas_threads(1);
  const sd::idx_dataset train = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
  const sd::idx_dataset test = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::test);
  auto cfg = config_for(o, world.size());
  cfg.communication_backend = sc::comm_backend_kind::mpi;
  sc::set_key(cfg, "bucket_launch", o.bucket_launch);
  st::trainer<model_t, strata::parallel::data<>> t(make_mlp(), cfg, strata::comm::any_comm(world),
                                                   {.print_progress = false});
  const double rate = timed_fit(t, o, train, test);
  if (world.rank() == 0) {
    std::printf("%s\n", nlohmann::json{{"samples_per_s", rate}}.dump().c_str());
  }
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
#ifdef STRATA_BENCH_MPI
    if (o.mpi_worker) {
      return mpi_worker(o);
    }
#endif
    const sd::idx_dataset train =
        sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train);
    const sd::idx_dataset test = sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::test);
    struct row {
      std::string name;
      double rate = 0.0;
      double low = 0.0;  // the slowest and fastest of the repeats (strata in this process)
      double high = 0.0;
      std::string note{};  // PyTorch's rows: the OpenMP wait policy that was faster
    };
    // The in-process strata configurations, each run o.repeats times in turns; medians.
    const std::pair<const char*, std::function<double()>> configurations[] = {
        {"strata 1 rank, 1 thread", [&] { return strata_one_rank(o, 1, train, test); }},
        {"strata 1 rank, 2 BLAS threads", [&] { return strata_one_rank(o, 2, train, test); }},
        {"strata 2 ranks (threads backend)",
         [&] { return strata_threads<strata::parallel::data<>>(o, 2, train, test); }},
        {"strata 2 ranks (threads), shared 2-thread BLAS",
         [&] { return strata_threads<strata::parallel::data<>>(o, 2, train, test, "auto", 2); }},
        {"strata 2 ranks (threads, blocking buckets)",
         [&] { return strata_threads<strata::parallel::data<>>(o, 2, train, test, "blocking"); }},
        {"strata 2 ranks zero1 (threads backend)",
         [&] { return strata_threads<strata::parallel::zero1>(o, 2, train, test); }},
        {"2 independent trainers, no communication",
         [&] { return strata_independent(o, train, test); }}};
    std::vector<std::vector<double>> runs(std::size(configurations));
    for (std::size_t r = 0; r < o.repeats; ++r) {
      for (std::size_t c = 0; c < std::size(configurations); ++c) {
        runs[c].push_back(configurations[c].second());
      }
    }
    std::vector<row> rows;
    for (std::size_t c = 0; c < std::size(configurations); ++c) {
      std::vector<double> v = runs[c];
      std::sort(v.begin(), v.end());
      rows.push_back({configurations[c].first, v[v.size() / 2], v.front(), v.back()});
    }
    const auto rate_of = [&](std::string_view name) {
      for (const row& r : rows) {
        if (r.name == name) {
          return r.rate;
        }
      }
      throw std::logic_error("bench_data_parallel: no row '" + std::string(name) + "'");
    };
    const double base = rate_of("strata 1 rank, 1 thread");
    const double two_threads = rate_of("strata 2 ranks (threads backend)");
    const double two_shared_blas = rate_of("strata 2 ranks (threads), shared 2-thread BLAS");
    const double two_zero1 = rate_of("strata 2 ranks zero1 (threads backend)");
    const double independent = rate_of("2 independent trainers, no communication");
    std::optional<double> two_mpi;
    std::optional<double> two_mpi_async;
#ifdef STRATA_BENCH_MPI
    if (o.mpi) {
      // bucket_launch auto (blocking over MPI) and async, o.repeats times in turns; medians.
      const std::pair<const char*, const char*> launches[] = {
          {"strata 2 ranks (MPI backend)", "auto"},
          {"strata 2 ranks (MPI, async buckets)", "async"}};
      std::vector<std::vector<double>> mpi_runs(std::size(launches));
      for (std::size_t r = 0; r < o.repeats; ++r) {
        for (std::size_t k = 0; k < std::size(launches); ++k) {
          const std::string command =
              "mpiexec -n 2 --allow-run-as-root --oversubscribe --bind-to none " +
              bench::self_path("bench_data_parallel") + " --mpi-worker --data-dir " + o.data_dir +
              " --global " + std::to_string(o.global) + " --steps " + std::to_string(o.steps) +
              " --warmup " + std::to_string(o.warmup) + " --loader-workers " +
              std::to_string(o.loader_workers) + " --bucket-mb " + std::to_string(o.bucket_mb) +
              " --bucket-launch " + launches[k].second + " 2>/dev/null";
          if (auto j = bench::run_json(command); j && j->contains("samples_per_s")) {
            mpi_runs[k].push_back(j->at("samples_per_s").get<double>());
          }
        }
      }
      for (std::size_t k = 0; k < std::size(launches); ++k) {
        std::vector<double> v = mpi_runs[k];
        if (v.empty()) {
          continue;
        }
        std::sort(v.begin(), v.end());
        rows.push_back({launches[k].first, v[v.size() / 2], v.front(), v.back()});
        (k == 0 ? two_mpi : two_mpi_async) = v[v.size() / 2];
      }
    }
#endif
    const strata::model::gemm_environment gemm_env = strata::model::detect_gemm_environment();
    const std::string coretype = bench::openblas_coretype_fix(gemm_env);
    double best_torch = 0.0;
    std::string torch_version;
    if (o.torch) {
      const std::string script =
          (std::filesystem::path(STRATA_SOURCE_DIR) / "bench" / "parallel" / "torch_ddp.py")
              .string();
      const std::string python =
          std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
      const std::string common = " --batch " + std::to_string(o.global) + " --steps " +
                                 std::to_string(o.steps) + " --warmup " + std::to_string(o.warmup) +
                                 " 2>/dev/null";
      // Each at its best on its threads (bench/common/torch.hpp): OpenBLAS's threads per
      // process, its kernels set right, the faster of OpenMP spinning or sleeping.
      const struct {
        const char* name;
        std::string args;
        int threads_per_process;
      } runs[] = {{"PyTorch DDP gloo, 2 processes x 1 thread", " --mode ddp --ranks 2", 1},
                  {"PyTorch 1 process, 1 thread", " --mode single --threads 1", 1},
                  {"PyTorch 1 process, 2 threads", " --mode single --threads 2", 2}};
      for (const auto& run : runs) {
        if (auto j = bench::run_torch_best(python + " " + script + run.args + common,
                                           run.threads_per_process, coretype)) {
          const double rate = j->at("samples_per_s").get<double>();
          rows.push_back({run.name, rate, rate, rate,
                          "OpenMP wait policy " + j->at("wait_policy").get<std::string>()});
          best_torch = std::max(best_torch, rate);
          torch_version = j->value("torch", "");
        }
      }
    }
    std::printf("# CPU: %s; %s\n", bench::cpu_model().c_str(),
                strata::describe(gemm_env.cpu).c_str());
    std::printf("# GEMM: %s\n",
                strata::model::describe(
                    strata::model::decide_gemm(strata::model::current_gemm(), gemm_env), gemm_env)
                    .c_str());
    if (!coretype.empty()) {
      std::printf("# OpenBLAS picked %s kernels here: PyTorch runs with %s\n",
                  gemm_env.openblas_core.c_str(), coretype.c_str());
    }
    std::printf(
        "# MLP 784-1024-1024-10, global batch %zu, %zu timed steps after %zu; strata: median "
        "of %zu runs in turns (range: slowest-fastest); baseline: strata 1 rank, 1 thread = "
        "%.0f samples/s\n",
        o.global, o.steps, o.warmup, o.repeats, base);
    std::printf("%-52s %12s %10s %16s  %s\n", "configuration", "samples/s", "vs_base", "range",
                "note");
    nlohmann::json out_rows = nlohmann::json::array();
    for (const auto& r : rows) {
      std::printf("%-52s %12.0f %9.2fx %8.0f-%-7.0f  %s\n", r.name.c_str(), r.rate, r.rate / base,
                  r.low, r.high, r.note.c_str());
      out_rows.push_back({{"configuration", r.name},
                          {"samples_per_s", r.rate},
                          {"slowest", r.low},
                          {"fastest", r.high}});
      if (!r.note.empty()) {
        out_rows.back()["note"] = r.note;
      }
    }
    const double efficiency = two_threads / (2.0 * base);
    const double efficiency_zero1 = two_zero1 / (2.0 * base);
    std::printf(
        "# scaling efficiency, 2 ranks (threads): data<all_reduce> %.1f%%, zero1 %.1f%% "
        "(goal >= 90%%); without communication (the ceiling): %.1f%%\n",
        100.0 * efficiency, 100.0 * efficiency_zero1, 100.0 * independent / (2.0 * base));
    std::printf(
        "# BLAS threads per rank (the trainer's blas_threads): 2 thread ranks with 1 BLAS thread "
        "each run %.2fx as fast as with one pool of 2 threads shared by both\n",
        two_threads / two_shared_blas);
    if (two_mpi) {
      std::printf("# scaling efficiency, 2 ranks (MPI): %.1f%%", 100.0 * *two_mpi / (2.0 * base));
      if (two_mpi_async) {
        std::printf("; with non-blocking buckets (bucket_launch = async): %.1f%%",
                    100.0 * *two_mpi_async / (2.0 * base));
      }
      std::printf("\n");
    }
    if (best_torch > 0.0) {
      std::printf(
          "# strata 2 ranks (threads) vs the best PyTorch configuration (torch %s): "
          "%.2fx (goal >= 1.2x)\n",
          torch_version.c_str(), two_threads / best_torch);
    } else if (o.torch) {
      std::printf(
          "# PyTorch: python3 cannot import torch (Debian: python3-torch); no comparison\n");
    }
    if (!o.json_path.empty()) {
      std::ofstream(o.json_path)
          << nlohmann::json{{"global_batch", o.global},
                            {"rows", out_rows},
                            {"efficiency_threads", efficiency},
                            {"efficiency_zero1", efficiency_zero1},
                            {"blas_per_rank_vs_shared", two_threads / two_shared_blas},
                            {"efficiency_ceiling", independent / (2.0 * base)}}
                 .dump(2)
          << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data_parallel: %s\n", e.what());
    return 1;
  }
  return 0;
}
