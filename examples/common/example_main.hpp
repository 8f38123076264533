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
#include <vector>

#include <strata/batch/accumulate.hpp>
#include <strata/batch/adaptive.hpp>
#include <strata/config.hpp>
#include <strata/precision/mixed.hpp>
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

// The line the tests and scripts read: "summary: test_accuracy ... params_xxh3 ...".
inline void print_summary(const strata::train::fit_summary& s,
                          const strata::config::train_config& cfg) {
  std::printf(
      "summary: test_accuracy %.4f test_loss %.4f epochs %llu steps %llu samples_per_s %.0f "
      "wall_s %.1f params_xxh3 %s%s%s\n",
      s.test_accuracy, s.test_loss, static_cast<unsigned long long>(s.epochs_done),
      static_cast<unsigned long long>(s.steps), s.samples_per_second, s.wall_seconds,
      s.params_xxh3.c_str(), s.resumed_from.empty() ? "" : " resumed_from ",
      s.resumed_from.c_str());
  if (s.stopped_by_max_steps) {
    std::printf("stopped after max_steps = %lld; run again to resume\n",
                static_cast<long long>(cfg.max_steps));
  }
}

// Runs body.template operator()<BatchPolicy, PrecisionPolicy>() with the policies the
// configuration names: batch::adaptive when adaptive_batch is on, else batch::accumulate (with
// gradient_accumulation_steps = 1 that is a fixed batch); precision::fp32, fp16 or bf16 by
// mixed_precision_dtype. Policies are compile-time choices: each pair is its own trainer type.
template <class Body>
auto with_policies(const strata::config::train_config& cfg, Body&& body) {
  using strata::config::precision_dtype;
  const auto by_precision = [&]<class Batch>() {
    switch (cfg.mixed_precision_dtype) {
      case precision_dtype::float16:
        return body.template operator()<Batch, strata::precision::fp16>();
      case precision_dtype::bfloat16:
        return body.template operator()<Batch, strata::precision::bf16>();
      case precision_dtype::float32:
        break;
    }
    return body.template operator()<Batch, strata::precision::fp32>();
  };
  if (cfg.adaptive_batch) {
    return by_precision.template operator()<strata::batch::adaptive>();
  }
  return by_precision.template operator()<strata::batch::accumulate>();
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
