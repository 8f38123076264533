// SPDX-License-Identifier: Apache-2.0
// The data-parallel policies over Open MPI (all-reduce, zero1, parameter server co-located,
// dedicated and asynchronous, top-k, hierarchical): N processes with B/N samples each train like
// one process with B (computed in every process as the reference), every rank ends with the same
// parameters, and checkpoints written by rank 0 resume on every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/mpi.hpp"
#include "strata/core/host.hpp"
#include "strata/data/transforms.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/data.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/trainer.hpp"

#include "unit/common/blobs.hpp"

namespace fs = std::filesystem;
namespace sd = strata::data;
namespace sm = strata::model;
namespace st = strata::train;
using strata::comm::mpi;

namespace {

using strata::test::blobs;

auto small_model() {
  return strata::test::blobs_mlp();
}
using model_t = decltype(small_model());

strata::config::train_config base_config(const std::string& name, int rank) {
  // A directory per process for the reference, one shared by the job for the parallel run.
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "mpi_data_parallel" / name;
  if (rank == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  strata::config::train_config cfg;
  cfg.epochs = 2;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  cfg.warmup_epochs = 0.5;
  return cfg;
}

// Trains one process as the reference (batch 64) and the job with `Policy` (64 / N each, `cfg`
// adjusted by `adjust`); checks the losses and parameters against the reference and that every
// rank holds rank 0's parameters.
template <class Policy, class Adjust>
void check_against_one_process(const std::string& name, Adjust adjust) {
  auto comm = mpi::world();
  const int ranks = comm.size();
  const int rank = comm.rank();
  auto one_cfg = base_config(name + "-reference-" + std::to_string(rank), 0);
  one_cfg.batch_size_per_gpu = 64;
  one_cfg.optimizer = strata::config::optimizer_kind::adamw;
  one_cfg.lr = 0.01;
  std::vector<double> one_losses;
  // Every process trains its own reference, each in its own directory.
  st::trainer<model_t> one(small_model(), one_cfg,
                           {.print_progress = false, .independent_processes = true});
  one.on_step([&](const st::step_metrics& m) { one_losses.push_back(m.loss); });
  one.fit(blobs{}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});

  auto cfg = base_config(name, rank);
  comm.barrier();
  cfg.world_size = ranks;
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  cfg.batch_size_per_gpu = 64 / ranks;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.lr = 0.01;
  adjust(cfg);
  std::vector<double> losses;
  st::trainer<model_t, Policy> t(small_model(), cfg, strata::comm::any_comm(comm),
                                 {.print_progress = false});
  t.on_step([&](const st::step_metrics& m) { losses.push_back(m.loss); });
  const st::fit_summary s =
      t.fit(blobs{}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});
  // A dedicated parameter server trains nothing and holds its own shard only.
  const bool server =
      cfg.dedicated_parameter_servers && rank >= ranks - static_cast<int>(cfg.parameter_servers);
  std::vector<float> root(t.params().values().begin(), t.params().values().end());
  comm.broadcast(root.data(), root.size(), strata::dtype::float32, 0);
  if (!server) {
    REQUIRE(losses.size() == one_losses.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      CHECK(losses[i] == doctest::Approx(one_losses[i]).epsilon(1e-5));
    }
    double worst = 0.0;
    for (std::size_t i = 0; i < one.params().size(); ++i) {
      worst = std::max(
          worst, static_cast<double>(std::abs(t.params().values()[i] - one.params().values()[i])));
    }
    CHECK(worst < 1e-4);
    CHECK(std::equal(root.begin(), root.end(), t.params().values().begin()));
  }

  // A second job resumes from the final checkpoint (optimizer shards, top-k residuals).
  st::trainer<model_t, Policy> again(small_model(), cfg, strata::comm::any_comm(comm),
                                     {.print_progress = false});
  const st::fit_summary r =
      again.fit(blobs{}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});
  CHECK_FALSE(r.resumed_from.empty());
  if (!server) {
    CHECK(r.params_xxh3 == s.params_xxh3);
  }
}

}  // namespace

TEST_CASE("N processes with B/N samples each train like one process with B") {
  // bucket_launch = auto reduces each bucket by a blocking call over MPI.
  static_assert(!strata::comm::nonblocking_progresses<mpi>);
  auto world = mpi::world();
  CHECK_FALSE(strata::comm::any_comm(world).progresses_nonblocking());
  auto cfg = base_config("parallel-launch", world.rank());
  world.barrier();
  cfg.world_size = world.size();
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  cfg.batch_size_per_gpu = 64 / world.size();
  const st::trainer<model_t, strata::parallel::data<>> t(
      small_model(), cfg, strata::comm::any_comm(world), {.print_progress = false});
  CHECK(t.executor().blocking_buckets());
  check_against_one_process<strata::parallel::data<>>("parallel", [](auto&) {});
}

TEST_CASE("over MPI, bucket_launch = async (non-blocking buckets) also trains like one process") {
  check_against_one_process<strata::parallel::data<>>("parallel-async", [](auto& cfg) {
    cfg.bucket_launch = strata::config::bucket_launch_kind::async;
  });
}

TEST_CASE("over MPI, polling the reducer moves its non-blocking buckets along before finish") {
  // Open MPI's non-blocking collectives advance only inside MPI calls: without poll() (which
  // group_done and part_done call on such a backend) the buckets would sit until finish().
  auto world = mpi::world();
  std::vector<float> grads(3000);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    grads[i] = static_cast<float>(world.rank() + 1) + static_cast<float>(i);
  }
  const std::vector<strata::parallel::grad_bucket> buckets{
      {.offset = 2000, .size = 1000, .first_group = 2},
      {.offset = 0, .size = 2000, .first_group = 0, .last_group = 1}};
  strata::parallel::bucket_reducer reducer(strata::comm::any_comm(world), buckets);
  reducer.begin(grads);
  reducer.group_done(2);  // the first bucket starts, and is polled once
  REQUIRE(reducer.reductions() == 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (reducer.poll() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  CHECK(reducer.poll() == 1);
  // Complete before finish(): the average is there already.
  const float ranks = static_cast<float>(world.size());
  const float mean_rank = (ranks + 1.0f) / 2.0f;
  CHECK(grads[2000] == doctest::Approx(mean_rank + 2000.0f));
  CHECK(grads[0] == static_cast<float>(world.rank() + 1));  // the second bucket has not started
  reducer.group_done(0);
  reducer.finish();
  for (std::size_t i = 0; i < grads.size(); i += 499) {
    INFO("float ", i);
    CHECK(grads[i] == doctest::Approx(mean_rank + static_cast<float>(i)));
  }
}

TEST_CASE("zero1 over MPI trains like one process and holds 1/N of the optimizer state") {
  check_against_one_process<strata::parallel::zero1>("zero1",
                                                     [](auto& cfg) { cfg.zero_stage = 1; });
  // What a rank's trainer allocates: all parameters and gradients, 1/N of AdamW's moments.
  auto comm = mpi::world();
  const int ranks = comm.size();
  auto cfg = base_config("zero1-memory", comm.rank());
  comm.barrier();
  cfg.world_size = ranks;
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  cfg.batch_size_per_gpu = 64 / ranks;
  cfg.optimizer = strata::config::optimizer_kind::adamw;
  cfg.zero_stage = 1;
  const std::size_t before = strata::host{}.memory().stats().in_use;
  st::trainer<model_t, strata::parallel::zero1> t(small_model(), cfg, strata::comm::any_comm(comm),
                                                  {.print_progress = false});
  const std::size_t held = strata::host{}.memory().stats().in_use - before;
  CHECK(held == st::estimate_memory(
                    small_model(), 1,
                    {.optimizer_state_per_parameter = 2, .shards = static_cast<std::size_t>(ranks)})
                    .model_state());
}

TEST_CASE("the parameter server over MPI trains like one process") {
  namespace par = strata::parallel;
  check_against_one_process<par::data<par::parameter_server>>("ps", [](auto& cfg) {
    cfg.gradient_sync = strata::config::gradient_sync_kind::parameter_server;
  });
  check_against_one_process<par::data<par::parameter_server>>("ps-one-server", [](auto& cfg) {
    cfg.gradient_sync = strata::config::gradient_sync_kind::parameter_server;
    cfg.parameter_servers = 1;
  });
  // Dedicated: half of the processes serve, the other half train with 64 / (N / 2) each.
  check_against_one_process<par::data<par::parameter_server>>("ps-dedicated", [](auto& cfg) {
    cfg.gradient_sync = strata::config::gradient_sync_kind::parameter_server;
    cfg.parameter_servers = cfg.world_size / 2;
    cfg.dedicated_parameter_servers = true;
    cfg.batch_size_per_gpu = 64 / (cfg.world_size / 2);
  });
  // Non-blocking buckets: each bucket's pieces go to their servers during backward (polled).
  check_against_one_process<par::data<par::parameter_server>>("ps-async", [](auto& cfg) {
    cfg.gradient_sync = strata::config::gradient_sync_kind::parameter_server;
    cfg.bucket_launch = strata::config::bucket_launch_kind::async;
  });
}

TEST_CASE("the parameter-server push in pieces over MPI: several in flight, polled, exact") {
  namespace par = strata::parallel;
  auto world = mpi::world();
  const auto ranks = static_cast<std::size_t>(world.size());
  const std::size_t n = 4000 * ranks;  // shards of 4000 floats with every rank a server
  std::vector<float> grads(n);
  for (std::size_t i = 0; i < n; ++i) {
    grads[i] = static_cast<float>(world.rank() + 1) + 0.5f * static_cast<float>(i % 97);
  }
  std::vector<float> whole = grads;
  par::ps_exchange reference(strata::comm::any_comm(world), n, world.size());
  reference.push(whole);
  // Five buckets from the end down, each cutting across shard boundaries; one of one float.
  const std::vector<par::grad_bucket> buckets{{.offset = n - 3000, .size = 3000, .first_group = 4},
                                              {.offset = n - 3001, .size = 1, .first_group = 3},
                                              {.offset = 2500, .size = n - 5501, .first_group = 2},
                                              {.offset = 1000, .size = 1500, .first_group = 1},
                                              {.offset = 0, .size = 1000, .first_group = 0}};
  par::ps_exchange ps(strata::comm::any_comm(world), n, world.size());
  par::bucket_reducer reducer(strata::comm::any_comm(world), ps, buckets);
  reducer.begin(grads);
  for (int g = 4; g >= 0; --g) {
    reducer.group_done(static_cast<std::size_t>(g));  // starts bucket 4 - g, polls
    CHECK(reducer.reductions() == static_cast<std::size_t>(5 - g));
    if (g == 4 && world.rank() == world.size() - 1) {
      // Bucket 0 lies in the last rank's shard: its first receive (rank 0's piece) completes
      // while the other buckets are still to come, moved on by polls alone.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (reducer.poll() < 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      CHECK(reducer.poll() >= 1);
    }
  }
  reducer.finish();
  const std::size_t lo = ps.shard_begin(world.rank());
  for (std::size_t i = lo; i < lo + ps.shard_size(); ++i) {
    if (grads[i] != whole[i]) {
      FAIL_CHECK("float " << i << ": " << grads[i] << " in pieces, " << whole[i] << " whole");
      break;
    }
  }
  const float mean_rank = (static_cast<float>(ranks) + 1.0f) / 2.0f;
  CHECK(grads[lo] == doctest::Approx(mean_rank + 0.5f * static_cast<float>(lo % 97)));
}

TEST_CASE("top-k with ratio 1 over MPI trains like one process, by all-gather and server") {
  namespace par = strata::parallel;
  check_against_one_process<par::data<par::all_gather, par::compress::topk>>(
      "topk-gather", [](auto& cfg) {
        cfg.gradient_sync = strata::config::gradient_sync_kind::all_gather;
        cfg.gradient_compression = strata::config::compression_kind::topk;
        cfg.topk_ratio = 1.0;
      });
  check_against_one_process<par::data<par::parameter_server, par::compress::topk>>(
      "topk-server", [](auto& cfg) {
        cfg.gradient_sync = strata::config::gradient_sync_kind::parameter_server;
        cfg.gradient_compression = strata::config::compression_kind::topk;
        cfg.topk_ratio = 1.0;
      });
}

TEST_CASE("the hierarchical all-reduce over MPI trains like one process, in buckets or not") {
  namespace par = strata::parallel;
  check_against_one_process<par::data<par::hierarchical>>("hierarchical", [](auto& cfg) {
    cfg.gradient_sync = strata::config::gradient_sync_kind::hierarchical;
    cfg.hierarchy_group_size = 2;  // 2 processes: one group; 4: two groups of 2
  });
  // Non-blocking buckets: the three stages move on from polls during backward and finish().
  check_against_one_process<par::data<par::hierarchical>>("hierarchical-async", [](auto& cfg) {
    cfg.gradient_sync = strata::config::gradient_sync_kind::hierarchical;
    cfg.hierarchy_group_size = 2;
    cfg.bucket_launch = strata::config::bucket_launch_kind::async;
  });
}

namespace {

// Dedicated asynchronous servers on the upper half of the ranks, staleness 1, over MPI.
template <class Precision>
void check_async_parameter_server(const std::string& name,
                                  strata::config::precision_dtype precision) {
  namespace par = strata::parallel;
  auto comm = mpi::world();
  const int ranks = comm.size();
  const int rank = comm.rank();
  auto cfg = base_config(name, rank);
  comm.barrier();
  cfg.mixed_precision_dtype = precision;
  cfg.world_size = ranks;
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  cfg.gradient_sync = strata::config::gradient_sync_kind::parameter_server;
  cfg.parameter_servers = ranks / 2;
  cfg.dedicated_parameter_servers = true;
  cfg.parameter_server_async = true;
  cfg.parameter_server_staleness = 1;
  cfg.batch_size_per_gpu = 64 / (ranks / 2);
  cfg.momentum = 0.0;
  cfg.weight_decay = 0.0;
  st::trainer<model_t, par::data<par::parameter_server>, Precision> t(
      small_model(), cfg, strata::comm::any_comm(comm), {.print_progress = false});
  const st::fit_summary s =
      t.fit(blobs{}, sd::identity{}, blobs{.n = 256, .salt = 1}, sd::identity{});
  if (rank < ranks / 2) {
    CHECK(s.test_accuracy > 0.7);
  } else {
    CHECK(t.executor().max_lead() <= 1);
    CHECK(s.steps == 16);  // 2 epochs of 512 / 64
  }
}

}  // namespace

TEST_CASE("the asynchronous parameter server over MPI keeps its staleness bound and learns") {
  check_async_parameter_server<strata::precision::fp32>("ps-async",
                                                        strata::config::precision_dtype::float32);
}

TEST_CASE("the asynchronous parameter server over MPI with bfloat16 and float16") {
  check_async_parameter_server<strata::precision::bf16>("ps-async-bf16",
                                                        strata::config::precision_dtype::bfloat16);
  check_async_parameter_server<strata::precision::fp16>("ps-async-fp16",
                                                        strata::config::precision_dtype::float16);
}

TEST_CASE("hierarchical buckets over MPI: several in flight, a part of length 0, a 16-bit wire") {
  namespace par = strata::parallel;
  auto world = mpi::world();
  strata::comm::any_comm any(world);
  auto groups = strata::comm::make_hierarchy(any, 2);  // n = 2: one group; n = 4: 2 x 2
  const std::vector<par::grad_bucket> buckets{{.offset = 102, .size = 1, .first_group = 4},
                                              {.offset = 72, .size = 30, .first_group = 3},
                                              {.offset = 40, .size = 32, .first_group = 2},
                                              {.offset = 20, .size = 20, .first_group = 1},
                                              {.offset = 0, .size = 20, .first_group = 0}};
  const auto n = static_cast<float>(world.size());
  std::vector<float> first;
  for (const strata::dtype wire : {strata::dtype::float32, strata::dtype::float16}) {
    INFO("wire ", strata::to_string(wire));
    std::vector<float> grads(103);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      grads[i] = static_cast<float>(world.rank() + 1) + 0.25f * static_cast<float>(i % 8);
    }
    // Non-blocking buckets over MPI progress only when polled: the reports poll them.
    par::bucket_reducer reducer(groups, buckets, strata::dtype::float32, wire, false);
    reducer.begin(grads);
    for (std::size_t group = 5; group-- > 0;) {
      reducer.group_done(group);
    }
    CHECK(reducer.reductions() == 5);
    reducer.finish();
    CHECK(reducer.poll() == 5);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      INFO("float ", i);
      CHECK(grads[i] == (n + 1.0f) / 2.0f + 0.25f * static_cast<float>(i % 8));
    }
    // Every rank holds the same bits.
    std::vector<float> root = grads;
    world.broadcast(root.data(), root.size(), strata::dtype::float32, 0);
    CHECK(root == grads);
    if (first.empty()) {
      first = grads;
    } else {
      CHECK(grads == first);  // exact values: the wire changes nothing here
    }
  }
}
