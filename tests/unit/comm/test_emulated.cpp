// SPDX-License-Identifier: Apache-2.0
// strata::comm::emulated<threads>: the conformance suite through the wrapper, the link cost
// model, measured delays of blocking and non-blocking operations, overlap with compute,
// serialization of operations on the link, split / with_link, and the counters.

#include "strata/comm/emulated.hpp"

#include <doctest/doctest.h>

#include "conformance/comm_backend.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

static_assert(strata::comm::check_comm_backend<strata::comm::emulated<strata::comm::threads>>());

namespace {

using strata::dtype;
using strata::comm::comm_config;
// A shorter name for the tests.
using net_link = strata::comm::network_link;
using strata::comm::modelled_transfer;
using strata::comm::op_kind;
using strata::comm::reduce_op;
using strata::comm::threads;
using emu = strata::comm::emulated<threads>;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t mib = std::size_t{1} << 20;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Runs fn(emulated) on n thread ranks, each wrapping its threads communicator.
template <class F>
void run_emulated(int n, const net_link& l, F&& fn, comm_config config = {}) {
  threads::run(
      n,
      [&](threads& t) {
        emu c(std::move(t), l);
        fn(c);
      },
      config);
}

// Per-rank measurements, checked on the test's thread after the ranks joined.
struct measured {
  double seconds = -1;
  double other = -1;
  std::uint64_t bytes = 0;
  std::uint64_t received = 0;
  double delay = -1;
  bool values_ok = false;
};

}  // namespace

TEST_CASE("link presets and validation") {
  CHECK(net_link::none().latency_seconds == 0);
  CHECK(net_link::none().bandwidth_bytes_per_second == 0);
  CHECK(net_link::ethernet_10g().bandwidth_bytes_per_second == 1.25e9);
  CHECK(net_link::ethernet_10g().latency_seconds == 20e-6);
  CHECK(net_link::ethernet_100g().bandwidth_bytes_per_second == 12.5e9);
  CHECK(net_link::infiniband_hdr().bandwidth_bytes_per_second == 25e9);
  CHECK(net_link::infiniband_hdr().latency_seconds == 1.5e-6);
  CHECK(net_link::infiniband_hdr().name == "infiniband_hdr");
  CHECK_NOTHROW(strata::comm::validate(net_link::ethernet_10g()));

  const net_link negative{.latency_seconds = -1e-6, .name = "bad"};
  CHECK_THROWS_WITH_AS(strata::comm::validate(negative),
                       doctest::Contains("latency_seconds = -0.000001"), strata::error);
  const net_link nan_bw{.bandwidth_bytes_per_second = std::numeric_limits<double>::quiet_NaN(),
                        .name = "nan"};
  CHECK_THROWS_WITH_AS(strata::comm::validate(nan_bw),
                       doctest::Contains("comm::network_link 'nan': bandwidth_bytes_per_second"),
                       strata::error);
  // The constructor and with_link refuse it too.
  threads::run(1, [&](threads& t) { CHECK_THROWS_AS(emu(std::move(t), negative), strata::error); });
  threads::run(1, [&](threads& t) {
    emu c(std::move(t), net_link::none());
    CHECK_THROWS_AS(c.with_link(nan_bw), strata::error);
    CHECK(c.link_model().name == "none");
  });
}

TEST_CASE("modelled_transfer follows the documented cost table") {
  const net_link l{.latency_seconds = 1e-3, .bandwidth_bytes_per_second = 1e6};
  // n = 4, 1000 floats = 4000 bytes.
  auto t = modelled_transfer(l, op_kind::all_reduce, 1000, dtype::float32, 4);
  CHECK(t.bytes_on_wire == 6000);  // 2 * 3 / 4 * 4000
  CHECK(t.steps == 6);
  CHECK(t.seconds == doctest::Approx(6e-3 + 6000 / 1e6));
  // reduce_scatter / all_gather / all_to_all take per-rank counts: total 4 x 250 doubles.
  t = modelled_transfer(l, op_kind::reduce_scatter, 250, dtype::float64, 4);
  CHECK(t.bytes_on_wire == 6000);  // 3 / 4 * 8000
  CHECK(t.steps == 3);
  t = modelled_transfer(l, op_kind::all_gather, 250, dtype::float64, 4);
  CHECK(t.bytes_on_wire == 6000);
  t = modelled_transfer(l, op_kind::all_to_all, 10, dtype::uint8, 4);
  CHECK(t.bytes_on_wire == 30);
  CHECK(t.steps == 3);
  t = modelled_transfer(l, op_kind::broadcast, 100, dtype::bfloat16, 4);
  CHECK(t.bytes_on_wire == 200);
  CHECK(t.steps == 3);
  t = modelled_transfer(l, op_kind::reduce, 100, dtype::int64, 4);
  CHECK(t.bytes_on_wire == 800);
  t = modelled_transfer(l, op_kind::send, 5, dtype::int32, 4);
  CHECK(t.bytes_on_wire == 20);
  CHECK(t.steps == 1);
  CHECK(t.seconds == doctest::Approx(1e-3 + 20 / 1e6));
  t = modelled_transfer(l, op_kind::recv, 5, dtype::int32, 4);
  CHECK(t.bytes_on_wire == 20);
  // barrier: latency only, ceil(log2 n) steps.
  t = modelled_transfer(l, op_kind::barrier, 0, dtype::uint8, 4);
  CHECK(t.bytes_on_wire == 0);
  CHECK(t.steps == 2);
  CHECK(modelled_transfer(l, op_kind::barrier, 0, dtype::uint8, 3).steps == 2);
  CHECK(modelled_transfer(l, op_kind::barrier, 0, dtype::uint8, 5).steps == 3);
  CHECK(modelled_transfer(l, op_kind::barrier, 0, dtype::uint8, 2).steps == 1);
  // all_reduce with n = 3 rounds down to whole bytes: 4 / 3 * 4000 = 5333.33.
  CHECK(modelled_transfer(l, op_kind::all_reduce, 1000, dtype::float32, 3).bytes_on_wire == 5333);
  // n = 1: nothing at all.
  t = modelled_transfer(l, op_kind::all_reduce, 1000, dtype::float32, 1);
  CHECK(t.bytes_on_wire == 0);
  CHECK(t.seconds == 0);
  // Infinite bandwidth: latency only.
  CHECK(modelled_transfer(net_link{.latency_seconds = 2e-6}, op_kind::all_reduce, 1000000,
                          dtype::float32, 2)
            .seconds == doctest::Approx(4e-6));
}

TEST_CASE(
    "emulated<threads> with net_link::none passes the conformance suite with 1, 2 and 3 ranks") {
  for (const int n : {1, 2, 3}) {
    CAPTURE(n);
    std::vector<strata::conformance::report> reports(static_cast<std::size_t>(n));
    run_emulated(n, net_link::none(),
                 [&](emu& c) {
                   reports[static_cast<std::size_t>(c.rank())] = strata::conformance::run_all(c);
                 },
                 {.timeout = 120});
    for (const auto& rep : reports) {
      CHECK_MESSAGE(rep.ok(), rep.summary());
      CHECK(rep.checks > 0);
    }
  }
}

TEST_CASE("emulated<threads> with a slow-latency link still passes the conformance suite") {
  // Small counts only: every operation pays 1 us per step plus the bytes at 10 GB/s.
  const net_link l{.latency_seconds = 1e-6, .bandwidth_bytes_per_second = 1e10, .name = "test"};
  std::vector<strata::conformance::report> reports(2);
  std::vector<double> delays(2, 0.0);
  run_emulated(2, l,
               [&](emu& c) {
                 reports[static_cast<std::size_t>(c.rank())] =
                     strata::conformance::run_all(c, {.counts = {0, 1, 7, 1000}});
                 delays[static_cast<std::size_t>(c.rank())] = c.delay_seconds();
               },
               {.timeout = 120});
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK_MESSAGE(reports[r].ok(), reports[r].summary());
    CHECK(delays[r] > 0);
  }
}

TEST_CASE("a blocking all_reduce of 1 MiB over a 1 GB/s link takes the modelled time") {
  const net_link l{.latency_seconds = 0, .bandwidth_bytes_per_second = 1e9, .name = "1GB/s"};
  for (const int n : {2, 3}) {
    CAPTURE(n);
    const auto un = static_cast<std::uint64_t>(n);
    const std::uint64_t wire = 2 * (un - 1) * mib / un;
    const double model = static_cast<double>(wire) / 1e9;
    std::vector<measured> m(static_cast<std::size_t>(n));
    run_emulated(n, l, [&](emu& c) {
      std::vector<float> data(mib / sizeof(float), static_cast<float>(c.rank() + 1));
      c.barrier();  // latency 0: costs nothing, lines the ranks up
      const auto t0 = clock_type::now();
      strata::comm::all_reduce(c, data, reduce_op::sum);
      auto& mine = m[static_cast<std::size_t>(c.rank())];
      mine.seconds = seconds_since(t0);
      mine.bytes = c.bytes_sent();
      mine.delay = c.delay_seconds();
      const float want = static_cast<float>(n * (n + 1) / 2);
      mine.values_ok = data.front() == want && data.back() == want;
    });
    for (const auto& mine : m) {
      CHECK(mine.values_ok);
      CHECK(mine.bytes == wire);
      CHECK(mine.delay == doctest::Approx(model));
      CHECK(mine.seconds >= model);
      CHECK(mine.seconds < model + 0.2);
    }
    MESSAGE("n = " << n << ": model " << model * 1e3 << " ms, measured " << m[0].seconds * 1e3
                   << " ms");
  }
}

TEST_CASE("a non-blocking all_reduce overlaps compute on the caller") {
  // 1 MiB on 2 ranks puts 1 MiB on the wire: 0.1 s at this bandwidth.
  const double transfer = 0.1;
  const double compute = 0.1;
  const net_link l{.bandwidth_bytes_per_second = static_cast<double>(mib) / transfer,
                   .name = "slow"};
  std::vector<measured> m(2);
  run_emulated(2, l, [&](emu& c) {
    auto& mine = m[static_cast<std::size_t>(c.rank())];
    std::vector<float> data(mib / sizeof(float), 1.0f);
    c.barrier();
    // Overlapped: issue, compute (sleep), wait.
    auto t0 = clock_type::now();
    auto r = strata::comm::all_reduce_async(c, data, reduce_op::sum);
    const bool early = r.test();  // the inner op may be done, the modelled transfer is not
    std::this_thread::sleep_for(std::chrono::duration<double>(compute));
    r.wait();
    mine.seconds = seconds_since(t0);
    mine.values_ok = !early && data.front() == 2.0f && data.back() == 2.0f;
    // Serial, for comparison: blocking all_reduce, then compute.
    c.barrier();
    t0 = clock_type::now();
    strata::comm::all_reduce(c, data, reduce_op::sum);
    std::this_thread::sleep_for(std::chrono::duration<double>(compute));
    mine.other = seconds_since(t0);
    mine.values_ok = mine.values_ok && data.front() == 4.0f;
  });
  for (const auto& mine : m) {
    CHECK(mine.values_ok);
    CHECK(mine.seconds >= std::max(compute, transfer));
    CHECK(mine.seconds < 0.8 * (compute + transfer));
    CHECK(mine.other >= compute + transfer);
  }
  MESSAGE("overlap: compute " << compute * 1e3 << " ms, transfer " << transfer * 1e3
                              << " ms; overlapped " << m[0].seconds * 1e3 << " / "
                              << m[1].seconds * 1e3 << " ms, serial " << m[0].other * 1e3 << " / "
                              << m[1].other * 1e3 << " ms (ranks 0 / 1)");
}

TEST_CASE("operations share the link: two async operations complete no earlier than their sum") {
  // 10 MB/s. all_reduce of 400 KB on 2 ranks: 400 KB on the wire, 40 ms; all_gather of 200 KB
  // per rank: 200 KB, 20 ms; then a blocking broadcast of 100 KB: 10 ms.
  const net_link l{.latency_seconds = 1e-3, .bandwidth_bytes_per_second = 1e7, .name = "10MB/s"};
  const double ta = 2e-3 + 0.04;
  const double tb = 1e-3 + 0.02;
  const double tc = 1e-3 + 0.01;
  std::vector<measured> m(2);
  std::vector<int> ok(2, 0);
  run_emulated(2, l, [&](emu& c) {
    auto& mine = m[static_cast<std::size_t>(c.rank())];
    std::vector<float> a(100000, 1.0f);
    std::vector<float> shard(50000, static_cast<float>(c.rank()));
    std::vector<float> full(100000);
    std::vector<float> b(25000, static_cast<float>(c.rank() + 7));
    const auto t0 = clock_type::now();
    auto ra = strata::comm::all_reduce_async(c, a, reduce_op::sum);
    auto rb = strata::comm::all_gather_async(c, std::span<const float>(shard), full);
    // B's modelled completion is exactly A's plus B's time: it queued behind A.
    const auto gap = rb.completion_time() - ra.completion_time();
    const bool queued =
        gap == std::chrono::ceil<clock_type::duration>(std::chrono::duration<double>(tb));
    rb.wait();  // only B: it cannot be done before A's time has passed as well
    mine.seconds = seconds_since(t0);
    const bool a_done = ra.test();  // A finished before B in the model
    ra.wait();
    strata::comm::broadcast(c, b, 1);
    mine.other = seconds_since(t0);
    ok[static_cast<std::size_t>(c.rank())] =
        queued && a_done && a.front() == 2.0f && full.front() == 0.0f && full.back() == 1.0f &&
        b.front() == 8.0f && c.link_free_at() >= rb.completion_time();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(ok[r] == 1);
    CHECK(m[r].seconds >= ta + tb);
    CHECK(m[r].seconds < ta + tb + 0.2);
    CHECK(m[r].other >= ta + tb + tc);
  }
  MESSAGE("serialized: A " << ta * 1e3 << " ms + B " << tb * 1e3 << " ms; B done after "
                           << m[0].seconds * 1e3 << " ms");
}

TEST_CASE("test() turns true only once the modelled time has passed") {
  const net_link l{.latency_seconds = 0.05, .name = "50ms"};
  std::vector<measured> m(2);
  run_emulated(2, l, [&](emu& c) {
    auto& mine = m[static_cast<std::size_t>(c.rank())];
    const auto t0 = clock_type::now();
    auto r = c.barrier_async();  // 1 step on 2 ranks: 50 ms
    int polls = 0;
    while (!r.test()) {
      ++polls;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    mine.seconds = seconds_since(t0);
    r.wait();  // a completed request can be waited again
    mine.values_ok = polls > 0;
    emu::request empty;
    mine.values_ok = mine.values_ok && empty.test();
    empty.wait();
  });
  for (const auto& mine : m) {
    CHECK(mine.values_ok);
    CHECK(mine.seconds >= 0.05);
    CHECK(mine.seconds < 0.25);
  }
}

TEST_CASE("bytes_sent and delay_seconds add up every operation by the formula") {
  const net_link l{.latency_seconds = 1e-6, .bandwidth_bytes_per_second = 1e9, .name = "test"};
  const int n = 3;
  std::vector<measured> m(n);
  run_emulated(n, l, [&](emu& c) {
    const int me = c.rank();
    std::vector<float> ar(1000, 1.0f);
    strata::comm::all_reduce(c, ar, reduce_op::sum);  // 2*2/3 * 4000 = 5333 B, 4 steps
    std::vector<double> rs_in(300, 1.0);
    std::vector<double> rs_out(100);
    strata::comm::reduce_scatter(c, std::span<const double>(rs_in), rs_out);  // 2*800 B, 2 steps
    std::vector<std::int32_t> ag_in(50, me);
    std::vector<std::int32_t> ag_out(150);
    auto r = strata::comm::all_gather_async(c, std::span<const std::int32_t>(ag_in),
                                            ag_out);  // 2*200 B, 2 steps
    r.wait();
    std::vector<strata::bfloat16> bc(10);
    strata::comm::broadcast(c, bc, 0);  // 20 B, 2 steps
    std::vector<double> red(10, 1.0);
    std::vector<double> red_out(me == 0 ? 10 : 0);
    strata::comm::reduce(c, std::span<const double>(red), red_out, reduce_op::sum,
                         0);  // 80 B, 2 steps
    std::vector<std::uint8_t> a2a_in(21, 1);
    std::vector<std::uint8_t> a2a_out(21);
    strata::comm::all_to_all(c, std::span<const std::uint8_t>(a2a_in),
                             a2a_out);  // 2*7 B, 2 steps
    c.barrier();                        // 0 B, 2 steps
    std::vector<float> msg(16, 1.0f);
    std::vector<float> got(16);
    auto s = strata::comm::send_async(c, std::span<const float>(msg), (me + 1) % n);  // 64 B, 1
    strata::comm::recv(c, got, (me + n - 1) % n);                                     // 64 B, 1
    s.wait();
    auto& mine = m[static_cast<std::size_t>(me)];
    mine.bytes = c.bytes_sent();
    mine.received = c.bytes_received();
    mine.delay = c.delay_seconds();
    mine.values_ok = ar[0] == 3.0f && rs_out[0] == 3.0 && ag_out[149] == 2 && got[0] == 1.0f;
  });
  const std::uint64_t bytes = 5333 + 1600 + 400 + 20 + 80 + 14 + 0 + 64;  // the receive apart
  const double steps = 4 + 2 + 2 + 2 + 2 + 2 + 2 + 1;  // the receive's step is incoming
  for (const auto& mine : m) {
    CHECK(mine.values_ok);
    CHECK(mine.bytes == bytes);
    CHECK(mine.received == 64);
    CHECK(mine.delay == doctest::Approx(steps * 1e-6 + static_cast<double>(bytes) / 1e9));
  }
}

TEST_CASE("the link is full duplex: a send and a receive at once take one transfer time") {
  // 400 kB at 4 MB/s: 100 ms each way. Exchanged at once they overlap (about 100 ms, not 200).
  const net_link l{.latency_seconds = 0, .bandwidth_bytes_per_second = 4e6, .name = "test"};
  std::vector<measured> m(2);
  run_emulated(2, l, [&](emu& c) {
    const int peer = 1 - c.rank();
    std::vector<float> out(100000, 1.0f);
    std::vector<float> in(100000);
    const auto t0 = std::chrono::steady_clock::now();
    auto s = strata::comm::send_async(c, std::span<const float>(out), peer);
    strata::comm::recv(c, in, peer);
    s.wait();
    auto& mine = m[static_cast<std::size_t>(c.rank())];
    mine.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mine.bytes = c.bytes_sent();
    mine.received = c.bytes_received();
    mine.values_ok = in[0] == 1.0f;
  });
  for (const auto& mine : m) {
    CHECK(mine.values_ok);
    CHECK(mine.bytes == 400000);
    CHECK(mine.received == 400000);
    CHECK(mine.seconds >= 0.099);
    CHECK(mine.seconds < 0.17);
  }
}

TEST_CASE("one rank: no delay and no bytes, whatever the link") {
  const net_link crawl{.latency_seconds = 10, .bandwidth_bytes_per_second = 1, .name = "crawl"};
  measured m;
  run_emulated(1, crawl, [&](emu& c) {
    std::vector<float> data(mib / sizeof(float), 3.0f);
    const auto t0 = clock_type::now();
    strata::comm::all_reduce(c, data, reduce_op::sum);
    auto r = strata::comm::all_reduce_async(c, data, reduce_op::avg);
    r.wait();
    c.barrier();
    m.seconds = seconds_since(t0);
    m.bytes = c.bytes_sent();
    m.delay = c.delay_seconds();
    m.values_ok = data[0] == 3.0f;
  });
  CHECK(m.values_ok);
  CHECK(m.bytes == 0);
  CHECK(m.delay == 0);
  CHECK(m.seconds < 1.0);
}

TEST_CASE("split keeps the link, with_link changes it for hierarchical setups") {
  const net_link slow{.latency_seconds = 1e-3, .bandwidth_bytes_per_second = 1e8, .name = "slow"};
  const net_link fast = net_link::infiniband_hdr();
  const int n = 4;
  std::vector<std::string> names(n);
  std::vector<std::string> renamed(n);
  std::vector<measured> m(n);
  run_emulated(n, slow, [&](emu& c) {
    const int me = c.rank();
    emu same = c.split(me % 2, me);
    names[static_cast<std::size_t>(me)] = same.link_model().name;
    emu group = c.split(me % 2, me).with_link(fast);
    renamed[static_cast<std::size_t>(me)] = group.link_model().name;
    std::vector<std::int64_t> v{me};
    strata::comm::all_reduce(group, v, reduce_op::sum);
    auto& mine = m[static_cast<std::size_t>(me)];
    mine.bytes = group.bytes_sent();
    mine.delay = group.delay_seconds();
    mine.other = c.delay_seconds();  // the parent's own counter: split is free
    // The tally with splits: the group's 8 bytes, then one more on the parent, seen from all.
    const bool group_sum = v[0] == (me % 2 == 0 ? 0 + 2 : 1 + 3);
    const bool tally_before = c.bytes_sent() == 0 && c.bytes_sent_with_splits() == 8 &&
                              group.bytes_sent_with_splits() == 8;
    strata::comm::all_reduce(c, v, reduce_op::sum);
    const std::uint64_t parent_bytes = c.bytes_sent();
    const bool tally_after = parent_bytes > 0 && c.bytes_sent_with_splits() == 8 + parent_bytes &&
                             same.bytes_sent_with_splits() == 8 + parent_bytes &&
                             group.bytes_sent_with_splits() == 8 + parent_bytes &&
                             same.bytes_sent() == 0;
    mine.values_ok = group.size() == 2 && group_sum && v[0] == 2 * (2 + 4) &&
                     c.link_model().name == "slow" && tally_before && tally_after &&
                     c.ranks_sharing_cpus() == n &&
                     group.ranks_sharing_cpus() == n;  // threads: every rank of the run
  });
  // 1 int64 on 2 ranks: 8 bytes, 2 steps on the fast link.
  const double want = modelled_transfer(fast, op_kind::all_reduce, 1, dtype::int64, 2).seconds;
  for (int r = 0; r < n; ++r) {
    const auto& mine = m[static_cast<std::size_t>(r)];
    CHECK(names[static_cast<std::size_t>(r)] == "slow");
    CHECK(renamed[static_cast<std::size_t>(r)] == "infiniband_hdr");
    CHECK(mine.values_ok);
    CHECK(mine.bytes == 8);
    CHECK(mine.delay == doctest::Approx(2 * 1.5e-6 + 8 / 25e9));
    CHECK(mine.delay == doctest::Approx(want));
    CHECK(mine.other == 0);
  }
}

TEST_CASE("a failed inner operation books nothing and its error comes through") {
  const net_link slow{.latency_seconds = 1, .name = "slow"};
  std::vector<int> ok(2, 0);
  run_emulated(2, slow, [&](emu& c) {
    std::vector<float> v(4);
    bool threw = false;
    try {
      c.send(v.data(), v.size(), dtype::float32, 7, 0);  // no rank 7
    } catch (const strata::comm_error& e) {
      // The first rank to throw marks itself failed, so the other may see peer_failed first.
      threw = e.kind() == strata::comm_error_kind::invalid_argument ||
              e.kind() == strata::comm_error_kind::peer_failed;
    }
    ok[static_cast<std::size_t>(c.rank())] = threw && c.bytes_sent() == 0 &&
                                             c.delay_seconds() == 0 &&
                                             c.link_free_at() == emu::clock::time_point{};
  });
  CHECK(ok[0] == 1);
  CHECK(ok[1] == 1);
}
