// SPDX-License-Identifier: Apache-2.0
#pragma once

// parallel::pipeline<Schedule>: the model cut into consecutive stages on different ranks, each
// step's samples cut into micro-batches that flow through the stages in the schedule's order
// (pipeline/). One executor replays any schedule: at each action of this rank's list it runs a
// pass on its chunk of the model (the trainer's stage passes), or moves an activation or a
// gradient to the neighbouring stage with non-blocking sends and receives posted at the start of
// the step, so that transfers overlap compute.
//
//   strata::train::trainer<decltype(mlp),
//   strata::parallel::pipeline<strata::pipeline::one_f_one_b>>
//       run(mlp, cfg, comm);  // pipeline_parallel_size = 2, pipeline_schedule = "one_f_one_b"
//
// Layout: world_size = data x pipeline ranks; rank = stage x data + d, so the ranks of one stage
// are neighbours (its data-parallel group, which averages that stage's gradients in buckets that
// leave as the step's last backward passes complete them) and each pipeline holds one rank of
// every stage. With pipeline_parallel_size = 1 ... the
// layer-wise model parallelism of the seed is this executor with micro_batches = 1.
//
// Each loader batch of a step (one per step under batch::fixed) is cut into micro_batches pieces
// (the last may be smaller). Only the first stage reads input samples (reads_inputs); every
// stage runs the same loader for the batch sizes and sample indices (dropout's streams), and the
// first stage sends the labels to the last.
// Messages carry [samples, floats per sample] before the data; a stage that receives another
// shape than it expects throws, naming both stages.
//
// Which layers each rank holds: [policy] pipeline_split (layers per virtual stage, comma
// separated), else pipeline::balance within [policy] pipeline_memory_cap_mb per stage over the
// layers' times: by default their flop estimates, the same in every process (a checkpoint
// resumes only under the split that wrote it); with pipeline_balance = "measured" a probe of each
// layer on one micro-batch (the slowest rank's times, so that every rank cuts alike; a new
// process may cut otherwise, and its resume is then refused by name).
//
// Loss scaling and the skip decision see every stage: the found-inf vote and the
// step's totals are reduced over all ranks; the adaptive micro-batch agrees over them too.
// Checkpoints: rank 0 writes every stage's parameters and optimizer state (its own as the
// trainer's params blob, the others' as pipeline.stage-<s>.*.bin), and each stage reads its own.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include "strata/core/digest.hpp"

#include "strata/comm/any_comm.hpp"
#include "strata/config/policy_keys.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/loss.hpp"
#include "strata/parallel/bucket_reducer.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/parallel/executor.hpp"
#include "strata/parallel/passes.hpp"
#include "strata/pipeline/concepts.hpp"
#include "strata/pipeline/partition.hpp"
#include "strata/pipeline/schedule.hpp"
#include "strata/pipeline/simulate.hpp"

namespace strata::parallel {

namespace detail {

// "pipeline<NAME>" or "pipeline<NAME v=V>", as a constant.
template <std::size_t N>
struct fixed_text {
  char data[N + 1]{};
  constexpr std::string_view view() const { return {data, N}; }
};

template <class Schedule>
constexpr std::size_t pipeline_name_size() {
  const std::size_t v = Schedule::chunks > 1 ? (Schedule::chunks >= 10 ? 5 : 4) : 0;
  return std::string_view("pipeline<").size() + Schedule::name.size() + v + 1;
}

template <class Schedule>
constexpr fixed_text<pipeline_name_size<Schedule>()> pipeline_name() {
  fixed_text<pipeline_name_size<Schedule>()> t{};
  std::size_t n = 0;
  const auto put = [&](std::string_view s) {
    for (char c : s) {
      t.data[n++] = c;
    }
  };
  put("pipeline<");
  put(Schedule::name);
  if constexpr (Schedule::chunks > 1) {
    put(" v=");
    if constexpr (Schedule::chunks >= 10) {
      t.data[n++] = static_cast<char>('0' + Schedule::chunks / 10);
    }
    t.data[n++] = static_cast<char>('0' + Schedule::chunks % 10);
  }
  put(">");
  return t;
}

template <class Schedule>
inline constexpr auto pipeline_name_v = pipeline_name<Schedule>();

}  // namespace detail

template <class Schedule>
class pipeline_executor;

template <class Schedule>
struct pipeline {
  static_assert(strata::pipeline::check_pipeline_schedule<Schedule>());
  static_assert(Schedule::chunks >= 1 && Schedule::chunks < 100,
                "parallel::pipeline<Schedule>: Schedule::chunks must be 1 .. 99");
  using policy_category = parallel_policy_tag;
  using schedule_type = Schedule;
  static constexpr std::string_view name = detail::pipeline_name_v<Schedule>.view();
  static constexpr bool distributed = true;
  static constexpr std::array config_keys{
      config::policy_key{"pipeline_split", config::policy_value::text, "", 0, 0,
                         "Layers per pipeline stage (per virtual stage with chunks), comma "
                         "separated; empty: balanced from the layers' cost estimates."},
      config::policy_key{"pipeline_memory_cap_mb", config::policy_value::integer, "0", 0, 1 << 30,
                         "Most MiB of parameters, optimizer state and activations per stage that "
                         "the balanced split may use; 0: no cap."},
      config::policy_key{"pipeline_balance", config::policy_value::text, "estimated", 0, 0,
                         "What the balanced split weighs layers by: estimated (their flop "
                         "estimates, the same split in every process) or measured (a probe of "
                         "each layer's forward and backward on one micro-batch)."}};
  using executor = pipeline_executor<pipeline>;

  // world_size = the communicator's, a multiple of pipeline_parallel_size; pipeline_schedule
  // as Schedule names it (a user's schedule, named otherwise, leaves the key unset); none of
  // the data-parallel synchronisation keys.
  static void check_config(const config::train_config& cfg, int world, int rank) {
    refuse_foreign_keys({.distributed = true, .bucketed = true, .pipeline = true, .parallel = name},
                        cfg, world, rank);
    const auto refuse = [](std::string key, std::string text) {
      throw config_error({.key = std::move(key), .file = {}, .line = 0, .column = 0},
                         std::move(text));
    };
    const std::int64_t p = cfg.pipeline_parallel_size;
    if (p < 1 || world % p != 0) {
      refuse("pipeline_parallel_size",
             "rank " + std::to_string(rank) + ": pipeline_parallel_size = " + std::to_string(p) +
                 " does not divide world_size = " + std::to_string(world));
    }
    const auto& names = config::enum_names<config::pipeline_schedule_kind>::names;
    const std::string_view set = names[static_cast<std::size_t>(cfg.pipeline_schedule)];
    const bool shipped = std::find(names.begin(), names.end(), Schedule::name) != names.end();
    const config::train_config defaults{};
    if (shipped ? set != Schedule::name : cfg.pipeline_schedule != defaults.pipeline_schedule) {
      refuse("pipeline_schedule",
             "pipeline_schedule = " + std::string(set) + ", but the trainer's parallel policy is " +
                 std::string(name) +
                 (shipped
                      ? " (give it parallel::pipeline<pipeline::" + std::string(set) + "> to match)"
                      : " (a schedule of the user's: leave pipeline_schedule unset)"));
    }
  }
};

// One rank's part of a pipeline: its stage's layers, the step's schedule replayed over the
// pipeline group, the stage's gradients averaged over its data-parallel group.
template <class Policy>
class pipeline_executor : public local_executor, public pass_runner {
  using Schedule = typename Policy::schedule_type;
  using clock = std::chrono::steady_clock;

 public:
  explicit pipeline_executor(const step_context& c) : local_executor(c) {
    if (c.comm == nullptr) {
      throw std::invalid_argument(std::string(Policy::name) + ": needs a communicator");
    }
    const int world = c.comm->size();
    stages_ = static_cast<int>(c.cfg.pipeline_parallel_size);
    data_ = world / stages_;
    stage_ = c.comm->rank() / data_;
    replica_ = c.comm->rank() % data_;
    // One pipeline per replica (ranks ordered by stage), one data group per stage.
    pipe_.emplace(c.comm->split(replica_, stage_));
    dp_.emplace(c.comm->split(stage_, replica_));
    micro_per_batch_ = static_cast<std::size_t>(c.cfg.micro_batches);
    // The stage's replicas start from its first replica's parameters.
    if (data_ > 1) {
      dp_->broadcast(ctx_.master.values().data(), ctx_.master.size(), dtype::float32, 0);
    }
  }

  // The trainer broadcasts nothing itself: stages hold different parameters (above).
  static constexpr bool shares_initial_params = true;

  // The layers of rank `rank` of `world`: its chunks, in order (virtual stages c p + stage).
  static std::vector<model::layer_range> rank_layers(const model_outline& m,
                                                     const config::train_config& cfg, int world,
                                                     int rank) {
    const int p = static_cast<int>(cfg.pipeline_parallel_size);
    const int stage = rank / (world / p);
    const auto bounds = split(m, cfg);
    std::vector<model::layer_range> mine;
    for (int c = 0; c < Schedule::chunks; ++c) {
      const auto s = static_cast<std::size_t>(c * p + stage);
      mine.push_back({bounds.boundaries[s], bounds.boundaries[s + 1]});
    }
    return mine;
  }

  // The micro-batch the trainer probes each layer with (its times balance the stages), or 0 when
  // the split does not need them.
  static std::size_t measures_layers(const config::train_config& cfg) {
    if (!config::policy_text(cfg, Policy::config_keys[0]).empty() ||
        config::policy_text(cfg, Policy::config_keys[2]) != "measured") {
      return 0;
    }
    return micro_batch_of(cfg);
  }
  static std::size_t micro_batch_of(const config::train_config& cfg) {
    return std::max<std::size_t>(
        1, (static_cast<std::size_t>(cfg.batch_size_per_gpu) + cfg.micro_batches - 1) /
               static_cast<std::size_t>(cfg.micro_batches));
  }

  // The split of the model's layers into p x chunks virtual stages.
  static strata::pipeline::partition split(const model_outline& m,
                                           const config::train_config& cfg) {
    const int p = static_cast<int>(cfg.pipeline_parallel_size);
    const int virtual_stages = p * Schedule::chunks;
    strata::pipeline::partition_problem pb{.stages = virtual_stages};
    const std::size_t micro = micro_batch_of(cfg);
    const std::string balance = config::policy_text(cfg, Policy::config_keys[2]);
    if (balance != "measured" && balance != "estimated") {
      throw config_error({.key = "policy.pipeline_balance", .file = {}, .line = 0, .column = 0},
                         "'" + balance + "': not one of measured, estimated");
    }
    const bool measured = m.seconds.size() == m.costs.size();
    for (std::size_t i = 0; i < m.costs.size(); ++i) {
      pb.layer_seconds.push_back(measured ? m.seconds[i]
                                          : m.costs[i].forward_flops + m.costs[i].backward_flops);
      // Values, gradients and up to two optimizer floats per parameter.
      pb.layer_fixed_bytes.push_back(m.parameters[i] * 4 * sizeof(float));
      pb.layer_activation_bytes.push_back(m.costs[i].activation_bytes * micro);
    }
    // Micro-batches each stage holds at once under the schedule.
    const auto lists = Schedule{}.lists(
        strata::pipeline::shape_for<Schedule>(p, static_cast<int>(cfg.micro_batches)));
    const auto run = strata::pipeline::simulate(lists);
    for (int s = 0; s < virtual_stages; ++s) {
      const int peak = run.peak_in_flight[static_cast<std::size_t>(s % p)];
      pb.in_flight.push_back(
          static_cast<std::size_t>(std::max(1, (peak + Schedule::chunks - 1) / Schedule::chunks)));
    }
    pb.memory_cap = static_cast<std::size_t>(config::policy_int(cfg, Policy::config_keys[1])) << 20;
    const std::string text = config::policy_text(cfg, Policy::config_keys[0]);
    const auto refuse = [&](const std::string& why) {
      throw config_error({.key = "policy.pipeline_split", .file = {}, .line = 0, .column = 0},
                         "'" + text + "': " + why);
    };
    try {
      if (text.empty()) {
        try {
          return strata::pipeline::balance(pb);
        } catch (const std::invalid_argument& e) {
          throw config_error(
              {.key = "policy.pipeline_memory_cap_mb", .file = {}, .line = 0, .column = 0},
              e.what());
        }
      }
      std::vector<std::size_t> counts;
      std::size_t start = 0;
      while (start <= text.size()) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        const std::string item = text.substr(start, comma - start);
        if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) {
          refuse("not a comma-separated list of layer counts");
        }
        counts.push_back(static_cast<std::size_t>(std::stoull(item)));
        start = comma + 1;
      }
      return strata::pipeline::check_split(pb, counts);
    } catch (const std::invalid_argument& e) {
      refuse(e.what());
    }
    return {};
  }

  // The ranks that train together: all of them (the step's totals, the checkpoint barrier).
  // Every replica of the pipeline reads its own shard of the samples; the stages of one pipeline
  // read the same.
  data_shard_of data_shard() const noexcept { return {.shards = data_, .index = replica_}; }

  int stage() const noexcept { return stage_; }
  int stages() const noexcept { return stages_; }
  comm::any_comm& pipeline_group() noexcept { return *pipe_; }
  comm::any_comm& data_group() noexcept { return *dp_; }
  // The schedule's lists for this many micro-batches.
  const strata::pipeline::schedule_lists& lists_for(int micro_batches) {
    auto it = lists_.find(micro_batches);
    if (it == lists_.end()) {
      it = lists_
               .emplace(micro_batches, Schedule{}.lists(strata::pipeline::shape_for<Schedule>(
                                           stages_, micro_batches)))
               .first;
    }
    return it->second;
  }

  // pass_runner: the executor runs the step's passes itself.
  pass_runner* passes_runner() noexcept { return this; }
  bool splits_backward() const override { return Schedule::splits_backward; }

  // Only the first stage reads input samples; the last gets the labels from it (run_step).
  bool reads_inputs() const noexcept { return stage_ == 0; }

  model::loss_result run_step(std::span<const micro_batch> batches, stage_passes& passes) override {
    pieces_ = cut(batches);
    share_labels();
    const auto& lists = lists_for(static_cast<int>(pieces_.size()));
    const auto begin = clock::now();
    model::loss_result r = replay(lists.ranks[static_cast<std::size_t>(stage_)], passes, true);
    timing_.wall += std::chrono::duration<double>(clock::now() - begin).count();
    ++timing_.steps;
    return r;
  }

  // What this rank's training steps took since the last reset: the schedule's wall time, the
  // time in passes, and the most micro-batches (x chunks) it held between forward and the end of
  // their backward. 1 - busy / wall is this rank's idle share (its part of the bubble).
  struct step_timing {
    double wall = 0.0;
    double busy = 0.0;
    std::size_t steps = 0;
    std::size_t peak_in_flight = 0;
  };
  const step_timing& timing() const noexcept { return timing_; }
  void reset_timing() noexcept { timing_ = {}; }

  model::loss_result run_forward(std::span<const micro_batch> batches,
                                 stage_passes& passes) override {
    pieces_.assign(batches.begin(), batches.end());
    share_labels();
    const auto lists = forward_only(static_cast<int>(pieces_.size()));
    model::loss_result r = replay(lists.ranks[static_cast<std::size_t>(stage_)], passes, false);
    // Every rank reports the last stage's result.
    double sums[3] = {r.loss_sum, static_cast<double>(r.correct), static_cast<double>(r.samples)};
    pipe_->broadcast(sums, 3, dtype::float64, stages_ - 1);
    return {.loss_sum = sums[0],
            .correct = static_cast<std::size_t>(sums[1]),
            .samples = static_cast<std::size_t>(sums[2])};
  }

  // With replicas, the stage's gradient buckets (bucket_size_mb), averaged over its data group
  // as the step's last backward passes complete them (bucket_launch as for data<all_reduce>).
  // The trainer's own step runner never sees them (null).
  bucket_reducer* begin_fit() {
    if (data_ > 1) {
      const bool blocking = cfg().bucket_launch == config::bucket_launch_kind::blocking ||
                            (cfg().bucket_launch == config::bucket_launch_kind::automatic &&
                             !dp_->progresses_nonblocking());
      reducer_ = bucket_reducer(
          *dp_, make_buckets(ctx_.compute, static_cast<std::size_t>(cfg().bucket_size_mb) << 20),
          ctx_.precision.compute, dtype::float32, 0, blocking);
      buckets_ = true;
    }
    return nullptr;
  }

  sync_result synchronize(const sync_args& a) {
    const auto begin = clock::now();
    double blocked = 0.0;
    if (buckets_ && started_) {
      blocked = reducer_.blocked_seconds();
      reducer_.finish();
      started_ = false;
    } else if (data_ > 1) {
      const std::span<float> g = ctx_.compute.grads();
      dp_->all_reduce(g.data(), g.data(), g.size(), dtype::float32, comm::reduce_op::avg);
    }
    ctx_.precision.round(ctx_.compute.grads());
    // Only the last stage has the loss; every replica's last stage counts its samples.
    sync_args mine = a;
    if (stage_ != stages_ - 1) {
      mine.mine = {};
    }
    sync_result r = local_executor::synchronize(mine);
    r.blocked_in_backward = blocked;
    r.comm_seconds = std::chrono::duration<double>(clock::now() - begin).count() + blocked;
    return r;
  }

  // The name this rank's parameters are saved under by rank 0 and read from.
  std::string params_blob() const {
    return stage_ == 0 ? "rank-0.params.bin" : blob_name(stage_, "params");
  }

  // Collective: the summary's params_xxh3. Rank 0 hashes every stage's parameters in stage
  // order (the first replica's: the others hold the same); the other ranks their own.
  std::string params_digest(std::span<const float> mine) {
    std::vector<float> all(mine.begin(), mine.end());
    if (replica_ == 0) {
      for (int s = 1; s < stages_; ++s) {
        std::int64_t n = stage_ == s ? static_cast<std::int64_t>(mine.size()) : 0;
        pipe_->broadcast(&n, 1, dtype::int64, s);
        if (stage_ == 0) {
          const std::size_t at = all.size();
          all.resize(at + static_cast<std::size_t>(n));
          pipe_->recv(all.data() + at, static_cast<std::size_t>(n), dtype::float32, s, 9);
        } else if (stage_ == s) {
          pipe_->send(mine.data(), mine.size(), dtype::float32, 0, 9);
        }
      }
    }
    return hex_digest(all);
  }

  // Collective: every stage's parameters (beyond stage 0's, the trainer's own) and optimizer
  // state, sent by the stage's first replica to rank 0, which writes them.
  std::vector<state_blob> state_blobs(std::uint64_t) {
    std::vector<state_blob> out;
    const bool writes = group_->rank() == 0;
    if (replica_ == 0) {
      for (int s = 0; s < stages_; ++s) {
        const bool mine = s == stage_;
        // Sizes first: the stages hold different layers.
        std::int64_t sizes[2] = {mine ? static_cast<std::int64_t>(ctx_.master.size()) : 0,
                                 mine ? static_cast<std::int64_t>(state_.size()) : 0};
        pipe_->broadcast(sizes, 2, dtype::int64, s);
        if (s == 0 && writes) {
          out.push_back({.name = blob_name(0, "optimizer"),
                         .bytes = std::as_bytes(std::as_const(state_).span())});
          continue;
        }
        if (s == 0) {
          continue;
        }
        if (writes) {
          saved_[s].params.resize(static_cast<std::size_t>(sizes[0]));
          saved_[s].state.resize(static_cast<std::size_t>(sizes[1]));
          pipe_->recv(saved_[s].params.data(), saved_[s].params.size(), dtype::float32, s, 7);
          pipe_->recv(saved_[s].state.data(), saved_[s].state.size(), dtype::float32, s, 8);
          out.push_back({.name = blob_name(s, "params"),
                         .bytes = std::as_bytes(std::span<const float>(saved_[s].params))});
          out.push_back({.name = blob_name(s, "optimizer"),
                         .bytes = std::as_bytes(std::span<const float>(saved_[s].state))});
        } else if (mine) {
          pipe_->send(ctx_.master.values().data(), ctx_.master.size(), dtype::float32, 0, 7);
          pipe_->send(state_.data(), state_.size(), dtype::float32, 0, 8);
        }
      }
    }
    return out;
  }
  void restore(const blob_reader& read) {
    if (stage_ != 0) {
      read(blob_name(stage_, "params"), ctx_.master.values());
    }
    read(blob_name(stage_, "optimizer"), state_.span());
  }
  std::vector<optimizer_blob> optimizer_blobs() const {
    return {{.name = blob_name(stage_, "optimizer"), .shards = {{0, ctx_.master.size()}}}};
  }

 private:
  struct saved_stage {
    std::vector<float> params;
    std::vector<float> state;
  };

  static std::string hex_digest(std::span<const float> values) { return xxh3_hex(values); }

  static std::string blob_name(int stage, std::string_view what) {
    return "pipeline.stage-" + std::to_string(stage) + "." + std::string(what) + ".bin";
  }

  // The step's labels, read by the first stage, to the last stage (one message), which uses them
  // in place of its own loader's.
  void share_labels() {
    if (stages_ == 1 || (stage_ != 0 && stage_ != stages_ - 1)) {
      return;
    }
    std::size_t total = 0;
    for (const micro_batch& b : pieces_) {
      total += b.size;
    }
    labels_.resize(total);
    if (stage_ == 0) {
      std::size_t at = 0;
      for (const micro_batch& b : pieces_) {
        std::copy(b.labels.begin(), b.labels.end(),
                  labels_.begin() + static_cast<std::ptrdiff_t>(at));
        at += b.size;
      }
      pipe_->send(labels_.data(), total, dtype::int32, stages_ - 1, 15);
      return;
    }
    pipe_->recv(labels_.data(), total, dtype::int32, 0, 15);
    std::size_t at = 0;
    for (micro_batch& b : pieces_) {
      b.labels = std::span<const std::int32_t>(labels_).subspan(at, b.size);
      at += b.size;
    }
  }

  // Every loader batch cut into micro_batches pieces (the last of each may be smaller).
  std::vector<micro_batch> cut(std::span<const micro_batch> batches) const {
    std::vector<micro_batch> out;
    for (const micro_batch& b : batches) {
      const std::size_t per_sample = b.size == 0 ? 0 : b.inputs.size() / b.size;
      const std::size_t pieces = std::min(micro_per_batch_, std::max<std::size_t>(b.size, 1));
      const std::size_t each = (b.size + pieces - 1) / pieces;
      for (std::size_t first = 0; first < b.size; first += each) {
        const std::size_t n = std::min(each, b.size - first);
        out.push_back({.inputs = b.inputs.empty()
                                     ? b.inputs
                                     : b.inputs.subspan(first * per_sample, n * per_sample),
                       .labels = b.labels.empty() ? b.labels : b.labels.subspan(first, n),
                       .indices = b.indices.empty() ? b.indices : b.indices.subspan(first, n),
                       .size = n});
      }
    }
    return out;
  }

  // Forward only, micro-batch by micro-batch through every chunk.
  strata::pipeline::schedule_lists forward_only(int micro_batches) const {
    const auto shape = strata::pipeline::shape_for<Schedule>(stages_, micro_batches);
    std::vector<std::vector<strata::pipeline::action>> compute(static_cast<std::size_t>(stages_));
    for (int r = 0; r < stages_; ++r) {
      for (int i = 0; i < micro_batches; ++i) {
        for (int c = 0; c < Schedule::chunks; ++c) {
          compute[static_cast<std::size_t>(r)].push_back(strata::pipeline::forward(i, c));
        }
      }
    }
    auto lists = strata::pipeline::with_transfers(shape, compute);
    return lists;
  }

  // A message's tag on the pipeline group: what it carries, for which chunk and micro-batch.
  int tag_of(bool gradient, int chunk, int micro, int micro_batches) const {
    const long tag =
        (static_cast<long>(gradient) * Schedule::chunks + chunk) * micro_batches + micro + 16;
    if (tag > 32767) {
      throw std::invalid_argument(std::string(Policy::name) + ": " + std::to_string(micro_batches) +
                                  " micro-batches per step are more than the message tags hold");
    }
    return static_cast<int>(tag);
  }

  // One transfer's memory: [samples, floats per sample, data...].
  struct message {
    buffer<float> data{};
    comm::any_comm::request request{};
    bool posted = false;
  };

  // Runs `list` (this rank's) over the pieces; returns the loss of the pieces the last stage saw.
  model::loss_result replay(const std::vector<strata::pipeline::action>& list, stage_passes& passes,
                            bool training) {
    using strata::pipeline::op;
    const int m = static_cast<int>(pieces_.size());
    const int v = Schedule::chunks;
    const int last = stages_ * v - 1;
    const auto key = [&](int chunk, int micro) {
      return static_cast<std::size_t>(chunk) * static_cast<std::size_t>(m) +
             static_cast<std::size_t>(micro);
    };
    const std::size_t slots = static_cast<std::size_t>(v) * static_cast<std::size_t>(m);
    std::vector<message> act_in(slots), grad_in(slots), act_out(slots), grad_out(slots);
    std::vector<std::size_t> slot_of(slots, 0);
    std::vector<std::vector<std::size_t>> free_slots(static_cast<std::size_t>(v));
    std::vector<std::size_t> next_slot(static_cast<std::size_t>(v), 0);
    std::vector<buffer<float>> loss_grad(static_cast<std::size_t>(m));
    model::loss_result total{};
    const auto stage_of = [&](int chunk) { return chunk * stages_ + stage_; };
    // Every receive of the step, posted now into its own buffer.
    for (const auto& a : list) {
      if (a.kind != op::recv_activation && a.kind != op::recv_gradient) {
        continue;
      }
      const bool gradient = a.kind == op::recv_gradient;
      const std::size_t elements =
          gradient ? passes.output_elements(a.chunk) : passes.input_elements(a.chunk);
      message& msg = (gradient ? grad_in : act_in)[key(a.chunk, a.micro)];
      msg.data = buffer<float>(2 + pieces_[static_cast<std::size_t>(a.micro)].size * elements);
      msg.request = pipe_->recv_async(msg.data.data(), msg.data.size(), dtype::float32, a.peer,
                                      tag_of(gradient, a.chunk, a.micro, m));
      msg.posted = true;
    }
    // The data a receive brought, its shape checked.
    const auto received = [&](const strata::pipeline::action& a, bool gradient,
                              std::size_t elements) -> std::span<const float> {
      message& msg = (gradient ? grad_in : act_in)[key(a.chunk, a.micro)];
      const int from = gradient ? stage_of(a.chunk) + 1 : stage_of(a.chunk) - 1;
      const std::size_t n = pieces_[static_cast<std::size_t>(a.micro)].size;
      const auto mismatch = [&](const std::string& what) {
        return error(std::string(Policy::name) + ": stage " + std::to_string(from) + " (rank " +
                     std::to_string(a.peer) + " of the pipeline) sent micro-batch " +
                     std::to_string(a.micro) + "'s " + (gradient ? "gradient" : "activation") +
                     " as " + what + "; stage " + std::to_string(stage_of(a.chunk)) + " expects " +
                     std::to_string(n) + " samples x " + std::to_string(elements) + " floats");
      };
      try {
        msg.request.wait();
      } catch (const std::exception& e) {
        throw mismatch(std::string("a message of another size (") + e.what() + ")");
      }
      const std::span<const float> d = std::as_const(msg.data).span();
      if (static_cast<std::size_t>(d[0]) != n || static_cast<std::size_t>(d[1]) != elements) {
        throw mismatch(std::to_string(static_cast<std::size_t>(d[0])) + " samples x " +
                       std::to_string(static_cast<std::size_t>(d[1])) + " floats");
      }
      return d.subspan(2);
    };
    const auto stage_message = [&](message& msg, std::span<const float> data, std::size_t n) {
      msg.data = buffer<float>(2 + data.size());
      msg.data.data()[0] = static_cast<float>(n);
      msg.data.data()[1] = static_cast<float>(n == 0 ? 0 : data.size() / n);
      std::copy(data.begin(), data.end(), msg.data.data() + 2);
    };
    // The step's last pass over each chunk's gradients (the last backward, and for a split
    // backward also the last weight pass): its layers' buckets leave as it completes them.
    std::vector<std::size_t> last_backward(static_cast<std::size_t>(v), list.size());
    std::vector<std::size_t> last_weight(static_cast<std::size_t>(v), list.size());
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto c = static_cast<std::size_t>(list[i].chunk);
      if (list[i].kind == op::backward || list[i].kind == op::backward_input) {
        last_backward[c] = i;
      } else if (list[i].kind == op::backward_weight) {
        last_weight[c] = i;
      }
    }
    // A bucket leaves once every group from its first on is complete (bucket_reducer): chunks
    // are reported from the last down, each once it and every chunk after it are complete. The
    // final pass of the highest chunk not yet reported reports its layers as it goes (a whole
    // backward does, in decreasing groups); a split backward's chunk is reported after its last
    // weight pass, since its input passes complete the layers without weights first.
    bucket_reducer* reducer = nullptr;
    if (training && buckets_) {
      reducer_.begin(ctx_.compute.grads_to_write());
      started_ = true;
      reducer = &reducer_;
    }
    std::vector<bool> complete(static_cast<std::size_t>(v), false);
    int unreported = v - 1;  // the highest chunk not yet reported
    const auto final_pass = [&](std::size_t index, std::size_t chunk) {
      return Schedule::splits_backward ? index == last_weight[chunk]
                                       : index == last_backward[chunk];
    };
    // The reducer for pass `index` of `chunk`, when it reports as it goes.
    const auto reporter = [&](std::size_t index, std::size_t chunk) -> bucket_reducer* {
      return reducer != nullptr && !Schedule::splits_backward && final_pass(index, chunk) &&
                     static_cast<int>(chunk) == unreported
                 ? reducer
                 : nullptr;
    };
    // After pass `index` of `chunk`: report every chunk that may be, from the highest down.
    const auto reported = [&](std::size_t index, std::size_t chunk, bool as_it_went) {
      if (reducer == nullptr || !final_pass(index, chunk)) {
        return;
      }
      complete[chunk] = true;
      if (as_it_went) {
        --unreported;
      }
      while (unreported >= 0 && complete[static_cast<std::size_t>(unreported)]) {
        reducer->group_done(passes.first_group(unreported));
        --unreported;
      }
    };
    std::vector<strata::pipeline::action> peers(slots * 2);  // who each receive came from
    std::size_t in_flight = 0;
    const auto busy = [&](clock::time_point from, bool counted) {
      if (counted) {
        timing_.busy += std::chrono::duration<double>(clock::now() - from).count();
      }
    };
    for (std::size_t index = 0; index < list.size(); ++index) {
      const auto& a = list[index];
      const int s = stage_of(a.chunk);
      const auto chunk = static_cast<std::size_t>(a.chunk);
      const micro_batch& b =
          a.kind == op::step ? pieces_.front() : pieces_[static_cast<std::size_t>(a.micro)];
      const std::size_t k = a.kind == op::step ? 0 : key(a.chunk, a.micro);
      switch (a.kind) {
        case op::recv_activation:
        case op::recv_gradient:
          peers[k * 2 + (a.kind == op::recv_gradient ? 1 : 0)] = a;
          break;
        case op::forward: {
          std::span<const float> input = b.inputs;
          if (s > 0) {
            input = received(peers[k * 2], false, passes.input_elements(a.chunk));
          }
          auto& spare = free_slots[static_cast<std::size_t>(a.chunk)];
          std::size_t slot = 0;
          if (!spare.empty()) {
            slot = spare.back();
            spare.pop_back();
          } else {
            slot = next_slot[static_cast<std::size_t>(a.chunk)]++;
          }
          slot_of[k] = slot;
          const auto pass_begin = clock::now();
          const std::span<const float> out = passes.forward(a.chunk, slot, input, b, training);
          in_flight = training ? in_flight + 1 : in_flight;
          timing_.peak_in_flight = std::max(timing_.peak_in_flight, in_flight);
          busy(pass_begin, training);
          if (s == last) {
            std::span<float> grad{};
            if (training) {
              loss_grad[static_cast<std::size_t>(a.micro)] = buffer<float>(out.size());
              grad = loss_grad[static_cast<std::size_t>(a.micro)].span();
            }
            const auto loss_begin = clock::now();
            total += passes.loss(out, b, grad);
            busy(loss_begin, training);
            if (!training) {
              free_slots[static_cast<std::size_t>(a.chunk)].push_back(slot);
            }
          } else {
            stage_message(act_out[k], out, b.size);
            if (!training) {
              free_slots[static_cast<std::size_t>(a.chunk)].push_back(slot);
            }
          }
          break;
        }
        case op::send_activation:
        case op::send_gradient: {
          message& msg = (a.kind == op::send_gradient ? grad_out : act_out)[k];
          msg.request = pipe_->send_async(
              msg.data.data(), msg.data.size(), dtype::float32, a.peer,
              tag_of(a.kind == op::send_gradient,
                     a.kind == op::send_gradient ? (s - 1) / stages_ : (s + 1) / stages_, a.micro,
                     m));
          msg.posted = true;
          break;
        }
        case op::backward:
        case op::backward_input: {
          std::span<const float> upstream;
          if (s == last) {
            upstream = std::as_const(loss_grad[static_cast<std::size_t>(a.micro)]).span();
          } else {
            upstream = received(peers[k * 2 + 1], true, passes.output_elements(a.chunk));
          }
          const bool split = a.kind == op::backward_input;
          const auto pass_begin = clock::now();
          bucket_reducer* live = reporter(index, chunk);
          const std::span<const float> down =
              passes.backward(a.chunk, slot_of[k], upstream, split, live);
          busy(pass_begin, training);
          reported(index, chunk, live != nullptr);
          in_flight -= split ? 0 : 1;
          if (s > 0) {
            stage_message(grad_out[k], down, b.size);
          }
          if (!split) {
            free_slots[static_cast<std::size_t>(a.chunk)].push_back(slot_of[k]);
          }
          break;
        }
        case op::backward_weight: {
          const auto pass_begin = clock::now();
          passes.backward_weight(a.chunk, slot_of[k], nullptr);
          busy(pass_begin, training);
          reported(index, chunk, false);
          --in_flight;
          free_slots[static_cast<std::size_t>(a.chunk)].push_back(slot_of[k]);
          break;
        }
        case op::step:
          break;
      }
    }
    for (auto* all : {&act_out, &grad_out}) {
      for (message& msg : *all) {
        if (msg.posted) {
          msg.request.wait();
        }
      }
    }
    return total;
  }

  int stages_ = 1;
  int data_ = 1;
  int stage_ = 0;
  int replica_ = 0;
  std::size_t micro_per_batch_ = 1;
  std::optional<comm::any_comm> pipe_{};
  std::optional<comm::any_comm> dp_{};
  std::map<int, strata::pipeline::schedule_lists> lists_{};
  std::vector<micro_batch> pieces_{};
  std::vector<std::int32_t> labels_{};  // the last stage's, from the first
  std::map<int, saved_stage> saved_{};
  step_timing timing_{};
  bucket_reducer reducer_{};
  bool buckets_ = false;  // begin_fit made the data group's buckets
  bool started_ = false;  // this step's buckets began
};

}  // namespace strata::parallel
