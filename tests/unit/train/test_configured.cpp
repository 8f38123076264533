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
std::string policy_for(const sc::train_config& cfg) {
  return st::with_data_policy(cfg, [&]<class Policy>(std::type_identity<Policy>) {
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

TEST_CASE("with_parallel_policy names tensor, pipeline and data policies; menus list theirs") {
  namespace sp = strata::parallel;
  const auto named = [](const sc::train_config& cfg) {
    return st::with_parallel_policy(
        cfg, []<class Policy>(std::type_identity<Policy>) { return std::string(Policy::name); });
  };
  sc::train_config cfg;
  cfg.world_size = 2;
  CHECK(named(cfg) == "data<all_reduce>");
  cfg.pipeline_parallel_size = 2;
  CHECK(named(cfg) == sp::pipeline<strata::pipeline::one_f_one_b>::name);
  cfg.pipeline_schedule = sc::pipeline_schedule_kind::gpipe;
  CHECK(named(cfg) == sp::pipeline<strata::pipeline::gpipe>::name);
  cfg.world_size = 4;
  cfg.tensor_parallel_size = 2;
  cfg.pipeline_schedule = sc::pipeline_schedule_kind::one_f_one_b;
  CHECK(named(cfg) == sp::tensor<sp::pipeline<strata::pipeline::one_f_one_b>>::name);
  cfg.pipeline_parallel_size = 1;
  CHECK(named(cfg) == sp::tensor<sp::data<>>::name);

  // Menus: membership by type, and the names a refusal lists.
  using menu = st::parallel_menu<sp::data<>, sp::zero1>;
  static_assert(menu::has<sp::zero1>);
  static_assert(!menu::has<sp::data<sp::hierarchical>>);
  CHECK(menu::names() == "data<all_reduce>, zero1");
  static_assert(st::parallel_menus::data_parallel::has<sp::data<>>);
  static_assert(st::parallel_menus::every_policy::has<sp::data<sp::parameter_server>>);
  static_assert(st::parallel_menus::mesh::has<sp::tensor<sp::data<>>>);
  static_assert(st::every_precision::has<strata::precision::bf16>);
  static_assert(!st::precision_menu<strata::precision::fp32>::has<strata::precision::fp16>);
  static_assert(st::every_batch::has<strata::batch::adaptive>);
  // The adaptive batch: with every policy of a plain menu, with the listed ones of adaptive_with.
  static_assert(menu::adaptive<sp::zero1>);
  using every = st::parallel_menus::every_policy;
  static_assert(every::has<sp::data<sp::hierarchical>> &&
                !every::adaptive<sp::data<sp::hierarchical>>);
  static_assert(every::adaptive<sp::data<>> && every::adaptive<sp::zero1>);
  CHECK(every::adaptive_names() == "data<all_reduce>, zero1");
  using mesh = st::parallel_menus::mesh;
  static_assert(mesh::has<sp::tensor<sp::data<>>> && !mesh::adaptive<sp::tensor<sp::data<>>>);
  CHECK(mesh::adaptive_names() == "data<all_reduce>");
  static_assert(!st::batch_menu<strata::batch::accumulate>::has<strata::batch::adaptive>);
  CHECK(st::parallel_menu<>::names() == "no parallel policy");

  // The key a refusal names: the one that asked for a policy outside the menu.
  const auto key = [](const sc::train_config& c) { return st::detail::parallel_policy_key(c); };
  cfg = {};
  cfg.world_size = 2;
  CHECK(key(cfg) == "world_size");
  cfg.gradient_sync = sc::gradient_sync_kind::hierarchical;
  CHECK(key(cfg) == "gradient_sync");
  cfg = {};
  cfg.world_size = 2;
  cfg.gradient_compression = sc::compression_kind::bfloat16;
  CHECK(key(cfg) == "gradient_compression");
  cfg = {};
  cfg.world_size = 2;
  cfg.zero_stage = 1;
  CHECK(key(cfg) == "zero_stage");
  cfg.pipeline_parallel_size = 2;
  CHECK(key(cfg) == "pipeline_parallel_size");
  cfg.pipeline_schedule = sc::pipeline_schedule_kind::zero_bubble_h1;
  CHECK(key(cfg) == "pipeline_schedule");
  cfg.tensor_parallel_size = 2;
  CHECK(key(cfg) == "tensor_parallel_size");
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
