// SPDX-License-Identifier: Apache-2.0
#pragma once

// The conformance suite of the parallel_policy concept (parallel/concepts.hpp,
// parallel/executor.hpp): one test body run on every parallel policy, shipped or a user's,
// through the trainer on thread ranks, with the blobs task of tests/unit/common. It checks the
// written semantics:
//   - agreement: every rank runs the same steps, each step's totals are over every rank's
//     samples, and (unless the case says the policy keeps ranks apart) every rank ends with the
//     same parameters, bit for bit;
//   - one rank: where the case claims it, N ranks with B samples each train like one rank with
//     N x B (losses and parameters within the case's tolerance);
//   - resume: a run stopped (at two steps, each mid-epoch) and resumed in a new trainer ends
//     with the parameters of an uninterrupted run on every rank, bit for bit;
//   - memory: each rank's model state right after construction, with AdamW, is what
//     estimate_memory gives for the executor's shards: the bytes strata::host accounts
//     (parameters, gradients, optimizer state), not helper vectors such as top-k's residual or
//     the parameter server's exchange buffers;
//   - another layout: the finished run continued as one rank (a named run, the same samples per
//     batch) reports the same final test loss and, where every rank holds the whole model, its
//     parameters bit for bit; or, where the case says the checkpoint stays with its layout
//     (blobs the policy does not describe: train/reshard.hpp), is refused with an error that
//     names a file or a key;
//   - the skip vote: with float16 and an overflow injected on the last rank only (into the part
//     of the gradients it applies), the step is skipped on every rank, every rank skips the same
//     steps, and (unless the ranks stay apart) they end with the same parameters.
// Failures are collected into a report (as the comm suite does), so one run lists all of them.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "conformance/findings.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/host.hpp"
#include "strata/data/transforms.hpp"
#include "strata/parallel/concepts.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/estimate_memory.hpp"
#include "strata/train/trainer.hpp"
#include "unit/common/blobs.hpp"

namespace strata::conformance {

using parallel_report = findings;

struct parallel_case {
  std::string name;                // the work directory's name
  int ranks = 2;                   // thread ranks
  int data_ranks = 0;              // ranks that read samples of their own (0: all; a pipeline's
                                   // stages share theirs)
  config::train_config cfg{};      // the policy's keys; world_size is set to `ranks`
  double one_rank_tolerance = -1;  // >= 0: claims to train like one rank with ranks x the batch
  bool same_params = true;         // every rank ends with rank 0's parameters
  bool skips_together = true;      // run the float16 skip-vote check
  // Each rank's model state (parameters, gradients, its shard of AdamW's state, as the host
  // account counts them) is what estimate_memory says for the executor's shards.
  bool memory_exact = true;
  // The finished run's checkpoint continues on one rank (else it must be refused by name).
  bool relayout = true;
};

namespace detail {

struct rank_run {
  test::run_record record;
  std::uint64_t skipped = 0;
};

inline config::train_config case_config(const parallel_case& c, const std::string& part) {
  config::train_config cfg = c.cfg;
  const std::filesystem::path dir =
      std::filesystem::path(STRATA_TEST_WORK_DIR) / "parallel_conformance" / c.name / part;
  std::filesystem::remove_all(dir);
  cfg.checkpoint_dir = dir.string();
  cfg.world_size = c.ranks;
  cfg.loader_workers = 0;
  return cfg;
}

// Every rank's record of one fit() of trainer<blobs_mlp, Policy, Extra...>; `setup(t)` first. A
// policy that is not distributed runs one rank without a communicator.
template <class Policy, class... Extra, class Setup>
std::vector<rank_run> run_ranks(int ranks, const config::train_config& cfg, Setup setup) {
  using trainer_t = train::trainer<decltype(test::blobs_mlp()), Policy, Extra...>;
  std::vector<rank_run> out(static_cast<std::size_t>(ranks));
  const auto run = [&](trainer_t& t, int rank) {
    setup(t);
    out[static_cast<std::size_t>(rank)].record = test::record(t);
    out[static_cast<std::size_t>(rank)].skipped = t.skipped_steps();
  };
  if constexpr (trainer_t::distributed) {
    comm::threads::run(ranks, [&](comm::threads& c) {
      trainer_t t(test::blobs_mlp(), cfg, comm::any_comm(c), {.print_progress = false});
      run(t, c.rank());
    });
  } else {
    trainer_t t(test::blobs_mlp(), cfg, {.print_progress = false});
    run(t, 0);
  }
  return out;
}

inline void expect_same_params(parallel_report& r, const std::vector<rank_run>& a,
                               const std::vector<rank_run>& b, const std::string& what) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    r.expect(a[i].record.params == b[i].record.params,
             what + ": rank " + std::to_string(i) + " ends with other parameters");
  }
}

}  // namespace detail

template <class Policy>
parallel_report run_parallel_suite(const parallel_case& c) {
  static_assert(parallel::check_parallel_policy<Policy>());
  parallel_report r;
  const auto none = [](auto&) {};
  config::train_config base = detail::case_config(c, "straight");
  base.run_name = "straight";  // named: continued under another layout below
  const std::vector<detail::rank_run> straight = detail::run_ranks<Policy>(c.ranks, base, none);
  const test::run_record& first = straight[0].record;
  r.expect(!first.steps.empty(), "agreement: the run took no step");
  for (std::size_t i = 1; i < straight.size(); ++i) {
    const test::run_record& other = straight[i].record;
    r.expect(other.steps.size() == first.steps.size(),
             "agreement: rank " + std::to_string(i) + " took another number of steps");
    for (std::size_t s = 0; s < other.steps.size() && s < first.steps.size(); ++s) {
      r.expect(
          other.steps[s].samples == first.steps[s].samples &&
              other.steps[s].loss == first.steps[s].loss,
          "agreement: step " + std::to_string(s) + "'s totals differ on rank " + std::to_string(i));
    }
    if (c.same_params) {
      r.expect(other.params == first.params,
               "agreement: rank " + std::to_string(i) + " ends with other parameters than rank 0");
    }
  }
  if (!first.steps.empty()) {
    const int readers = c.data_ranks > 0 ? c.data_ranks : c.ranks;
    r.expect(first.steps[0].samples == static_cast<std::size_t>(readers * base.batch_size_per_gpu *
                                                                base.gradient_accumulation_steps),
             "agreement: a step's totals are not over every rank's samples");
  }

  if (c.one_rank_tolerance >= 0) {
    // The case's common keys on one rank; the parallel policy's own keys at their defaults.
    const config::train_config& k = c.cfg;
    const config::train_config one{.batch_size_per_gpu = k.batch_size_per_gpu * c.ranks,
                                   .gradient_accumulation_steps = k.gradient_accumulation_steps,
                                   .epochs = k.epochs,
                                   .seed = k.seed,
                                   .optimizer = k.optimizer,
                                   .lr = k.lr,
                                   .momentum = k.momentum,
                                   .weight_decay = k.weight_decay,
                                   .loader_workers = 0,
                                   .checkpoint_dir = detail::case_config(c, "one").checkpoint_dir};
    train::trainer<decltype(test::blobs_mlp())> t(test::blobs_mlp(), one,
                                                  {.print_progress = false});
    const test::run_record single = test::record(t);
    r.expect(single.steps.size() == first.steps.size(), "one rank: another number of steps");
    double worst_loss = 0.0;
    for (std::size_t s = 0; s < single.steps.size() && s < first.steps.size(); ++s) {
      worst_loss = std::max(worst_loss, std::abs(single.steps[s].loss - first.steps[s].loss) /
                                            std::max(1e-12, std::abs(single.steps[s].loss)));
    }
    r.expect(worst_loss <= 1e-5,
             "one rank: a step's loss differs by " + std::to_string(worst_loss) + " (relative)");
    double worst = 0.0;
    for (std::size_t i = 0; i < single.params.size() && i < first.params.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(single.params[i] - first.params[i])));
    }
    // A sharding policy pads the parameters to equal shards: the padding stays zero.
    for (std::size_t i = single.params.size(); i < first.params.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(first.params[i])));
    }
    r.expect(single.params.size() <= first.params.size() && worst <= c.one_rank_tolerance,
             "one rank: the parameters differ by " + std::to_string(worst));
  }

  // Another layout: the finished run continued on one rank with the same samples per batch.
  {
    const config::train_config k = c.cfg;
    const config::train_config defaults{};
    config::train_config one = base;
    one.world_size = 1;
    one.batch_size_per_gpu =
        k.batch_size_per_gpu * static_cast<std::size_t>(c.data_ranks > 0 ? c.data_ranks : c.ranks);
    one.tensor_parallel_size = 1;
    one.pipeline_parallel_size = 1;
    one.data_parallel_size = 0;
    one.micro_batches = defaults.micro_batches;
    one.pipeline_schedule = defaults.pipeline_schedule;
    one.zero_stage = 0;
    one.gradient_sync = defaults.gradient_sync;
    one.hierarchy_group_size = defaults.hierarchy_group_size;
    one.parameter_servers = defaults.parameter_servers;
    one.dedicated_parameter_servers = false;
    one.policy.clear();
    one.resume = config::resume_mode::required;
    std::string refused;
    test::run_record continued;
    try {
      train::trainer<decltype(test::blobs_mlp())> t(test::blobs_mlp(), one,
                                                    {.print_progress = false});
      continued = test::record(t);
    } catch (const error& e) {
      refused = e.what();
    }
    if (c.relayout) {
      r.expect(refused.empty(), "another layout: one rank could not continue: " + refused);
      r.expect(refused.empty() && continued.steps.empty() &&
                   std::abs(continued.summary.test_loss - first.summary.test_loss) <=
                       1e-5 * std::max(1.0, std::abs(first.summary.test_loss)),
               "another layout: one rank's final test loss " +
                   std::to_string(continued.summary.test_loss) + ", the run's " +
                   std::to_string(first.summary.test_loss));
      if (c.data_ranks == 0 && refused.empty()) {
        bool same = continued.params.size() <= first.params.size();
        for (std::size_t i = 0; same && i < first.params.size(); ++i) {
          same = first.params[i] == (i < continued.params.size() ? continued.params[i] : 0.0f);
        }
        r.expect(same, "another layout: one rank loaded other parameters than rank 0 saved");
      }
    } else {
      r.expect(refused.find(".bin") != std::string::npos ||
                   refused.find("config error") != std::string::npos,
               "another layout: expected a refusal naming a file or a key, got '" +
                   (refused.empty() ? std::string("none") : refused) + "'");
    }
  }

  // Stopped, resumed in a new trainer: every rank as the uninterrupted run. Two stops, a step
  // apart by two, so that at least one falls between the events of a periodic policy.
  const std::size_t steps = first.steps.size();
  for (const std::size_t stop : {steps / 2 - 1, steps / 2 + 1}) {
    if (stop == 0 || stop >= steps) {
      continue;
    }
    config::train_config split = detail::case_config(c, "split-" + std::to_string(stop));
    split.max_steps = static_cast<std::int64_t>(stop);
    detail::run_ranks<Policy>(c.ranks, split, none);
    split.max_steps = 0;
    const std::vector<detail::rank_run> resumed = detail::run_ranks<Policy>(c.ranks, split, none);
    for (std::size_t i = 0; i < resumed.size(); ++i) {
      r.expect(!resumed[i].record.summary.resumed_from.empty(),
               "resume: rank " + std::to_string(i) + " did not resume");
    }
    detail::expect_same_params(r, resumed, straight, "resume after step " + std::to_string(stop));
  }

  if (c.memory_exact) {
    config::train_config m = detail::case_config(c, "memory");
    m.optimizer = config::optimizer_kind::adamw;
    m.lr = 0.01;
    using executor = typename Policy::executor;
    const int shards = executor::shards(m, c.ranks);
    const std::size_t want = train::estimate_memory(test::blobs_mlp(), 1,
                                                    {.optimizer_state_per_parameter = 2,
                                                     .shards = static_cast<std::size_t>(shards)})
                                 .model_state();
    std::vector<std::size_t> held(static_cast<std::size_t>(c.ranks));
    const auto measure = [&](auto make, int rank) {
      const std::size_t before = host{}.memory().stats().in_use;
      auto t = make();
      held[static_cast<std::size_t>(rank)] = host{}.memory().stats().in_use - before;
    };
    using trainer_t = train::trainer<decltype(test::blobs_mlp()), Policy>;
    if constexpr (trainer_t::distributed) {
      comm::threads::run(c.ranks, [&](comm::threads& comm) {
        measure(
            [&] {
              return std::make_unique<trainer_t>(test::blobs_mlp(), m, comm::any_comm(comm),
                                                 train::trainer_options{.print_progress = false});
            },
            comm.rank());
      });
    } else {
      measure(
          [&] {
            return std::make_unique<trainer_t>(test::blobs_mlp(), m,
                                               train::trainer_options{.print_progress = false});
          },
          0);
    }
    for (std::size_t i = 0; i < held.size(); ++i) {
      r.expect(held[i] == want, "memory: rank " + std::to_string(i) + " holds " +
                                    std::to_string(held[i]) + " bytes, estimate_memory says " +
                                    std::to_string(want) + " for " + std::to_string(shards) +
                                    " shard(s)");
    }
  }

  if (c.skips_together) {
    config::train_config fp16 = detail::case_config(c, "fp16");
    fp16.mixed_precision_dtype = config::precision_dtype::float16;
    const int last = c.ranks - 1;
    const auto inject = [last](auto& t) {
      if (t.rank() == last) {
        // Into the part of the gradients this rank applies (all of them, unless sharded).
        const std::size_t at = t.executor().owned().first;
        t.on_gradients([at](std::uint64_t step, std::span<float> grads) {
          if (step == 2) {
            grads[at] = std::numeric_limits<float>::infinity();
          }
        });
      }
    };
    const auto runs = detail::run_ranks<Policy, precision::fp16>(c.ranks, fp16, inject);
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const test::run_record& rec = runs[i].record;
      // The loss scaler may skip other steps too (its first scale can overflow); every rank
      // skips the same ones.
      r.expect(rec.steps.size() > 2 && rec.steps[2].skipped && runs[i].skipped >= 1 &&
                   runs[i].skipped == runs[0].skipped,
               "skip vote: rank " + std::to_string(i) + " did not skip step 2 with the others (" +
                   std::to_string(runs[i].skipped) + " skipped, rank 0 " +
                   std::to_string(runs[0].skipped) + ")");
      if (c.same_params) {
        r.expect(rec.params == runs[0].record.params,
                 "skip vote: rank " + std::to_string(i) + " ends apart from rank 0");
      }
    }
  }
  return r;
}

}  // namespace strata::conformance
