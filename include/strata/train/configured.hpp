// SPDX-License-Identifier: Apache-2.0
#pragma once

// The trainer a configuration names: policies are compile-time choices, so a program that picks
// them from a config file (or the command line) compiles every trainer type it may need and
// runs the one the values name. train_as_configured does that for the shipped policies:
//
//   const strata::config::train_config cfg = ...;            // read_config_file, cli, ...
//   strata::train::fit_summary s = strata::train::train_as_configured(model, cfg,
//       [&](auto& run) { return run.fit(train, augment, test, test_transform); });
//
//   - batch: batch::adaptive when adaptive_batch is on, else batch::accumulate (with
//     gradient_accumulation_steps = 1 that is a fixed batch);
//   - precision: precision::fp32, fp16 or bf16 by mixed_precision_dtype (with_precision_policy);
//   - parallel: world_size 1 is parallel::single_rank; more is the data-parallel policy
//     with_data_policy names, or with pipeline_parallel_size > 1 (every_policy menu) the
//     pipeline with_pipeline_policy names, or (mesh menu) the dp x tp x pp layout's policy
//     (tensor_parallel_size > 1: parallel::tensor<...>), over communication_backend: `threads` runs
//     world_size ranks as threads of this process (rank 0's summary is returned), `mpi` makes
//     this process one rank of mpiexec's job (where the program links strata::mpi, which defines
//     STRATA_HAVE_MPI).
//
// `train(trainer&)` runs on every rank (on thread ranks, concurrently) and returns fit()'s
// summary. Each combination is one trainer type compiled in full: with
// data_parallel_menu::every_policy that is 3 precisions x 14 trainers (the compile time of
// example 01), with all_reduce_only 3 x 4 (example 02); a configuration the menu leaves out is a
// config_error naming the key. With more than one rank the adaptive batch runs with
// data<all_reduce> and zero1 only (a config_error for the others). Configurations that name no
// policy at all (gradient_compression = topk with all_reduce, say) are refused earlier, by
// config::validate.

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

// Which data-parallel policies a program compiles in (each is one trainer type per precision and
// batch policy, compiled in full):
//   every_policy     every policy with_data_policy names: 14 trainer types per precision;
//   all_reduce_only  data<all_reduce> without compression or ZeRO, the one most runs use: 4;
//   mesh             the dp x tp x pp mesh of a model with tensor-parallel layers: data<>,
//                    pipeline<one_f_one_b>, tensor<data<>> and tensor<pipeline<one_f_one_b>>,
//                    a fixed batch: 4 (and the one-rank trainers).
enum class data_parallel_menu { every_policy, all_reduce_only, mesh };

namespace detail {

// Under data_parallel_menu::all_reduce_only, the key that would need another policy.
inline void check_all_reduce_only(const config::train_config& cfg) {
  using config::compression_kind;
  using config::gradient_sync_kind;
  const char* key = cfg.gradient_sync != gradient_sync_kind::all_reduce  ? "gradient_sync"
                    : cfg.gradient_compression != compression_kind::none ? "gradient_compression"
                    : cfg.zero_stage != 0                                ? "zero_stage"
                                                                         : nullptr;
  if (key != nullptr) {
    throw config_error({.key = key},
                       "this program compiles in only gradient_sync = all_reduce without "
                       "gradient_compression or zero_stage for world_size > 1 "
                       "(strata::train::data_parallel_menu::all_reduce_only)");
  }
}

}  // namespace detail

// Calls run(std::type_identity<Policy>{}) with the data-parallel policy the configuration names:
//   gradient_sync = all_reduce: parallel::data<all_reduce> with gradient_compression none,
//     float16 or bfloat16 (compress::cast), or parallel::zero1 with zero_stage = 1;
//   hierarchical: parallel::data<hierarchical>, with the same compressors as all_reduce;
//   all_gather: parallel::data<all_gather, compress::topk>;
//   parameter_server: parallel::data<parameter_server>, with compress::topk when
//     gradient_compression = topk.
template <data_parallel_menu Menu = data_parallel_menu::every_policy, class Run>
decltype(auto) with_data_policy(const config::train_config& cfg, Run&& run) {
  namespace sp = parallel;
  if constexpr (Menu == data_parallel_menu::all_reduce_only) {
    detail::check_all_reduce_only(cfg);
    return run(std::type_identity<sp::data<sp::all_reduce>>{});
  } else {
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

namespace detail {

// data_parallel_menu::mesh on more than one rank: the layout's policy, a fixed batch.
template <class Model, class Precision, class Train>
fit_summary on_mesh(const Model& model, const config::train_config& cfg, Train& train) {
  check_all_reduce_only(cfg);
  if (cfg.adaptive_batch) {
    throw config_error({.key = "adaptive_batch"},
                       "this program runs the dp x tp x pp mesh with a fixed batch "
                       "(strata::train::data_parallel_menu::mesh)");
  }
  if (cfg.pipeline_parallel_size > 1 &&
      cfg.pipeline_schedule != config::pipeline_schedule_kind::one_f_one_b) {
    throw config_error({.key = "pipeline_schedule"},
                       "this program compiles in pipeline_schedule = one_f_one_b only "
                       "(strata::train::data_parallel_menu::mesh)");
  }
  using pipe = parallel::pipeline<strata::pipeline::one_f_one_b>;
  const auto on = [&]<class Policy>(std::type_identity<Policy>) {
    return train_on_ranks<trainer<Model, batch::accumulate, Precision, Policy>>(model, cfg, train);
  };
  if (cfg.tensor_parallel_size > 1) {
    return cfg.pipeline_parallel_size > 1
               ? on(std::type_identity<parallel::tensor<pipe>>{})
               : on(std::type_identity<parallel::tensor<parallel::data<>>>{});
  }
  return cfg.pipeline_parallel_size > 1 ? on(std::type_identity<pipe>{})
                                        : on(std::type_identity<parallel::data<>>{});
}

}  // namespace detail

// Makes the trainer the configuration names and returns train(trainer&) (see the top).
template <data_parallel_menu Menu = data_parallel_menu::every_policy, class Model, class Train>
fit_summary train_as_configured(const Model& model, const config::train_config& cfg,
                                Train&& train) {
  return with_precision_policy(cfg, [&]<class Precision>(std::type_identity<Precision>) {
    if (cfg.world_size == 1) {
      if (cfg.adaptive_batch) {
        trainer<Model, batch::adaptive, Precision> run(model, cfg);
        return fit_summary(train(run));
      }
      trainer<Model, batch::accumulate, Precision> run(model, cfg);
      return fit_summary(train(run));
    }
    if (cfg.communication_backend != config::comm_backend_kind::threads &&
        cfg.communication_backend != config::comm_backend_kind::mpi) {
      throw config_error({.key = "communication_backend"},
                         "train_as_configured runs data parallelism over threads or mpi");
    }
#if !defined(STRATA_HAVE_MPI)
    if (cfg.communication_backend == config::comm_backend_kind::mpi) {
      throw config_error({.key = "communication_backend"},
                         "this program was built without MPI (link strata::mpi, which defines "
                         "STRATA_HAVE_MPI; strata's own build: STRATA_ENABLE_MPI=ON)");
    }
#endif
    if constexpr (Menu == data_parallel_menu::mesh) {
      return detail::on_mesh<Model, Precision>(model, cfg, train);
    } else {
      if (cfg.pipeline_parallel_size > 1) {
        if constexpr (Menu == data_parallel_menu::all_reduce_only) {
          throw config_error({.key = "pipeline_parallel_size"},
                             "this program compiles in data<all_reduce> only "
                             "(strata::train::data_parallel_menu::all_reduce_only), no pipeline");
        } else {
          if (cfg.adaptive_batch) {
            throw config_error({.key = "adaptive_batch"},
                               "train_as_configured runs pipelines with a fixed batch; the trainer "
                               "itself takes batch::adaptive with parallel::pipeline");
          }
          return with_pipeline_policy(cfg, [&]<class Policy>(std::type_identity<Policy>) {
            return train_on_ranks<trainer<Model, batch::accumulate, Precision, Policy>>(model, cfg,
                                                                                        train);
          });
        }
      }
      return with_data_policy<Menu>(cfg, [&]<class Policy>(std::type_identity<Policy>) {
        // Runs trainer<Model, Batch, Precision, Policy> on every rank; rank 0's summary.
        const auto on_ranks = [&]<class Batch>(std::type_identity<Batch>) {
          return train_on_ranks<trainer<Model, Batch, Precision, Policy>>(model, cfg, train);
        };
        if (cfg.adaptive_batch) {
          // Each trainer type is compiled in full, so the adaptive batch is paired with the two
          // plain all-reduce policies only; the trainer itself takes it with any of them.
          if constexpr (std::is_same_v<Policy, parallel::data<>> ||
                        std::is_same_v<Policy, parallel::zero1>) {
            return on_ranks(std::type_identity<batch::adaptive>{});
          } else {
            throw config_error(
                {.key = "adaptive_batch"},
                "train_as_configured runs adaptive_batch with more than one rank on gradient_sync "
                "= all_reduce without gradient_compression (zero_stage 0 or 1); set "
                "adaptive_batch = false for this policy");
          }
        }
        return on_ranks(std::type_identity<batch::accumulate>{});
      });
    }
  });
}

}  // namespace strata::train
