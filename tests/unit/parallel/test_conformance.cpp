// SPDX-License-Identifier: Apache-2.0
// The parallel conformance suite (tests/conformance/parallel_policy.hpp) on every shipped
// parallel policy and on the user's local SGD of examples/03_custom_policies.
#include "conformance/parallel_policy.hpp"

#include <doctest/doctest.h>

#include <string>

#include "../../../examples/03_custom_policies/local_sgd.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/pipeline.hpp"
#include "strata/parallel/single_rank.hpp"
#include "strata/pipeline.hpp"

namespace par = strata::parallel;
namespace sc = strata::config;
using strata::conformance::parallel_case;

namespace {

// Two epochs of 512 blobs, 32 samples per rank and step, plain SGD.
sc::train_config base() {
  sc::train_config cfg;
  cfg.epochs = 2;
  cfg.batch_size_per_gpu = 32;
  cfg.lr = 0.05;
  cfg.momentum = 0.0;
  cfg.checkpoint_interval = 1;
  return cfg;
}

void check(const strata::conformance::parallel_report& r, const std::string& policy) {
  std::string all;
  for (const std::string& f : r.failures) {
    all += "\n  " + f;
  }
  INFO(policy, ": ", r.failures.size(), " failure(s)", all);
  CHECK(r.ok());
  CHECK(r.checks > 5);
}

}  // namespace

TEST_CASE("parallel conformance: single_rank") {
  check(strata::conformance::run_parallel_suite<par::single_rank>(
            {.name = "single", .ranks = 1, .cfg = base(), .one_rank_tolerance = 0.0}),
        "single_rank");
}

TEST_CASE("parallel conformance: data<all_reduce> and zero1") {
  check(strata::conformance::run_parallel_suite<par::data<>>(
            {.name = "all_reduce", .ranks = 2, .cfg = base(), .one_rank_tolerance = 1e-4}),
        "data<all_reduce>");
  auto zero = base();
  zero.zero_stage = 1;
  check(strata::conformance::run_parallel_suite<par::zero1>(
            {.name = "zero1", .ranks = 2, .cfg = zero, .one_rank_tolerance = 1e-4}),
        "zero1");
}

TEST_CASE("parallel conformance: data<hierarchical> and data<parameter_server>") {
  auto h = base();
  h.gradient_sync = sc::gradient_sync_kind::hierarchical;
  h.hierarchy_group_size = 2;
  check(strata::conformance::run_parallel_suite<par::data<par::hierarchical>>(
            {.name = "hierarchical", .ranks = 4, .cfg = h, .one_rank_tolerance = 1e-4}),
        "data<hierarchical>");
  auto ps = base();
  ps.gradient_sync = sc::gradient_sync_kind::parameter_server;
  check(strata::conformance::run_parallel_suite<par::data<par::parameter_server>>(
            {.name = "ps", .ranks = 2, .cfg = ps, .one_rank_tolerance = 1e-4}),
        "data<parameter_server>");
}

TEST_CASE("parallel conformance: compressed gradients (no one-rank claim)") {
  auto cast = base();
  cast.gradient_compression = sc::compression_kind::bfloat16;
  check(strata::conformance::run_parallel_suite<
            par::data<par::all_reduce, par::compress::cast<strata::bfloat16>>>(
            {.name = "cast", .ranks = 2, .cfg = cast, .relayout = false}),
        "data<all_reduce, cast<bfloat16>>");
  auto topk = base();
  topk.gradient_sync = sc::gradient_sync_kind::all_gather;
  topk.gradient_compression = sc::compression_kind::topk;
  topk.topk_ratio = 0.1;
  check(strata::conformance::run_parallel_suite<par::data<par::all_gather, par::compress::topk>>(
            {.name = "topk", .ranks = 2, .cfg = topk, .relayout = false}),
        "data<all_gather, topk>");
}

TEST_CASE("parallel conformance: pipelines (stages hold different layers)") {
  // The totals, a bit-exact resume at two stops and the float16 skip vote; the one-rank
  // equivalence and memory of stages: unit.parallel.pipeline.
  auto pp = base();
  pp.pipeline_parallel_size = 2;
  pp.micro_batches = 4;
  check(strata::conformance::run_parallel_suite<par::pipeline<strata::pipeline::one_f_one_b>>(
            {.name = "pipeline_1f1b",
             .ranks = 2,
             .data_ranks = 1,
             .cfg = pp,
             .same_params = false,
             .memory_exact = false}),
        "pipeline<one_f_one_b>");
  pp.pipeline_schedule = sc::pipeline_schedule_kind::zero_bubble_h1;
  check(strata::conformance::run_parallel_suite<par::pipeline<strata::pipeline::zero_bubble_h1>>(
            {.name = "pipeline_zb",
             .ranks = 2,
             .data_ranks = 1,
             .cfg = pp,
             .same_params = false,
             .memory_exact = false}),
        "pipeline<zero_bubble_h1>");
  pp.pipeline_schedule = sc::pipeline_schedule_kind::interleaved_1f1b;
  check(
      strata::conformance::run_parallel_suite<par::pipeline<strata::pipeline::interleaved_1f1b<2>>>(
          {.name = "pipeline_interleaved",
           .ranks = 2,
           .data_ranks = 1,
           .cfg = pp,
           .same_params = false,
           .memory_exact = false}),
      "pipeline<interleaved_1f1b v=2>");
  pp.pipeline_schedule = sc::pipeline_schedule_kind::gpipe;
  check(strata::conformance::run_parallel_suite<par::pipeline<strata::pipeline::gpipe>>(
            {.name = "pipeline_dp",
             .ranks = 4,
             .data_ranks = 2,
             .cfg = pp,
             .same_params = false,
             .memory_exact = false}),
        "pipeline<gpipe>, dp 2 x pp 2");
}

TEST_CASE("parallel conformance: a user's local SGD") {
  auto every = base();
  every.policy["local_sgd_period"] = "1";
  check(strata::conformance::run_parallel_suite<local_sgd>({.name = "local_sgd_1",
                                                            .ranks = 2,
                                                            .cfg = every,
                                                            .one_rank_tolerance = 1e-4,
                                                            .relayout = false}),
        "local_sgd, period 1");
  auto apart = base();
  apart.policy["local_sgd_period"] = "3";  // 16 steps: the ranks end apart
  check(strata::conformance::run_parallel_suite<local_sgd>({.name = "local_sgd_3",
                                                            .ranks = 2,
                                                            .cfg = apart,
                                                            .same_params = false,
                                                            .relayout = false}),
        "local_sgd, period 3");
}

namespace {

// A wrong policy: local SGD whose checkpoints leave out every rank's own parameters, so that a
// resumed rank continues from rank 0's.
struct forgetful_local_sgd : local_sgd {
  class executor : public local_sgd::executor {
   public:
    using local_sgd::executor::executor;
    void restore(const strata::parallel::blob_reader&) {}
  };
};

// A wrong policy: says its optimizer state is cut into one shard per rank, but keeps all of it.
struct unsharded_claim : local_sgd {
  class executor : public local_sgd::executor {
   public:
    using local_sgd::executor::executor;
    static int shards(const sc::train_config&, int world) { return world; }
  };
};

}  // namespace

TEST_CASE("the parallel suite catches a policy whose memory is not what it claims") {
  auto every = base();
  every.policy["local_sgd_period"] = "1";
  const auto r = strata::conformance::run_parallel_suite<unsharded_claim>(
      {.name = "unsharded", .ranks = 2, .cfg = every, .skips_together = false});
  bool memory_failed = false;
  for (const std::string& f : r.failures) {
    memory_failed = memory_failed || f.starts_with("memory: rank 0 holds");
  }
  CHECK(memory_failed);
}

TEST_CASE("the parallel suite catches a policy that does not resume its ranks") {
  auto apart = base();
  apart.policy["local_sgd_period"] = "3";
  const auto r = strata::conformance::run_parallel_suite<forgetful_local_sgd>(
      {.name = "forgetful", .ranks = 2, .cfg = apart, .same_params = false});
  CHECK_FALSE(r.ok());
  bool resume_failed = false;
  for (const std::string& f : r.failures) {
    resume_failed = resume_failed || f.starts_with("resume after step 7: rank 1");
  }
  CHECK(resume_failed);
}
