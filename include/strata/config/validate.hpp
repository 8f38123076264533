// SPDX-License-Identifier: Apache-2.0
#pragma once

// Checks across keys: each key's own range is checked where it is read; here the keys that must
// agree with each other, and with the launcher. Every error names both sides.

#include <cstdint>
#include <string>
#include <string_view>

#include "strata/config/train_config.hpp"
#include "strata/core/error.hpp"

namespace strata::config {

// The data-parallel size that the layout implies (data_parallel_size, or derived from the world).
inline std::int64_t effective_data_parallel_size(const train_config& cfg) {
  if (cfg.data_parallel_size != 0) {
    return cfg.data_parallel_size;
  }
  return cfg.world_size / (cfg.tensor_parallel_size * cfg.pipeline_parallel_size);
}

// Every single key in range and every pair consistent; throws config_error otherwise.
// `source` names where the values came from (a file, "command line") for the message.
// Throws config_error naming run_name when it cannot be one directory's name (empty: automatic).
inline void check_run_name(std::string_view name, std::string_view source = {}) {
  if (name.empty()) {
    return;
  }
  if (name == "." || name == ".." || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos || name.front() == '.') {
    throw config_error({.key = "run_name", .file = std::string(source)},
                       "'" + std::string(name) +
                           "' is not a directory name (no '/', and not starting with '.'); "
                           "empty = automatic");
  }
}

inline void validate(const train_config& cfg, std::string_view source = {}) {
  check_run_name(cfg.run_name, source);
  const auto at = [&](std::string_view key) {
    return config_location{.key = std::string(key), .file = std::string(source)};
  };
  visit_keys([&](const auto& key) { check_range(cfg, key, at(key.name)); });

  const auto s = [](std::int64_t v) { return std::to_string(v); };
  if (cfg.pipeline_parallel_size > cfg.world_size) {
    throw config_error(at("pipeline_parallel_size"),
                       "pipeline_parallel_size = " + s(cfg.pipeline_parallel_size) +
                           " is larger than world_size = " + s(cfg.world_size) +
                           "; a pipeline needs one rank per stage");
  }
  if (cfg.tensor_parallel_size > cfg.world_size) {
    throw config_error(at("tensor_parallel_size"),
                       "tensor_parallel_size = " + s(cfg.tensor_parallel_size) +
                           " is larger than world_size = " + s(cfg.world_size));
  }
  const std::int64_t model_ranks = cfg.tensor_parallel_size * cfg.pipeline_parallel_size;
  if (cfg.data_parallel_size == 0) {
    if (cfg.world_size % model_ranks != 0) {
      throw config_error(at("world_size"),
                         "world_size = " + s(cfg.world_size) +
                             " is not divisible by tensor_parallel_size x pipeline_parallel_size "
                             "= " +
                             s(cfg.tensor_parallel_size) + " x " + s(cfg.pipeline_parallel_size));
    }
  } else if (cfg.data_parallel_size * model_ranks != cfg.world_size) {
    throw config_error(at("data_parallel_size"),
                       "data_parallel_size x tensor_parallel_size x pipeline_parallel_size = " +
                           s(cfg.data_parallel_size) + " x " + s(cfg.tensor_parallel_size) + " x " +
                           s(cfg.pipeline_parallel_size) +
                           " does not equal world_size = " + s(cfg.world_size));
  }
  if (cfg.micro_batches > cfg.batch_size_per_gpu) {
    throw config_error(at("micro_batches"), "micro_batches = " + s(cfg.micro_batches) +
                                                " pieces of a batch of batch_size_per_gpu = " +
                                                s(cfg.batch_size_per_gpu) +
                                                " samples: each needs a sample");
  }
  if (cfg.adaptive_batch_min > cfg.adaptive_batch_max) {
    throw config_error(at("adaptive_batch_min"),
                       "adaptive_batch_min = " + s(cfg.adaptive_batch_min) +
                           " is larger than adaptive_batch_max = " + s(cfg.adaptive_batch_max));
  }
  if (cfg.adaptive_batch && (cfg.batch_size_per_gpu < cfg.adaptive_batch_min ||
                             cfg.batch_size_per_gpu > cfg.adaptive_batch_max)) {
    throw config_error(
        at("batch_size_per_gpu"),
        "with adaptive_batch = true, batch_size_per_gpu = " + s(cfg.batch_size_per_gpu) +
            " must lie in adaptive_batch_min .. "
            "adaptive_batch_max = " +
            s(cfg.adaptive_batch_min) + " .. " + s(cfg.adaptive_batch_max));
  }
  if (cfg.loss_scale_min > cfg.loss_scale_initial) {
    throw config_error(
        at("loss_scale_min"),
        "loss_scale_min = " + detail::format_real(cfg.loss_scale_min) +
            " is larger than loss_scale_initial = " + detail::format_real(cfg.loss_scale_initial));
  }
  if (cfg.warmup_epochs >= static_cast<double>(cfg.epochs) && cfg.warmup_epochs > 0.0) {
    throw config_error(at("warmup_epochs"),
                       "warmup_epochs = " + detail::format_real(cfg.warmup_epochs) +
                           " is not less than epochs = " + s(cfg.epochs));
  }
  if (cfg.lr_min > cfg.lr) {
    throw config_error(at("lr_min"), "lr_min = " + detail::format_real(cfg.lr_min) +
                                         " is larger than lr = " + detail::format_real(cfg.lr));
  }
  if (cfg.gradient_compression == compression_kind::topk &&
      cfg.gradient_sync != gradient_sync_kind::all_gather &&
      cfg.gradient_sync != gradient_sync_kind::parameter_server) {
    throw config_error(at("gradient_compression"),
                       "gradient_compression = topk is not summable and cannot travel through "
                       "gradient_sync = " +
                           std::string(to_string(cfg.gradient_sync)) +
                           "; use all_gather or parameter_server");
  }
  if (cfg.gradient_sync == gradient_sync_kind::all_gather &&
      cfg.gradient_compression != compression_kind::topk) {
    throw config_error(at("gradient_sync"),
                       "gradient_sync = all_gather carries top-k compressed gradients only "
                       "(gradient_compression = topk); dense gradients are cheaper by "
                       "all_reduce");
  }
  if (cfg.zero_stage == 1 && (cfg.gradient_sync != gradient_sync_kind::all_reduce ||
                              cfg.gradient_compression != compression_kind::none)) {
    throw config_error(at("zero_stage"),
                       "zero_stage = 1 shards the optimizer state of gradient_sync = all_reduce "
                       "without compression; gradient_sync = " +
                           std::string(to_string(cfg.gradient_sync)) + ", gradient_compression = " +
                           std::string(to_string(cfg.gradient_compression)) +
                           (cfg.gradient_sync == gradient_sync_kind::parameter_server
                                ? " (the parameter server shards it over its servers already)"
                                : ""));
  }
  if ((cfg.gradient_compression == compression_kind::float16 ||
       cfg.gradient_compression == compression_kind::bfloat16) &&
      cfg.gradient_sync != gradient_sync_kind::all_reduce &&
      cfg.gradient_sync != gradient_sync_kind::hierarchical) {
    throw config_error(
        at("gradient_compression"),
        "gradient_compression = " + std::string(to_string(cfg.gradient_compression)) +
            " runs with gradient_sync = all_reduce or hierarchical only, not " +
            std::string(to_string(cfg.gradient_sync)));
  }
}

// The launcher's rank count must equal world_size. `launcher` names it ("mpiexec", "threads").
inline void check_world_size(const train_config& cfg, std::int64_t launcher_size,
                             std::string_view launcher) {
  if (cfg.world_size != launcher_size) {
    throw config_error(config_location{.key = "world_size"},
                       "world_size = " + std::to_string(cfg.world_size) + " but " +
                           std::string(launcher) + " started " + std::to_string(launcher_size) +
                           " rank(s); make them equal (mpiexec -n " +
                           std::to_string(cfg.world_size) + ", or --world_size " +
                           std::to_string(launcher_size) + ")");
  }
}

}  // namespace strata::config
