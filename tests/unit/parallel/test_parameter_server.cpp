// SPDX-License-Identifier: Apache-2.0
// parallel::data<parameter_server> and compress::topk (by all-gather and through the server).
#include "strata/parallel/ps/exchange.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "strata/batch/accumulate.hpp"
#include "strata/comm/emulated.hpp"
#include "strata/comm/threads.hpp"
#include "strata/parallel/data.hpp"
#include "strata/parallel/topk.hpp"
#include "strata/precision/mixed.hpp"
#include "strata/train/trainer.hpp"

#include "../common/blobs.hpp"

namespace fs = std::filesystem;
namespace sc = strata::config;
namespace sm = strata::model;
namespace sp = strata::precision;
namespace st = strata::train;
namespace par = strata::parallel;
using strata::comm::threads;
using strata::test::check_same_training;
using strata::test::record;
using strata::test::run_record;

namespace {

using model_t = decltype(strata::test::blobs_mlp());

sc::train_config base_config(const std::string& name, int ranks) {
  const fs::path dir = fs::path(STRATA_TEST_WORK_DIR) / "parameter_server" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  sc::train_config cfg;
  cfg.epochs = 2;
  cfg.world_size = ranks;
  cfg.batch_size_per_gpu = 64 / ranks;
  cfg.lr = 0.05;
  cfg.loader_workers = 1;
  cfg.checkpoint_dir = (dir / "ckpt").string();
  cfg.checkpoint_interval = 1;
  cfg.warmup_epochs = 0.5;
  return cfg;
}

// Runs `ranks` thread ranks of trainer<blobs_mlp, Policy, Extra...>; returns every rank's record
// and checks that every rank ended with the same parameters.
template <class Policy, class... Extra, class Setup = std::nullptr_t>
std::vector<run_record> run_ranks(int ranks, const sc::train_config& cfg, Setup setup = nullptr) {
  return strata::test::run_thread_ranks<Policy, Extra...>(ranks, cfg, strata::test::blobs_mlp,
                                                          setup);
}

// The largest difference over the entries both have (a store padded to shards is longer).
double worst_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return worst;
}

}  // namespace

TEST_CASE("topk_count rounds down, keeps one and refuses ratios outside (0, 1]") {
  CHECK(par::topk_count(1000, 0.01) == 10);
  CHECK(par::topk_count(1099, 0.01) == 10);
  CHECK(par::topk_count(50, 0.01) == 1);
  CHECK(par::topk_count(7, 1.0) == 7);
  CHECK(par::topk_count(0, 0.5) == 0);
  CHECK_THROWS_WITH_AS(par::topk_count(10, 0.0), doctest::Contains("topk_ratio"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(par::topk_count(10, 1.5), doctest::Contains("topk_ratio"),
                       std::invalid_argument);
}

TEST_CASE("top-k selects the largest magnitudes and keeps the rest as residual") {
  par::topk_compressor tk(6, 0.5);  // k = 3
  REQUIRE(tk.k() == 3);
  std::vector<float> g{0.1f, -4.0f, 2.0f, -2.0f, 0.5f, 3.0f};
  std::vector<std::int32_t> pairs;
  tk.select(g, 1.0f, pairs);
  // |-4|, |3| and one of the two |2|: the lower index (2) wins the tie.
  REQUIRE(pairs.size() == 6);
  CHECK(pairs[0] == 1);
  CHECK(std::bit_cast<float>(pairs[1]) == -4.0f);
  CHECK(pairs[2] == 2);
  CHECK(std::bit_cast<float>(pairs[3]) == 2.0f);
  CHECK(pairs[4] == 5);
  CHECK(std::bit_cast<float>(pairs[5]) == 3.0f);
  const std::vector<float> residual(tk.residual().begin(), tk.residual().end());
  CHECK(residual == std::vector<float>{0.1f, 0.0f, 0.0f, -2.0f, 0.5f, 0.0f});

  // The next step adds the residual first (error feedback): -2 + -1.5 = -3.5 now wins.
  std::vector<float> next{0.0f, 0.0f, 0.0f, -1.5f, 0.0f, 0.0f};
  pairs.clear();
  tk.select(next, 1.0f, pairs);
  REQUIRE(pairs.size() == 6);
  CHECK(pairs[0] == 0);  // residual 0.1, 0.5 at index 4 and -3.5 at index 3
  CHECK(std::bit_cast<float>(pairs[1]) == doctest::Approx(0.1f));
  CHECK(pairs[2] == 3);
  CHECK(std::bit_cast<float>(pairs[3]) == -3.5f);
  CHECK(pairs[4] == 4);
  CHECK(std::bit_cast<float>(pairs[5]) == 0.5f);
  CHECK(std::all_of(tk.residual().begin(), tk.residual().end(), [](float r) { return r == 0; }));
}

namespace {

// The top-k of `g` by a full stable sort: (index, value) pairs in index order.
std::vector<std::int32_t> reference_topk(const std::vector<float>& g, std::size_t k) {
  std::vector<std::size_t> order(g.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return std::abs(g[a]) > std::abs(g[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  std::vector<std::int32_t> pairs;
  for (const std::size_t i : order) {
    pairs.push_back(static_cast<std::int32_t>(i));
    pairs.push_back(std::bit_cast<std::int32_t>(g[i]));
  }
  return pairs;
}

}  // namespace

TEST_CASE("top-k on large gradients equals a full sort (sampled bound and its fallback)") {
  const std::size_t n = 300000;
  const std::size_t k = 3000;  // 1%
  std::vector<float> g(n);
  // Quantised values: many ties in magnitude, both signs.
  std::uint64_t x = 12345;
  for (auto& v : g) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(static_cast<int>((x >> 33) % 20001) - 10000) / 64.0f;
  }
  par::topk_compressor tk(n, 0.01);
  REQUIRE(tk.k() == k);
  std::vector<std::int32_t> pairs;
  std::vector<float> work = g;
  tk.select(work, 1.0f, pairs);
  CHECK(pairs == reference_topk(g, k));

  // Large values only at the sample's positions (every n / 65536-th entry), so that the sampled
  // bound leaves fewer than k candidates and the full search decides.
  std::vector<float> h(n, 0.5f);
  const std::size_t stride = n / 65536;
  for (std::size_t j = 0; j < 65536; ++j) {
    h[j * stride] = 100.0f + static_cast<float>(j % 5000);
  }
  par::topk_compressor fresh(n, 0.01);
  pairs.clear();
  work = h;
  fresh.select(work, 1.0f, pairs);
  CHECK(pairs == reference_topk(h, k));
}

TEST_CASE("top-k keeps the residual unscaled and sends NaN first") {
  par::topk_compressor tk(4, 0.25);              // k = 1
  std::vector<float> g{8.0f, 4.0f, 2.0f, 1.0f};  // carrying a loss scale of 4
  std::vector<std::int32_t> pairs;
  tk.select(g, 4.0f, pairs);
  const std::vector<float> residual(tk.residual().begin(), tk.residual().end());
  CHECK(residual == std::vector<float>{0.0f, 1.0f, 0.5f, 0.25f});
  // At scale 2 the residual is worth 2, 1, 0.5 on top of the new gradients.
  std::vector<float> h{0.0f, 0.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  pairs.clear();
  tk.select(h, 2.0f, pairs);
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[0] == 2);
  CHECK(std::isnan(std::bit_cast<float>(pairs[1])));
  CHECK(tk.residual()[1] == 1.0f);
  CHECK(tk.residual()[3] == 0.25f);
}

TEST_CASE("the parameter-server exchange averages shards and pulls them back") {
  for (const int servers : {1, 2, 3}) {
    INFO(servers, " servers");
    threads::run(3, [&](threads& c) {
      const std::size_t n = 12;
      par::ps_exchange ps(strata::comm::any_comm(c), n, servers);
      std::vector<float> grads(n);
      for (std::size_t i = 0; i < n; ++i) {
        grads[i] = static_cast<float>(i) + 10.0f * static_cast<float>(c.rank());
      }
      ps.push(grads);
      std::vector<float> values(n, -1.0f);
      if (ps.is_server()) {
        const std::size_t b = ps.shard_begin(c.rank());
        for (std::size_t i = b; i < b + ps.shard_size(); ++i) {
          CHECK(grads[i] == doctest::Approx(static_cast<float>(i) + 10.0f));  // mean of 0, 10, 20
          values[i] = 2.0f * grads[i];
        }
      }
      ps.pull(values);
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(values[i] == doctest::Approx(2.0f * (static_cast<float>(i) + 10.0f)));
      }
    });
  }
}

TEST_CASE("the push in pieces equals the whole push, bit for bit, and keeps its order") {
  // 13 floats padded to 15 for 3 servers; ranges from the end down, as backward gives them,
  // cutting across the shards [0, 5), [5, 10), [10, 15), one of a single float.
  const std::vector<par::ps_exchange::push_range> ranges{{.offset = 11, .count = 4},
                                                         {.offset = 7, .count = 4},
                                                         {.offset = 6, .count = 1},
                                                         {.offset = 0, .count = 6}};
  for (const int servers : {1, 3}) {
    INFO(servers, " servers");
    threads::run(3, [&](threads& c) {
      const std::size_t n = 15;
      par::ps_exchange ps(strata::comm::any_comm(c), n, servers);
      std::vector<float> whole(n);
      for (std::size_t i = 0; i < n; ++i) {
        whole[i] = 0.1f * static_cast<float>(i) + 1.7f * static_cast<float>(c.rank() + 1);
      }
      std::vector<float> pieces = whole;
      ps.push(whole);
      ps.begin_push(pieces, ranges);
      CHECK_THROWS_AS(ps.send_range(1), std::logic_error);  // range 0 goes first
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        ps.send_range(i);
        ps.poll();
      }
      ps.finish_push();
      if (ps.is_server()) {
        const std::size_t b = ps.shard_begin(c.rank());
        for (std::size_t i = b; i < b + ps.shard_size(); ++i) {
          CHECK(pieces[i] == whole[i]);
          CHECK(pieces[i] == doctest::Approx(0.1f * static_cast<float>(i) + 3.4f));
        }
      }
      // finish_push sends whatever was not sent yet.
      std::vector<float> late(n);
      for (std::size_t i = 0; i < n; ++i) {
        late[i] = static_cast<float>(i) + static_cast<float>(c.rank());  // mean: i + 1
      }
      ps.begin_push(late, ranges);
      ps.send_range(0);
      ps.finish_push();
      if (ps.is_server()) {
        const std::size_t b = ps.shard_begin(c.rank());
        for (std::size_t i = b; i < b + ps.shard_size(); ++i) {
          CHECK(late[i] == static_cast<float>(i) + 1.0f);
        }
      }

      // Entries outside every range (a store's padding) are left as they are; ranges must fit
      // and not overlap, or nothing is posted.
      const std::vector<par::ps_exchange::push_range> partial{{.offset = 0, .count = 12}};
      std::vector<float> padded(n, static_cast<float>(c.rank()));
      ps.begin_push(padded, partial);
      ps.finish_push();
      if (ps.is_server()) {
        const std::size_t b = ps.shard_begin(c.rank());
        for (std::size_t i = b; i < b + ps.shard_size(); ++i) {
          CHECK(padded[i] == (i < 12 ? 1.0f : static_cast<float>(c.rank())));
        }
      }
      const std::vector<par::ps_exchange::push_range> overlapping{{.offset = 0, .count = 8},
                                                                  {.offset = 7, .count = 8}};
      CHECK_THROWS_WITH_AS(ps.begin_push(padded, overlapping), doctest::Contains("overlaps"),
                           std::invalid_argument);
      const std::vector<par::ps_exchange::push_range> outside{{.offset = 10, .count = 6}};
      CHECK_THROWS_WITH_AS(ps.begin_push(padded, outside),
                           doctest::Contains("outside the 15 parameters"), std::invalid_argument);
    });
  }
}

TEST_CASE("parameter-server buckets push each bucket as backward completes it") {
  // Three groups, one bucket each, from the end down: [8, 12), [3, 8), [0, 3).
  const std::vector<par::grad_bucket> buckets{
      {.offset = 8, .size = 4, .first_group = 2, .last_group = 2},
      {.offset = 3, .size = 5, .first_group = 1, .last_group = 1},
      {.offset = 0, .size = 3, .first_group = 0, .last_group = 0}};
  for (const int servers : {1, 2}) {
    INFO(servers, " servers");
    threads::run(2, [&](threads& c) {
      const std::size_t n = 12;
      par::ps_exchange ps(strata::comm::any_comm(c), n, servers);
      par::ps_exchange reference(strata::comm::any_comm(c), n, servers);
      std::vector<float> grads(n);
      for (std::size_t i = 0; i < n; ++i) {
        grads[i] = static_cast<float>(i) * (c.rank() == 0 ? 1.0f : 3.0f);
      }
      std::vector<float> expected = grads;
      reference.push(expected);
      par::bucket_reducer reducer(strata::comm::any_comm(c), ps, buckets);
      CHECK(reducer.parameter_server());
      reducer.begin(grads);
      CHECK(reducer.reductions() == 0);
      reducer.group_done(2);
      CHECK(reducer.reductions() == 1);
      if (servers == 1) {
        // The first bucket went out now, not in finish(): the server's first receive (rank 1's
        // piece of bucket 0) completes while the other buckets are still to come.
        c.barrier();
        if (c.rank() == 0) {
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (reducer.poll() < 1 && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
          CHECK(reducer.poll() >= 1);
        }
        c.barrier();
      }
      reducer.group_done(1);
      CHECK(reducer.reductions() == 2);
      reducer.group_done(0);
      reducer.finish();
      CHECK(reducer.launch_order() == std::vector<std::size_t>{0, 1, 2});
      if (ps.is_server()) {
        const std::size_t b = ps.shard_begin(c.rank());
        for (std::size_t i = b; i < b + ps.shard_size(); ++i) {
          CHECK(grads[i] == expected[i]);
          CHECK(grads[i] == 2.0f * static_cast<float>(i));
        }
      }
      // Without reports every bucket goes out in finish().
      std::vector<float> again(n, static_cast<float>(c.rank()));
      reducer.begin(again);
      reducer.finish();
      if (ps.is_server()) {
        CHECK(again[ps.shard_begin(c.rank())] == 0.5f);
      }
    });
  }
}

TEST_CASE("the top-k push sends each server the pairs of its shard") {
  threads::run(2, [&](threads& c) {
    const std::size_t n = 8;
    par::ps_exchange ps(strata::comm::any_comm(c), n, 2);
    par::topk_compressor tk(n, 0.25);  // 2 of 8
    // Rank 0's largest: indices 1 and 6; rank 1's: 2 and 3 (both in shard 0).
    std::vector<float> g = c.rank() == 0 ? std::vector<float>{0, 5, 0, 0, 0, 0, -6, 0}
                                         : std::vector<float>{0, 0, 7, 8, 0.5f, 0, 0, 0};
    ps.push_topk(tk, g, 1.0f);
    if (c.rank() == 0) {
      CHECK(g[0] == 0.0f);
      CHECK(g[1] == 2.5f);
      CHECK(g[2] == 3.5f);
      CHECK(g[3] == 4.0f);
    } else {
      CHECK(g[4] == 0.0f);  // rank 1 kept 0.5 as residual
      CHECK(g[6] == -3.0f);
      CHECK(tk.residual()[4] == 0.5f);
    }
  });
}

TEST_CASE("data<parameter_server> trains like data<all_reduce> with 2 and 4 ranks") {
  for (const int ranks : {2, 4}) {
    for (const int servers : {0, 1}) {
      INFO(ranks, " ranks, parameter_servers = ", servers);
      auto cfg = base_config("dense-" + std::to_string(ranks), ranks);
      cfg.optimizer = sc::optimizer_kind::adamw;
      cfg.lr = 0.01;
      const run_record dense = run_ranks<par::data<>>(ranks, cfg)[0];
      auto pcfg = base_config("ps-" + std::to_string(ranks) + "-" + std::to_string(servers), ranks);
      pcfg.optimizer = sc::optimizer_kind::adamw;
      pcfg.lr = 0.01;
      pcfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
      pcfg.parameter_servers = servers;
      const run_record ps = run_ranks<par::data<par::parameter_server>>(ranks, pcfg)[0];
      REQUIRE(ps.steps.size() == dense.steps.size());
      for (std::size_t i = 0; i < dense.steps.size(); ++i) {
        CHECK(ps.steps[i].loss == doctest::Approx(dense.steps[i].loss).epsilon(1e-5));
      }
      CHECK(worst_difference(ps.params, dense.params) < 1e-5);
    }
  }
}

TEST_CASE("parameter-server buckets over a layer larger than a bucket train like after backward") {
  // Group 0: 8 x 33000 + 33000 floats, more than a 1 MiB bucket: 3 buckets, the shard boundary
  // of 2 co-located servers inside the first layer's parts.
  const auto wide_model = [] {
    return sm::sequential(strata::sample_shape{.channels = 1, .height = 1, .width = 8},
                          sm::linear{.in = 8, .out = 33000}, sm::relu{},
                          sm::linear{.in = 33000, .out = 4});
  };
  const auto config = [](const std::string& name, sc::bucket_launch_kind launch, int servers) {
    auto cfg = base_config(name, 2);
    cfg.epochs = 1;
    cfg.max_steps = 3;  // each step moves 430k parameters: 3 steps show the same as the epoch
    cfg.lr = 0.01;
    cfg.checkpoint_interval = 0;
    cfg.bucket_size_mb = 1;
    cfg.bucket_launch = launch;
    cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
    cfg.parameter_servers = servers;
    return cfg;
  };
  for (const int servers : {0, 1}) {
    INFO("parameter_servers = ", servers);
    // async: pushed bucket by bucket during backward; blocking: the whole push after backward.
    const run_record buckets = strata::test::run_thread_ranks<par::data<par::parameter_server>>(
        2, config("wide-async-" + std::to_string(servers), sc::bucket_launch_kind::async, servers),
        wide_model)[0];
    const run_record whole = strata::test::run_thread_ranks<par::data<par::parameter_server>>(
        2,
        config("wide-blocking-" + std::to_string(servers), sc::bucket_launch_kind::blocking,
               servers),
        wide_model)[0];
    REQUIRE(buckets.steps.size() == whole.steps.size());
    CHECK(buckets.params == whole.params);
    CHECK(buckets.summary.params_xxh3 == whole.summary.params_xxh3);
    auto dense = config("wide-dense-" + std::to_string(servers), sc::bucket_launch_kind::async, 0);
    dense.gradient_sync = sc::gradient_sync_kind::all_reduce;
    dense.parameter_servers = 0;
    const run_record reduced = strata::test::run_thread_ranks<par::data<>>(2, dense, wide_model)[0];
    CHECK(worst_difference(buckets.params, reduced.params) < 1e-6);
  }
}

TEST_CASE("parameter-server buckets with bfloat16 and accumulation equal the push after backward") {
  // Each bucket is rounded through bfloat16 as it goes, the whole gradient after backward
  // otherwise; only the step's last micro-batch communicates.
  const auto config = [](const std::string& name, sc::bucket_launch_kind launch) {
    auto cfg = base_config(name, 2);
    cfg.epochs = 1;
    cfg.checkpoint_interval = 0;
    cfg.batch_size_per_gpu = 16;
    cfg.gradient_accumulation_steps = 2;
    cfg.mixed_precision_dtype = sc::precision_dtype::bfloat16;
    cfg.bucket_launch = launch;
    cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
    return cfg;
  };
  const run_record buckets =
      run_ranks<par::data<par::parameter_server>, sp::bf16, strata::batch::accumulate>(
          2, config("bf16-async", sc::bucket_launch_kind::async))[0];
  const run_record whole =
      run_ranks<par::data<par::parameter_server>, sp::bf16, strata::batch::accumulate>(
          2, config("bf16-blocking", sc::bucket_launch_kind::blocking))[0];
  REQUIRE(buckets.steps.size() == whole.steps.size());
  for (std::size_t i = 0; i < whole.steps.size(); ++i) {
    CHECK(buckets.steps[i].loss == whole.steps[i].loss);
  }
  CHECK(buckets.params == whole.params);
}

TEST_CASE("a parameter-server run stopped and resumed matches an uninterrupted one") {
  auto cfg = base_config("ps-straight", 3);
  cfg.batch_size_per_gpu = 20;
  cfg.optimizer = sc::optimizer_kind::adamw;
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  cfg.parameter_servers = 2;
  const run_record straight = run_ranks<par::data<par::parameter_server>>(3, cfg)[0];
  auto split = cfg;
  split.checkpoint_dir =
      (fs::path(STRATA_TEST_WORK_DIR) / "parameter_server" / "ps-split").string();
  fs::remove_all(split.checkpoint_dir);
  split.max_steps = 7;
  run_ranks<par::data<par::parameter_server>>(3, split);
  split.max_steps = 0;
  const run_record resumed = run_ranks<par::data<par::parameter_server>>(3, split)[0];
  CHECK_FALSE(resumed.summary.resumed_from.empty());
  CHECK(resumed.summary.params_xxh3 == straight.summary.params_xxh3);
}

TEST_CASE("top-k with ratio 1 equals dense training, by all-gather and through the server") {
  for (const int ranks : {2, 4}) {
    INFO(ranks, " ranks");
    auto cfg = base_config("topk-dense-" + std::to_string(ranks), ranks);
    const run_record dense = run_ranks<par::data<>>(ranks, cfg)[0];
    auto tcfg = base_config("topk-one-" + std::to_string(ranks), ranks);
    tcfg.gradient_sync = sc::gradient_sync_kind::all_gather;
    tcfg.gradient_compression = sc::compression_kind::topk;
    tcfg.topk_ratio = 1.0;
    const run_record gathered =
        run_ranks<par::data<par::all_gather, par::compress::topk>>(ranks, tcfg)[0];
    check_same_training(gathered, dense, 1e-5);
    tcfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
    tcfg.checkpoint_dir += "-ps";
    fs::remove_all(tcfg.checkpoint_dir);
    const run_record served =
        run_ranks<par::data<par::parameter_server, par::compress::topk>>(ranks, tcfg)[0];
    REQUIRE(served.steps.size() == dense.steps.size());
    for (std::size_t i = 0; i < dense.steps.size(); ++i) {
      CHECK(served.steps[i].loss == doctest::Approx(dense.steps[i].loss).epsilon(1e-5));
    }
    CHECK(worst_difference(served.params, dense.params) < 1e-5);
  }
}

namespace {

// Trains 2 ranks of Policy over an emulated link (no delay) and returns rank 0's record and the
// bytes rank 0 put on the link.
template <class Policy>
std::pair<run_record, std::size_t> run_counted(const sc::train_config& cfg) {
  std::vector<run_record> records(2);
  std::size_t bytes = 0;
  threads::run(2, [&](threads& t) {
    const int rank = t.rank();
    strata::comm::emulated c(std::move(t));
    st::trainer<model_t, Policy> tr(strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c),
                                    {.print_progress = false});
    records[static_cast<std::size_t>(rank)] = record(tr);
    if (rank == 0) {
      bytes = c.bytes_sent();
    }
  });
  CHECK(records[1].params == records[0].params);
  return {records[0], bytes};
}

}  // namespace

TEST_CASE("top-k at 10% sends a fifth of the dense bytes, learns, and matches through the server") {
  auto cfg = base_config("topk-10-dense", 2);
  cfg.epochs = 4;
  cfg.checkpoint_interval = 0;  // checkpoints gather the residuals: not counted here
  const auto [dense, dense_bytes] = run_counted<par::data<>>(cfg);
  cfg = base_config("topk-10", 2);
  cfg.epochs = 4;
  cfg.checkpoint_interval = 0;
  cfg.gradient_sync = sc::gradient_sync_kind::all_gather;
  cfg.gradient_compression = sc::compression_kind::topk;
  cfg.topk_ratio = 0.1;
  const auto [gathered, bytes] = run_counted<par::data<par::all_gather, par::compress::topk>>(cfg);
  // Per step a dense all-reduce moves 4 bytes per parameter over the 2-rank ring, top-k 8 bytes
  // per pair for a tenth of them; the set-up, checkpoints and metrics are the same in both.
  INFO("dense ", dense_bytes, " bytes, top-k ", bytes);
  CHECK(bytes < dense_bytes * 3 / 10);
  CHECK(bytes > dense_bytes / 10);
  CHECK(gathered.summary.test_accuracy > dense.summary.test_accuracy - 0.05);
  // The same pairs through a co-located server on each rank.
  auto pcfg = cfg;
  pcfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  pcfg.checkpoint_dir += "-ps";
  fs::remove_all(pcfg.checkpoint_dir);
  const run_record served =
      run_ranks<par::data<par::parameter_server, par::compress::topk>>(2, pcfg)[0];
  REQUIRE(served.steps.size() == gathered.steps.size());
  for (std::size_t i = 0; i < served.steps.size(); ++i) {
    CHECK(served.steps[i].loss == doctest::Approx(gathered.steps[i].loss).epsilon(1e-5));
  }
  CHECK(worst_difference(served.params, gathered.params) < 1e-5);  // the server's store is padded
}

TEST_CASE("the top-k residual is saved in checkpoints: a resumed run equals an uninterrupted one") {
  auto cfg = base_config("topk-straight", 2);
  cfg.gradient_sync = sc::gradient_sync_kind::all_gather;
  cfg.gradient_compression = sc::compression_kind::topk;
  cfg.topk_ratio = 0.05;
  const run_record straight = run_ranks<par::data<par::all_gather, par::compress::topk>>(2, cfg)[0];
  auto split = cfg;
  split.checkpoint_dir =
      (fs::path(STRATA_TEST_WORK_DIR) / "parameter_server" / "topk-split").string();
  fs::remove_all(split.checkpoint_dir);
  split.max_steps = 9;
  std::vector<std::vector<float>> residuals(2);
  run_ranks<par::data<par::all_gather, par::compress::topk>>(2, split, [&](auto& t) {
    t.on_step([&t, &residuals](const st::step_metrics&) {
      const auto r = t.executor().topk_residual();
      residuals[static_cast<std::size_t>(t.rank())].assign(r.begin(), r.end());
    });
  });
  // The residuals differ per rank and are not zero.
  CHECK(residuals[0] != residuals[1]);
  CHECK(std::any_of(residuals[0].begin(), residuals[0].end(), [](float r) { return r != 0; }));
  // The checkpoint holds both, in rank order.
  std::vector<float> saved;
  for (const auto& entry : fs::recursive_directory_iterator(split.checkpoint_dir)) {
    if (entry.path().filename() == "topk_residual.ranks.bin") {
      std::ifstream f(entry.path(), std::ios::binary);
      saved.resize(fs::file_size(entry.path()) / sizeof(float));
      f.read(reinterpret_cast<char*>(saved.data()),
             static_cast<std::streamsize>(saved.size() * sizeof(float)));
    }
  }
  std::vector<float> both = residuals[0];
  both.insert(both.end(), residuals[1].begin(), residuals[1].end());
  CHECK(saved == both);
  split.max_steps = 0;
  const run_record resumed =
      run_ranks<par::data<par::all_gather, par::compress::topk>>(2, split)[0];
  CHECK_FALSE(resumed.summary.resumed_from.empty());
  CHECK(resumed.summary.params_xxh3 == straight.summary.params_xxh3);
}

TEST_CASE("a skipped fp16 step keeps the top-k residual") {
  auto cfg = base_config("topk-fp16", 2);
  cfg.gradient_sync = sc::gradient_sync_kind::all_gather;
  cfg.gradient_compression = sc::compression_kind::topk;
  cfg.topk_ratio = 0.1;
  cfg.mixed_precision_dtype = sc::precision_dtype::float16;
  // Rank 1's residual after each step (on_gradients runs after the exchange, so the
  // injected inf makes step 3 skip on both ranks).
  std::vector<std::vector<float>> after;
  const auto records =
      run_ranks<par::data<par::all_gather, par::compress::topk>, sp::fp16>(2, cfg, [&](auto& t) {
        if (t.rank() != 1) {
          return;
        }
        t.on_gradients([](std::uint64_t step, std::span<float> grads) {
          if (step == 3) {
            grads[5] = std::numeric_limits<float>::infinity();
          }
        });
        t.on_step([&t, &after](const st::step_metrics&) {
          const auto r = t.executor().topk_residual();
          after.emplace_back(r.begin(), r.end());
        });
      });
  REQUIRE(records[0].steps.size() > 4);
  CHECK_FALSE(records[0].steps[2].skipped);
  CHECK(records[0].steps[3].skipped);
  CHECK_FALSE(records[0].steps[4].skipped);
  REQUIRE(after.size() > 4);
  CHECK(after[1] != after[2]);  // an applied step moves the residual
  CHECK(after[2] == after[3]);  // the skipped one leaves it as it was
  CHECK(records[0].summary.test_accuracy > 0.85);
}

TEST_CASE("the exchange with dedicated servers averages the workers' shards") {
  // Ranks 0 and 1 train, ranks 2 and 3 serve.
  threads::run(4, [&](threads& c) {
    const std::size_t n = 8;
    par::ps_exchange ps(strata::comm::any_comm(c), n, 2, 2);
    CHECK(ps.is_worker() == (c.rank() < 2));
    CHECK(ps.server_index() == (c.rank() < 2 ? -1 : c.rank() - 2));
    std::vector<float> grads(n, 0.0f);
    if (ps.is_worker()) {
      for (std::size_t i = 0; i < n; ++i) {
        grads[i] = static_cast<float>(i) + 4.0f * static_cast<float>(c.rank());
      }
    }
    ps.push(grads);
    std::vector<float> values(n, -1.0f);
    if (ps.is_server()) {
      const std::size_t b = ps.shard_begin(ps.server_index());
      for (std::size_t i = b; i < b + ps.shard_size(); ++i) {
        CHECK(grads[i] == doctest::Approx(static_cast<float>(i) + 2.0f));  // mean of +0, +4
        values[i] = -grads[i];
      }
    }
    ps.pull(values);
    if (ps.is_worker()) {
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(values[i] == doctest::Approx(-(static_cast<float>(i) + 2.0f)));
      }
    }
  });
}

TEST_CASE("dedicated parameter servers train like data<all_reduce> on the workers") {
  auto cfg = base_config("dedicated-dense", 2);
  cfg.optimizer = sc::optimizer_kind::adamw;
  cfg.lr = 0.01;
  const run_record dense = run_ranks<par::data<>>(2, cfg)[0];
  for (const int servers : {1, 2}) {
    INFO(servers, " dedicated servers");
    auto pcfg = base_config("dedicated-" + std::to_string(servers), 2 + servers);
    pcfg.batch_size_per_gpu = 32;  // per worker
    pcfg.optimizer = sc::optimizer_kind::adamw;
    pcfg.lr = 0.01;
    pcfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
    pcfg.parameter_servers = servers;
    pcfg.dedicated_parameter_servers = true;
    std::vector<run_record> records(static_cast<std::size_t>(2 + servers));
    threads::run(2 + servers, [&](threads& c) {
      st::trainer<model_t, par::data<par::parameter_server>> t(
          strata::test::blobs_mlp(), pcfg, strata::comm::any_comm(c), {.print_progress = false});
      records[static_cast<std::size_t>(c.rank())] = record(t);
    });
    const run_record& worker = records[0];
    CHECK(records[1].params == worker.params);
    REQUIRE(worker.steps.size() == dense.steps.size());
    for (std::size_t i = 0; i < dense.steps.size(); ++i) {
      CHECK(worker.steps[i].loss == doctest::Approx(dense.steps[i].loss).epsilon(1e-5));
      CHECK(worker.steps[i].samples == dense.steps[i].samples);
    }
    CHECK(worst_difference(worker.params, dense.params) < 1e-5);
    // The servers trained no samples, applied every step, and report no accuracy.
    CHECK(records[2].steps.empty());
    CHECK(records[2].summary.steps == worker.summary.steps);
  }
}

TEST_CASE("dedicated servers: top-k, fp16 skips and a stopped and resumed run") {
  auto cfg = base_config("dedicated-straight", 3);
  cfg.batch_size_per_gpu = 32;
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  cfg.gradient_compression = sc::compression_kind::topk;
  cfg.topk_ratio = 0.2;
  cfg.parameter_servers = 1;
  cfg.dedicated_parameter_servers = true;
  cfg.mixed_precision_dtype = sc::precision_dtype::float16;
  cfg.loss_scale_initial = 16777216.0;  // 2^24: the first steps overflow and are skipped
  cfg.optimizer = sc::optimizer_kind::adamw;
  cfg.lr = 0.01;
  using policy = par::data<par::parameter_server, par::compress::topk>;
  const auto straight = run_ranks<policy, sp::fp16>(3, cfg);
  // The same job with the server co-located on rank 0 of 2 ranks: the same numbers.
  auto colocated = cfg;
  colocated.world_size = 2;
  colocated.dedicated_parameter_servers = false;
  colocated.checkpoint_dir += "-colocated";
  fs::remove_all(colocated.checkpoint_dir);
  const auto same = run_ranks<policy, sp::fp16>(2, colocated);
  check_same_training(straight[0], same[0], 1e-6);
  CHECK(straight[0].summary.test_accuracy == same[0].summary.test_accuracy);
  std::size_t skipped = 0;
  for (std::size_t i = 0; i < same[0].steps.size(); ++i) {
    CHECK(straight[0].steps[i].skipped == same[0].steps[i].skipped);
    skipped += same[0].steps[i].skipped ? 1 : 0;
  }
  CHECK(skipped > 0);
  CHECK_FALSE(same[0].steps.back().skipped);
  auto split = cfg;
  split.checkpoint_dir =
      (fs::path(STRATA_TEST_WORK_DIR) / "parameter_server" / "dedicated-split").string();
  fs::remove_all(split.checkpoint_dir);
  split.max_steps = 9;
  run_ranks<policy, sp::fp16>(3, split);
  split.max_steps = 0;
  const auto resumed = run_ranks<policy, sp::fp16>(3, split);
  CHECK_FALSE(resumed[0].summary.resumed_from.empty());
  CHECK(resumed[0].summary.params_xxh3 == straight[0].summary.params_xxh3);
}

namespace {

// 2 workers and 1 dedicated asynchronous server; returns every rank's record and the server's
// largest observed lead. `slow` sleeps worker 1 that long after each of its steps.
template <class Precision = sp::fp32>
std::pair<std::vector<run_record>, std::uint64_t> run_async(const sc::train_config& cfg,
                                                            std::chrono::milliseconds slow) {
  std::vector<run_record> records(3);
  std::uint64_t lead = 0;
  threads::run(3, [&](threads& c) {
    st::trainer<model_t, par::data<par::parameter_server>, Precision> t(
        strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false});
    if (c.rank() == 1 && slow.count() > 0) {
      t.on_step([slow](const st::step_metrics&) { std::this_thread::sleep_for(slow); });
    }
    records[static_cast<std::size_t>(c.rank())] = record(t);
    if (c.rank() == 2) {
      lead = t.executor().max_lead();
    }
  });
  return {records, lead};
}

sc::train_config async_config(const std::string& name, std::int64_t staleness) {
  auto cfg = base_config(name, 3);
  cfg.batch_size_per_gpu = 32;  // per worker
  cfg.momentum = 0.0;           // plain SGD: sequential updates add up to the averaged one
  cfg.weight_decay = 0.0;
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  cfg.parameter_servers = 1;
  cfg.dedicated_parameter_servers = true;
  cfg.parameter_server_async = true;
  cfg.parameter_server_staleness = staleness;
  return cfg;
}

}  // namespace

TEST_CASE("the asynchronous server with staleness 0 trains like synchronous SGD") {
  auto cfg = base_config("async-reference", 2);
  cfg.momentum = 0.0;
  cfg.weight_decay = 0.0;
  const run_record sync = run_ranks<par::data<>>(2, cfg)[0];
  const auto [records, lead] = run_async(async_config("async-0", 0), std::chrono::milliseconds(0));
  CHECK(lead == 0);
  for (int r = 0; r < 2; ++r) {
    INFO("worker ", r);
    REQUIRE(records[static_cast<std::size_t>(r)].steps.size() == sync.steps.size());
    CHECK(worst_difference(records[static_cast<std::size_t>(r)].params, sync.params) < 1e-5);
  }
  CHECK(records[2].summary.steps == sync.summary.steps);
}

TEST_CASE("the asynchronous server lets a worker lead by at most the staleness bound") {
  auto reference = base_config("async-2-reference", 2);
  reference.momentum = 0.0;
  reference.weight_decay = 0.0;
  const run_record sync = run_ranks<par::data<>>(2, reference)[0];
  // Worker 1 sleeps after every step: worker 0 runs ahead until the bound holds it.
  const auto cfg = async_config("async-2", 2);
  const auto [records, lead] = run_async(cfg, std::chrono::milliseconds(25));
  CHECK(lead == 2);
  CHECK(records[0].summary.test_accuracy > sync.summary.test_accuracy - 0.05);
  CHECK(records[1].summary.test_accuracy > sync.summary.test_accuracy - 0.05);
  // A later job resumes from the final checkpoint (worker 0 saved the servers' parameters).
  const auto again = run_async(cfg, std::chrono::milliseconds(0));
  CHECK_FALSE(again.first[0].summary.resumed_from.empty());
  CHECK(again.first[0].summary.params_xxh3 == records[0].summary.params_xxh3);
}

TEST_CASE("the asynchronous server with bfloat16 trains like synchronous bfloat16") {
  auto reference = base_config("async-bf16-reference", 2);
  reference.momentum = 0.0;
  reference.weight_decay = 0.0;
  reference.mixed_precision_dtype = sc::precision_dtype::bfloat16;
  const run_record sync = run_ranks<par::data<>, sp::bf16>(2, reference)[0];
  auto cfg = async_config("async-bf16", 0);
  cfg.mixed_precision_dtype = sc::precision_dtype::bfloat16;
  const auto [records, lead] = run_async<sp::bf16>(cfg, std::chrono::milliseconds(0));
  CHECK(lead == 0);
  for (int r = 0; r < 2; ++r) {
    INFO("worker ", r);
    const run_record& mine = records[static_cast<std::size_t>(r)];
    REQUIRE(mine.steps.size() == sync.steps.size());
    // One update per worker of half its gradient (each rounded through bfloat16) instead of one
    // of the average: the same SGD up to the rounding.
    const double worst = worst_difference(mine.params, sync.params);
    MESSAGE("worker ", r, ": largest parameter difference to synchronous bfloat16 ", worst);
    CHECK(worst < 1e-2);
    CHECK(mine.summary.test_accuracy > sync.summary.test_accuracy - 0.02);
  }
}

TEST_CASE("an asynchronous float16 worker skips its own overflowing steps, the others go on") {
  auto reference = base_config("async-fp16-reference", 2);
  reference.momentum = 0.0;
  reference.weight_decay = 0.0;
  reference.mixed_precision_dtype = sc::precision_dtype::float16;
  // A loss scale far too large: the first steps overflow float16 until the scaler has backed
  // off far enough (the synchronous reference skips as many steps).
  reference.loss_scale_initial = 268435456.0;  // 2^28
  reference.loss_scale_backoff_factor = 0.125;
  const run_record sync = run_ranks<par::data<>, sp::fp16>(2, reference)[0];
  std::size_t sync_skipped = 0;
  for (const auto& m : sync.steps) {
    sync_skipped += m.skipped ? 1 : 0;
  }
  auto cfg = async_config("async-fp16", 1);
  cfg.mixed_precision_dtype = sc::precision_dtype::float16;
  cfg.loss_scale_initial = reference.loss_scale_initial;
  cfg.loss_scale_backoff_factor = reference.loss_scale_backoff_factor;
  const auto [records, lead] = run_async<sp::fp16>(cfg, std::chrono::milliseconds(0));
  CHECK(lead <= 1);
  for (int r = 0; r < 2; ++r) {
    INFO("worker ", r);
    const run_record& mine = records[static_cast<std::size_t>(r)];
    REQUIRE(mine.steps.size() == sync.steps.size());
    std::size_t skipped = 0;
    for (const auto& m : mine.steps) {
      skipped += m.skipped ? 1 : 0;
    }
    MESSAGE("worker ", r, ": ", skipped, " steps skipped (synchronous: ", sync_skipped,
            "), test accuracy ", mine.summary.test_accuracy, " (synchronous ",
            sync.summary.test_accuracy, ")");
    CHECK(skipped > 0);                      // the overflows were caught
    CHECK(skipped < mine.steps.size() / 2);  // and the scale came down
    CHECK(mine.summary.test_accuracy > sync.summary.test_accuracy - 0.05);
  }
  // The server counted every worker step, pushed or skipped.
  CHECK(records[2].summary.steps == sync.summary.steps);
}

TEST_CASE("parameter-server and top-k keys must match the policy") {
  auto cfg = base_config("keys", 2);
  cfg.parameter_servers = 1;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<>>(strata::test::blobs_mlp(), cfg,
                                           strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("parameter_servers configures"), strata::config_error);
  });
  cfg.parameter_servers = 3;
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<par::parameter_server>>(
            strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("parameter_servers = 3 is more than the 2 ranks"), strata::config_error);
  });
  cfg.parameter_servers = 0;
  cfg.gradient_sync = sc::gradient_sync_kind::all_reduce;
  cfg.topk_ratio = 0.2;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<>>(strata::test::blobs_mlp(), cfg,
                                           strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("topk_ratio configures"), strata::config_error);
  });
  cfg.gradient_sync = sc::gradient_sync_kind::all_gather;
  cfg.gradient_compression = sc::compression_kind::topk;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<par::parameter_server, par::compress::topk>>(
            strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("gradient_sync = all_gather"), strata::config_error);
  });
  cfg.gradient_compression = sc::compression_kind::none;
  cfg.topk_ratio = sc::train_config{}.topk_ratio;
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  cfg.dedicated_parameter_servers = true;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<par::parameter_server>>(
            strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("dedicated_parameter_servers needs 1 .. world_size - 1 servers"),
        strata::config_error);
  });
  cfg.gradient_sync = sc::gradient_sync_kind::all_reduce;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<>>(strata::test::blobs_mlp(), cfg,
                                           strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("dedicated_parameter_servers configures"), strata::config_error);
  });
  cfg.dedicated_parameter_servers = false;
  cfg.gradient_sync = sc::gradient_sync_kind::parameter_server;
  cfg.parameter_server_async = true;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<par::parameter_server>>(
            strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("parameter_server_async needs dedicated_parameter_servers"),
        strata::config_error);
  });
  cfg.parameter_server_async = false;
  cfg.parameter_server_staleness = 3;
  threads::run(2, [&](threads& c) {
    CHECK_THROWS_WITH_AS(
        (st::trainer<model_t, par::data<par::parameter_server>>(
            strata::test::blobs_mlp(), cfg, strata::comm::any_comm(c), {.print_progress = false})),
        doctest::Contains("parameter_server_staleness configures"), strata::config_error);
  });
  cfg.parameter_server_staleness = 0;
  cfg.gradient_sync = sc::gradient_sync_kind::all_reduce;
  cfg.gradient_compression = sc::compression_kind::topk;
  // Config validation: top-k needs a transport that can carry it.
  cfg.gradient_sync = sc::gradient_sync_kind::all_reduce;
  CHECK_THROWS_WITH_AS(strata::config::validate(cfg), doctest::Contains("use all_gather"),
                       strata::config_error);
}
