// SPDX-License-Identifier: Apache-2.0
// strata::comm::observed<Inner, Observer> and a user's wrapper built on it (the byte counter of
// examples/03_custom_policies): the conformance suite through it, and the bytes it counts.
#include "../../../examples/03_custom_policies/byte_counter.hpp"

#include <doctest/doctest.h>

#include "conformance/comm_backend.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/dtype.hpp"

using strata::dtype;
using strata::comm::op_kind;
using strata::comm::reduce_op;
using strata::comm::threads;
using counted = counting<threads>;

static_assert(strata::comm::check_comm_backend<counted>());
static_assert(strata::comm::comm_backend<counted>);

TEST_CASE("a user's byte counter over threads passes the conformance suite with 1, 2 and 3 ranks") {
  for (const int n : {1, 2, 3}) {
    CAPTURE(n);
    std::vector<strata::conformance::report> reports(static_cast<std::size_t>(n));
    std::vector<std::uint64_t> calls(static_cast<std::size_t>(n));
    threads::run(n,
                 [&](threads& t) {
                   counted c(std::move(t));
                   const auto r = static_cast<std::size_t>(c.rank());
                   reports[r] = strata::conformance::run_all(c);
                   for (const std::uint64_t k : c.observer().counts->calls) {
                     calls[r] += k;
                   }
                 },
                 {.timeout = 120});
    for (std::size_t r = 0; r < reports.size(); ++r) {
      CHECK_MESSAGE(reports[r].ok(), reports[r].summary());
      CHECK(reports[r].checks > 0);
      CHECK(calls[r] > 0);  // the suite's operations went through the observer
    }
  }
}

TEST_CASE("the byte counter counts each operation's input bytes, splits included") {
  std::vector<byte_counts> seen(3);
  threads::run(3, [&](threads& t) {
    counted c(std::move(t));
    const int rank = c.rank();
    std::vector<float> grads(1000, 1.0f);
    c.all_reduce(grads.data(), grads.data(), grads.size(), dtype::float32, reduce_op::sum);
    c.all_reduce_async(grads.data(), grads.data(), 10, dtype::float32, reduce_op::sum).wait();
    std::vector<double> slices(3 * 5, 1.0), mine(5);
    c.reduce_scatter(slices.data(), mine.data(), 5, dtype::float64, reduce_op::sum);
    std::vector<std::int32_t> part(4, rank), all(12);
    c.all_gather(part.data(), all.data(), 4, dtype::int32);
    std::vector<std::uint8_t> blocks(3 * 2), got(3 * 2);
    c.all_to_all(blocks.data(), got.data(), 2, dtype::uint8);
    c.broadcast(grads.data(), 7, dtype::float32, 2);
    if (rank == 0) {
      c.send(grads.data(), 3, dtype::float32, 1, 9);
    } else if (rank == 1) {
      c.recv(grads.data(), 3, dtype::float32, 0, 9);
    }
    c.barrier();
    counted pair = c.split(rank == 2 ? 1 : 0, rank);  // shares the counts
    pair.all_reduce(grads.data(), grads.data(), 100, dtype::float32, reduce_op::sum);
    seen[static_cast<std::size_t>(rank)] = *c.observer().counts;
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    const byte_counts& b = seen[r];
    CHECK(b.of(op_kind::all_reduce) == (1000 + 10 + 100) * 4);
    CHECK(b.calls[static_cast<std::size_t>(op_kind::all_reduce)] == 3);
    CHECK(b.of(op_kind::reduce_scatter) == 3 * 5 * 8);
    CHECK(b.of(op_kind::all_gather) == 4 * 4);
    CHECK(b.of(op_kind::all_to_all) == 3 * 2);
    CHECK(b.of(op_kind::broadcast) == 7 * 4);
    CHECK(b.of(op_kind::send) == (r == 0 ? 12u : 0u));
    CHECK(b.of(op_kind::recv) == (r == 1 ? 12u : 0u));
    CHECK(b.of(op_kind::barrier) == 0);
    CHECK(b.calls[static_cast<std::size_t>(op_kind::barrier)] == 1);
    CHECK(b.calls[static_cast<std::size_t>(op_kind::split)] == 1);
  }
}

TEST_CASE("observed keeps the inner backend's placement and progress properties") {
  threads::run(2, [](threads& t) {
    counted c(std::move(t));
    CHECK(strata::comm::ranks_sharing_cpus(c) == 2);
    CHECK(strata::comm::ranks_sharing_memory(c) == 2);
    strata::comm::any_comm handle(c);
    CHECK(handle.size() == 2);
    CHECK(handle.progresses_nonblocking() == strata::comm::nonblocking_progresses<threads>);
  });
}
