// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the example trainers share: the default configuration file beside the binary, the
// command line, the summary line, and turning failures into exit codes (2 for a config error,
// 1 for anything else, with the message on stderr).

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include <strata/batch/accumulate.hpp>
#include <strata/comm/any_comm.hpp>
#include <strata/comm/threads.hpp>
#include <strata/parallel/data.hpp>
#include <strata/parallel/single_rank.hpp>
#ifdef STRATA_EXAMPLES_MPI
#include <strata/comm/mpi.hpp>
#endif
#include <strata/batch/adaptive.hpp>
#include <strata/config.hpp>
#include <strata/precision/mixed.hpp>
#include <strata/train/comm_config.hpp>
#include <strata/train/gradient_fault.hpp>
#include <strata/train/trainer.hpp>

namespace examples {

// argv with "--config <binary's directory>/<config_name>" in front when the user gave no
// --config and that file exists.
inline std::vector<const char*> with_default_config(int argc, char** argv,
                                                    const std::string& config_name,
                                                    std::string& storage) {
  std::vector<const char*> args(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" || a.rfind("--config=", 0) == 0) {
      return args;
    }
  }
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto file = (ec ? std::filesystem::path(argv[0]) : exe).parent_path() / config_name;
  if (std::filesystem::exists(file)) {
    storage = file.string();
    args.insert(args.begin() + 1, {"--config", storage.c_str()});
  }
  return args;
}

// False in the processes of an MPI job other than rank 0, which print no summary.
inline bool& prints_summary() {
  static bool yes = true;
  return yes;
}

// The line the tests and scripts read: "summary: test_accuracy ... params_xxh3 ...".
inline void print_summary(const strata::train::fit_summary& s,
                          const strata::config::train_config& cfg) {
  if (!prints_summary()) {
    return;
  }
  std::printf(
      "summary: test_accuracy %.4f test_loss %.4f epochs %llu steps %llu samples_per_s %.0f "
      "wall_s %.1f params_xxh3 %s%s%s%s\n",
      s.test_accuracy, s.test_loss, static_cast<unsigned long long>(s.epochs_done),
      static_cast<unsigned long long>(s.steps), s.samples_per_second, s.wall_seconds,
      s.params_xxh3.c_str(), s.resumed_from.empty() ? "" : " resumed_from ", s.resumed_from.c_str(),
      s.skipped_steps == 0 ? "" : (" skipped_steps " + std::to_string(s.skipped_steps)).c_str());
  if (s.stopped_by_max_steps) {
    std::printf("stopped after max_steps = %lld; run again to resume\n",
                static_cast<long long>(cfg.max_steps));
  }
}

// Which data-parallel policies a program compiles in. Each policy is one trainer type per
// precision and batch policy, and each trainer type is compiled in full (about 5 s at -O3 here):
//   every_policy     all of with_data_policy() below: example 01, 42 trainer types;
//   all_reduce_only  data<all_reduce> without compression or ZeRO, the one most runs use:
//                    example 02, 12 trainer types. The others are a config_error naming the key.
enum class data_parallel_menu { every_policy, all_reduce_only };

// Under data_parallel_menu::all_reduce_only, the keys that would need another policy.
inline void check_all_reduce_only(const strata::config::train_config& cfg) {
  using strata::config::compression_kind;
  using strata::config::gradient_sync_kind;
  const char* key = cfg.gradient_sync != gradient_sync_kind::all_reduce  ? "gradient_sync"
                    : cfg.gradient_compression != compression_kind::none ? "gradient_compression"
                    : cfg.zero_stage != 0                                ? "zero_stage"
                                                                         : nullptr;
  if (key != nullptr) {
    throw strata::config_error(
        {.key = key},
        "this example compiles in only gradient_sync = all_reduce without gradient_compression "
        "or zero_stage for world_size > 1 (examples/common/example_main.hpp: "
        "data_parallel_menu); fashion_mnist_mlp (example 01) compiles every data-parallel "
        "policy");
  }
}

// Calls run(std::type_identity<Policy>{}) with the data-parallel policy the configuration names
// (config/validate.hpp has refused the combinations that do not exist):
//   gradient_sync = all_reduce: parallel::data<all_reduce> with gradient_compression none,
//     float16 or bfloat16 (compress::cast), or parallel::zero1 with zero_stage = 1;
//   hierarchical: parallel::data<hierarchical>, with the same compressors as all_reduce;
//   all_gather: parallel::data<all_gather, compress::topk>;
//   parameter_server: parallel::data<parameter_server>, with compress::topk when
//     gradient_compression = topk.
template <data_parallel_menu Menu = data_parallel_menu::every_policy, class Run>
decltype(auto) with_data_policy(const strata::config::train_config& cfg, Run&& run) {
  namespace sp = strata::parallel;
  if constexpr (Menu == data_parallel_menu::all_reduce_only) {
    check_all_reduce_only(cfg);
    return run(std::type_identity<sp::data<sp::all_reduce>>{});
  } else {
    using strata::config::compression_kind;
    using strata::config::gradient_sync_kind;
    // The summing synchronisations with the compressor of gradient_compression.
    const auto summed = [&]<class Sync>(std::type_identity<Sync>) {
      switch (cfg.gradient_compression) {
        case compression_kind::float16:
          return run(std::type_identity<sp::data<Sync, sp::compress::cast<strata::float16>>>{});
        case compression_kind::bfloat16:
          return run(std::type_identity<sp::data<Sync, sp::compress::cast<strata::bfloat16>>>{});
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

// Makes the trainer the configuration names and runs fit through `train(trainer&)`:
//   - batch: batch::adaptive when adaptive_batch is on, else batch::accumulate (with
//     gradient_accumulation_steps = 1 that is a fixed batch);
//   - precision: precision::fp32, fp16 or bf16 by mixed_precision_dtype;
//   - parallel: world_size 1 is parallel::single_rank; more is the data-parallel policy of
//     with_data_policy() over communication_backend: `threads` runs world_size ranks as threads
//     of this process (rank 0's summary is returned), `mpi` makes this process one rank of
//     mpiexec's job (built with MPI; `mpiexec -n 2 fashion_mnist_mlp --world_size 2
//     --communication_backend mpi`).
// Policies are compile-time choices: each combination is its own trainer type (so this function
// instantiates 3 precisions x 14 trainers with data_parallel_menu::every_policy, 3 x 4 with
// all_reduce_only). With more than one rank, the adaptive batch runs
// with data<all_reduce> (no compression) and zero1; each rank adapts within its own
// memory_budget_mb, and the ranks agree on the smallest micro-batch.
template <data_parallel_menu Menu = data_parallel_menu::every_policy, class Model, class Train>
strata::train::fit_summary train_as_configured(const Model& model,
                                               const strata::config::train_config& cfg,
                                               Train&& train) {
  using strata::config::precision_dtype;
  // Every trainer takes the fault suite's STRATA_GRADIENT_FAULT (train/gradient_fault.hpp).
  const auto go = [&](auto& run) {
    strata::train::attach_gradient_fault(run);
    return train(run);
  };
  const auto with_precision = [&](auto&& run) {
    switch (cfg.mixed_precision_dtype) {
      case precision_dtype::float16:
        return run(std::type_identity<strata::precision::fp16>{});
      case precision_dtype::bfloat16:
        return run(std::type_identity<strata::precision::bf16>{});
      case precision_dtype::float32:
        break;
    }
    return run(std::type_identity<strata::precision::fp32>{});
  };
  return with_precision([&]<class Precision>(std::type_identity<Precision>) {
    if (cfg.world_size == 1) {
      if (cfg.adaptive_batch) {
        strata::train::trainer<Model, strata::batch::adaptive, Precision> run(model, cfg);
        return go(run);
      }
      strata::train::trainer<Model, strata::batch::accumulate, Precision> run(model, cfg);
      return go(run);
    }
    if (cfg.communication_backend != strata::config::comm_backend_kind::threads &&
        cfg.communication_backend != strata::config::comm_backend_kind::mpi) {
      throw strata::config_error({.key = "communication_backend"},
                                 "the examples run data parallelism over threads or mpi");
    }
#ifndef STRATA_EXAMPLES_MPI
    if (cfg.communication_backend == strata::config::comm_backend_kind::mpi) {
      throw strata::config_error({.key = "communication_backend"},
                                 "this build has no MPI (configure with STRATA_ENABLE_MPI=ON)");
    }
#endif
    return with_data_policy<Menu>(cfg, [&]<class Policy>(std::type_identity<Policy>) {
      // Runs trainer<Model, Batch, Precision, Policy> on every rank; rank 0's summary.
      const auto on_ranks = [&]<class Batch>(std::type_identity<Batch>) {
        using data_trainer = strata::train::trainer<Model, Batch, Precision, Policy>;
#ifdef STRATA_EXAMPLES_MPI
        if (cfg.communication_backend == strata::config::comm_backend_kind::mpi) {
          static strata::comm::mpi_environment environment;
          auto world = strata::comm::mpi::world(strata::train::comm_config_of(cfg));
          prints_summary() = world.rank() == 0;
          try {
            data_trainer run(model, cfg, strata::comm::any_comm(world));
            return go(run);
          } catch (const strata::config_error&) {
            throw;  // every rank refuses the same configuration
          } catch (const std::exception& e) {
            // One rank failed: the others would wait in their next collective until
            // comm_timeout. End the job now, with this rank's error.
            if (world.size() > 1) {
              strata::comm::mpi_environment::abort(
                  "strata: rank " + std::to_string(world.rank()) + " of " +
                  std::to_string(world.size()) + ": " + e.what() +
                  "\nstrata: calling MPI_Abort so that the other ranks stop now");
            }
            throw;
          }
        }
#endif
        strata::train::fit_summary first;
        strata::comm::threads::run(
            static_cast<int>(cfg.world_size),
            [&](strata::comm::threads& comm) {
              data_trainer run(model, cfg, strata::comm::any_comm(comm));
              strata::train::fit_summary s = go(run);
              if (comm.rank() == 0) {
                first = std::move(s);
              }
            },
            strata::train::comm_config_of(cfg));
        return first;
      };
      if (cfg.adaptive_batch) {
        // Each trainer type is compiled in full, so the examples pair the adaptive batch with
        // the two plain all-reduce policies only; the library takes it with any of them.
        if constexpr (std::is_same_v<Policy, strata::parallel::data<>> ||
                      std::is_same_v<Policy, strata::parallel::zero1>) {
          return on_ranks(std::type_identity<strata::batch::adaptive>{});
        } else {
          throw strata::config_error(
              {.key = "adaptive_batch"},
              "the examples run adaptive_batch with more than one rank on gradient_sync = "
              "all_reduce without gradient_compression (zero_stage 0 or 1); set adaptive_batch = "
              "false for this policy");
        }
      }
      return on_ranks(std::type_identity<strata::batch::accumulate>{});
    });
  });
}

// Parses the command line (with `config_name` beside the binary as the default file) and runs
// `body(config)`, which returns fit()'s summary; prints it. Exit status: 0, 2 on a config error,
// 1 on any other error.
template <class Body>
int run(int argc, char** argv, const std::string& description, const std::string& config_name,
        Body&& body) {
  std::string storage;
  const std::vector<const char*> args = with_default_config(argc, argv, config_name, storage);
  const std::string program = std::filesystem::path(config_name).stem().string();
  strata::config::cli parser(description);
  const auto guarded = [&](const strata::config::train_config& cfg) {
    try {
      print_summary(body(cfg), cfg);
      return 0;
    } catch (const strata::config_error&) {
      throw;  // run_main prints it and exits with status 2
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
      return 1;
    }
  };
  return strata::config::run_main(static_cast<int>(args.size()), args.data(), parser, guarded);
}

}  // namespace examples
