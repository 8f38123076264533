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

#include <strata/config.hpp>
#include <strata/train/configured.hpp>
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

// The library's train_as_configured (strata/train/configured.hpp: the trainer the configuration
// names, over threads or MPI, among the policies a program lists), with what the examples add:
// every trainer takes the fault suite's STRATA_GRADIENT_FAULT (train/gradient_fault.hpp), and in
// an MPI job only rank 0 prints the summary.
namespace parallel_menus = strata::train::parallel_menus;

// What every example does to a trainer before training: the fault suite's gradient fault, and
// under MPI the summary printed by rank 0 alone.
template <class Trainer>
void prepare(Trainer& run, const strata::config::train_config& cfg) {
  strata::train::attach_gradient_fault(run);
  if (cfg.world_size > 1 && cfg.communication_backend == strata::config::comm_backend_kind::mpi) {
    prints_summary() = run.rank() == 0;  // one trainer per process: no other thread writes it
  }
}

template <class ParallelMenu = parallel_menus::data_parallel,
          class PrecisionMenu = strata::train::every_precision,
          class BatchMenu = strata::train::every_batch, class Model, class Train>
strata::train::fit_summary train_as_configured(const Model& model,
                                               const strata::config::train_config& cfg,
                                               Train&& train) {
  return strata::train::train_as_configured<ParallelMenu, PrecisionMenu, BatchMenu>(
      model, cfg, [&](auto& run) {
        prepare(run, cfg);
        return train(run);
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
