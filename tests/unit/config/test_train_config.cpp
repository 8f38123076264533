// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "strata/config/toml_reader.hpp"
#include "strata/config/train_config.hpp"

namespace sc = strata::config;

TEST_CASE("the seed article's keys exist under their exact names") {
  const std::set<std::string_view> keys(sc::key_names.begin(), sc::key_names.end());
  for (const auto* name :
       {"batch_size_per_gpu", "gradient_accumulation_steps", "world_size", "communication_backend",
        "mixed_precision_dtype", "checkpoint_interval", "lr_schedule"}) {
    CHECK_MESSAGE(keys.count(name) == 1, name);
  }
  CHECK(keys.size() == sc::key_names.size());  // no key declared twice
}

TEST_CASE("print_toml reads back to an equal config, for defaults and for changed values") {
  CHECK(sc::parse_toml(sc::print_toml(sc::train_config{})) == sc::train_config{});
  sc::train_config cfg;
  cfg.batch_size_per_gpu = 96;
  cfg.lr = 0.1 + 0.2;  // not exactly representable in short decimal
  cfg.weight_decay = 1e-5;
  cfg.warmup_epochs = 1.0;
  cfg.data_dir = "/data/with \"quotes\" and \\ slashes";
  cfg.communication_backend = sc::comm_backend_kind::mpi;
  cfg.mixed_precision_dtype = sc::precision_dtype::float16;
  cfg.pipeline_schedule = sc::pipeline_schedule_kind::interleaved_1f1b;
  cfg.nesterov = false;
  cfg.world_size = 4;
  const auto back = sc::parse_toml(sc::print_toml(cfg));
  CHECK(back == cfg);
  CHECK(back.lr == cfg.lr);
}

TEST_CASE("enum names round trip") {
  CHECK(sc::to_string(sc::precision_dtype::bfloat16) == "bfloat16");
  CHECK(sc::parse_enum<sc::lr_schedule_kind>("cosine") == sc::lr_schedule_kind::cosine);
  CHECK_FALSE(sc::parse_enum<sc::lr_schedule_kind>("linear").has_value());
  CHECK(sc::allowed_values<sc::comm_backend_kind>() == "threads | mpi | nccl");
}

TEST_CASE("docs/config.md documents every key with its default") {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/docs/config.md");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const sc::train_config defaults;
  sc::visit_keys([&](const auto& key) {
    const std::string row = "| `" + std::string(key.name) + "` |";
    const auto at = doc.find(row);
    CHECK_MESSAGE(at != std::string::npos, "docs/config.md lacks a row for ", key.name);
    if (at != std::string::npos) {
      const auto line = doc.substr(at, doc.find('\n', at) - at);
      const auto value = sc::value_text(defaults, key);
      CHECK_MESSAGE(line.find("`" + value + "`") != std::string::npos, "docs/config.md row for ",
                    key.name, " does not show its default ", value);
    }
  });
}
