// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the trainer does about compute before it trains: the GEMM provider the `gemm` key asks
// for (model/gemm.hpp), and the log's first lines on it (provider, kernels, threads, measured
// GFLOP/s, what the choice skipped, how 16-bit products run, whether the program was compiled for
// the CPU's vectors). Separate from the trainer so that
// the executors of later parallel policies log the same.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "strata/config/train_config.hpp"
#include "strata/core/cpu_features.hpp"
#include "strata/core/error.hpp"
#include "strata/model/blas.hpp"
#include "strata/model/gemm.hpp"

namespace strata::train::detail {

// The GEMM provider for cfg.gemm (model/gemm.hpp), made the process's current one; a
// config_error naming the key when this build lacks the provider asked for.
inline model::gemm_decision choose_gemm(const config::train_config& cfg) {
  std::optional<model::gemm_provider> wanted;
  switch (cfg.gemm) {
    case config::gemm_kind::automatic:
      break;
    case config::gemm_kind::onednn:
      wanted = model::gemm_provider::onednn;
      break;
    case config::gemm_kind::openblas:
      wanted = model::gemm_provider::openblas;
      break;
    case config::gemm_kind::eigen:
      wanted = model::gemm_provider::eigen;
      break;
  }
  try {
    return model::select_gemm(wanted);
  } catch (const std::invalid_argument& e) {
    throw config_error({.key = "gemm", .file = {}, .line = 0, .column = 0}, e.what());
  }
}

// bf16_products: the process's mode when the key names one (auto leaves it as it is: a program
// may set model::set_bf16_products itself), and a config_error naming the key when the mode in
// force asks for bfloat16 products that this build, CPU or provider cannot give.
inline void set_up_bf16_products(const config::train_config& cfg, model::gemm_provider provider) {
  switch (cfg.bf16_products) {
    case config::bf16_products_kind::on:
      model::set_bf16_products(model::bf16_products_mode::on);
      break;
    case config::bf16_products_kind::off:
      model::set_bf16_products(model::bf16_products_mode::off);
      break;
    case config::bf16_products_kind::automatic:
      break;
  }
  if (model::bf16_products_setting() != model::bf16_products_mode::on) {
    return;
  }
  if (!model::bf16_products_supported()) {
    throw config_error({.key = "bf16_products"}, "\"on\": " + model::bf16_products_refusal());
  }
  if (provider != model::gemm_provider::onednn) {
    throw config_error({.key = "bf16_products"},
                       std::string("\"on\": bfloat16 products run on oneDNN, and gemm chose ") +
                           model::to_string(provider) +
                           "; set gemm = onednn with it, or bf16_products = auto or off");
  }
}

// The GEMM's provider (choose_gemm) and threads, for the whole process: blas_threads when set,
// else the environment's, else the usable CPUs shared by `ranks_sharing_cpus` ranks (set first:
// "auto" measures the providers on them). Before anything: STRATA_CPU_ISA must name a class this
// CPU has (check_cpu_isa_cap), and bf16_products what can run (set_up_bf16_products).
inline model::gemm_decision set_up_gemm(const config::train_config& cfg, int ranks_sharing_cpus) {
  check_cpu_isa_cap();
  if (cfg.blas_threads != 0) {
    model::set_blas_threads(static_cast<int>(cfg.blas_threads));
  } else if (!model::blas_threads_from_environment()) {
    model::set_blas_threads(model::automatic_blas_threads(ranks_sharing_cpus));
  }
  model::gemm_decision d = choose_gemm(cfg);
  const bool bf16_on = cfg.bf16_products == config::bf16_products_kind::on ||
                       (cfg.bf16_products == config::bf16_products_kind::automatic &&
                        model::bf16_products_setting() == model::bf16_products_mode::on);
  if (bf16_on && cfg.gemm == config::gemm_kind::automatic &&
      d.provider != model::gemm_provider::onednn &&
      model::gemm_compiled(model::gemm_provider::onednn) && model::bf16_products_supported()) {
    const std::string measured = model::to_string(d.provider);
    d = model::select_gemm(model::gemm_provider::onednn);
    d.notes.push_back("auto: oneDNN, which bf16_products = on needs (" + measured +
                      " on this CPU otherwise)");
  }
  set_up_bf16_products(cfg, d.provider);
  return d;
}

// The log's first lines on compute: the GEMM provider, its kernels, its threads and its GFLOP/s
// on one product the size of the step's largest (batch x the largest weight tensor), then what
// the choice skipped and how to fix it; and with 16-bit storage, how its products run.
inline std::vector<std::string> compute_log(const model::gemm_decision& d, std::size_t batch,
                                            std::size_t rows, std::size_t cols,
                                            std::string_view storage) {
  const model::gemm_environment env = model::detect_gemm_environment();
  std::vector<std::string> lines;
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f", model::measure_gemm(d.provider, batch, rows, cols));
  lines.push_back("gemm: " + model::describe(d, env) + ", " +
                  std::to_string(model::blas_threads()) + " thread(s), " + rate + " GFLOP/s on a " +
                  std::to_string(batch) + "x" + std::to_string(rows) + "x" + std::to_string(cols) +
                  " product; CPU: " + describe(env.cpu));
  for (const std::string& note : d.notes) {
    lines.push_back("gemm: " + note);
  }
  const std::string narrow = compiled_isa_note(compiled_isa(), widest_isa(env.cpu));
  if (!narrow.empty()) {
    lines.push_back("cpu: " + narrow);
  }
  const bool bf16 = storage == "bfloat16";
  if (bf16 && model::bf16_products(d.provider)) {
    lines.push_back("precision: bfloat16 products on oneDNN (" + d.kernel +
                    "), accumulated in float32; master weights and the optimizer in float32");
  } else if (bf16 && d.provider == model::gemm_provider::onednn && env.cpu.avx512_bf16 &&
             !env.cpu.amx_bf16 &&
             model::bf16_products_setting() == model::bf16_products_mode::automatic) {
    const model::bf16_probe_result& probe = model::bf16_products_probe();
    char measured[128];
    std::snprintf(measured, sizeof measured, "%.1f GFLOP/s against float32's %.1f",
                  probe.bf16_gflops, probe.fp32_gflops);
    lines.push_back(std::string("precision: bfloat16 products on oneDNN measured ") + measured +
                    " on this CPU (AVX512-BF16 without AMX-BF16: at best as fast), so the "
                    "products run in float32 on values rounded to bfloat16; "
                    "model::set_bf16_products(on) forces bfloat16 products; master weights and "
                    "the optimizer in float32");
  } else if (bf16 || storage == "float16") {
    std::string why;
    if (bf16) {
      why = env.cpu.avx512_bf16 || env.cpu.amx_bf16
                ? "this CPU has AVX512-BF16 or AMX-BF16; bfloat16 products need gemm = onednn"
                : "this CPU has no AVX512-BF16 or AMX-BF16";
    } else if (env.cpu.amx_fp16) {
      why = "this CPU has AMX-FP16, which strata's float16 products do not use yet";
    } else if (env.cpu.avx512_fp16) {
      why =
          "this CPU has AVX512-FP16, whose float16 products accumulate in float16, not the "
          "float32 the policy keeps; float16 products accumulated in float32 need AMX-FP16";
    } else {
      why = "this CPU has no AVX512-FP16 or AMX-FP16";
    }
    lines.push_back(std::string("precision: ") + std::string(storage) +
                    " is emulated: the products run in float32 on values rounded to " +
                    std::string(storage) + ", slower than float32 (" + why + ")");
  }
  return lines;
}

// The log's line on how the threads share the usable CPUs, when the compute threads (ranks x
// GEMM threads) and the loader's workers together outnumber them; empty otherwise. The workers
// run at a lower priority (data::loader_config::worker_nice), so the products keep their CPUs
// and the workers take the time the products leave; with worker_nice 0 they compete.
inline std::string threads_note(int usable, int ranks_sharing, int gemm_threads,
                                std::size_t workers, int worker_nice) {
  const long compute = static_cast<long>(ranks_sharing) * gemm_threads;
  const long loaders = static_cast<long>(ranks_sharing) * static_cast<long>(workers);
  if (loaders == 0 || compute + loaders <= usable) {
    return {};
  }
  std::string line = "threads: " + std::to_string(ranks_sharing) + " rank(s) x (" +
                     std::to_string(gemm_threads) + " GEMM + " + std::to_string(workers) +
                     " loader) threads on " + std::to_string(usable) + " usable CPU(s): ";
  if (worker_nice > 0) {
    line += "the loader workers run at nice +" + std::to_string(worker_nice) +
            ", below the products, and take the CPU time the products leave (a loader that "
            "falls behind shows as data time in the epoch lines)";
  } else {
    line += "the loader workers compete with the products at the same priority";
  }
  if (compute < usable) {
    return line + "; blas_threads and loader_workers set the split";
  }
  return line + "; blas_threads " +
         std::to_string(std::max(1L, (usable - loaders) / std::max(1, ranks_sharing))) +
         " would give the workers CPUs of their own, for a loader that needs them";
}

}  // namespace strata::train::detail
