// SPDX-License-Identifier: Apache-2.0
#pragma once

// The trainer a configuration names: policies are compile-time choices, so a program that picks
// them from a config file (or the command line) compiles every trainer type it may need and
// runs the one the values name. train_as_configured does that for the policies a program lists:
//
//   const strata::config::train_config cfg = ...;            // read_config_file, cli, ...
//   strata::train::fit_summary s = strata::train::train_as_configured(model, cfg,
//       [&](auto& run) { return run.fit(train, augment, test, test_transform); });
//
//   // Which parallel policies (for world_size > 1) and precisions the program compiles in:
//   using menu = strata::train::parallel_menu<strata::parallel::data<>,
//                                             strata::parallel::pipeline<strata::pipeline::gpipe>>;
//   strata::train::train_as_configured<menu,
//   strata::train::precision_menu<strata::precision::fp32>>(
//       model, cfg, train);
//
//   - batch: batch::adaptive when adaptive_batch is on, else batch::accumulate (with
//     gradient_accumulation_steps = 1 that is a fixed batch), among the BatchMenu's (default:
//     both);
//   - precision: precision::fp32, fp16 or bf16 by mixed_precision_dtype (with_precision_policy),
//     among the PrecisionMenu's (default: all three);
//   - parallel: world_size 1 is parallel::single_rank; more is the policy with_parallel_policy
//     names (tensor_parallel_size > 1: parallel::tensor<...>; pipeline_parallel_size > 1 the
//     pipeline of pipeline_schedule; else the data-parallel policy of gradient_sync,
//     gradient_compression and zero_stage), among the ParallelMenu's (default:
//     parallel_menus::data_parallel, data<all_reduce> alone), over communication_backend:
//     `threads` runs world_size ranks as threads of this process (rank 0's summary is
//     returned), `mpi` makes this process one rank of mpiexec's job (where the program links
//     strata::mpi, which defines STRATA_HAVE_MPI).
//
// `train(trainer&)` runs on every rank (on thread ranks, concurrently) and returns fit()'s
// summary. Each combination is one trainer type compiled in full, which is what a program's
// compile time grows with: the default menus make 3 precisions x (2 one-rank + 2 data<>)
// trainers, parallel_menus::every_policy 3 x 16 more. A configuration the menus leave out is a
// config_error naming the key, never a silent substitute. The adaptive batch runs with more than
// one rank on data<all_reduce> and zero1 only (a config_error for the others), pipelines and
// tensor parallelism with a fixed batch. Configurations that name no policy at all
// (gradient_compression = topk with all_reduce, say) are refused earlier, by config::validate.

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "strata/batch/accumulate.hpp"
#include "strata/batch/adaptive.hpp"
#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/config/train_config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/parallel/single_rank.hpp"
#include "strata/parallel/tensor_parallel.hpp"
#include "strata/pipeline.hpp"
#include "strata/precision/fp32.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/comm_config.hpp"
#include "strata/train/trainer.hpp"
#if defined(STRATA_HAVE_MPI)
#include "strata/comm/mpi.hpp"
#endif

namespace strata::train {

// The parallel policies a program compiles in for more than one rank (train_as_configured's
// first template argument): each is one trainer type per precision and batch policy.
// With the batch menu's batch::adaptive, every policy of the menu is also compiled with the
// adaptive batch (adaptive_with<Menu, ...> names fewer).
template <class... Policies>
struct parallel_menu {
  template <class Policy>
  static constexpr bool has = (std::is_same_v<Policy, Policies> || ...);
  template <class Policy>
  static constexpr bool adaptive = has<Policy>;
  // "data<all_reduce>, zero1": for the errors that name what the program has.
  static std::string names() {
    std::string out;
    ((out += (out.empty() ? "" : ", ") + std::string(Policies::name)), ...);
    return out.empty() ? std::string("no parallel policy") : out;
  }
  static std::string adaptive_names() { return names(); }
};

// Menu, with the adaptive batch compiled for AdaptivePolicies only (each pairing is one more
// trainer type per precision): parallel_menus::every_policy pairs it with data<all_reduce> and
// zero1, the mesh with data<all_reduce>.
template <class Menu, class... AdaptivePolicies>
struct adaptive_with : Menu {
  template <class Policy>
  static constexpr bool adaptive = (std::is_same_v<Policy, AdaptivePolicies> || ...);
  static std::string adaptive_names() { return parallel_menu<AdaptivePolicies...>::names(); }
};

// The precision policies a program compiles in (train_as_configured's second argument).
template <class... Precisions>
struct precision_menu {
  template <class Precision>
  static constexpr bool has = (std::is_same_v<Precision, Precisions> || ...);
};

// The batch policies a program compiles in (train_as_configured's third argument):
// batch::accumulate (a fixed batch when gradient_accumulation_steps = 1) and batch::adaptive.
template <class... Batches>
struct batch_menu {
  template <class Batch>
  static constexpr bool has = (std::is_same_v<Batch, Batches> || ...);
};

namespace parallel_menus {
namespace sp = parallel;
// data<all_reduce>: the one most runs use (train_as_configured's default).
using data_parallel = parallel_menu<sp::data<>>;
// Every data-parallel policy and pipeline schedule the configuration can name; the adaptive
// batch with data<all_reduce> and zero1.
using every_policy = adaptive_with<
    parallel_menu<
        sp::data<>, sp::data<sp::all_reduce, sp::compress::cast<float16>>,
        sp::data<sp::all_reduce, sp::compress::cast<bfloat16>>, sp::zero1,
        sp::data<sp::hierarchical>, sp::data<sp::hierarchical, sp::compress::cast<float16>>,
        sp::data<sp::hierarchical, sp::compress::cast<bfloat16>>,
        sp::data<sp::all_gather, sp::compress::topk>, sp::data<sp::parameter_server>,
        sp::data<sp::parameter_server, sp::compress::topk>, sp::pipeline<strata::pipeline::gpipe>,
        sp::pipeline<strata::pipeline::one_f_one_b>,
        sp::pipeline<strata::pipeline::interleaved_1f1b<2>>,
        sp::pipeline<strata::pipeline::zero_bubble_h1>>,
    sp::data<>, sp::zero1>;
// The dp x tp x pp mesh of a model with tensor-parallel layers: data<>, pipeline<one_f_one_b>,
// tensor<data<>> and tensor<pipeline<one_f_one_b>>; the adaptive batch with data<> only.
using mesh = adaptive_with<
    parallel_menu<sp::data<>, sp::pipeline<strata::pipeline::one_f_one_b>, sp::tensor<sp::data<>>,
                  sp::tensor<sp::pipeline<strata::pipeline::one_f_one_b>>>,
    sp::data<>>;
}  // namespace parallel_menus

using every_precision = precision_menu<precision::fp32, precision::fp16, precision::bf16>;
using every_batch = batch_menu<batch::accumulate, batch::adaptive>;

// Calls run(std::type_identity<Policy>{}) with the data-parallel policy the configuration names:
//   gradient_sync = all_reduce: parallel::data<all_reduce> with gradient_compression none,
//     float16 or bfloat16 (compress::cast), or parallel::zero1 with zero_stage = 1;
//   hierarchical: parallel::data<hierarchical>, with the same compressors as all_reduce;
//   all_gather: parallel::data<all_gather, compress::topk>;
//   parameter_server: parallel::data<parameter_server>, with compress::topk when
//     gradient_compression = topk.
// Naming a type instantiates nothing: only what run does with it is compiled.
template <class Run>
decltype(auto) with_data_policy(const config::train_config& cfg, Run&& run) {
  namespace sp = parallel;
  using config::compression_kind;
  using config::gradient_sync_kind;
  // The summing synchronisations with the compressor of gradient_compression.
  const auto summed = [&]<class Sync>(std::type_identity<Sync>) {
    switch (cfg.gradient_compression) {
      case compression_kind::float16:
        return run(std::type_identity<sp::data<Sync, sp::compress::cast<float16>>>{});
      case compression_kind::bfloat16:
        return run(std::type_identity<sp::data<Sync, sp::compress::cast<bfloat16>>>{});
      case compression_kind::none:
      case compression_kind::topk:
        break;
    }
    return run(std::type_identity<sp::data<Sync>>{});
  };
  switch (cfg.gradient_sync) {
    case gradient_sync_kind::hierarchical:
      return summed(std::type_identity<sp::hierarchical>{});
    case gradient_sync_kind::all_gather:
      return run(std::type_identity<sp::data<sp::all_gather, sp::compress::topk>>{});
    case gradient_sync_kind::parameter_server:
      if (cfg.gradient_compression == compression_kind::topk) {
        return run(std::type_identity<sp::data<sp::parameter_server, sp::compress::topk>>{});
      }
      return run(std::type_identity<sp::data<sp::parameter_server>>{});
    case gradient_sync_kind::all_reduce:
      break;
  }
  if (cfg.zero_stage == 1) {
    return run(std::type_identity<sp::zero1>{});
  }
  return summed(std::type_identity<sp::all_reduce>{});
}

// Calls run(std::type_identity<Policy>{}) with the pipeline of pipeline_schedule:
// parallel::pipeline<gpipe | one_f_one_b | interleaved_1f1b<2> | zero_bubble_h1> (interleaved
// with two chunks per rank; other chunk counts need a trainer of their own).
template <class Run>
decltype(auto) with_pipeline_policy(const config::train_config& cfg, Run&& run) {
  namespace sp = parallel;
  switch (cfg.pipeline_schedule) {
    case config::pipeline_schedule_kind::gpipe:
      return run(std::type_identity<sp::pipeline<strata::pipeline::gpipe>>{});
    case config::pipeline_schedule_kind::interleaved_1f1b:
      return run(std::type_identity<sp::pipeline<strata::pipeline::interleaved_1f1b<2>>>{});
    case config::pipeline_schedule_kind::zero_bubble_h1:
      return run(std::type_identity<sp::pipeline<strata::pipeline::zero_bubble_h1>>{});
    case config::pipeline_schedule_kind::one_f_one_b:
      break;
  }
  return run(std::type_identity<sp::pipeline<strata::pipeline::one_f_one_b>>{});
}

// Calls run(std::type_identity<Precision>{}) with the precision policy of mixed_precision_dtype.
template <class Run>
decltype(auto) with_precision_policy(const config::train_config& cfg, Run&& run) {
  switch (cfg.mixed_precision_dtype) {
    case config::precision_dtype::float16:
      return run(std::type_identity<precision::fp16>{});
    case config::precision_dtype::bfloat16:
      return run(std::type_identity<precision::bf16>{});
    case config::precision_dtype::float32:
      break;
  }
  return run(std::type_identity<precision::fp32>{});
}

// Runs Trainer (a distributed trainer type, any parallel policy: a user's too) on world_size
// ranks over communication_backend: `threads` runs them as threads of this process and returns
// rank 0's summary; `mpi` makes this process one rank of mpiexec's job (where the program links
// strata::mpi) and returns its own. train(trainer&) runs on every rank and returns fit()'s
// summary. A rank that fails under MPI ends the job with its error (MPI_Abort) instead of
// leaving the others to wait until comm_timeout.
template <class Trainer, class Model, class Train>
fit_summary train_on_ranks(const Model& model, const config::train_config& cfg, Train&& train) {
  static_assert(Trainer::distributed,
                "train_on_ranks: the trainer's parallel policy must be distributed");
  if (cfg.communication_backend != config::comm_backend_kind::threads &&
      cfg.communication_backend != config::comm_backend_kind::mpi) {
    throw config_error({.key = "communication_backend"},
                       "train_on_ranks runs ranks over threads or mpi");
  }
  if (cfg.communication_backend == config::comm_backend_kind::mpi) {
#if defined(STRATA_HAVE_MPI)
    static comm::mpi_environment environment;
    auto world = comm::mpi::world(comm_config_of(cfg));
    try {
      Trainer run(model, cfg, comm::any_comm(world));
      return fit_summary(train(run));
    } catch (const config_error&) {
      throw;  // every rank refuses the same configuration
    } catch (const std::exception& e) {
      // One rank failed: the others would wait in their next collective until comm_timeout.
      // End the job now, with this rank's error.
      if (world.size() > 1) {
        comm::mpi_environment::abort("strata: rank " + std::to_string(world.rank()) + " of " +
                                     std::to_string(world.size()) + ": " + e.what() +
                                     "\nstrata: calling MPI_Abort so that the other ranks stop "
                                     "now");
      }
      throw;
    }
#else
    throw config_error({.key = "communication_backend"},
                       "this program was built without MPI (link strata::mpi, which defines "
                       "STRATA_HAVE_MPI; strata's own build: STRATA_ENABLE_MPI=ON)");
#endif
  }
  fit_summary first;
  comm::threads::run(
      static_cast<int>(cfg.world_size),
      [&](comm::threads& comm) {
        Trainer run(model, cfg, comm::any_comm(comm));
        fit_summary s = train(run);
        if (comm.rank() == 0) {
          first = std::move(s);
        }
      },
      comm_config_of(cfg));
  return first;
}

// Calls run(std::type_identity<Policy>{}) with the parallel policy the configuration names for
// more than one rank: tensor_parallel_size > 1 is parallel::tensor<Inner> (Inner: the pipeline
// of pipeline_schedule when pipeline_parallel_size > 1, else data<>), else
// pipeline_parallel_size > 1 the pipeline of pipeline_schedule, else with_data_policy's.
template <class Run>
decltype(auto) with_parallel_policy(const config::train_config& cfg, Run&& run) {
  if (cfg.tensor_parallel_size > 1) {
    if (cfg.pipeline_parallel_size > 1) {
      return with_pipeline_policy(cfg, [&]<class Pipeline>(std::type_identity<Pipeline>) {
        return run(std::type_identity<parallel::tensor<Pipeline>>{});
      });
    }
    return run(std::type_identity<parallel::tensor<parallel::data<>>>{});
  }
  if (cfg.pipeline_parallel_size > 1) {
    return with_pipeline_policy(cfg, run);
  }
  return with_data_policy(cfg, run);
}

namespace detail {

// The key of the configuration that names a parallel policy outside the program's menu: the
// layout's, else the first data-parallel key set away from its default.
inline std::string parallel_policy_key(const config::train_config& cfg) {
  if (cfg.tensor_parallel_size > 1) {
    return "tensor_parallel_size";
  }
  if (cfg.pipeline_parallel_size > 1) {
    return cfg.pipeline_schedule != config::pipeline_schedule_kind::one_f_one_b
               ? "pipeline_schedule"
               : "pipeline_parallel_size";
  }
  if (cfg.gradient_sync != config::gradient_sync_kind::all_reduce) {
    return "gradient_sync";
  }
  if (cfg.gradient_compression != config::compression_kind::none) {
    return "gradient_compression";
  }
  return cfg.zero_stage != 0 ? "zero_stage" : "world_size";
}

}  // namespace detail

// Makes the trainer the configuration names, among the policies of ParallelMenu (for more than
// one rank), PrecisionMenu and BatchMenu, and returns train(trainer&) (see the top).
template <class ParallelMenu = parallel_menus::data_parallel, class PrecisionMenu = every_precision,
          class BatchMenu = every_batch, class Model, class Train>
fit_summary train_as_configured(const Model& model, const config::train_config& cfg,
                                Train&& train) {
  if (cfg.adaptive_batch && !BatchMenu::template has<batch::adaptive>) {
    throw config_error({.key = "adaptive_batch"},
                       "this program compiles in a fixed batch only (batch::accumulate; "
                       "strata::train::batch_menu)");
  }
  return with_precision_policy(cfg, [&]<class Precision>(std::type_identity<Precision>) {
    if constexpr (!PrecisionMenu::template has<Precision>) {
      throw config_error({.key = "mixed_precision_dtype"}, "this program does not compile in " +
                                                               std::string(Precision::name) +
                                                               " (strata::train::precision_menu)");
      return fit_summary{};
    } else {
      if (cfg.world_size == 1) {
        if constexpr (BatchMenu::template has<batch::adaptive>) {
          if (cfg.adaptive_batch) {
            trainer<Model, batch::adaptive, Precision> run(model, cfg);
            return fit_summary(train(run));
          }
        }
        trainer<Model, batch::accumulate, Precision> run(model, cfg);
        return fit_summary(train(run));
      }
      if (cfg.communication_backend != config::comm_backend_kind::threads &&
          cfg.communication_backend != config::comm_backend_kind::mpi) {
        throw config_error({.key = "communication_backend"},
                           "train_as_configured runs more than one rank over threads or mpi");
      }
#if !defined(STRATA_HAVE_MPI)
      if (cfg.communication_backend == config::comm_backend_kind::mpi) {
        throw config_error({.key = "communication_backend"},
                           "this program was built without MPI (link strata::mpi, which defines "
                           "STRATA_HAVE_MPI; strata's own build: STRATA_ENABLE_MPI=ON)");
      }
#endif
      return with_parallel_policy(cfg, [&]<class Policy>(std::type_identity<Policy>) {
        if constexpr (!ParallelMenu::template has<Policy>) {
          throw config_error({.key = detail::parallel_policy_key(cfg)},
                             "this program compiles in only " + ParallelMenu::names() +
                                 " for world_size > 1 (strata::train::parallel_menu)");
          return fit_summary{};
        } else {
          // Runs trainer<Model, Batch, Precision, Policy> on every rank; rank 0's summary.
          const auto on_ranks = [&]<class Batch>(std::type_identity<Batch>) {
            return train_on_ranks<trainer<Model, Batch, Precision, Policy>>(model, cfg, train);
          };
          if (!cfg.adaptive_batch) {
            return on_ranks(std::type_identity<batch::accumulate>{});
          }
          if constexpr (BatchMenu::template has<batch::adaptive> &&
                        ParallelMenu::template adaptive<Policy>) {
            return on_ranks(std::type_identity<batch::adaptive>{});
          } else {
            // Each pairing is a trainer type compiled in full, so the menu names the policies
            // the adaptive batch runs with (adaptive_with); the trainer itself takes more.
            throw config_error({.key = "adaptive_batch"},
                               "this program compiles adaptive_batch with more than one rank for " +
                                   ParallelMenu::adaptive_names() +
                                   " only (strata::train::adaptive_with); set adaptive_batch = "
                                   "false for " +
                                   std::string(Policy::name));
            return fit_summary{};
          }
        }
      });
    }
  });
}

}  // namespace strata::train
