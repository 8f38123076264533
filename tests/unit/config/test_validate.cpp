// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <string>

#include "strata/config/toml_reader.hpp"
#include "strata/config/validate.hpp"

namespace sc = strata::config;

namespace {

std::string message_of(const char* toml) {
  try {
    sc::parse_toml(toml);
  } catch (const strata::config_error& e) {
    return e.what();
  }
  return "(no error)";
}

bool names(const std::string& text, const char* a, const char* b) {
  return text.find(a) != std::string::npos && text.find(b) != std::string::npos;
}

}  // namespace

TEST_CASE("the defaults are valid") {
  CHECK_NOTHROW(sc::validate(sc::train_config{}));
}

TEST_CASE("inconsistent pairs name both keys") {
  CHECK(names(message_of("world_size = 2\npipeline_parallel_size = 4"), "pipeline_parallel_size",
              "world_size"));
  CHECK(names(message_of("world_size = 2\ntensor_parallel_size = 4"), "tensor_parallel_size",
              "world_size"));
  CHECK(names(message_of("world_size = 6\ntensor_parallel_size = 4"), "world_size",
              "tensor_parallel_size"));
  CHECK(names(message_of("world_size = 8\ndata_parallel_size = 3\npipeline_parallel_size = 2"),
              "data_parallel_size", "world_size"));
  CHECK(names(message_of("batch_size_per_gpu = 16\nmicro_batches = 32"), "micro_batches",
              "batch_size_per_gpu"));
  CHECK(names(message_of("adaptive_batch_min = 64\nadaptive_batch_max = 32"), "adaptive_batch_min",
              "adaptive_batch_max"));
  CHECK(names(message_of("adaptive_batch = true\nbatch_size_per_gpu = 4"), "batch_size_per_gpu",
              "adaptive_batch_min"));
  CHECK(names(message_of("epochs = 3\nwarmup_epochs = 3.0"), "warmup_epochs", "epochs"));
  CHECK(names(message_of("lr = 0.1\nlr_min = 0.2"), "lr_min", "lr"));
  CHECK(names(message_of("gradient_compression = \"topk\"\ngradient_sync = \"hierarchical\""),
              "gradient_compression", "gradient_sync"));
  CHECK(names(message_of("gradient_compression = \"float16\"\ngradient_sync = \"all_gather\""),
              "gradient_sync", "all_gather"));
  CHECK(names(message_of("gradient_compression = \"bfloat16\"\n"
                         "gradient_sync = \"parameter_server\""),
              "gradient_compression", "parameter_server"));
  CHECK(names(message_of("zero_stage = 1\ngradient_sync = \"hierarchical\""), "zero_stage",
              "hierarchical"));
}

TEST_CASE("the 16-bit casts go with the summing synchronisations") {
  for (const char* sync : {"all_reduce", "hierarchical"}) {
    for (const char* wire : {"float16", "bfloat16"}) {
      const std::string text =
          std::string("gradient_sync = \"") + sync + "\"\ngradient_compression = \"" + wire + "\"";
      CHECK_NOTHROW(sc::validate(sc::parse_toml(text)));
    }
  }
}

TEST_CASE("consistent layouts pass and derive the data-parallel size") {
  const auto cfg = sc::parse_toml(
      "world_size = 8\ntensor_parallel_size = 2\n"
      "pipeline_parallel_size = 2");
  CHECK(sc::effective_data_parallel_size(cfg) == 2);
  const auto explicit_dp = sc::parse_toml(
      "world_size = 8\ndata_parallel_size = 4\n"
      "pipeline_parallel_size = 2");
  CHECK(sc::effective_data_parallel_size(explicit_dp) == 4);
}

TEST_CASE("world_size must match the launcher") {
  sc::train_config cfg;
  cfg.world_size = 4;
  CHECK_NOTHROW(sc::check_world_size(cfg, 4, "mpiexec"));
  try {
    sc::check_world_size(cfg, 2, "mpiexec");
    FAIL("mismatch accepted");
  } catch (const strata::config_error& e) {
    CHECK(e.key() == "world_size");
    CHECK(std::string(e.what()).find("mpiexec started 2 rank(s)") != std::string::npos);
    CHECK(std::string(e.what()).find("world_size = 4") != std::string::npos);
  }
}
