// SPDX-License-Identifier: Apache-2.0
// What does tensor parallelism give on this machine, and what does it cost in communication and
// save in memory?
//
// 1. A ViT block (residual attention + residual parallel MLP, dim D, 4 D hidden, T tokens, batch
//    B): forward and backward on 1 thread rank (tp 1) and on 2 thread ranks (tp 2), 1 BLAS
//    thread each; seconds per pass (median of --repeats), the speedup, and the share of rank 0's
//    time inside the tensor group's collectives (timed around each all-reduce / all-gather).
// 2. The whole step of example 04's ViT (dim 64, 16 tokens, batch 128) through the trainer on
//    synthetic 28 x 28 images: samples per second on 1 rank (1 and 2 BLAS threads), on tp 2
//    (2 thread ranks, 1 BLAS thread each) and, where built with MPI, on tp 2 over 2 processes
//    (this program again under mpiexec, 1 BLAS thread each). Then its forward and backward passes
//    alone at batch 128, timed like the block: the collectives' share of the step's passes.
// 3. Memory per rank of the block model for tp 1, 2, 4: parameters and activation workspace
//    (floats the store and workspace hold), beside estimate_memory for that rank of the group.
//
//   build/bench/bench_tensor [--dim 256] [--tokens 64] [--batch 16] [--repeats 7] [--steps 30]
//                            [--no-mpi]
//
// Formulas: docs/benchmarks.md.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "../common/args.hpp"
#include "../common/machine.hpp"
#include "../common/spawn.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/cpu_features.hpp"
#include "strata/core/rng.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/gemm.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/tensor.hpp"
#include "strata/parallel/tensor_parallel.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/trainer.hpp"

#ifdef STRATA_BENCH_MPI
#include "strata/comm/mpi.hpp"
#endif

namespace sm = strata::model;
namespace sp = strata::parallel;
namespace st = strata::train;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::size_t dim = 256;
  std::size_t tokens = 64;
  std::size_t batch = 16;
  std::size_t repeats = 7;
  std::size_t steps = 30;
  bool mpi = true;          // the MPI row, where built with MPI
  bool mpi_worker = false;  // a process of that row's mpiexec job
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return bench::next_value(argc, argv, i, "bench_tensor"); };
    if (a == "--dim") {
      o.dim = std::stoul(value());
    } else if (a == "--tokens") {
      o.tokens = std::stoul(value());
    } else if (a == "--batch") {
      o.batch = std::stoul(value());
    } else if (a == "--repeats") {
      o.repeats = std::stoul(value());
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--no-mpi") {
      o.mpi = false;
    } else if (a == "--mpi-worker") {
      o.mpi_worker = true;
    } else {
      std::fprintf(stderr, "bench_tensor: unknown option %s\n", a.c_str());
      std::exit(2);
    }
  }
  return o;
}

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

auto block_model(const options& o) {
  return sm::sequential(
      strata::sample_shape{.channels = 1, .height = o.tokens, .width = o.dim},
      sm::residual{sm::layer_norm{.features = o.dim}, sm::self_attention{.dim = o.dim, .heads = 8}},
      sm::residual{sm::layer_norm{.features = o.dim},
                   sp::parallel_mlp{.dim = o.dim, .hidden = 4 * o.dim}});
}

// The tensor group, timing its collectives.
class timed_group final : public sm::tensor_comm {
 public:
  explicit timed_group(strata::comm::threads& c) : inner_(c) {}
  void all_reduce_sum(std::span<float> v) override {
    const auto t = clock_type::now();
    inner_.all_reduce_sum(v);
    seconds += seconds_since(t);
  }
  void all_gather(std::span<const float> mine, std::span<float> all) override {
    const auto t = clock_type::now();
    inner_.all_gather(mine, all);
    seconds += seconds_since(t);
  }
  double seconds = 0.0;

 private:
  sp::comm_tensor_group<strata::comm::threads> inner_;
};

struct block_timing {
  double step = 0.0;  // median seconds of forward + backward
  double comm = 0.0;  // rank 0's seconds in collectives, per step (of the median's run)
};

template <class Model>
block_timing time_block(const Model& m, const options& o, std::size_t batch, int tp) {
  std::vector<double> steps;
  std::vector<double> comms;
  std::mutex lock;
  strata::comm::threads::run(tp, [&](strata::comm::threads& c) {
    timed_group group(c);
    const sm::tensor_context ctx{
        .place = {.rank = static_cast<std::size_t>(c.rank()), .size = static_cast<std::size_t>(tp)},
        .comm = &group};
    auto params = m.make_params({.tensor = ctx.place});
    params.initialize(1);
    auto work = m.make_workspace(batch, {.tensor = ctx.place});
    std::vector<float> x(batch * m.input_shape().elements());
    strata::rng_stream rng(5);
    for (float& v : x) {
      v = rng.uniform(-1.0f, 1.0f);
    }
    const std::vector<float> grad(batch * m.output_shape().elements(), 0.001f);
    for (std::size_t r = 0; r < o.repeats + 1; ++r) {
      c.barrier();
      group.seconds = 0.0;
      const auto t = clock_type::now();
      (void)m.forward(work, params, x, batch, {.training = true, .tensor = ctx});
      m.backward(work, params, grad);
      const double s = seconds_since(t);
      if (r > 0 && c.rank() == 0) {  // r = 0 warms up
        const std::lock_guard g(lock);
        steps.push_back(s);
        comms.push_back(group.seconds);
      }
    }
  });
  std::vector<std::size_t> order(steps.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return steps[a] < steps[b]; });
  const std::size_t mid = order[order.size() / 2];
  return {.step = steps[mid], .comm = comms[mid]};
}

// Synthetic 28 x 28 images, 10 classes.
struct noise_images {
  using dataset_category = strata::data::dataset_tag;
  std::size_t n = 4096;
  std::size_t size() const { return n; }
  strata::sample_shape shape() const { return {.channels = 1, .height = 28, .width = 28}; }
  std::int32_t read(std::size_t i, std::span<float> out) const {
    strata::rng_stream rng = strata::rng_stream::for_sample(3, 0, i);
    for (float& v : out) {
      v = rng.uniform(-1.0f, 1.0f);
    }
    return static_cast<std::int32_t>(i % 10);
  }
};

auto example_vit() {
  constexpr std::size_t d = 64;
  const auto attention = [] {
    return sm::residual{sm::layer_norm{.features = d}, sm::self_attention{.dim = d, .heads = 4}};
  };
  const auto mlp = [] {
    return sm::residual{sm::layer_norm{.features = d}, sp::parallel_mlp{.dim = d, .hidden = 128}};
  };
  return sm::sequential(strata::sample_shape{.channels = 1, .height = 28, .width = 28},
                        sm::patch_embedding{.patch = 7, .dim = d}, attention(), mlp(), attention(),
                        mlp(), attention(), mlp(), attention(), mlp(),
                        sm::layer_norm{.features = d}, sm::token_mean{},
                        sm::linear{.in = d, .out = 10});
}

strata::config::train_config step_config(const options& o, const std::string& name) {
  strata::config::train_config cfg;
  cfg.epochs = 1;
  cfg.batch_size_per_gpu = 128;
  cfg.max_steps = static_cast<std::int64_t>(o.steps);
  cfg.max_eval_samples = 1;
  cfg.loader_workers = 1;
  cfg.blas_threads = 1;
  cfg.checkpoint_interval = 0;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.001;
  cfg.resume = strata::config::resume_mode::never;
  cfg.checkpoint_dir = (std::filesystem::temp_directory_path() / "bench_tensor" / name).string();
  return cfg;
}

double samples_per_second(const st::fit_summary& s) {
  return s.samples_per_second;
}

#ifdef STRATA_BENCH_MPI
// One process of the tp 2 job over MPI; rank 0 prints {"samples_per_s": ...}.
int mpi_worker(const options& o) {
  strata::comm::mpi_environment environment;
  auto world = strata::comm::mpi::world();
  sm::set_blas_threads(1);
  auto cfg = step_config(o, "tp2-mpi");
  cfg.world_size = world.size();
  cfg.tensor_parallel_size = world.size();
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  const auto vit = example_vit();
  st::trainer<decltype(vit), sp::tensor<sp::data<>>> t(vit, cfg, strata::comm::any_comm(world),
                                                       {.print_progress = false});
  const auto s = t.fit(noise_images{}, strata::data::identity{}, noise_images{.n = 1},
                       strata::data::identity{});
  if (world.rank() == 0) {
    std::printf("{\"samples_per_s\": %.3f}\n", samples_per_second(s));
  }
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
#ifdef STRATA_BENCH_MPI
  if (o.mpi_worker) {
    return mpi_worker(o);
  }
#endif
  const sm::gemm_environment env = sm::detect_gemm_environment();
  std::printf("# CPU: %s; %s; built for %s vectors\n", bench::cpu_model().c_str(),
              strata::describe(env.cpu).c_str(), strata::to_string(strata::compiled_isa()));
  sm::set_blas_threads(1);
  std::printf("# GEMM: %s, 1 thread per rank\n\n", sm::blas_backend().c_str());

  const auto block = block_model(o);
  std::printf(
      "1. ViT block (dim %zu, %zu tokens, batch %zu, 8 heads, MLP %zu): forward + backward\n",
      o.dim, o.tokens, o.batch, 4 * o.dim);
  const block_timing one = time_block(block, o, o.batch, 1);
  const block_timing two = time_block(block, o, o.batch, 2);
  std::printf("   tp 1: %.3f ms\n", one.step * 1e3);
  std::printf("   tp 2: %.3f ms, speedup %.2fx, collectives %.1f%% of rank 0's step\n\n",
              two.step * 1e3, one.step / two.step, 100.0 * two.comm / two.step);

  std::printf("2. example 04's ViT through the trainer (batch 128, %zu steps, synthetic images)\n",
              o.steps);
  const auto vit = example_vit();
  using vit_t = decltype(vit);
  // One rank on 1 BLAS thread (the same cores per rank as tp 2's ranks), and on 2 (the same
  // cores in all as tp 2).
  const auto one_rank = [&](std::int64_t blas_threads) {
    auto cfg = step_config(o, "tp1");
    cfg.blas_threads = blas_threads;
    st::trainer<vit_t> t(vit, cfg, {.print_progress = false});
    return samples_per_second(t.fit(noise_images{}, strata::data::identity{}, noise_images{.n = 1},
                                    strata::data::identity{}));
  };
  const double single = one_rank(1);
  const double single_two_threads = one_rank(2);
  double split = 0.0;
  {
    auto cfg = step_config(o, "tp2");
    cfg.world_size = 2;
    cfg.tensor_parallel_size = 2;
    strata::comm::threads::run(2, [&](strata::comm::threads& c) {
      st::trainer<vit_t, sp::tensor<sp::data<>>> t(vit, cfg, strata::comm::any_comm(c),
                                                   {.print_progress = false});
      const auto s = t.fit(noise_images{}, strata::data::identity{}, noise_images{.n = 1},
                           strata::data::identity{});
      if (c.rank() == 0) {
        split = samples_per_second(s);
      }
    });
  }
  std::printf(
      "   1 rank, 1 BLAS thread:  %.0f samples/s\n   1 rank, 2 BLAS threads: %.0f samples/s\n"
      "   tp 2 (1 BLAS thread each): %.0f samples/s (%.2fx 1 thread, %.2fx 2 threads)\n",
      single, single_two_threads, split, split / single, split / single_two_threads);
  // The step's forward and backward passes alone, timed like the block: where the collectives'
  // share of the whole step is.
  const block_timing vit_one = time_block(vit, o, 128, 1);
  const block_timing vit_two = time_block(vit, o, 128, 2);
  std::printf(
      "   its forward + backward alone: tp 1 %.3f ms, tp 2 %.3f ms (%.2fx), collectives %.1f%% "
      "of rank 0's passes\n",
      vit_one.step * 1e3, vit_two.step * 1e3, vit_one.step / vit_two.step,
      100.0 * vit_two.comm / vit_two.step);
#ifdef STRATA_BENCH_MPI
  if (o.mpi) {
    const std::string command = "mpiexec -n 2 --allow-run-as-root --oversubscribe --bind-to none " +
                                bench::self_path("bench_tensor") + " --mpi-worker --steps " +
                                std::to_string(o.steps) + " 2>&1";
    if (const auto j = bench::run_json(command); j && j->contains("samples_per_s")) {
      const double over_mpi = j->at("samples_per_s").get<double>();
      std::printf(
          "   tp 2 over MPI (2 processes, 1 BLAS thread each): %.0f samples/s (%.2fx 1 "
          "thread, %.2fx 2 threads)\n",
          over_mpi, over_mpi / single, over_mpi / single_two_threads);
    } else {
      std::printf("   tp 2 over MPI: the mpiexec job printed no result (%s)\n", command.c_str());
    }
  }
#else
  std::printf("   tp 2 over MPI: not built (STRATA_ENABLE_MPI off)\n");
#endif
  std::printf("\n");

  std::printf("3. memory per rank of the block model, batch %zu (MiB): held / estimate_memory\n",
              o.batch);
  const auto mib = [](std::size_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  for (const std::size_t tp : {1, 2, 4}) {
    const sm::tensor_place place{.rank = 0, .size = tp};
    const auto params = block.make_params({.tensor = place});
    const auto work = block.make_workspace(o.batch, {.tensor = place});
    const auto estimate = st::estimate_memory(block, o.batch, {.tensor = place});
    // estimate_memory counts the loss gradient beside the workspace, rounded to 64 bytes.
    const std::size_t logits =
        (o.batch * block.output_shape().elements() * sizeof(float) + 63) / 64 * 64;
    std::printf("   tp %zu: parameters %.2f / %.2f, workspace %.2f / %.2f\n", tp,
                mib(params.size() * sizeof(float)), mib(estimate.parameters),
                mib(work.floats() * sizeof(float)), mib(estimate.activations - logits));
  }
  return 0;
}
