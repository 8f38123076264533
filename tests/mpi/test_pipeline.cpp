// SPDX-License-Identifier: Apache-2.0
// parallel::pipeline over Open MPI: the stages of one job (pp = N, and dp 2 x pp 2 on 4 ranks)
// train like one process (computed in every process as the reference: losses of every step, each
// stage's tensors against the reference's of the same name), and a second job resumes from the
// checkpoint rank 0 wrote with the same parameters. The same for the mesh (parallel::tensor):
// tp 2 on 2 ranks, dp 2 x tp 2 and tp 2 x pp 2 on 4, on a small vision transformer (each rank's
// slices against the reference's).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/mpi.hpp"
#include "strata/data/transforms.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/parallel/tensor_parallel.hpp"
#include "strata/pipeline.hpp"
#include "strata/train/trainer.hpp"

#include "unit/common/blobs.hpp"
#include "unit/common/vit.hpp"

namespace fs = std::filesystem;
namespace sd = strata::data;
namespace st = strata::train;
namespace pl = strata::pipeline;
using strata::comm::mpi;
using strata::test::blobs;

namespace {

using model_t = decltype(strata::test::blobs_mlp());

strata::config::train_config base_config(const std::string& name, bool shared) {
  auto comm = mpi::world();
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "mpi_pipeline" /
                       (shared ? name : name + "-" + std::to_string(comm.rank()));
  if (!shared || comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  comm.barrier();
  strata::config::train_config cfg;
  cfg.epochs = 2;
  cfg.lr = 0.05;
  cfg.batch_size_per_gpu = 32;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  return cfg;
}

// The reference: one process trains `one` alone; its step losses.
template <class Trainer, class Train, class Test>
std::vector<double> reference_losses(Trainer& one, const Train& train, const Test& test) {
  std::vector<double> losses;
  one.on_step([&](const st::step_metrics& m) { losses.push_back(m.loss); });
  one.fit(train, sd::identity{}, test, sd::identity{});
  return losses;
}

// This process's rank `t` of the job trains like the reference `one` (its `one_losses`): every
// step's loss, this rank's slices of every tensor against the same slices of the reference's
// (a stage's tensors whole), the test accuracy. Then a second job, `make_again()`, resumes from
// the final checkpoint with the same params_xxh3. Returns the first job's summary.
template <class Trainer, class Reference, class Make, class Train, class Test>
st::fit_summary check_like_one_process(Trainer& t, Reference& one,
                                       const std::vector<double>& one_losses, Make make_again,
                                       const Train& train, const Test& test) {
  std::vector<double> losses;
  t.on_step([&](const st::step_metrics& m) { losses.push_back(m.loss); });
  const st::fit_summary s = t.fit(train, sd::identity{}, test, sd::identity{});
  REQUIRE(losses.size() == one_losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    CHECK(losses[i] == doctest::Approx(one_losses[i]).epsilon(1e-5));
  }
  double worst = 0.0;
  for (const auto& e : t.params().entries()) {
    const auto mine = t.params().value(e.name);
    std::vector<float> theirs(mine.size());
    strata::model::param_store::copy_slice(e, one.params().value(e.name), theirs);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(mine[i] - theirs[i])));
    }
  }
  CHECK(worst < 1e-4);
  CHECK(s.test_accuracy ==
        doctest::Approx(one.evaluate(test, sd::identity{}).accuracy).epsilon(1e-6));
  // Every stage's and tensor rank's parameters come back.
  auto again = make_again();
  const st::fit_summary r = again.fit(train, sd::identity{}, test, sd::identity{});
  CHECK_FALSE(r.resumed_from.empty());
  CHECK(r.params_xxh3 == s.params_xxh3);
  return s;
}

template <class Schedule>
void check_pipeline(int stages, strata::config::pipeline_schedule_kind kind) {
  auto comm = mpi::world();
  const int ranks = comm.size();
  const int replicas = ranks / stages;
  const std::string name = std::string(Schedule::name) + "-pp" + std::to_string(stages);
  INFO(name);
  auto one_cfg = base_config(name + "-reference", false);
  one_cfg.batch_size_per_gpu = 32 * replicas;
  st::trainer<model_t> one(strata::test::blobs_mlp(), one_cfg,
                           {.print_progress = false, .independent_processes = true});
  const std::vector<double> one_losses = reference_losses(one, blobs{}, blobs{.n = 256, .salt = 1});

  auto cfg = base_config(name, true);
  cfg.world_size = ranks;
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  cfg.pipeline_parallel_size = stages;
  cfg.pipeline_schedule = kind;
  cfg.micro_batches = 3;  // 11, 11 and 10 samples
  using trainer_t = st::trainer<model_t, strata::parallel::pipeline<Schedule>>;
  const auto make = [&] {
    return trainer_t(strata::test::blobs_mlp(), cfg, strata::comm::any_comm(comm),
                     {.print_progress = false});
  };
  trainer_t t = make();
  (void)check_like_one_process(t, one, one_losses, make, blobs{}, blobs{.n = 256, .salt = 1});
}

template <class Policy>
void check_mesh(int tp, int pp) {
  using strata::test::blob_images;
  using vit_t = decltype(strata::test::image_vit());
  auto comm = mpi::world();
  const int ranks = comm.size();
  const int replicas = ranks / (tp * pp);
  const std::string name = "mesh-tp" + std::to_string(tp) + "-pp" + std::to_string(pp);
  INFO(name);
  auto one_cfg = base_config(name + "-reference", false);
  one_cfg.batch_size_per_gpu = 32 * replicas;
  st::trainer<vit_t> one(strata::test::image_vit(), one_cfg,
                         {.print_progress = false, .independent_processes = true});
  const std::vector<double> one_losses =
      reference_losses(one, blob_images{}, blob_images{.n = 256, .salt = 1});

  auto cfg = base_config(name, true);
  cfg.run_name = "vit";  // the third job below continues it under another layout
  cfg.world_size = ranks;
  cfg.communication_backend = strata::config::comm_backend_kind::mpi;
  cfg.tensor_parallel_size = tp;
  cfg.pipeline_parallel_size = pp;
  if (pp > 1) {
    cfg.pipeline_schedule = strata::config::pipeline_schedule_kind::one_f_one_b;
    cfg.micro_batches = 2;
    // The second job must cut the stages as the first did (a probe may not).
    cfg.policy["pipeline_balance"] = "estimated";
  }
  using trainer_t = st::trainer<vit_t, Policy>;
  const auto make = [&] {
    return trainer_t(strata::test::image_vit(), cfg, strata::comm::any_comm(comm),
                     {.print_progress = false});
  };
  trainer_t t = make();
  const st::fit_summary s = check_like_one_process(t, one, one_losses, make, blob_images{},
                                                   blob_images{.n = 256, .salt = 1});

  // A third job loads the checkpoint as plain data parallelism over every process (the same 32
  // x replicas samples a batch): each process holds every tensor whole, bit for bit the slices'.
  auto dp = cfg;
  dp.tensor_parallel_size = 1;
  dp.pipeline_parallel_size = 1;
  dp.micro_batches = strata::config::train_config{}.micro_batches;
  dp.policy.clear();
  dp.batch_size_per_gpu = 32 * static_cast<std::size_t>(replicas) / static_cast<std::size_t>(ranks);
  dp.resume = strata::config::resume_mode::required;
  st::trainer<vit_t, strata::parallel::data<>> whole(
      strata::test::image_vit(), dp, strata::comm::any_comm(comm), {.print_progress = false});
  const st::fit_summary w =
      whole.fit(blob_images{}, sd::identity{}, blob_images{.n = 256, .salt = 1}, sd::identity{});
  CHECK_FALSE(w.resumed_from.empty());
  CHECK(w.steps_this_run == 0);
  CHECK(s.steps > 0);
  for (const auto& e : t.params().entries()) {
    CAPTURE(e.name);
    const auto mine = t.params().value(e.name);
    std::vector<float> loaded(mine.size());
    strata::model::param_store::copy_slice(e, whole.params().value(e.name), loaded);
    CHECK(std::equal(mine.begin(), mine.end(), loaded.begin()));
  }
}

}  // namespace

TEST_CASE("the dp x tp x pp mesh over MPI trains like one process and resumes") {
  using strata::parallel::tensor;
  const int ranks = mpi::world().size();
  if (ranks == 2) {
    check_mesh<tensor<strata::parallel::data<>>>(2, 1);
  }
  if (ranks == 4) {
    check_mesh<tensor<strata::parallel::data<>>>(2, 1);  // dp 2 x tp 2
    check_mesh<tensor<strata::parallel::pipeline<pl::one_f_one_b>>>(2, 2);
  }
}

TEST_CASE("pipelines over MPI train like one process and resume") {
  const int ranks = mpi::world().size();
  using kind = strata::config::pipeline_schedule_kind;
  check_pipeline<pl::one_f_one_b>(ranks, kind::one_f_one_b);
  check_pipeline<pl::zero_bubble_h1>(ranks, kind::zero_bubble_h1);
  if (ranks == 2) {
    check_pipeline<pl::interleaved_1f1b<2>>(2, kind::interleaved_1f1b);
  }
  if (ranks == 4) {
    check_pipeline<pl::gpipe>(2, kind::gpipe);  // dp 2 x pp 2
  }
}
