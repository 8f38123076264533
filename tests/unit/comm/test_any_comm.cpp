// SPDX-License-Identifier: Apache-2.0
// strata::comm::any_comm: results through the type-erased handle equal those of direct calls on
// the backend (threads and emulated<threads>), requests, the empty request, size checks.

#include "strata/comm/any_comm.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/emulated.hpp"
#include "strata/comm/threads.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace {

using strata::dtype;
using strata::comm::any_comm;
using strata::comm::reduce_op;
using strata::comm::threads;
using emu = strata::comm::emulated<threads>;
using net_link =
    strata::comm::network_link;  // not `link`: ambiguous with POSIX ::link at global scope
using clock_type = std::chrono::steady_clock;

static_assert(strata::comm::comm_request<any_comm::request>);
static_assert(std::is_copy_constructible_v<any_comm>);
static_assert(!std::is_default_constructible_v<any_comm>);
static_assert(!std::is_constructible_v<any_comm, int&>);

// Values that make sum and avg differ in the last bits between orders of reduction.
std::vector<float> input(int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    v[i] = 0.1f * static_cast<float>(rank + 1) + 0.01f * static_cast<float>(i % 97);
  }
  return v;
}

// What a non-template class (the trainer) does with its communicator.
class holder {
 public:
  explicit holder(any_comm comm) : comm_(comm) {}
  float average(float x) {
    std::vector<float> v{x};
    comm_.all_reduce(v, reduce_op::avg);
    return v[0];
  }

 private:
  any_comm comm_;
};

// Every check of one rank; failures are counted here and asserted on the test's thread.
template <class C>
int compare_with_direct(C& c) {
  int bad = 0;
  const auto expect = [&](bool ok) { bad += ok ? 0 : 1; };
  any_comm a(c);
  expect(a.rank() == c.rank() && a.size() == c.size() && &a.config() == &c.config());
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t count = 1000 * un;

  // all_reduce, sum and avg, typed and untyped, blocking and not.
  for (const auto op : {reduce_op::sum, reduce_op::avg}) {
    auto direct = input(c.rank(), count);
    strata::comm::all_reduce(c, direct, op);
    auto typed = input(c.rank(), count);
    a.all_reduce(typed, op);
    expect(typed == direct);
    auto untyped = input(c.rank(), count);
    std::vector<float> out(count);
    a.all_reduce(untyped.data(), out.data(), count, dtype::float32, op);
    expect(out == direct);
    auto async = input(c.rank(), count);
    any_comm::request r = a.all_reduce_async(async, op);
    expect(r.pending());
    r.wait();
    expect(!r.pending());
    expect(async == direct);
    r.wait();  // again: a no-op
  }

  // reduce_scatter and all_gather, typed and async.
  {
    const auto in = input(c.rank(), count);
    std::vector<float> direct(count / un);
    strata::comm::reduce_scatter(c, std::span<const float>(in), direct, reduce_op::sum);
    std::vector<float> typed(count / un);
    a.reduce_scatter(std::span<const float>(in), typed, reduce_op::sum);
    expect(typed == direct);
    std::vector<float> async(count / un);
    auto r = a.reduce_scatter_async(std::span<const float>(in), async, reduce_op::sum);
    while (!r.test()) {
    }
    expect(async == direct);

    std::vector<float> gathered_direct(count);
    strata::comm::all_gather(c, std::span<const float>(direct), gathered_direct);
    std::vector<float> gathered(count);
    a.all_gather(std::span<const float>(typed), gathered);
    expect(gathered == gathered_direct);
    std::vector<float> gathered_async(count);
    auto g = a.all_gather_async(std::span<const float>(typed), gathered_async);
    g.wait();
    expect(gathered_async == gathered_direct);
    // The gathered slices of a reduce_scatter are the full all_reduce.
    auto full = input(c.rank(), count);
    strata::comm::all_reduce(c, full, reduce_op::sum);
    expect(gathered == full);
  }

  // broadcast (typed, from the last rank), reduce, all_to_all, barrier.
  {
    std::vector<std::int64_t> b(5, c.rank() == n - 1 ? 42 : -1);
    a.broadcast(b, n - 1);
    expect(b == std::vector<std::int64_t>(5, 42));
    std::vector<double> in(3, static_cast<double>(c.rank() + 1));
    std::vector<double> out(3, 0.0);
    a.reduce(in.data(), out.data(), 3, dtype::float64, reduce_op::max, 0);
    expect(c.rank() != 0 || out == std::vector<double>(3, static_cast<double>(n)));
    std::vector<std::int32_t> send(un);
    for (std::size_t d = 0; d < un; ++d) {
      send[d] = c.rank() * 100 + static_cast<int>(d);
    }
    std::vector<std::int32_t> recv(un);
    a.all_to_all(send.data(), recv.data(), 1, dtype::int32);
    for (std::size_t s = 0; s < un; ++s) {
      expect(recv[s] == static_cast<int>(s) * 100 + c.rank());
    }
    a.barrier();
    a.barrier_async().wait();
  }

  // Messages around a ring, blocking and not.
  if (n > 1) {
    const int right = (c.rank() + 1) % n;
    const int left = (c.rank() + n - 1) % n;
    const std::vector<float> mine(7, static_cast<float>(c.rank()));
    std::vector<float> got(7);
    auto s = a.send_async(mine.data(), mine.size(), dtype::float32, right, 3);
    a.recv(got, left, 3);
    s.wait();
    expect(got == std::vector<float>(7, static_cast<float>(left)));
    std::vector<float> got2(7);
    auto r = a.recv_async(got2.data(), got2.size(), dtype::float32, left, 4);
    a.send(std::span<const float>(mine), right, 4);
    r.wait();
    expect(got2 == got);
  }

  // A non-template class holding any_comm, and a copy of the handle, reach the same communicator.
  holder h(a);
  expect(h.average(static_cast<float>(c.rank())) == static_cast<float>(n - 1) / 2.0f);
  return bad;
}

}  // namespace

TEST_CASE("any_comm over threads gives the results of direct calls") {
  for (const int n : {1, 2, 3}) {
    CAPTURE(n);
    std::vector<int> bad(static_cast<std::size_t>(n), -1);
    threads::run(
        n, [&](threads& c) { bad[static_cast<std::size_t>(c.rank())] = compare_with_direct(c); });
    for (const int b : bad) {
      CHECK(b == 0);
    }
  }
}

TEST_CASE("any_comm over emulated<threads> gives the same results and goes through the link") {
  const net_link l{.latency_seconds = 1e-5, .bandwidth_bytes_per_second = 1e10, .name = "test"};
  for (const int n : {2, 3}) {
    CAPTURE(n);
    std::vector<int> bad(static_cast<std::size_t>(n), -1);
    std::vector<std::uint64_t> bytes(static_cast<std::size_t>(n), 0);
    threads::run(n, [&](threads& t) {
      emu c(std::move(t), l);
      bad[static_cast<std::size_t>(c.rank())] = compare_with_direct(c);
      // One more all_reduce through any_comm: booked on the emulated communicator.
      const auto before = c.bytes_sent();
      std::vector<float> v(1000, 1.0f);
      any_comm(c).all_reduce(v, reduce_op::sum);
      bytes[static_cast<std::size_t>(c.rank())] = c.bytes_sent() - before;
    });
    const auto un = static_cast<std::uint64_t>(n);
    for (std::size_t r = 0; r < bad.size(); ++r) {
      CHECK(bad[r] == 0);
      CHECK(bytes[r] == 2 * (un - 1) * 4000 / un);
    }
  }
}

TEST_CASE("any_comm requests keep the emulated link's completion time") {
  const net_link l{.latency_seconds = 0.05, .name = "50ms"};
  std::vector<double> seconds(2, -1.0);
  std::vector<int> early(2, -1);
  threads::run(2, [&](threads& t) {
    emu c(std::move(t), l);
    any_comm a(c);
    const auto t0 = clock_type::now();
    any_comm::request r = a.barrier_async();  // 1 step: 50 ms
    early[static_cast<std::size_t>(c.rank())] = r.test() ? 1 : 0;
    r.wait();
    seconds[static_cast<std::size_t>(c.rank())] =
        std::chrono::duration<double>(clock_type::now() - t0).count();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(early[r] == 0);
    CHECK(seconds[r] >= 0.05);
    CHECK(seconds[r] < 0.25);
  }
}

TEST_CASE("a default-constructed any_comm::request is complete") {
  any_comm::request r;
  CHECK_FALSE(r.pending());
  CHECK(r.test());
  CHECK_NOTHROW(r.wait());
  any_comm::request moved(std::move(r));
  CHECK(moved.test());
}

TEST_CASE("any_comm's typed forms check sizes on this rank before anything is sent") {
  std::vector<int> ok(2, 0);
  threads::run(2, [&](threads& c) {
    any_comm a(c);
    const std::vector<float> in(5);
    std::vector<float> out(2);  // reduce_scatter needs in = 2 x out
    try {
      a.reduce_scatter(std::span<const float>(in), out);
    } catch (const strata::comm_error& e) {
      ok[static_cast<std::size_t>(c.rank())] =
          e.kind() == strata::comm_error_kind::invalid_argument ? 1 : 0;
    }
    // Nothing was sent: the communicator still works.
    std::vector<float> v{1.0f};
    a.all_reduce(v, reduce_op::sum);
    ok[static_cast<std::size_t>(c.rank())] &= v[0] == 2.0f ? 1 : 0;
  });
  CHECK(ok[0] == 1);
  CHECK(ok[1] == 1);
}

TEST_CASE("any_comm::split owns the sub-communicator and is itself a comm_backend") {
  static_assert(strata::comm::comm_backend<strata::comm::any_comm>);
  strata::comm::threads::run(4, [](strata::comm::threads& c) {
    strata::comm::any_comm world(c);
    std::optional<strata::comm::any_comm> half;
    {
      strata::comm::any_comm temporary = world.split(c.rank() / 2, c.rank());
      half = temporary;  // the copy keeps the sub-communicator alive
    }
    CHECK(half->size() == 2);
    CHECK(half->rank() == c.rank() % 2);
    std::vector<int> v{c.rank()};
    half->all_reduce(v.data(), v.data(), 1, strata::dtype::int32, strata::comm::reduce_op::sum);
    CHECK(v[0] == (c.rank() / 2 == 0 ? 0 + 1 : 2 + 3));
  });
}
