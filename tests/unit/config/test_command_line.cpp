// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/config/command_line.hpp"

namespace sc = strata::config;

namespace {

sc::command_line parse(std::vector<std::string> args, sc::train_config defaults = {}) {
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const auto& a : args) {
    argv.push_back(a.c_str());
  }
  sc::cli parser("test program", defaults);
  return parser.parse(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const strata::config_error& e) {
    return e.what();
  }
  return "(no error)";
}

std::filesystem::path write_file(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::path(STRATA_TEST_WORK_DIR) / "cli";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("every key can be overridden; files apply in order, the command line last") {
  const auto a = write_file("a.toml", "batch_size_per_gpu = 16\nworld_size = 2\nlr = 0.2\n");
  const auto b = write_file("b.toml", "batch_size_per_gpu = 32\n");
  const auto got = parse({"--config", a.string(), "--config", b.string(), "--lr", "0.3",
                          "--mixed_precision_dtype=bfloat16", "--nesterov", "false"});
  CHECK(got.action == sc::command_action::run);
  CHECK(got.config.batch_size_per_gpu == 32);
  CHECK(got.config.world_size == 2);
  CHECK(got.config.lr == 0.3);
  CHECK(got.config.mixed_precision_dtype == sc::precision_dtype::bfloat16);
  CHECK_FALSE(got.config.nesterov);
  CHECK(got.config_files.size() == 2);

  sc::cli parser("all keys");
  std::size_t options = 0;
  sc::visit_keys([&](const auto& key) {
    options += parser.app().get_option_no_throw("--" + std::string(key.name)) != nullptr;
  });
  CHECK(options == sc::key_count);
}

TEST_CASE("a repeated option takes the last value") {
  CHECK(parse({"--epochs", "3", "--epochs", "4"}).config.epochs == 4);
}

TEST_CASE("the program's defaults apply before files") {
  sc::train_config defaults;
  defaults.epochs = 2;
  CHECK(parse({}, defaults).config.epochs == 2);
  CHECK(parse({"--epochs", "5"}, defaults).config.epochs == 5);
}

TEST_CASE("--print-config prints TOML that reads back to the same config") {
  const auto got = parse({"--world_size", "4", "--lr", "0.0125", "--print-config"});
  CHECK(got.action == sc::command_action::print_config);
  const auto file = write_file("printed.toml", got.text);
  const auto again = parse({"--config", file.string()});
  CHECK(again.config == got.config);
}

TEST_CASE("--policy.NAME sets a key of the [policy] table, over the files, and prints back") {
  const auto file = write_file("policy.toml", "[policy]\nlocal_sgd_period = 4\nkeep = 1\n");
  const auto got = parse({"--config", file.string(), "--policy.local_sgd_period", "8",
                          "--policy.ramp_rate=0.5", "--print-config"});
  CHECK(got.config.policy.at("local_sgd_period") == "8");
  CHECK(got.config.policy.at("keep") == "1");
  CHECK(got.config.policy.at("ramp_rate") == "0.5");
  const auto again = parse({"--config", write_file("policy-printed.toml", got.text).string()});
  CHECK(again.config == got.config);
  CHECK(contains(error_of({"--policy.local_sgd_period"}),
                 "expected a value after '--policy.local_sgd_period'"));
  CHECK(contains(error_of({"--policy.Bad", "1"}), "lower-case letters"));
}

TEST_CASE("--help returns the usage text") {
  const auto got = parse({"--help"});
  CHECK(got.action == sc::command_action::help);
  CHECK(contains(got.text, "--batch_size_per_gpu"));
  CHECK(contains(got.text, "--print-config"));
}

TEST_CASE("bad command lines are config errors naming the option") {
  CHECK(contains(error_of({"--batch_sise_per_gpu", "3"}),
                 "unknown option '--batch_sise_per_gpu'; did you mean '--batch_size_per_gpu'?"));
  CHECK(contains(error_of({"--world-size", "3"}), "did you mean '--world_size'?"));
  CHECK(contains(error_of({"stray"}), "unexpected argument 'stray'"));
  CHECK(contains(error_of({"--lr"}), "--lr"));
  CHECK(contains(error_of({"--epochs", "many"}), "key 'epochs'"));
  CHECK(contains(error_of({"--world_size", "2", "--pipeline_parallel_size", "4"}),
                 "pipeline_parallel_size = 4 is larger than world_size = 2"));
  CHECK(contains(error_of({"--config", "/nonexistent.toml"}), "/nonexistent.toml: no such file"));
}

TEST_CASE("run_main turns a config error into exit status 2 and runs the body otherwise") {
  sc::cli bad_parser("t");
  const char* bad[] = {"prog", "--epochs", "0"};
  bool ran = false;
  CHECK(sc::run_main(3, bad, bad_parser, [&](const sc::train_config&) {
          ran = true;
          return 0;
        }) == sc::config_error_exit_code);
  CHECK_FALSE(ran);
  sc::cli good_parser("t");
  const char* good[] = {"prog", "--epochs", "3"};
  CHECK(sc::run_main(3, good, good_parser, [&](const sc::train_config& cfg) {
          ran = true;
          return static_cast<int>(cfg.epochs);
        }) == 3);
  CHECK(ran);
}
