// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "strata/config/toml_reader.hpp"

namespace sc = strata::config;

namespace {

// The config_error thrown by `fn`, or a failed check when none is.
template <class Fn>
strata::config_error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const strata::config_error& e) {
    return e;
  }
  FAIL("no config_error was thrown");
  return strata::config_error({}, "unreachable");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("the seed table's keys read from TOML") {
  const auto cfg = sc::parse_toml(R"(
batch_size_per_gpu = 128
gradient_accumulation_steps = 4
world_size = 8
communication_backend = "nccl"
mixed_precision_dtype = "bfloat16"
checkpoint_interval = 5
lr_schedule = "step"
)");
  CHECK(cfg.batch_size_per_gpu == 128);
  CHECK(cfg.gradient_accumulation_steps == 4);
  CHECK(cfg.world_size == 8);
  CHECK(cfg.communication_backend == sc::comm_backend_kind::nccl);
  CHECK(cfg.mixed_precision_dtype == sc::precision_dtype::bfloat16);
  CHECK(cfg.checkpoint_interval == 5);
  CHECK(cfg.lr_schedule == sc::lr_schedule_kind::step);
  // Keys not in the document keep their defaults.
  CHECK(cfg.epochs == sc::train_config{}.epochs);
}

TEST_CASE("an integer is accepted where a float is expected, not the other way round") {
  CHECK(sc::parse_toml("lr = 1").lr == 1.0);
  const auto e = error_of([] { sc::parse_toml("batch_size_per_gpu = 32.5", "a.toml"); });
  CHECK(e.key() == "batch_size_per_gpu");
  CHECK(e.file() == "a.toml");
  CHECK(e.line() == 1);
  CHECK(contains(e.what(), "expected integer"));
  CHECK(contains(e.what(), "found a float"));
}

TEST_CASE("a syntax error names file, line and column") {
  const auto e = error_of([] { sc::parse_toml("epochs = 3\nlr = [1\n", "broken.toml"); });
  CHECK(e.file() == "broken.toml");
  CHECK(e.line() >= 2);
  CHECK(e.column() > 0);
  CHECK(contains(e.what(), "broken.toml:"));
  CHECK(contains(e.what(), "TOML syntax error"));
}

TEST_CASE("an unknown key is rejected with a did-you-mean") {
  const auto e = error_of([] { sc::parse_toml("\n\nbatch_sise_per_gpu = 3", "u.toml"); });
  CHECK(e.line() == 3);
  CHECK(e.column() == 1);
  CHECK(contains(e.what(), "unknown key 'batch_sise_per_gpu'"));
  CHECK(contains(e.what(), "did you mean 'batch_size_per_gpu'?"));
  const auto far = error_of([] { sc::parse_toml("zzzzzzzzzzzzzzzz = 1"); });
  CHECK_FALSE(contains(far.what(), "did you mean"));
  // The configuration is flat: a table is an unknown key, or a value of the wrong type.
  const auto table = error_of([] { sc::parse_toml("[dataset]\nlr = 0.1\n"); });
  CHECK(contains(table.what(), "unknown key 'dataset'"));
  const auto typed = error_of([] { sc::parse_toml("[optimizer]\nlr = 0.1\n"); });
  CHECK(typed.key() == "optimizer");
  CHECK(contains(typed.what(), "found a table"));
}

TEST_CASE("wrong types name the key, what was found and what is allowed") {
  const auto e = error_of([] { sc::parse_toml("nesterov = \"yes\""); });
  CHECK(e.key() == "nesterov");
  CHECK(contains(e.what(), "expected boolean"));
  CHECK(contains(e.what(), "found a string"));
  const auto s = error_of([] { sc::parse_toml("communication_backend = 3"); });
  CHECK(contains(s.what(), "threads | mpi | nccl"));
}

TEST_CASE("out-of-range values name the key, the value and the range") {
  const auto e = error_of([] { sc::parse_toml("batch_size_per_gpu = 0"); });
  CHECK(e.key() == "batch_size_per_gpu");
  CHECK(contains(e.what(), "value 0 is out of range"));
  CHECK(contains(e.what(), "1 .. 1048576"));
  const auto r = error_of([] { sc::parse_toml("momentum = 1.5"); });
  CHECK(contains(r.what(), "1.5"));
  CHECK(contains(r.what(), "[0.0, 1.0]"));
  const auto x = error_of([] { sc::parse_toml("lr = 0.0"); });
  CHECK(contains(x.what(), "(0.0, 1000.0]"));
  const auto n = error_of([] { sc::parse_toml("lr = nan"); });
  CHECK(n.key() == "lr");
}

TEST_CASE("an enum value not allowed gets the allowed list and a suggestion") {
  const auto e = error_of([] { sc::parse_toml("mixed_precision_dtype = \"bfloat61\""); });
  CHECK(e.key() == "mixed_precision_dtype");
  CHECK(contains(e.what(), "float32 | float16 | bfloat16"));
  CHECK(contains(e.what(), "did you mean 'bfloat16'?"));
  const auto g = error_of([] { sc::parse_toml("communication_backend = \"gloo\""); });
  CHECK(contains(g.what(), "'gloo' is not allowed"));
  const auto b = error_of([] { sc::parse_toml("bucket_launch = \"sometimes\""); });
  CHECK(b.key() == "bucket_launch");
  CHECK(contains(b.what(), "auto | async | blocking"));
  CHECK(sc::parse_toml("bucket_launch = \"blocking\"").bucket_launch ==
        sc::bucket_launch_kind::blocking);
  CHECK(sc::parse_toml("bucket_launch = \"auto\"").bucket_launch ==
        sc::bucket_launch_kind::automatic);
}

TEST_CASE("files: missing, and read from disk") {
  const auto missing = error_of([] { sc::load_toml_file("/nonexistent/strata.toml"); });
  CHECK(missing.file() == "/nonexistent/strata.toml");
  CHECK(contains(missing.what(), "no such file"));

  const auto dir = std::filesystem::path(STRATA_TEST_WORK_DIR) / "config";
  std::filesystem::create_directories(dir);
  const auto path = dir / "run.toml";
  std::ofstream(path) << "world_size = 4\nbatch_size_per_gpu = 16\n";
  const auto cfg = sc::load_toml_file(path);
  CHECK(cfg.world_size == 4);
  CHECK(cfg.batch_size_per_gpu == 16);
}

TEST_CASE("set_key parses every kind of value from text") {
  sc::train_config cfg;
  sc::set_key(cfg, "epochs", "7");
  sc::set_key(cfg, "lr", "0.125");
  sc::set_key(cfg, "nesterov", "false");
  sc::set_key(cfg, "data_dir", "/tmp/data");
  sc::set_key(cfg, "optimizer", "adamw");
  CHECK(cfg.epochs == 7);
  CHECK(cfg.lr == 0.125);
  CHECK_FALSE(cfg.nesterov);
  CHECK(cfg.data_dir == "/tmp/data");
  CHECK(cfg.optimizer == sc::optimizer_kind::adamw);
  CHECK(contains(error_of([&] { sc::set_key(cfg, "epochs", "7x"); }).what(), "not an integer"));
  CHECK(contains(error_of([&] { sc::set_key(cfg, "epochs", "99999999999999999999"); }).what(),
                 "64-bit"));
  CHECK(contains(error_of([&] { sc::set_key(cfg, "lr", "fast"); }).what(), "not a number"));
  CHECK(contains(error_of([&] { sc::set_key(cfg, "nesterov", "maybe"); }).what(), "not a boolean"));
  CHECK(
      contains(error_of([&] { sc::set_key(cfg, "epoch", "3"); }).what(), "did you mean 'epochs'?"));
}

TEST_CASE("resume reads \"auto\", a TOML boolean or its text, and prints back to the same") {
  CHECK(sc::train_config{}.resume == sc::resume_mode::automatic);
  CHECK(sc::parse_toml("resume = \"auto\"").resume == sc::resume_mode::automatic);
  CHECK(sc::parse_toml("resume = true").resume == sc::resume_mode::required);
  CHECK(sc::parse_toml("resume = false").resume == sc::resume_mode::never);
  CHECK(sc::parse_toml("resume = \"false\"").resume == sc::resume_mode::never);
  sc::train_config cfg;
  sc::set_key(cfg, "resume", "true");
  CHECK(cfg.resume == sc::resume_mode::required);
  sc::set_key(cfg, "run_name", "baseline");
  CHECK(cfg.run_name == "baseline");
  // true / false print as TOML booleans, auto as a string; each reads back equal.
  for (const auto mode :
       {sc::resume_mode::automatic, sc::resume_mode::required, sc::resume_mode::never}) {
    cfg.resume = mode;
    CHECK(sc::parse_toml(sc::print_toml(cfg)) == cfg);
  }
  cfg.resume = sc::resume_mode::never;
  CHECK(contains(sc::print_toml(cfg), "resume = false "));
  const auto e = error_of([] { (void)sc::parse_toml("resume = \"sometimes\""); });
  CHECK(contains(e.what(), "resume"));
  CHECK(contains(e.what(), "auto | true | false"));
  CHECK(contains(error_of([] { (void)sc::parse_toml("resume = 1"); }).what(), "found an integer"));
}

TEST_CASE("the [policy] table keeps a policy's own keys as text and prints back to the same") {
  const auto cfg = sc::parse_toml(
      "epochs = 2\n[policy]\nlocal_sgd_period = 4\nramp_rate = 0.25\nwarm = true\n"
      "tag = \"a \\\"b\\\"\"\nodd = \"007\"\n",
      "p.toml");
  CHECK(cfg.epochs == 2);
  CHECK(cfg.policy.at("local_sgd_period") == "4");
  CHECK(cfg.policy.at("ramp_rate") == "0.25");
  CHECK(cfg.policy.at("warm") == "true");
  CHECK(cfg.policy.at("tag") == "a \"b\"");
  CHECK(cfg.policy.at("odd") == "007");  // a string, printed quoted: 007 is no TOML integer
  const std::string printed = sc::print_toml(cfg);
  CHECK(contains(printed, "[policy]\n"));
  CHECK(contains(printed, "local_sgd_period = 4\n"));
  CHECK(contains(printed, "odd = \"007\"\n"));
  CHECK(sc::parse_toml(printed, "printed.toml") == cfg);
  sc::train_config set;
  sc::set_key(set, "policy.local_sgd_period", "8");
  CHECK(set.policy.at("local_sgd_period") == "8");
}

TEST_CASE("a bad [policy] table names the key, file and line") {
  const auto flat = error_of([] { sc::parse_toml("policy = 3\n", "p.toml"); });
  CHECK(flat.key() == "policy");
  CHECK(contains(flat.what(), "expected a table"));
  const auto nested = error_of([] { sc::parse_toml("[policy]\nx = 1\n[policy.inner]\ny = 2\n"); });
  CHECK(nested.key() == "policy.inner");
  CHECK(contains(nested.what(), "got a table"));
  const auto array = error_of([] { sc::parse_toml("\n[policy]\nsteps = [1, 2]\n", "a.toml"); });
  CHECK(array.key() == "policy.steps");
  CHECK(array.line() == 3);
  CHECK(contains(array.what(), "got an array"));
  const auto name = error_of([] { sc::parse_toml("[policy]\nPeriod = 1\n"); });
  CHECK(name.key() == "policy.Period");
  CHECK(contains(name.what(), "lower-case letters"));
  const auto cli_name = error_of([] {
    sc::train_config c;
    sc::set_key(c, "policy.", "1");
  });
  CHECK(contains(cli_name.what(), "lower-case letters"));
}
