// SPDX-License-Identifier: Apache-2.0
// strata::comm::mpi beyond the conformance suite: the environment, the world_size check,
// fingerprint mismatches caught on every rank before data moves, fault injection, point-to-point
// count checks, requests, split, sampled fingerprints, invalid arguments. Every rank runs every
// test case; each case makes its own communicator, so a case that leaves one out of step does not
// disturb the next.
#include <doctest/doctest.h>

#include <climits>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/collectives.hpp"
#include "strata/comm/mpi.hpp"
#include "strata/config/validate.hpp"

namespace {

using strata::dtype;
using strata::float16;
using strata::comm::comm_config;
using strata::comm::fault_action;
using strata::comm::fingerprint_mode;
using strata::comm::mpi;
using strata::comm::op_kind;
using strata::comm::reduce_op;

comm_config checked() {
  return comm_config{.timeout = 30.0, .fingerprint = fingerprint_mode::always};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `call` expecting comm_error (mismatch) naming `differs`, and checks that `data` still
// holds `before` (no data moved).
template <class Call>
void expect_mismatch(Call&& call, const std::string& differs, const std::vector<float>& data,
                     float before) {
  bool thrown = false;
  try {
    call();
  } catch (const strata::comm_error& e) {
    thrown = true;
    INFO(e.what());
    CHECK(e.kind() == strata::comm_error_kind::mismatch);
    CHECK(contains(e.what(), differs));
  }
  CHECK(thrown);
  CHECK(std::all_of(data.begin(), data.end(), [&](float v) { return v == before; }));
}

}  // namespace

static_assert(strata::comm::check_comm_backend<mpi>());
static_assert(strata::comm::comm_request<mpi::request>);
static_assert(!std::is_copy_constructible_v<mpi> && std::is_nothrow_move_constructible_v<mpi>);
static_assert(!std::is_copy_constructible_v<mpi::request>);

TEST_CASE("the environment and the world communicator") {
  int world_rank = -1;
  int world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  REQUIRE(world_size >= 2);
  auto comm = mpi::world(checked());
  CHECK(comm.rank() == world_rank);
  CHECK(comm.size() == world_size);
  CHECK(comm.config() == checked());
  int same = MPI_UNEQUAL;
  MPI_Comm_compare(comm.native_handle(), MPI_COMM_WORLD, &same);
  CHECK(same == MPI_CONGRUENT);  // a duplicate: strata's messages never meet the program's own
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  CHECK(provided >= MPI_THREAD_SERIALIZED);

  mpi moved = std::move(comm);
  CHECK(moved.size() == world_size);
  CHECK(comm.size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from handle is empty
  CHECK_THROWS_AS(comm.barrier(), strata::error);
  moved.barrier();
}

TEST_CASE("ranks_sharing_cpus: the process alone when bound, else the node's ranks") {
  auto comm = mpi::world();
  const int sharing = comm.ranks_sharing_cpus();
  INFO("usable CPUs ", strata::usable_cpus(), " of ", strata::machine_cpus());
  if (strata::cpus_bound()) {
    CHECK(sharing == 1);
  } else {
    CHECK(sharing == comm.size());  // every rank of the test job runs on this machine
  }
  CHECK(strata::comm::any_comm(comm).ranks_sharing_cpus() == sharing);
  CHECK(strata::comm::ranks_sharing_cpus(comm) == sharing);
}

TEST_CASE("ranks_sharing_memory: the node's ranks, bound to cores or not") {
  auto comm = mpi::world();
  CHECK(comm.ranks_sharing_memory() == comm.size());  // every rank of the test job runs here
  CHECK(strata::comm::any_comm(comm).ranks_sharing_memory() == comm.size());
  CHECK(strata::comm::ranks_sharing_memory(comm) == comm.size());
}

TEST_CASE("world_size is checked against the processes mpiexec started") {
  strata::config::train_config cfg;
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  auto comm = mpi::world(checked());
  CHECK(comm.size() == world_size);
  cfg.world_size = world_size;
  CHECK_NOTHROW(strata::config::check_world_size(cfg, comm.size(), "mpiexec"));

  cfg.world_size = world_size + 1;
  try {
    strata::config::check_world_size(cfg, comm.size(), "mpiexec");
    FAIL("no config_error");
  } catch (const strata::config_error& e) {
    CHECK(e.key() == "world_size");
    CHECK(contains(e.what(), "mpiexec started " + std::to_string(world_size)));
  }
  comm.barrier();  // every rank threw before any message: still in step
}

TEST_CASE("a program's first calls: the world, its size checked, a collective") {
  // (main made the mpi_environment, as every MPI program of strata does: tests/mpi/main.cpp.)
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  strata::config::train_config cfg;
  cfg.world_size = world_size;
  std::vector<float> grads(16, 1.0f);
  // snippet-begin: world
  auto comm = strata::comm::mpi::world();                         // MPI_COMM_WORLD, duplicated
  strata::config::check_world_size(cfg, comm.size(), "mpiexec");  // config_error if they differ
  strata::comm::all_reduce(comm, grads, strata::comm::reduce_op::sum);
  // snippet-end: world
  CHECK(grads == std::vector<float>(16, static_cast<float>(world_size)));
}

TEST_CASE("avg is a sum divided at the end; 16-bit floats reduce through MPI user operations") {
  auto comm = mpi::world(checked());
  const int n = comm.size();
  std::vector<std::int32_t> ints{comm.rank(), 10 * comm.rank()};
  strata::comm::all_reduce(comm, ints, reduce_op::avg);
  const int sum = n * (n - 1) / 2;
  CHECK(ints[0] == sum / n);  // integer avg truncates
  CHECK(ints[1] == 10 * sum / n);

  std::vector<float16> halves{float16(1.0f + static_cast<float>(comm.rank())), float16(0.5f)};
  strata::comm::all_reduce(comm, halves, reduce_op::avg);
  CHECK(static_cast<float>(halves[0]) == static_cast<float>(float16(1.0f + (n - 1) / 2.0f)));
  CHECK(static_cast<float>(halves[1]) == 0.5f);

  std::vector<strata::bfloat16> mins{strata::bfloat16(static_cast<float>(-comm.rank()))};
  strata::comm::all_reduce(comm, mins, reduce_op::min);
  CHECK(static_cast<float>(mins[0]) == static_cast<float>(-(n - 1)));

  std::vector<float> out(1);
  std::vector<float> in{2.0f};
  strata::comm::reduce(comm, in, comm.rank() == 0 ? std::span<float>(out) : std::span<float>(),
                       reduce_op::avg, 0);
  if (comm.rank() == 0) {
    CHECK(out[0] == 2.0f);
  }
}

TEST_CASE("mismatched collectives fail on every rank before any data moves") {
  auto comm = mpi::world(checked());
  const bool odd = comm.rank() % 2 == 1;
  const auto un = static_cast<std::size_t>(comm.size());
  std::vector<float> data(200000 * un, 3.0f);
  std::vector<float> out(200000 * un, 3.0f);
  float* d = data.data();

  SUBCASE("count 1001 vs 1000") {
    expect_mismatch(
        [&] { comm.all_reduce(d, d, odd ? 1001 : 1000, dtype::float32, reduce_op::sum); },
        "count differs", data, 3.0f);
  }
  SUBCASE("count 100000 vs 1000") {
    expect_mismatch(
        [&] { comm.all_reduce(d, d, odd ? 100000 : 1000, dtype::float32, reduce_op::sum); },
        "count differs", data, 3.0f);
  }
  SUBCASE("dtype") {
    expect_mismatch(
        [&] { comm.all_reduce(d, d, 1000, odd ? dtype::int32 : dtype::float32, reduce_op::sum); },
        "dtype differs", data, 3.0f);
  }
  SUBCASE("reduction") {
    expect_mismatch(
        [&] { comm.all_reduce(d, d, 1000, dtype::float32, odd ? reduce_op::avg : reduce_op::sum); },
        "reduction differs", data, 3.0f);
  }
  SUBCASE("broadcast root") {
    expect_mismatch([&] { comm.broadcast(d, 1000, dtype::float32, odd ? 1 : 0); }, "root differs",
                    data, 3.0f);
  }
  SUBCASE("reduce root") {
    expect_mismatch(
        [&] { comm.reduce(out.data(), d, 1000, dtype::float32, reduce_op::sum, odd ? 1 : 0); },
        "root differs", data, 3.0f);
  }
  SUBCASE("all_gather count") {
    expect_mismatch([&] { comm.all_gather(out.data(), d, odd ? 7 : 8, dtype::float32); },
                    "count differs", data, 3.0f);
  }
  SUBCASE("reduce_scatter against all_reduce") {
    expect_mismatch(
        [&] {
          if (odd) {
            comm.reduce_scatter(out.data(), d, 100, dtype::float32, reduce_op::sum);
          } else {
            comm.all_reduce(out.data(), d, 100, dtype::float32, reduce_op::sum);
          }
        },
        "op differs", data, 3.0f);
  }
  SUBCASE("all_to_all count") {
    expect_mismatch([&] { comm.all_to_all(out.data(), d, odd ? 1000 : 100000, dtype::float32); },
                    "count differs", data, 3.0f);
  }
  SUBCASE("a rank skips a collective") {
    expect_mismatch(
        [&] {
          comm.all_reduce(out.data(), out.data(), 10, dtype::float32, reduce_op::sum);
          if (!odd) {
            comm.all_reduce(d, d, 10, dtype::float32, reduce_op::sum);
          }
          comm.barrier();
        },
        "op", data, 3.0f);
  }
  // Every rank threw at the same operation: the communicator is still in step.
  std::vector<std::int32_t> one{1};
  strata::comm::all_reduce(comm, one);
  CHECK(one[0] == comm.size());
}

TEST_CASE("a mismatch in a non-blocking operation leaves the next ones alone") {
  auto comm = mpi::world(checked());
  const bool odd = comm.rank() % 2 == 1;
  std::vector<float> a(1001, 1.0f);
  std::vector<float> b(64, 1.0f);
  auto bad =
      comm.all_reduce_async(a.data(), a.data(), odd ? 1001 : 1000, dtype::float32, reduce_op::sum);
  auto good = strata::comm::all_reduce_async(comm, b);
  good.wait();  // waited first: the check of `bad` completes inside this wait
  CHECK(b[0] == static_cast<float>(comm.size()));
  CHECK_THROWS_AS(bad.wait(), strata::comm_error);
  CHECK(bad.test());  // the error is thrown once
  CHECK(a[0] == 1.0f);
}

TEST_CASE("injected faults: throw on one rank, wrong_count") {
  auto comm = mpi::world(checked());
  std::vector<float> v(16, 1.0f);
  SUBCASE("wrong_count becomes a mismatch everywhere") {
    strata::comm::scoped_faults faults{
        {.rank = 1, .op = op_kind::all_reduce, .sequence = 1, .action = fault_action::wrong_count}};
    strata::comm::all_reduce(comm, v);
    try {
      strata::comm::all_reduce(comm, v);
      FAIL("no mismatch");
    } catch (const strata::comm_error& e) {
      CHECK(e.kind() == strata::comm_error_kind::mismatch);
      CHECK(e.sequence() == 1);
      CHECK(contains(e.what(), "rank 1: all_reduce #1 float32 x 17 op sum (count differs"));
    }
    CHECK(v[0] == static_cast<float>(comm.size()));
  }
  SUBCASE("throw: that rank throws, the others see it out of step") {
    strata::comm::scoped_faults faults{
        {.rank = 1, .op = op_kind::all_reduce, .sequence = 0, .action = fault_action::throw_error}};
    if (comm.rank() == 1) {
      CHECK_THROWS_WITH_AS(strata::comm::all_reduce(comm, v),
                           doctest::Contains("injected fault 'throw' on rank 1 in all_reduce #0"),
                           strata::error);
      // Its next call is #1, which the others meet with their #0.
      CHECK_THROWS_AS(comm.barrier(), strata::comm_error);
    } else {
      try {
        strata::comm::all_reduce(comm, v);
        FAIL("no mismatch");
      } catch (const strata::comm_error& e) {
        CHECK(e.kind() == strata::comm_error_kind::mismatch);
        CHECK(contains(e.what(), "rank 1: barrier #1"));
      }
    }
  }
}

TEST_CASE("a receive that gets a different count is a mismatch") {
  auto comm = mpi::world(checked());
  std::vector<std::int64_t> buf(10, 5);
  if (comm.rank() == 0) {
    comm.send(buf.data(), 10, dtype::int64, 1, 1);  // more than rank 1 receives
    comm.send(buf.data(), 4, dtype::int64, 1, 2);   // fewer
  } else if (comm.rank() == 1) {
    CHECK_THROWS_WITH_AS(comm.recv(buf.data(), 8, dtype::int64, 0, 1),
                         doctest::Contains("sent more than the 8 element(s)"), strata::comm_error);
    CHECK_THROWS_WITH_AS(comm.recv(buf.data(), 8, dtype::int64, 0, 2),
                         doctest::Contains("received 4 element(s) of int64 from peer 0"),
                         strata::comm_error);
  }
  comm.barrier();
}

TEST_CASE("requests: default, moved, waited twice, out of order, dropped") {
  auto comm = mpi::world(checked());
  mpi::request none;
  CHECK(none.test());
  none.wait();

  const int n = comm.size();
  std::vector<std::vector<std::int32_t>> buffers(20, std::vector<std::int32_t>(1000));
  std::vector<mpi::request> requests;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    std::fill(buffers[i].begin(), buffers[i].end(), static_cast<std::int32_t>(i));
    requests.push_back(strata::comm::all_reduce_async(comm, buffers[i]));
  }
  for (std::size_t i = requests.size(); i-- > 0;) {
    mpi::request r = std::move(requests[i]);
    CHECK(requests[i].test());  // moved from: complete
    r.wait();
    r.wait();
    CHECK(buffers[i][999] == static_cast<std::int32_t>(i) * n);
  }
  {
    auto dropped = comm.barrier_async();  // destroyed while running: waits
  }
  std::vector<float> x{1.0f};
  auto r = strata::comm::all_reduce_async(comm, x);
  while (!r.test()) {
  }
  CHECK(x[0] == static_cast<float>(n));
  mpi::request assigned = comm.barrier_async();
  assigned = comm.barrier_async();  // the first one is waited for here
  assigned.wait();
}

TEST_CASE("split: groups, keys, nesting, and faults numbered by group rank") {
  auto comm = mpi::world(checked());
  const int n = comm.size();
  const int me = comm.rank();
  auto group = comm.split(me % 2, -me);
  CHECK(group.config() == comm.config());
  CHECK(group.size() == (n - me % 2 + 1) / 2);
  std::vector<std::int32_t> ranks(static_cast<std::size_t>(group.size()));
  std::vector<std::int32_t> mine{me};
  strata::comm::all_gather(group, mine, ranks);
  for (std::size_t i = 0; i + 1 < ranks.size(); ++i) {
    CHECK(ranks[i] > ranks[i + 1]);  // keys -rank reverse the order
  }
  auto single = group.split(group.rank(), 0);
  CHECK(single.size() == 1);
  std::vector<float> v{2.0f};
  strata::comm::all_reduce(single, v, reduce_op::prod);
  CHECK(v[0] == 2.0f);
  {
    // Faults name the rank in the communicator: every process is rank 0 of its `single`.
    strata::comm::scoped_faults faults{
        {.rank = 0, .op = op_kind::all_reduce, .sequence = 1, .action = fault_action::throw_error}};
    CHECK_THROWS_WITH_AS(strata::comm::all_reduce(single, v),
                         doctest::Contains("on rank 0 in all_reduce #1"), strata::error);
  }

  CHECK_THROWS_WITH_AS((void)comm.split(-1, 0), doctest::Contains("negative"), strata::comm_error);
  comm.barrier();
  group.barrier();
}

TEST_CASE("sampled fingerprints: checked and unchecked operations stay in order") {
  auto comm = mpi::world(comm_config{.timeout = 30.0,
                                     .fingerprint = fingerprint_mode::sampled,
                                     .sample_first = 1,
                                     .sample_every = 3});
  // Checked: #0, #1, #4, #7; the others go straight to MPI, behind the checked ones.
  const int n = comm.size();
  std::vector<std::vector<float>> bufs(8, std::vector<float>(100, 1.0f));
  std::vector<mpi::request> requests;
  for (auto& b : bufs) {
    requests.push_back(strata::comm::all_reduce_async(comm, b));
  }
  for (std::size_t i = requests.size(); i-- > 0;) {
    requests[i].wait();
    CHECK(bufs[i][99] == static_cast<float>(n));
  }
  // #8, #9 unchecked, #10 checked: a mismatch there is caught.
  strata::comm::barrier(comm);
  strata::comm::barrier(comm);
  const bool odd = comm.rank() % 2 == 1;
  std::vector<float> d(11, 1.0f);
  CHECK_THROWS_AS(
      comm.all_reduce(d.data(), d.data(), odd ? 11 : 10, dtype::float32, reduce_op::sum),
      strata::comm_error);
}

TEST_CASE("history, zero-element calls and invalid arguments") {
  auto comm = mpi::world(checked());
  std::vector<float> v(4, 1.0f);
  strata::comm::all_reduce(comm, v);
  CHECK(contains(comm.history(), "all_reduce #0 float32 x 4 op sum: completed"));

  // Zero elements, null buffers: legal, and still collective.
  comm.all_reduce(nullptr, nullptr, 0, dtype::float64, reduce_op::max);
  comm.reduce_scatter(nullptr, nullptr, 0, dtype::float16, reduce_op::sum);
  comm.all_gather(nullptr, nullptr, 0, dtype::int64);
  comm.broadcast(nullptr, 0, dtype::uint8, 0);
  comm.reduce(nullptr, nullptr, 0, dtype::int32, reduce_op::avg, comm.size() - 1);
  comm.all_to_all(nullptr, nullptr, 0, dtype::bfloat16);

  // The same bad argument on every rank: every rank throws, nobody waits.
  CHECK_THROWS_WITH_AS(comm.broadcast(v.data(), 4, dtype::float32, comm.size()),
                       doctest::Contains("root"), strata::comm_error);
  CHECK_THROWS_WITH_AS(comm.send(v.data(), 4, dtype::float32, -1, 0), doctest::Contains("peer"),
                       strata::comm_error);
  CHECK_THROWS_WITH_AS(comm.send(v.data(), 4, dtype::float32, 0, -3), doctest::Contains("tag"),
                       strata::comm_error);
  CHECK_THROWS_WITH_AS(
      comm.all_reduce(v.data(), v.data(), std::size_t{INT_MAX} + 1, dtype::float32, reduce_op::sum),
      doctest::Contains("more than MPI's int count"), strata::comm_error);
  CHECK_THROWS_WITH_AS(comm.all_reduce(nullptr, v.data(), 4, dtype::float32, reduce_op::sum),
                       doctest::Contains("send buffer is null"), strata::comm_error);
  std::vector<float> w(4, 1.0f);
  strata::comm::all_reduce(comm, w);
  CHECK(w[0] == static_cast<float>(comm.size()));
  CHECK(contains(comm.history(), "all_reduce #7 float32 x 4 op sum: completed"));
}
