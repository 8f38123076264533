// SPDX-License-Identifier: Apache-2.0
// What do overlap and hierarchy buy when the ranks sit behind a slow network? On one machine,
// ranks run as threads (comm::threads) and every communicator is wrapped in comm::emulated, which
// holds each operation back until a modelled link would have carried it (comm/emulated.hpp), here
// 10 Gbit/s Ethernet (network_link::ethernet_10g(): 1.25e9 B/s, 20 us per step).
//
//   build/bench/bench_emulated [--data-dir DIR] [--steps N] [--warmup N] [--rounds 2]
//                              [--iters 20] [--epochs 3] [--topk-ratio 0.01]
//                              [--only overlap|compression|hierarchy] [--json FILE]
//
// 1. Overlap. 2 ranks train parallel::data<all_reduce> on Fashion-MNIST at a global batch of 256
//    (128 per rank, 1 BLAS thread each), for two models: the CNN of example 02 (conv 5x5x32,
//    pool, conv 5x5x64, pool, fc 3136-1024, fc 1024-10) and the MLP of bench_data_parallel
//    (784-1024-1024-10). Each trains (a) with one bucket (bucket_size_mb = 1024): the whole
//    gradient is all-reduced after backward and nothing overlaps; (b) with buckets of 1 MiB: each
//    bucket's all-reduce starts as soon as backward has produced all of its floats, while the
//    layers in front of it are still going back. --steps timed steps per configuration (default
//    40 for the CNN, 150 for the MLP: about 30 s on 2 idle cores) are split over --rounds rounds of
//    (a) then (b), each a fresh run with --warmup untimed steps first, so that a change in the
//    machine's load falls on both. Per step: compute (forward, backward, update),
//    exposed communication (step_metrics::comm_seconds: the wait for the gradients after
//    backward plus the 3-double metrics all-reduce; mean over the timed steps and both ranks),
//    the same for the later rank of each step (see the caveat), samples/s (wall clock over the
//    timed steps), and the modelled time of one all-reduce of the whole gradient on the link
//    (modelled_transfer), which (a) should expose in full.
//    hidden share = 1 - exposed(b) / exposed(a).
//    The ceiling: a bucket can only start once backward has produced every float in it, and the
//    first layer's gradient is the last one backward produces, so the bucket that holds its end
//    (the last in backward order) can never overlap with anything: at best
//    ceiling = 1 - bytes(last bucket) / bytes(all buckets) of the communication is hidden.
//    The CNN's big fc layer (98% of the parameters) is cut into 1 MiB parts, reduced while the
//    conv layers (most of the compute) go back, and its last bucket holds only the two conv
//    layers (1.6%). The MLP's two large layers are cut into 1 MiB parts too, and linear reports
//    its weight gradient in blocks of rows as it computes them, so each part travels while the
//    layer computes the next; its last bucket is the end of the first layer (0.9%).
//    A second limit is time: a bucket hides only behind the backward that is left after it
//    starts.
//    Caveat of the model: an operation's modelled time runs from this rank's issue time, and
//    the inner all-reduce completes only when both ranks have issued it, so the rank whose
//    backward ends first also waits for the other (the skew, which on a loaded 2-core machine
//    can exceed the transfer). The later rank of each step waits for the link alone: the
//    "late rank" column is, per step, the smaller of the two ranks' comm_seconds. It can read
//    below the modelled time: comm::threads reduces on per-rank progress threads, which wake
//    when the later rank issues the all-reduce and, on 2 cores, can keep that rank's own thread
//    off the CPU for a few ms while the modelled link is already busy; that time counts as
//    compute.
//    Last line: the same (a) / (b) for the MLP with parallel::data<hierarchical> on 4 ranks in
//    groups of 2 (global batch 256, every link ethernet_10g): with buckets, each goes through
//    the three stages (reduce inside the group, all-reduce across, broadcast inside) while
//    backward goes on; and (c) bucket_launch = blocking, which sends the whole gradient through
//    comm::hierarchical_all_reduce (rings) after backward, the path before buckets. Bytes count
//    the split communicators too (bytes_sent_with_splits). emulated books a reduce or broadcast
//    as the whole part on every rank (its cost table), more than the ring's (g - 1) / g, and the
//    stage-C split has its own link clock: compare (b) with (c) on samples/s.
//    And (a) / (b) for the MLP with parallel::data<parameter_server>, 2 ranks that both serve:
//    each pushes the half of the gradient in the other's shard after backward, or bucket by
//    bucket as backward completes it; the pull after the update is the same in both.
//
// 2. Hierarchy (no training). 4 ranks, one all-reduce (sum) of the MLP's gradient (its
//    parameter count of float32), median time over --iters iterations after --warmup:
//    (a) a flat ring (comm::all_reduce(..., all_reduce_algorithm::ring)) over the world, every
//        rank's link ethernet_10g: every ring step crosses the slow link;
//    (b) comm::hierarchical_all_reduce over groups of 2 consecutive ranks (make_hierarchy): a ring
//        reduce-scatter inside the group on a fast link (network_link::infiniband_hdr(), standing
//        for the link inside a node), a ring all-reduce of each rank's half across the groups on
//        ethernet_10g, and a ring all-gather inside the group on the fast link;
//    (c) the flat ring with every link infiniband_hdr, the reference;
//    (d) the flat backend all-reduce (emulated's own all_reduce, which books one ring all-reduce
//        from the cost table) on ethernet_10g: what parallel::data<all_reduce> pays per bucket.
//    The rings of (a)-(c) run on point-to-point messages; emulated's link is full duplex (sends on
//    the outgoing direction, receives on the incoming one, independently), so a ring over
//    messages books what (d)'s one all-reduce does. Bytes per rank on each link are what it
//    sends (emulated::bytes_sent()); "modelled" is emulated::delay_seconds() (the link time of
//    the outgoing direction, queueing excluded). Each rank r contributes (r + 1) + (i mod 7) at
//    element i, so every sum is exact; #wrong counts the elements, over all ranks, that differ from
//    it (as nccl-tests prints), and (a) and (b) must agree bit for bit.
//
// 3. Compression. The MLP trains --epochs epochs of the whole training set on 2 ranks behind the
//    same link with (a) parallel::data<all_reduce> (1 MiB buckets), (b) data<all_reduce,
//    cast<bfloat16>> and (c) data<all_gather, topk> at --topk-ratio (error feedback); the bytes
//    rank 0 sends per step (and the same less the 3-double metrics all-reduce: the gradient
//    bytes), their share of (a)'s gradient bytes, and the test accuracy on all 10000 test
//    images after the same epochs, in points against (a).
//
// Every ratio compares rows measured in the same run. The link presets are nominal rates with
// assumed latencies, for relative comparisons only (comm/emulated.hpp).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/args.hpp"

#include "strata/comm/algorithms.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/emulated.hpp"
#include "strata/comm/threads.hpp"
#include "strata/data.hpp"
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/parallel/data.hpp"
#include "strata/train/trainer.hpp"

namespace sc = strata::config;
namespace sd = strata::data;
namespace sm = strata::model;
namespace sp = strata::parallel;
namespace st = strata::train;
namespace scomm = strata::comm;
using clock_type = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr const char* program = "bench_emulated";

struct options {
  std::string data_dir{sd::fashion_mnist_default_dir};
  std::size_t steps = 0;  // timed training steps; 0: each model's default (see default_steps)
  std::size_t warmup = 2;
  std::size_t rounds = 2;  // overlap: (a), (b) alternate this many times, steps split among them
  std::size_t iters = 20;  // hierarchy: timed all-reduces
  std::size_t epochs = 3;  // compression: epochs of the whole training set per policy
  double topk_ratio = 0.01;
  std::string only{};  // "", "overlap", "compression" or "hierarchy"
  std::string json_path{};
};

void usage_and_exit() {
  std::fprintf(
      stderr,
      "usage: bench_emulated [--data-dir DIR] [--steps N] [--warmup N] [--rounds N] [--iters N] "
      "[--epochs N] [--topk-ratio R] [--only overlap|compression|hierarchy] [--json FILE]\n");
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] { return bench::next_value(argc, argv, i, program); };
    if (a == "--data-dir") {
      o.data_dir = value();
    } else if (a == "--steps") {
      o.steps = std::stoul(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoul(value());
    } else if (a == "--rounds") {
      o.rounds = std::stoul(value());
    } else if (a == "--iters") {
      o.iters = std::stoul(value());
    } else if (a == "--epochs") {
      o.epochs = std::stoul(value());
    } else if (a == "--topk-ratio") {
      o.topk_ratio = std::stod(value());
    } else if (a == "--only") {
      o.only = value();
    } else if (a == "--json") {
      o.json_path = value();
    } else {
      usage_and_exit();
    }
  }
  if (!o.only.empty() && o.only != "overlap" && o.only != "compression" && o.only != "hierarchy") {
    std::fprintf(stderr, "%s: --only takes overlap, compression or hierarchy, not '%s'\n", program,
                 o.only.c_str());
    std::exit(2);
  }
  if (o.warmup == 0 || o.iters == 0 || o.rounds == 0 || o.epochs == 0 ||
      !(o.topk_ratio > 0.0 && o.topk_ratio <= 1.0)) {
    std::fprintf(stderr,
                 "%s: --warmup, --rounds, --iters and --epochs must be >= 1, --topk-ratio in "
                 "(0, 1]\n",
                 program);
    std::exit(2);
  }
  return o;
}

double mean(const std::vector<double>& v) {
  double s = 0.0;
  for (const double x : v) {
    s += x;
  }
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  if (v.empty()) {
    return 0.0;
  }
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// ---- models and data ----------------------------------------------------------------------------

// The CNN of examples/02_fashion_mnist_cnn (same layers, same augmentation).
auto make_cnn() {
  return sm::sequential(
      {.channels = 1, .height = 28, .width = 28},
      sm::conv2d{.in_channels = 1, .out_channels = 32, .kernel = 5, .padding = 2}, sm::relu{},
      sm::max_pool2d{.kernel = 2, .stride = 2},
      sm::conv2d{.in_channels = 32, .out_channels = 64, .kernel = 5, .padding = 2}, sm::relu{},
      sm::max_pool2d{.kernel = 2, .stride = 2}, sm::flatten{}, sm::linear{.in = 3136, .out = 1024},
      sm::relu{}, sm::dropout{.rate = 0.3}, sm::linear{.in = 1024, .out = 10});
}

auto cnn_augmentation() {
  return sd::compose{sd::random_crop{.padding = 2, .fill = 0.0f},
                     sd::horizontal_flip{.probability = 0.5}, sd::fashion_mnist_normalize()};
}

// The MLP of bench_data_parallel (example 01).
auto make_mlp() {
  return sm::sequential({.channels = 1, .height = 28, .width = 28}, sm::flatten{},
                        sm::linear{.in = 784, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 1024, .out = 1024}, sm::relu{}, sm::dropout{.rate = 0.1},
                        sm::linear{.in = 1024, .out = 10});
}

auto mlp_augmentation() {
  return sd::compose{sd::horizontal_flip{.probability = 0.5}, sd::fashion_mnist_normalize()};
}

// The MLP's parameter count (the hierarchy section's message), from its parameter store.
std::size_t mlp_parameter_count() {
  return make_mlp().make_params().parameter_count();
}

struct fashion_mnist {
  sd::idx_dataset train;
  sd::idx_dataset test;
};

// ---- training under an emulated link (sections 1 and 3) ----------------------------------------

constexpr std::size_t global_batch = 256;
constexpr int training_ranks = 2;

// A data-parallel configuration of 2 ranks x 128 samples for `steps` steps (one epoch of exactly
// that many batches). The caller sets the policy's keys (bucket_size_mb, gradient_sync,
// gradient_compression, ...) and may raise epochs / max_eval_samples for an accuracy.
sc::train_config training_config(const options& o, std::size_t steps) {
  sc::train_config cfg;
  cfg.data_dir = o.data_dir;
  cfg.world_size = training_ranks;
  cfg.batch_size_per_gpu = static_cast<std::int64_t>(global_batch) / training_ranks;
  cfg.epochs = 1;
  cfg.max_train_samples = static_cast<std::int64_t>(global_batch * (steps + o.warmup));
  cfg.max_eval_samples = 100;
  cfg.loader_workers = 1;
  cfg.checkpoint_interval = 0;
  cfg.checkpoint_dir = (std::filesystem::temp_directory_path() / "strata_bench_emulated").string();
  cfg.resume = strata::config::resume_mode::never;
  cfg.lr = 0.05;
  cfg.momentum = 0.9;
  cfg.nesterov = true;
  cfg.weight_decay = 5e-4;
  cfg.warmup_epochs = 0.0;
  cfg.log_every = 1000000;
  return cfg;
}

struct training_settings {
  scomm::network_link link = scomm::network_link::ethernet_10g();
  std::size_t warmup = 2;  // steps not timed (the first ones)
  bool evaluate = false;   // report the test accuracy of cfg.max_eval_samples (0: all)
};

// What run_training measured. Times are means over the timed steps of each rank, then over the
// ranks.
struct training_result {
  std::size_t timed_steps = 0;
  double compute_seconds = 0.0;  // per step: forward, backward, optimizer
  double comm_seconds = 0.0;     // per step: exposed communication (step_metrics::comm_seconds)
  // Per step the smaller of the ranks' comm_seconds, averaged: the rank whose backward ended last
  // waits for the link only, the other also for it (see the header on skew).
  double comm_seconds_late_rank = 0.0;
  double samples_per_second = 0.0;   // global samples / wall time of the timed steps (rank 0)
  std::size_t timed_samples = 0;     // global samples of the timed steps
  double timed_seconds = 0.0;        // their wall time (rank 0)
  std::uint64_t bytes_sent = 0;      // by rank 0 on its link during fit() (all steps, evaluation)
  std::uint64_t bytes_per_step = 0;  // per timed step (its own traffic)
  std::optional<double> test_accuracy{};   // when settings.evaluate
  std::size_t gradient_floats = 0;         // the flat gradient buffer (padding included)
  std::vector<sp::grad_bucket> buckets{};  // make_buckets on the trainer's params, backward order
};

// Trains make_model() with trainer<Model, Policy> on cfg.world_size thread ranks, each behind
// comm::emulated with settings.link, passed to the trainer as comm::any_comm. One BLAS thread per
// rank. `Policy` is any data-parallel policy the trainer takes (parallel::data<...>, zero1, ...).
template <class Policy, class MakeModel, class Augment>
training_result run_training(MakeModel&& make_model, sc::train_config cfg, const Augment& augment,
                             const fashion_mnist& data, const training_settings& settings) {
  using model_t = std::invoke_result_t<MakeModel&>;
  if (!settings.evaluate) {
    cfg.max_eval_samples = 100;  // fit() always evaluates; keep it short when nobody looks
  }
  cfg.zero_stage = std::is_same_v<Policy, sp::zero1> ? 1 : 0;
  cfg.blas_threads = 1;
  const auto ranks = static_cast<std::size_t>(cfg.world_size);
  std::vector<std::vector<double>> compute(ranks);
  std::vector<std::vector<double>> comm(ranks);
  training_result result;
  scomm::threads::run(cfg.world_size, [&](scomm::threads& t) {
    scomm::emulated link(std::move(t), settings.link);
    const auto me = static_cast<std::size_t>(link.rank());
    st::trainer<model_t, Policy> trainer(make_model(), cfg, scomm::any_comm(link),
                                         {.print_progress = false});
    clock_type::time_point begin{};
    clock_type::time_point end{};
    std::size_t samples = 0;
    std::uint64_t bytes_begin = 0;
    std::uint64_t bytes_end = 0;
    trainer.on_step([&](const st::step_metrics& m) {
      if (m.step + 1 == settings.warmup) {
        begin = clock_type::now();
        bytes_begin = link.bytes_sent_with_splits();
      } else if (m.step >= settings.warmup) {
        samples += m.samples;
        end = clock_type::now();
        bytes_end = link.bytes_sent_with_splits();
        compute[me].push_back(m.compute_seconds);
        comm[me].push_back(m.comm_seconds);
      }
    });
    const std::uint64_t bytes_before = link.bytes_sent_with_splits();
    const st::fit_summary summary =
        trainer.fit(data.train, augment, data.test, sd::fashion_mnist_normalize());
    std::error_code ignored;  // a measurement keeps no checkpoints (every rank tries)
    std::filesystem::remove_all(trainer.run().directory, ignored);
    if (me == 0) {
      result.bytes_sent = link.bytes_sent_with_splits() - bytes_before;
      // The timed steps' own traffic (evaluation and checkpoints happen between them).
      const std::size_t timed = compute[0].size();
      result.bytes_per_step = timed == 0 ? 0 : (bytes_end - bytes_begin) / timed;
      result.timed_samples = samples;
      result.timed_seconds = std::chrono::duration<double>(end - begin).count();
      result.samples_per_second =
          samples == 0 ? 0.0 : static_cast<double>(samples) / result.timed_seconds;
      if (settings.evaluate) {
        result.test_accuracy = summary.test_accuracy;
      }
      result.gradient_floats = trainer.params().size();
      result.buckets =
          sp::make_buckets(trainer.params(), static_cast<std::size_t>(cfg.bucket_size_mb) << 20);
    }
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    result.compute_seconds += mean(compute[r]) / static_cast<double>(ranks);
    result.comm_seconds += mean(comm[r]) / static_cast<double>(ranks);
  }
  result.timed_steps = compute[0].size();
  std::vector<double> late(result.timed_steps);
  for (std::size_t k = 0; k < late.size(); ++k) {
    late[k] = comm[0][k];
    for (std::size_t r = 1; r < ranks; ++r) {
      late[k] = std::min(late[k], comm[r].at(k));
    }
  }
  result.comm_seconds_late_rank = mean(late);
  return result;
}

json to_json(const training_result& r) {
  json j{{"timed_steps", r.timed_steps},
         {"compute_s_per_step", r.compute_seconds},
         {"exposed_comm_s_per_step", r.comm_seconds},
         {"exposed_comm_s_late_rank", r.comm_seconds_late_rank},
         {"samples_per_s", r.samples_per_second},
         {"bytes_sent_per_rank", r.bytes_sent},
         {"bytes_sent_per_rank_per_step", r.bytes_per_step},
         {"buckets", r.buckets.size()}};
  if (r.test_accuracy) {
    j["test_accuracy"] = *r.test_accuracy;
  }
  return j;
}

// Several runs of one configuration as one: per-step means weighted by the timed steps, samples/s
// over the summed wall time, bytes summed; the rest from the last run.
training_result combine(const std::vector<training_result>& runs) {
  training_result out = runs.back();
  out.timed_steps = 0;
  out.compute_seconds = 0.0;
  out.comm_seconds = 0.0;
  out.comm_seconds_late_rank = 0.0;
  out.timed_samples = 0;
  out.timed_seconds = 0.0;
  out.bytes_sent = 0;
  std::size_t all_steps = 0;
  for (const training_result& r : runs) {
    const auto w = static_cast<double>(r.timed_steps);
    out.compute_seconds += r.compute_seconds * w;
    out.comm_seconds += r.comm_seconds * w;
    out.comm_seconds_late_rank += r.comm_seconds_late_rank * w;
    out.timed_steps += r.timed_steps;
    out.timed_samples += r.timed_samples;
    out.timed_seconds += r.timed_seconds;
    out.bytes_sent += r.bytes_sent;
    all_steps += r.bytes_per_step == 0 ? 0 : r.bytes_sent / r.bytes_per_step;
  }
  if (out.timed_steps != 0) {
    const auto n = static_cast<double>(out.timed_steps);
    out.compute_seconds /= n;
    out.comm_seconds /= n;
    out.comm_seconds_late_rank /= n;
  }
  out.samples_per_second =
      out.timed_seconds > 0.0 ? static_cast<double>(out.timed_samples) / out.timed_seconds : 0.0;
  out.bytes_per_step = all_steps == 0 ? 0 : out.bytes_sent / all_steps;
  return out;
}

// ---- section 1: overlap -------------------------------------------------------------------------

constexpr std::int64_t one_bucket_mb = 1024;  // larger than either model's gradient
constexpr std::int64_t small_bucket_mb = 1;

// Default timed steps per model: the whole section stays under a minute on 2 cores.
std::size_t default_steps(const options& o, bool cnn) {
  if (o.steps != 0) {
    return o.steps;
  }
  return cnn ? 40 : 150;
}

struct overlap_row {
  std::string model{};
  std::size_t parameters = 0;
  double modelled_seconds = 0.0;  // one all-reduce of the whole gradient on the link
  double ceiling = 0.0;           // 1 - last bucket / all, for the 1 MiB buckets
  std::size_t last_bucket_floats = 0;
  training_result serial{};      // (a) one bucket
  training_result overlapped{};  // (b) buckets of 1 MiB
};

// `tune` adjusts the configuration (the hierarchical row: 4 ranks in groups of 2).
template <class Policy = sp::data<>, class MakeModel, class Augment>
overlap_row overlap_for(const std::string& name, const options& o, bool cnn, MakeModel&& make_model,
                        const Augment& augment, const fashion_mnist& data,
                        const std::function<void(sc::train_config&)>& tune = {}) {
  // The rounds alternate (a) and (b), so that a change in the machine's load during the run
  // falls on both.
  const std::size_t steps = (default_steps(o, cnn) + o.rounds - 1) / o.rounds;
  const training_settings settings{.link = scomm::network_link::ethernet_10g(), .warmup = o.warmup};
  auto cfg = training_config(o, steps);
  if (tune) {
    tune(cfg);
  }
  std::vector<training_result> serial;
  std::vector<training_result> overlapped;
  for (std::size_t round = 0; round < o.rounds; ++round) {
    cfg.bucket_size_mb = one_bucket_mb;
    serial.push_back(run_training<Policy>(make_model, cfg, augment, data, settings));
    cfg.bucket_size_mb = small_bucket_mb;
    overlapped.push_back(run_training<Policy>(make_model, cfg, augment, data, settings));
  }
  overlap_row row{.model = name};
  row.serial = combine(serial);
  row.overlapped = combine(overlapped);
  row.parameters = make_model().make_params().parameter_count();
  const std::size_t floats = row.overlapped.gradient_floats;
  row.modelled_seconds = scomm::modelled_transfer(settings.link, scomm::op_kind::all_reduce, floats,
                                                  strata::dtype::float32, training_ranks)
                             .seconds;
  if (!row.overlapped.buckets.empty()) {
    row.last_bucket_floats = row.overlapped.buckets.back().size;
    row.ceiling = 1.0 - static_cast<double>(row.last_bucket_floats) / static_cast<double>(floats);
  }
  return row;
}

json run_overlap(const options& o, const fashion_mnist& data) {
  const auto link = scomm::network_link::ethernet_10g();
  std::vector<overlap_row> rows;
  rows.push_back(overlap_for("CNN", o, true, make_cnn, cnn_augmentation(), data));
  rows.push_back(overlap_for("MLP", o, false, make_mlp, mlp_augmentation(), data));

  std::printf(
      "# 1. Overlap: parallel::data<all_reduce>, 2 ranks (threads, 1 BLAS thread each) behind "
      "emulated %s (%.3g B/s, %.0f us/step), global batch %zu; %zu rounds of (a) then (b), each "
      "timing its steps after %zu warmup\n",
      link.name.c_str(), link.bandwidth_bytes_per_second, link.latency_seconds * 1e6, global_batch,
      o.rounds, o.warmup);
  std::printf("%-5s %-18s %6s %11s %11s %13s %10s %9s\n", "model", "buckets", "steps", "compute_ms",
              "exposed_ms", "late_rank_ms", "samples/s", "vs_one");
  json out_rows = json::array();
  for (const auto& r : rows) {
    const std::pair<const char*, const training_result*> runs[] = {{"(a) 1024 MiB", &r.serial},
                                                                   {"(b) 1 MiB", &r.overlapped}};
    for (const auto& [label, t] : runs) {
      const std::string buckets = std::string(label) + " x" + std::to_string(t->buckets.size());
      std::printf("%-5s %-18s %6zu %11.1f %11.2f %13.2f %10.0f %8.2fx\n", r.model.c_str(),
                  buckets.c_str(), t->timed_steps, t->compute_seconds * 1e3, t->comm_seconds * 1e3,
                  t->comm_seconds_late_rank * 1e3, t->samples_per_second,
                  t->samples_per_second / r.serial.samples_per_second);
    }
  }
  // exposed(a) / modelled: the one-bucket wait against one all-reduce of the whole gradient on
  // the link; about 1 for the later rank (plus the metrics all-reduce), above it with skew.
  std::printf("%-5s %10s %9s %12s %12s %14s %8s %12s %8s\n", "model", "params", "grad_MB",
              "modelled_ms", "(a)/modelled", "(a)late/model", "buckets", "last_bucket", "ceiling");
  for (const auto& r : rows) {
    const double bytes = static_cast<double>(r.overlapped.gradient_floats) * 4.0;
    std::printf("%-5s %10zu %9.2f %12.2f %11.2fx %13.2fx %8zu %11.1f%% %7.1f%%\n", r.model.c_str(),
                r.parameters, bytes / 1e6, r.modelled_seconds * 1e3,
                r.serial.comm_seconds / r.modelled_seconds,
                r.serial.comm_seconds_late_rank / r.modelled_seconds, r.overlapped.buckets.size(),
                100.0 * (1.0 - r.ceiling), 100.0 * r.ceiling);
  }
  for (const auto& r : rows) {
    const double hidden = 1.0 - r.overlapped.comm_seconds / r.serial.comm_seconds;
    const double hidden_late =
        1.0 - r.overlapped.comm_seconds_late_rank / r.serial.comm_seconds_late_rank;
    std::printf(
        "# %s: hidden share = 1 - exposed(b) / exposed(a) = %.1f%% (later rank: %.1f%%), "
        "ceiling %.1f%%; step time %.1f -> %.1f ms\n",
        r.model.c_str(), 100.0 * hidden, 100.0 * hidden_late, 100.0 * r.ceiling,
        1e3 * static_cast<double>(global_batch) / r.serial.samples_per_second,
        1e3 * static_cast<double>(global_batch) / r.overlapped.samples_per_second);
    out_rows.push_back({{"model", r.model},
                        {"parameters", r.parameters},
                        {"gradient_bytes", r.overlapped.gradient_floats * 4},
                        {"modelled_all_reduce_s", r.modelled_seconds},
                        {"last_bucket_floats", r.last_bucket_floats},
                        {"ceiling", r.ceiling},
                        {"hidden_share", hidden},
                        {"hidden_share_late_rank", hidden_late},
                        {"one_bucket", to_json(r.serial)},
                        {"buckets_1mib", to_json(r.overlapped)}});
  }
  // data<hierarchical> on 4 ranks in groups of 2, every link 10 GbE: the three stages of each
  // bucket (reduce inside the group, all-reduce across, broadcast inside) while backward goes on.
  const auto four_ranks = [](sc::train_config& cfg) {
    cfg.world_size = 4;
    cfg.batch_size_per_gpu = static_cast<std::int64_t>(global_batch) / 4;
    cfg.gradient_sync = sc::gradient_sync_kind::hierarchical;
    cfg.hierarchy_group_size = 2;
  };
  const overlap_row h = overlap_for<sp::data<sp::hierarchical>>(
      "MLP", o, false, make_mlp, mlp_augmentation(), data, four_ranks);
  // (c) the whole gradient through hierarchical_all_reduce (rings over point-to-point) after
  // backward: what bucket_launch = blocking (and auto over MPI) runs.
  std::vector<training_result> whole_runs;
  {
    const std::size_t steps = (default_steps(o, false) + o.rounds - 1) / o.rounds;
    auto cfg = training_config(o, steps);
    four_ranks(cfg);
    cfg.bucket_launch = sc::bucket_launch_kind::blocking;
    for (std::size_t round = 0; round < o.rounds; ++round) {
      whole_runs.push_back(run_training<sp::data<sp::hierarchical>>(
          make_mlp, cfg, mlp_augmentation(), data,
          {.link = scomm::network_link::ethernet_10g(), .warmup = o.warmup}));
    }
  }
  const training_result whole = combine(whole_runs);
  const double h_hidden = 1.0 - h.overlapped.comm_seconds / h.serial.comm_seconds;
  const double h_hidden_late =
      1.0 - h.overlapped.comm_seconds_late_rank / h.serial.comm_seconds_late_rank;
  std::printf(
      "# MLP, data<hierarchical>, 4 ranks in groups of 2, all links %s (exposed / later rank "
      "ms, samples/s, bytes sent per rank and step): (a) one bucket %.2f / %.2f, %.0f, %.2f MB; "
      "(b) %zu buckets of 1 MiB %.2f / %.2f, %.0f, %.2f MB; (c) whole gradient by rings after "
      "backward %.2f / %.2f, %.0f, %.2f MB. Hidden share (b) against (a) %.1f%% (later rank "
      "%.1f%%); samples/s (b)/(a) %.2fx, (b)/(c) %.2fx\n",
      link.name.c_str(), h.serial.comm_seconds * 1e3, h.serial.comm_seconds_late_rank * 1e3,
      h.serial.samples_per_second, static_cast<double>(h.serial.bytes_per_step) / 1e6,
      h.overlapped.buckets.size(), h.overlapped.comm_seconds * 1e3,
      h.overlapped.comm_seconds_late_rank * 1e3, h.overlapped.samples_per_second,
      static_cast<double>(h.overlapped.bytes_per_step) / 1e6, whole.comm_seconds * 1e3,
      whole.comm_seconds_late_rank * 1e3, whole.samples_per_second,
      static_cast<double>(whole.bytes_per_step) / 1e6, 100.0 * h_hidden, 100.0 * h_hidden_late,
      h.overlapped.samples_per_second / h.serial.samples_per_second,
      h.overlapped.samples_per_second / whole.samples_per_second);
  json hierarchical{{"model", "MLP"},
                    {"ranks", 4},
                    {"group_size", 2},
                    {"hidden_share", h_hidden},
                    {"hidden_share_late_rank", h_hidden_late},
                    {"one_bucket", to_json(h.serial)},
                    {"buckets_1mib", to_json(h.overlapped)},
                    {"whole_gradient_rings", to_json(whole)}};
  // data<parameter_server> on 2 ranks, both co-located servers, 10 GbE: each rank pushes the
  // half of the gradient in the other's shard, (a) after backward, (b) bucket by bucket during
  // it; the pull of the updated shards follows the update in both (it counts as compute).
  const auto servers = [](sc::train_config& cfg) {
    cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  };
  const overlap_row p = overlap_for<sp::data<sp::parameter_server>>(
      "MLP", o, false, make_mlp, mlp_augmentation(), data, servers);
  const double p_hidden = 1.0 - p.overlapped.comm_seconds / p.serial.comm_seconds;
  const double p_hidden_late =
      1.0 - p.overlapped.comm_seconds_late_rank / p.serial.comm_seconds_late_rank;
  std::printf(
      "# MLP, data<parameter_server>, 2 ranks, both co-located servers, %s (exposed / later rank "
      "ms, samples/s): (a) push after backward %.2f / %.2f, %.0f; (b) %zu buckets of 1 MiB "
      "pushed during backward %.2f / %.2f, %.0f. Hidden share %.1f%% (later rank %.1f%%); "
      "samples/s (b)/(a) %.2fx\n",
      link.name.c_str(), p.serial.comm_seconds * 1e3, p.serial.comm_seconds_late_rank * 1e3,
      p.serial.samples_per_second, p.overlapped.buckets.size(), p.overlapped.comm_seconds * 1e3,
      p.overlapped.comm_seconds_late_rank * 1e3, p.overlapped.samples_per_second, 100.0 * p_hidden,
      100.0 * p_hidden_late, p.overlapped.samples_per_second / p.serial.samples_per_second);
  json parameter_server{{"model", "MLP"},
                        {"ranks", 2},
                        {"hidden_share", p_hidden},
                        {"hidden_share_late_rank", p_hidden_late},
                        {"push_after_backward", to_json(p.serial)},
                        {"buckets_1mib", to_json(p.overlapped)}};
  return json{
      {"link", link.name}, {"global_batch", global_batch}, {"rounds", o.rounds},
      {"rows", out_rows},  {"hierarchical", hierarchical}, {"parameter_server", parameter_server}};
}

// ---- section 2: hierarchy -----------------------------------------------------------------------

using emulated_threads = scomm::emulated<scomm::threads>;

struct hierarchy_row {
  std::string name{};
  std::string links{};
  double seconds = 0.0;           // median over the timed iterations (rank 0, between barriers)
  double modelled_seconds = 0.0;  // link time per all-reduce, summed over the communicators
  std::uint64_t slow_bytes = 0;   // per rank per all-reduce on ethernet_10g
  std::uint64_t fast_bytes = 0;   // per rank per all-reduce on the fast link
  std::size_t wrong = 0;          // elements that differ from the exact sum, over all ranks
};

// Rank r's contribution at element i; the sum over n ranks is exact in float.
float input_value(int rank, std::size_t i) {
  return static_cast<float>(rank + 1) + static_cast<float>(i % 7);
}

float expected_sum(int ranks, std::size_t i) {
  return static_cast<float>(ranks * (ranks + 1) / 2) +
         static_cast<float>(ranks) * static_cast<float>(i % 7);
}

json run_hierarchy(const options& o) {
  constexpr int ranks = 4;
  constexpr int group = 2;
  const auto slow = scomm::network_link::ethernet_10g();
  const auto fast = scomm::network_link::infiniband_hdr();
  const std::size_t count = mlp_parameter_count();
  const std::size_t runs = o.warmup + o.iters;

  enum { flat_slow, hierarchical, flat_fast, flat_native, hierarchical_bf16, modes };
  std::vector<hierarchy_row> rows(modes);
  rows[flat_slow] = {.name = "(a) flat ring", .links = "all " + slow.name};
  rows[hierarchical] = {.name = "(b) hierarchical, groups of 2",
                        .links = "local " + fast.name + ", cross " + slow.name};
  rows[flat_fast] = {.name = "(c) flat ring (reference)", .links = "all " + fast.name};
  rows[flat_native] = {.name = "(d) flat backend all_reduce", .links = "all " + slow.name};
  rows[hierarchical_bf16] = {.name = "(e) hierarchical, bf16 wire",
                             .links = "local " + fast.name + ", cross " + slow.name};
  std::vector<std::vector<double>> times(modes);
  std::vector<std::size_t> wrong(static_cast<std::size_t>(ranks) * modes, 0);
  std::vector<std::size_t> a_differs_from_b(ranks, 0);

  scomm::threads::run(ranks, [&](scomm::threads& t) {
    emulated_threads world(std::move(t), slow);
    const int me = world.rank();
    // Local groups of 2 consecutive ranks and the ranks of equal position across them; both
    // inherit the world's link, and the local one gets the fast link.
    scomm::hierarchy<emulated_threads> h = scomm::make_hierarchy(world, group);
    h.local().with_link(fast);

    std::vector<float> input(count);
    for (std::size_t i = 0; i < count; ++i) {
      input[i] = input_value(me, i);
    }
    std::vector<float> data(count);
    std::vector<float> result_a;
    const auto timed = [&](int mode, const std::function<void()>& all_reduce) {
      for (std::size_t it = 0; it < runs; ++it) {
        std::copy(input.begin(), input.end(), data.begin());
        world.inner().barrier();  // not on the emulated link: it books nothing
        const auto t0 = clock_type::now();
        all_reduce();
        world.inner().barrier();
        const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
        if (me == 0 && it >= o.warmup) {
          times[static_cast<std::size_t>(mode)].push_back(seconds);
        }
      }
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i) {
        bad += data[i] != expected_sum(ranks, i) ? 1 : 0;
      }
      wrong[static_cast<std::size_t>(me) * modes + static_cast<std::size_t>(mode)] = bad;
    };
    // The counters of one communicator over a mode's runs: bytes and link seconds per all-reduce.
    struct counters {
      std::uint64_t bytes = 0;
      double seconds = 0.0;
    };
    const auto snapshot = [](const emulated_threads& c) {
      return counters{c.bytes_sent(), c.delay_seconds()};
    };
    const auto per_run = [&](counters before, const emulated_threads& c) {
      return counters{(c.bytes_sent() - before.bytes) / runs,
                      (c.delay_seconds() - before.seconds) / static_cast<double>(runs)};
    };

    // (a) flat ring over the slow link.
    auto w0 = snapshot(world);
    timed(flat_slow, [&] {
      scomm::all_reduce(world, data, scomm::reduce_op::sum, scomm::all_reduce_algorithm::ring);
    });
    const counters a = per_run(w0, world);
    result_a = data;

    // (b) hierarchical: fast inside the group, slow across.
    const auto l0 = snapshot(h.local());
    const auto c0 = snapshot(h.cross());
    timed(hierarchical, [&] { scomm::hierarchical_all_reduce(h, data, scomm::reduce_op::sum); });
    const counters b_local = per_run(l0, h.local());
    const counters b_cross = per_run(c0, h.cross());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < count; ++i) {
      differ += data[i] != result_a[i] ? 1 : 0;
    }
    a_differs_from_b[static_cast<std::size_t>(me)] = differ;

    // (e) (b) with the values as bfloat16 on every link, as data<hierarchical,
    // compress::cast<bfloat16>> sends gradients (each hop rounds to bfloat16; the sums here are
    // small integers, exact in it). The conversions are timed too.
    std::vector<strata::bfloat16> wire(count);
    const auto l1 = snapshot(h.local());
    const auto c1 = snapshot(h.cross());
    timed(hierarchical_bf16, [&] {
      strata::convert_floats(data.data(), wire.data(), count);
      scomm::hierarchical_all_reduce(h, wire, scomm::reduce_op::sum,
                                     {.narrow_floats = scomm::narrow_float_mode::in_type});
      strata::convert_floats(wire.data(), data.data(), count);
    });
    const counters e_local = per_run(l1, h.local());
    const counters e_cross = per_run(c1, h.cross());

    // (d) the backend's own all_reduce on the slow link (one booking of the ring cost).
    w0 = snapshot(world);
    timed(flat_native, [&] {
      world.all_reduce(data.data(), data.data(), count, strata::dtype::float32,
                       scomm::reduce_op::sum);
    });
    const counters d = per_run(w0, world);

    // (c) flat ring with every link fast.
    world.with_link(fast);
    w0 = snapshot(world);
    timed(flat_fast, [&] {
      scomm::all_reduce(world, data, scomm::reduce_op::sum, scomm::all_reduce_algorithm::ring);
    });
    const counters c = per_run(w0, world);

    if (me == 0) {
      rows[flat_slow].slow_bytes = a.bytes;
      rows[flat_slow].modelled_seconds = a.seconds;
      rows[hierarchical].fast_bytes = b_local.bytes;
      rows[hierarchical].slow_bytes = b_cross.bytes;
      rows[hierarchical].modelled_seconds = b_local.seconds + b_cross.seconds;
      rows[flat_fast].fast_bytes = c.bytes;
      rows[flat_fast].modelled_seconds = c.seconds;
      rows[flat_native].slow_bytes = d.bytes;
      rows[flat_native].modelled_seconds = d.seconds;
      rows[hierarchical_bf16].fast_bytes = e_local.bytes;
      rows[hierarchical_bf16].slow_bytes = e_cross.bytes;
      rows[hierarchical_bf16].modelled_seconds = e_local.seconds + e_cross.seconds;
    }
  });

  for (int m = 0; m < modes; ++m) {
    auto& row = rows[static_cast<std::size_t>(m)];
    row.seconds = median(times[static_cast<std::size_t>(m)]);
    for (int r = 0; r < ranks; ++r) {
      row.wrong += wrong[static_cast<std::size_t>(r) * modes + static_cast<std::size_t>(m)];
    }
  }
  std::size_t differ = 0;
  for (const std::size_t d : a_differs_from_b) {
    differ += d;
  }

  std::printf(
      "# 2. Hierarchy: sum all-reduce of %zu float32 (%.2f MB, the MLP's gradient) on %d ranks "
      "(threads), median of %zu after %zu; slow = %s (%.3g B/s, %.0f us/step), fast = %s (%.3g "
      "B/s, %.1f us/step)\n",
      count, static_cast<double>(count) * 4.0 / 1e6, ranks, o.iters, o.warmup, slow.name.c_str(),
      slow.bandwidth_bytes_per_second, slow.latency_seconds * 1e6, fast.name.c_str(),
      fast.bandwidth_bytes_per_second, fast.latency_seconds * 1e6);
  std::printf("%-30s %-40s %9s %12s %9s %14s %14s %7s\n", "algorithm", "links", "time_ms",
              "modelled_ms", "flat/this", "slow_MB/rank", "fast_MB/rank", "#wrong");
  json out_rows = json::array();
  const double flat = rows[flat_slow].seconds;
  for (const auto& r : rows) {
    std::printf("%-30s %-40s %9.2f %12.2f %8.2fx %14.2f %14.2f %7zu\n", r.name.c_str(),
                r.links.c_str(), r.seconds * 1e3, r.modelled_seconds * 1e3, flat / r.seconds,
                static_cast<double>(r.slow_bytes) / 1e6, static_cast<double>(r.fast_bytes) / 1e6,
                r.wrong);
    out_rows.push_back({{"algorithm", r.name},
                        {"links", r.links},
                        {"median_s", r.seconds},
                        {"modelled_s", r.modelled_seconds},
                        {"flat_over_this", flat / r.seconds},
                        {"slow_link_bytes_per_rank", r.slow_bytes},
                        {"fast_link_bytes_per_rank", r.fast_bytes},
                        {"wrong", r.wrong}});
  }
  std::printf(
      "# flat ring / hierarchical = %.2fx measured, %.2fx modelled; (a) and (b) differ in %zu "
      "elements%s\n",
      flat / rows[hierarchical].seconds,
      rows[flat_slow].modelled_seconds / rows[hierarchical].modelled_seconds, differ,
      differ == 0 ? " (bit-identical)" : "");
  std::printf("# hierarchical float32 / bfloat16 wire = %.2fx measured, %.2fx modelled\n",
              rows[hierarchical].seconds / rows[hierarchical_bf16].seconds,
              rows[hierarchical].modelled_seconds / rows[hierarchical_bf16].modelled_seconds);
  std::printf(
      "# (a) sends %.2fx the bytes of (d): a ring over messages and the backend all_reduce "
      "cost the same on a full-duplex link\n",
      static_cast<double>(rows[flat_slow].slow_bytes) /
          static_cast<double>(rows[flat_native].slow_bytes));
  return json{{"ranks", ranks},
              {"group_size", group},
              {"count", count},
              {"slow_link", slow.name},
              {"fast_link", fast.name},
              {"iterations", o.iters},
              {"a_differs_from_b", differ},
              {"rows", out_rows}};
}

// ---- section 3: compression ---------------------------------------------------------------------

struct compression_row {
  std::string policy{};
  training_result run{};
  std::uint64_t gradient_bytes_per_step = 0;  // bytes_per_step minus the metrics all-reduce
};

json run_compression(const options& o, const fashion_mnist& data) {
  const auto link = scomm::network_link::ethernet_10g();
  auto cfg = training_config(o, 1);
  cfg.epochs = static_cast<std::int64_t>(o.epochs);
  cfg.max_train_samples = 0;  // the whole training set, every epoch
  cfg.max_eval_samples = 0;   // the whole test set
  cfg.bucket_size_mb = 1;
  const training_settings settings{.link = link, .warmup = o.warmup, .evaluate = true};
  // The metrics all-reduce of every step (3 doubles) is not gradient traffic.
  const std::uint64_t metrics_bytes =
      scomm::modelled_transfer(link, scomm::op_kind::all_reduce, 3, strata::dtype::float64,
                               training_ranks)
          .bytes_on_wire;
  std::vector<compression_row> rows;
  rows.push_back({"data<all_reduce> (dense)",
                  run_training<sp::data<>>(make_mlp, cfg, mlp_augmentation(), data, settings)});
  {
    auto c = cfg;
    c.gradient_compression = sc::compression_kind::bfloat16;
    rows.push_back({"data<all_reduce, cast<bfloat16>>",
                    run_training<sp::data<sp::all_reduce, sp::compress::cast<strata::bfloat16>>>(
                        make_mlp, c, mlp_augmentation(), data, settings)});
  }
  {
    auto c = cfg;
    c.bucket_size_mb = sc::train_config{}.bucket_size_mb;
    c.gradient_sync = sc::gradient_sync_kind::all_gather;
    c.gradient_compression = sc::compression_kind::topk;
    c.topk_ratio = o.topk_ratio;
    rows.push_back(
        {"data<all_gather, topk>", run_training<sp::data<sp::all_gather, sp::compress::topk>>(
                                       make_mlp, c, mlp_augmentation(), data, settings)});
  }
  for (auto& r : rows) {
    r.gradient_bytes_per_step =
        r.run.bytes_per_step > metrics_bytes ? r.run.bytes_per_step - metrics_bytes : 0;
  }
  const compression_row& dense = rows.front();
  std::printf(
      "# 3. Compression: the MLP, 2 ranks behind emulated %s, global batch %zu, %zu epochs of "
      "the whole training set, test accuracy on all 10000 test images; topk_ratio %.3g\n",
      link.name.c_str(), global_batch, o.epochs, o.topk_ratio);
  std::printf("%-34s %10s %14s %14s %9s %9s %9s\n", "policy", "samples/s", "bytes/step",
              "grad_bytes", "vs_dense", "accuracy", "d_points");
  json out_rows = json::array();
  for (const auto& r : rows) {
    const double share = static_cast<double>(r.gradient_bytes_per_step) /
                         static_cast<double>(dense.gradient_bytes_per_step);
    const double points = 100.0 * (*r.run.test_accuracy - *dense.run.test_accuracy);
    std::printf("%-34s %10.0f %14llu %14llu %8.3f%% %9.4f %+9.2f\n", r.policy.c_str(),
                r.run.samples_per_second, static_cast<unsigned long long>(r.run.bytes_per_step),
                static_cast<unsigned long long>(r.gradient_bytes_per_step), 100.0 * share,
                *r.run.test_accuracy, points);
    out_rows.push_back({{"policy", r.policy},
                        {"gradient_bytes_per_step", r.gradient_bytes_per_step},
                        {"share_of_dense", share},
                        {"accuracy_points_vs_dense", points},
                        {"run", to_json(r.run)}});
  }
  return json{{"link", link.name},
              {"epochs", o.epochs},
              {"topk_ratio", o.topk_ratio},
              {"metrics_bytes_per_step", metrics_bytes},
              {"rows", out_rows}};
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    json out{{"bench", program}};
    std::optional<fashion_mnist> data;
    if (o.only != "hierarchy") {
      data.emplace(sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::train),
                   sd::load_fashion_mnist(o.data_dir, sd::fashion_mnist_split::test));
    }
    if (o.only.empty() || o.only == "overlap") {
      out["overlap"] = run_overlap(o, *data);
      std::printf("\n");
    }
    if (o.only.empty() || o.only == "compression") {
      out["compression"] = run_compression(o, *data);
      std::printf("\n");
    }
    if (o.only.empty() || o.only == "hierarchy") {
      out["hierarchy"] = run_hierarchy(o);
    }
    if (!o.json_path.empty()) {
      std::ofstream(o.json_path) << out.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
  return 0;
}
