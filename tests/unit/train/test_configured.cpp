// SPDX-License-Identifier: Apache-2.0
#include "strata/train/configured.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/config/validate.hpp"

namespace {

namespace sc = strata::config;
namespace st = strata::train;

// Whether validate() takes the configuration.
bool accepted(const sc::train_config& cfg) {
  try {
    sc::validate(cfg);
    return true;
  } catch (const strata::config_error&) {
    return false;
  }
}

// The parallel policy with_data_policy names for cfg, after checking that the policy takes cfg's
// keys for 2 ranks.
template <st::data_parallel_menu Menu = st::data_parallel_menu::every_policy>
std::string policy_for(const sc::train_config& cfg) {
  return st::with_data_policy<Menu>(cfg, [&]<class Policy>(std::type_identity<Policy>) {
    CHECK_NOTHROW(Policy::check_config(cfg, 2, 0));
    return std::string(Policy::name);
  });
}

}  // namespace

TEST_CASE("every parallel configuration validate() takes names a policy that takes it") {
  using sc::compression_kind;
  using sc::gradient_sync_kind;
  struct expected {
    gradient_sync_kind sync;
    compression_kind compression;
    int zero_stage;
    const char* policy;
  };
  const std::vector<expected> table{
      {gradient_sync_kind::all_reduce, compression_kind::none, 0, "data<all_reduce>"},
      {gradient_sync_kind::all_reduce, compression_kind::float16, 0,
       "data<all_reduce, cast<float16>>"},
      {gradient_sync_kind::all_reduce, compression_kind::bfloat16, 0,
       "data<all_reduce, cast<bfloat16>>"},
      {gradient_sync_kind::all_reduce, compression_kind::none, 1, "zero1"},
      {gradient_sync_kind::hierarchical, compression_kind::none, 0, "data<hierarchical>"},
      {gradient_sync_kind::hierarchical, compression_kind::float16, 0,
       "data<hierarchical, cast<float16>>"},
      {gradient_sync_kind::hierarchical, compression_kind::bfloat16, 0,
       "data<hierarchical, cast<bfloat16>>"},
      {gradient_sync_kind::all_gather, compression_kind::topk, 0, "data<all_gather, topk>"},
      {gradient_sync_kind::parameter_server, compression_kind::none, 0, "data<parameter_server>"},
      {gradient_sync_kind::parameter_server, compression_kind::topk, 0,
       "data<parameter_server, topk>"},
  };
  std::size_t taken = 0;
  for (const auto sync : {gradient_sync_kind::all_reduce, gradient_sync_kind::hierarchical,
                          gradient_sync_kind::all_gather, gradient_sync_kind::parameter_server}) {
    for (const auto compression : {compression_kind::none, compression_kind::float16,
                                   compression_kind::bfloat16, compression_kind::topk}) {
      for (const int zero_stage : {0, 1}) {
        sc::train_config cfg;
        cfg.world_size = 2;
        cfg.gradient_sync = sync;
        cfg.gradient_compression = compression;
        cfg.zero_stage = zero_stage;
        if (!accepted(cfg)) {
          continue;
        }
        ++taken;
        CAPTURE(static_cast<int>(sync));
        CAPTURE(static_cast<int>(compression));
        CAPTURE(zero_stage);
        const expected* row = nullptr;
        for (const expected& e : table) {
          if (e.sync == sync && e.compression == compression && e.zero_stage == zero_stage) {
            row = &e;
          }
        }
        REQUIRE(row != nullptr);  // validate() takes only the combinations in the table
        CHECK(policy_for(cfg) == row->policy);
      }
    }
  }
  CHECK(taken == table.size());
}

TEST_CASE("the all_reduce_only menu names the key another policy would need") {
  sc::train_config cfg;
  cfg.world_size = 2;
  CHECK(policy_for<st::data_parallel_menu::all_reduce_only>(cfg) == "data<all_reduce>");
  const auto refused_key = [](const sc::train_config& c) {
    try {
      (void)policy_for<st::data_parallel_menu::all_reduce_only>(c);
    } catch (const strata::config_error& e) {
      CHECK(std::string(e.what()).find("compiles in only gradient_sync = all_reduce") !=
            std::string::npos);
      return e.key();
    }
    return std::string("(accepted)");
  };
  cfg.gradient_sync = sc::gradient_sync_kind::hierarchical;
  CHECK(refused_key(cfg) == "gradient_sync");
  cfg = {};
  cfg.world_size = 2;
  cfg.gradient_compression = sc::compression_kind::bfloat16;
  CHECK(refused_key(cfg) == "gradient_compression");
  cfg = {};
  cfg.world_size = 2;
  cfg.zero_stage = 1;
  CHECK(refused_key(cfg) == "zero_stage");
}

TEST_CASE("mixed_precision_dtype names the precision policy") {
  const auto name_for = [](sc::precision_dtype dtype) {
    sc::train_config cfg;
    cfg.mixed_precision_dtype = dtype;
    return st::with_precision_policy(cfg, []<class Precision>(std::type_identity<Precision>) {
      return std::string(Precision::name);
    });
  };
  CHECK(name_for(sc::precision_dtype::float32) == strata::precision::fp32::name);
  CHECK(name_for(sc::precision_dtype::float16) == strata::precision::fp16::name);
  CHECK(name_for(sc::precision_dtype::bfloat16) == strata::precision::bf16::name);
  CHECK(strata::precision::fp16::name != strata::precision::bf16::name);
}

TEST_CASE("a parallel policy refuses the keys it does not run, by key") {
  namespace sp = strata::parallel;
  const auto refused_key = [](auto check) {
    try {
      check();
    } catch (const strata::config_error& e) {
      return e.key();
    }
    return std::string("(accepted)");
  };
  sc::train_config cfg;
  CHECK(refused_key([&] { sp::single_rank::check_config(cfg, 1, 0); }) == "(accepted)");
  cfg.world_size = 2;
  CHECK(refused_key([&] { sp::single_rank::check_config(cfg, 1, 0); }) == "world_size");
  CHECK(refused_key([&] { sp::data<>::check_config(cfg, 3, 1); }) == "world_size");
  CHECK(refused_key([&] { sp::data<>::check_config(cfg, 2, 1); }) == "(accepted)");
  cfg.zero_stage = 1;
  CHECK(refused_key([&] { sp::data<>::check_config(cfg, 2, 0); }) == "zero_stage");
  CHECK(refused_key([&] { sp::zero1::check_config(cfg, 2, 0); }) == "(accepted)");
  cfg.zero_stage = 0;
  CHECK(refused_key([&] { sp::zero1::check_config(cfg, 2, 0); }) == "zero_stage");
  cfg.topk_ratio = 0.05;
  CHECK(refused_key([&] { sp::data<>::check_config(cfg, 2, 0); }) == "topk_ratio");
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  cfg.gradient_compression = sc::compression_kind::topk;
  CHECK(refused_key([&] {
          sp::data<sp::parameter_server, sp::compress::topk>::check_config(cfg, 2, 0);
        }) == "(accepted)");
  CHECK(refused_key([&] { sp::data<sp::parameter_server>::check_config(cfg, 2, 0); }) ==
        "gradient_compression");
}
