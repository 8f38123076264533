// SPDX-License-Identifier: Apache-2.0
// strata::comm::threads: collectives against a serial reference, messages, split, non-blocking
// overlap, and the no-hang guarantees under injected faults.

#include "strata/comm/threads.hpp"

#include <doctest/doctest.h>

#include "conformance/comm_backend.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "strata/comm/any_comm.hpp"
#include "strata/comm/collectives.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"
#include "strata/core/memory.hpp"

static_assert(strata::comm::check_comm_backend<strata::comm::threads>());

namespace {

using strata::comm_error;
using strata::comm_error_kind;
using strata::dtype;
using strata::comm::comm_config;
using strata::comm::fault_action;
using strata::comm::op_kind;
using strata::comm::reduce_op;
using strata::comm::threads;
using clock_type = std::chrono::steady_clock;

constexpr std::array<reduce_op, 5> all_ops = {reduce_op::sum, reduce_op::avg, reduce_op::min,
                                              reduce_op::max, reduce_op::prod};

// Small values. Results are compared bit for bit with reduce_many over the same inputs in rank
// order (integer products wrap, floats round, exactly as the backend must).
template <class T>
T value(int rank, std::size_t i) {
  const int v = 1 + static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 5);
  if constexpr (std::is_same_v<T, strata::float16> || std::is_same_v<T, strata::bfloat16>) {
    return T(static_cast<float>(v) * 0.5f);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v) * static_cast<T>(0.25) + static_cast<T>(rank);
  } else {
    return static_cast<T>(v + rank);
  }
}

template <class T>
std::vector<T> input(int rank, std::size_t count, std::size_t salt = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    v[i] = value<T>(rank, i + salt);
  }
  return v;
}

// The serial reference: every rank's input reduced element-wise in rank order.
template <class T>
std::vector<T> reference(int n, std::size_t count, reduce_op op, std::size_t salt = 0) {
  std::vector<std::vector<T>> in;
  std::vector<const T*> ptrs;
  for (int r = 0; r < n; ++r) {
    in.push_back(input<T>(r, count, salt));
  }
  for (const auto& v : in) {
    ptrs.push_back(v.data());
  }
  std::vector<T> out(count);
  strata::comm::reduce_many(out.data(), ptrs.data(), static_cast<std::size_t>(n), count, op);
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Collects failures from rank threads (doctest's CHECK is not for use from several threads).
class failures {
 public:
  void add(const std::string& what) {
    const std::lock_guard lock(mutex_);
    list_.push_back(what);
  }
  void expect(bool ok, const std::string& what) {
    if (!ok) {
      add(what);
    }
  }
  void report() const {
    for (const auto& f : list_) {
      FAIL_CHECK(f);
    }
    CHECK(list_.empty());
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> list_;
};

std::string where(const threads& c, const char* what, std::size_t count, bool in_place) {
  return std::string(what) + " on rank " + std::to_string(c.rank()) + "/" +
         std::to_string(c.size()) + " count " + std::to_string(count) +
         (in_place ? " in place" : " out of place");
}

// Every collective of one dtype, in and out of place, against the serial reference.
template <class T>
void check_collectives(threads& c, std::size_t count, failures& f) {
  const int n = c.size();
  const int me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  const dtype t = strata::dtype_of<T>;
  for (const reduce_op op : all_ops) {
    const auto want = reference<T>(n, count, op);
    for (const bool in_place : {false, true}) {
      // all_reduce
      auto send = input<T>(me, count);
      std::vector<T> recv(count);
      c.all_reduce(send.data(), in_place ? send.data() : recv.data(), count, t, op);
      f.expect(same_bits(in_place ? send : recv, want), where(c, "all_reduce", count, in_place));
      // reduce at every root
      for (int root = 0; root < n; ++root) {
        send = input<T>(me, count);
        std::vector<T> out(count);
        T* dst = in_place ? send.data() : out.data();
        c.reduce(send.data(), me == root ? dst : nullptr, count, t, op, root);
        if (me == root) {
          f.expect(same_bits(in_place ? send : out, want), where(c, "reduce", count, in_place));
        }
      }
      // reduce_scatter: rank r's input has n blocks of `count`; block b of rank r is
      // input(r, n * count) at offset b * count.
      const auto full = reference<T>(n, count * un, op);
      auto rs_send = input<T>(me, count * un);
      std::vector<T> rs_recv(count);
      T* rs_dst = in_place ? rs_send.data() + static_cast<std::size_t>(me) * count : rs_recv.data();
      c.reduce_scatter(rs_send.data(), rs_dst, count, t, op);
      std::vector<T> got(rs_dst, rs_dst + count);
      std::vector<T> expected(full.begin() + static_cast<std::ptrdiff_t>(me * count),
                              full.begin() + static_cast<std::ptrdiff_t>((me + 1) * count));
      f.expect(same_bits(got, expected), where(c, "reduce_scatter", count, in_place));
    }
  }
  for (const bool in_place : {false, true}) {
    // all_gather
    std::vector<T> gathered(count * un);
    const auto mine = input<T>(me, count);
    const T* src = mine.data();
    if (in_place) {
      std::copy(
          mine.begin(), mine.end(),
          gathered.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(me) * count));
      src = gathered.data() + static_cast<std::size_t>(me) * count;
    }
    c.all_gather(src, gathered.data(), count, t);
    bool ok = true;
    for (int r = 0; r < n; ++r) {
      const auto theirs = input<T>(r, count);
      ok = ok && std::equal(theirs.begin(), theirs.end(),
                            gathered.begin() +
                                static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count),
                            [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; });
    }
    f.expect(ok, where(c, "all_gather", count, in_place));
    // all_to_all: block b of rank r's send is input(r, count, salt = b * count); rank r receives
    // block r of every rank.
    std::vector<T> a2a_send(count * un);
    for (int b = 0; b < n; ++b) {
      const auto block = input<T>(me, count, static_cast<std::size_t>(b) * 1000);
      std::copy(
          block.begin(), block.end(),
          a2a_send.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(b) * count));
    }
    std::vector<T> a2a_recv(count * un);
    T* dst = in_place ? a2a_send.data() : a2a_recv.data();
    c.all_to_all(a2a_send.data(), dst, count, t);
    ok = true;
    for (int r = 0; r < n; ++r) {
      const auto block = input<T>(r, count, static_cast<std::size_t>(me) * 1000);
      ok = ok && (count == 0 || std::memcmp(block.data(), dst + static_cast<std::size_t>(r) * count,
                                            count * sizeof(T)) == 0);
    }
    f.expect(ok, where(c, "all_to_all", count, in_place));
  }
  // broadcast from every root
  for (int root = 0; root < n; ++root) {
    auto buf = me == root ? input<T>(root, count, 77) : std::vector<T>(count);
    c.broadcast(buf.data(), count, t, root);
    f.expect(same_bits(buf, input<T>(root, count, 77)), where(c, "broadcast", count, false));
  }
}

void check_all_dtypes(threads& c, std::size_t count, failures& f) {
  check_collectives<float>(c, count, f);
  check_collectives<double>(c, count, f);
  check_collectives<strata::float16>(c, count, f);
  check_collectives<strata::bfloat16>(c, count, f);
  check_collectives<std::int32_t>(c, count, f);
  check_collectives<std::int64_t>(c, count, f);
  check_collectives<std::uint8_t>(c, count, f);
}

// Runs fn on n ranks and returns each rank's comm_error kind (or nullopt: no comm_error), the
// other exceptions' messages, and how long the run took.
struct fault_outcome {
  std::vector<std::optional<comm_error_kind>> kinds;
  std::vector<std::string> messages;
  std::vector<bool> killed;
  double seconds = 0;
};

template <class F>
fault_outcome run_with_faults(int n, F&& fn, comm_config config = {.timeout = 2}) {
  const auto start = clock_type::now();
  const auto outcomes = threads::try_run(n, fn, config);
  fault_outcome out;
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  for (const auto& e : outcomes) {
    std::optional<comm_error_kind> kind;
    std::string message;
    bool killed = false;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const threads::killed& k) {
        killed = true;
        message = k.what();
      } catch (const comm_error& c) {
        kind = c.kind();
        message = c.what();
        // Every comm error carries the reporting rank's recent operations.
        CHECK(message.find("last operations of rank") != std::string::npos);
      } catch (const std::exception& x) {
        message = x.what();
      }
    }
    out.kinds.push_back(kind);
    out.messages.push_back(message);
    out.killed.push_back(killed);
  }
  return out;
}

std::vector<float> ones(std::size_t n) {
  return std::vector<float>(n, 1.0f);
}

}  // namespace

TEST_CASE("threads passes the comm_backend conformance suite with 1, 2, 3 and 4 ranks") {
  for (const int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    std::vector<strata::conformance::report> reports(static_cast<std::size_t>(n));
    threads::run(n,
                 [&](threads& c) {
                   reports[static_cast<std::size_t>(c.rank())] = strata::conformance::run_all(c);
                 },
                 {.timeout = 120});
    for (const auto& rep : reports) {
      CHECK_MESSAGE(rep.ok(), rep.summary());
      CHECK(rep.checks > 0);
    }
  }
}

TEST_CASE("threads: every collective, every dtype and reduce_op, against a serial reference") {
  for (const int n : {1, 2, 3, 4}) {
    CAPTURE(n);
    failures f;
    threads::run(n, [&](threads& c) {
      for (const std::size_t count :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
        check_all_dtypes(c, count, f);
      }
    });
    f.report();
  }
}

TEST_CASE("threads: run starts the ranks and joins them; all_reduce averages in place") {
  std::vector<std::vector<float>> results(4);
  // snippet-begin: run
  strata::comm::threads::run(
      4,
      [&](strata::comm::threads& comm) {
        std::vector<float> grads(1024, static_cast<float>(comm.rank()));  // 0, 1, 2, 3
        strata::comm::all_reduce(comm, grads, strata::comm::reduce_op::avg);
        results[static_cast<std::size_t>(comm.rank())] = grads;  // 1.5 on every rank
      },
      strata::comm::comm_config{.timeout = 30});
  // snippet-end: run
  for (const auto& r : results) {
    CHECK(r == std::vector<float>(1024, 1.5f));
  }
}

TEST_CASE("threads: the typed front ends take ranges and check their sizes on the calling rank") {
  const std::size_t n = 6;
  failures f;
  threads::run(2, [&](threads& comm) {
    const auto me = static_cast<float>(comm.rank());
    const std::vector<float> shard(3, me);
    std::vector<float> full(6);
    std::vector<float> bucket(4, me + 1.0f);
    // snippet-begin: typed
    std::vector<float> grads(n, 1.0f);
    strata::comm::all_reduce(comm, grads, strata::comm::reduce_op::avg);  // in place
    strata::comm::all_gather(comm, shard, full);  // full holds size() shards: sizes checked
    auto pending = strata::comm::all_reduce_async(comm, bucket);  // a sum; overlap ...
    pending.wait();
    // snippet-end: typed
    f.expect(grads == std::vector<float>(n, 1.0f), "all_reduce avg");
    f.expect(full == std::vector<float>{0.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f}, "all_gather");
    f.expect(bucket == std::vector<float>(4, 3.0f), "all_reduce_async sum");
    // Both ranks make the same wrong call: each throws before anything is sent.
    std::vector<float> too_short(5);
    try {
      strata::comm::all_gather(comm, shard, too_short);
      f.add("all_gather into 5 of 6 elements did not throw");
    } catch (const comm_error& e) {
      f.expect(e.kind() == comm_error_kind::invalid_argument, e.what());
    }
    comm.barrier();  // still in step
  });
  f.report();
}

TEST_CASE("threads: large counts (1000003 elements) of float and bfloat16") {
  for (const int n : {2, 3}) {
    CAPTURE(n);
    failures f;
    threads::run(n, [&](threads& c) {
      const std::size_t count = 1000003;
      for (const reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
        auto send = input<float>(c.rank(), count);
        std::vector<float> recv(count);
        c.all_reduce(send.data(), recv.data(), count, dtype::float32, op);
        f.expect(same_bits(recv, reference<float>(c.size(), count, op)), "all_reduce float");
        c.all_reduce(send.data(), send.data(), count, dtype::float32, op);
        f.expect(same_bits(send, reference<float>(c.size(), count, op)), "all_reduce in place");
        auto half = input<strata::bfloat16>(c.rank(), count);
        strata::comm::all_reduce(c, half, op);
        f.expect(same_bits(half, reference<strata::bfloat16>(c.size(), count, op)),
                 "all_reduce bfloat16");
      }
      std::vector<float> gathered(1000003 * static_cast<std::size_t>(c.size()));
      auto mine = input<float>(c.rank(), 1000003);
      strata::comm::all_gather(c, mine, gathered);
      f.expect(std::memcmp(gathered.data() + static_cast<std::size_t>(c.rank()) * 1000003,
                           mine.data(), mine.size() * sizeof(float)) == 0,
               "all_gather large");
    });
    f.report();
  }
}

TEST_CASE("threads: buffers too large for caches (streaming stores), aligned or not") {
  // 2 ranks x 2 buffers x 18 MB exceed the footprint above which stores bypass the cache.
  failures f;
  threads::run(2, [&](threads& c) {
    const std::size_t count = 4500001;
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      auto send = input<float>(c.rank(), count + offset);
      std::vector<float> recv(count + offset);
      c.all_reduce(send.data() + offset, recv.data() + offset, count, dtype::float32,
                   reduce_op::sum);
      auto want = reference<float>(2, count + offset, reduce_op::sum);
      f.expect(std::memcmp(recv.data() + offset, want.data() + offset, count * sizeof(float)) == 0,
               "all_reduce, offset " + std::to_string(offset));
      std::vector<float> out(count + offset);
      c.reduce(send.data() + offset, out.data() + offset, count, dtype::float32, reduce_op::max, 1);
      if (c.rank() == 1) {
        want = reference<float>(2, count + offset, reduce_op::max);
        f.expect(std::memcmp(out.data() + offset, want.data() + offset, count * sizeof(float)) == 0,
                 "reduce, offset " + std::to_string(offset));
      }
      const auto source = input<float>(0, count + offset, 5);
      auto bc = c.rank() == 0 ? source : std::vector<float>(count + offset);
      c.broadcast(bc.data() + offset, count, dtype::float32, 0);
      f.expect(std::memcmp(bc.data() + offset, source.data() + offset, count * sizeof(float)) == 0,
               "broadcast, offset " + std::to_string(offset));
    }
  });
  f.report();
}

TEST_CASE("threads: results are identical on every rank and across runs") {
  std::vector<std::vector<float>> results(4);
  for (int run = 0; run < 2; ++run) {
    threads::run(4, [&](threads& c) {
      std::vector<float> v(4099);
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = 1.0f / static_cast<float>(1 + i + static_cast<std::size_t>(c.rank()) * 13);
      }
      c.all_reduce(v.data(), v.data(), v.size(), dtype::float32, reduce_op::sum);
      if (run == 0) {
        results[static_cast<std::size_t>(c.rank())] = v;
      } else if (!same_bits(v, results[0])) {
        throw strata::error("differs from the first run");
      }
    });
  }
  for (const auto& r : results) {
    CHECK(same_bits(r, results[0]));
  }
}

TEST_CASE("threads: zero-element calls still synchronize") {
  std::atomic<int> late_done{0};
  std::atomic<bool> early_passed_first{false};
  threads::run(2, [&](threads& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      late_done.store(1);
    }
    c.all_reduce(nullptr, nullptr, 0, dtype::float32, reduce_op::sum);
    if (c.rank() == 0) {
      early_passed_first.store(late_done.load() == 1);
    }
    c.broadcast(nullptr, 0, dtype::int32, 1);
    c.all_gather(nullptr, nullptr, 0, dtype::uint8);
    auto r = c.recv_async(nullptr, 0, dtype::float64, 1 - c.rank(), 5);
    c.send(nullptr, 0, dtype::float64, 1 - c.rank(), 5);
    r.wait();
  });
  CHECK(early_passed_first.load());
}

TEST_CASE("threads: split orders ranks by (key, rank) and has its own sequence numbers") {
  failures f;
  threads::run(6, [&](threads& c) {
    const int color = c.rank() % 2;
    // Reverse order within each color by key.
    threads sub = c.split(color, -c.rank());
    f.expect(sub.size() == 3, "split size");
    const int expected_rank = 2 - c.rank() / 2;
    f.expect(sub.rank() == expected_rank, "split rank of " + std::to_string(c.rank()));
    std::vector<std::int64_t> v = {c.rank()};
    strata::comm::all_reduce(sub, v);
    f.expect(v[0] == (color == 0 ? 0 + 2 + 4 : 1 + 3 + 5), "sum over the color");
    // A nested split, and messages inside the sub-communicator.
    threads pair = sub.split(sub.rank() == 2 ? 1 : 0, 0);
    f.expect(pair.size() == (sub.rank() == 2 ? 1 : 2), "nested split size");
    if (pair.size() == 2) {
      std::int32_t x = pair.rank() == 0 ? 100 + c.rank() : -1;
      pair.broadcast(&x, 1, dtype::int32, 0);
      f.expect(x >= 100, "nested broadcast");
    }
    // Interleave world and sub-communicator collectives.
    for (int i = 0; i < 20; ++i) {
      std::vector<float> w = {1.0f};
      strata::comm::all_reduce(i % 2 == 0 ? c : sub, w);
      f.expect(w[0] == (i % 2 == 0 ? 6.0f : 3.0f), "interleaved");
    }
    // Equal keys keep the old order.
    threads same = c.split(0, 0);
    f.expect(same.rank() == c.rank() && same.size() == 6, "equal keys");
  });
  f.report();
}

TEST_CASE("threads: messages match on (source, tag) in order; send_async + recv exchanges") {
  failures f;
  threads::run(3, [&](threads& c) {
    const int me = c.rank();
    const int next = (me + 1) % 3;
    const int prev = (me + 2) % 3;
    // A ring exchange with a blocking recv after a non-blocking send.
    std::vector<double> out(1000, me);
    std::vector<double> in(1000, -1);
    auto s = c.send_async(out.data(), out.size(), dtype::float64, next, 7);
    c.recv(in.data(), in.size(), dtype::float64, prev, 7);
    s.wait();
    f.expect(in[999] == prev, "ring exchange");
    // Several messages with one tag arrive in order; another tag can be received first.
    if (me == 0) {
      for (std::int32_t i = 0; i < 5; ++i) {
        c.send_async(&i, 1, dtype::int32, 1, 1).wait();
      }
    } else if (me == 1) {
      std::vector<threads::request> reqs;
      std::array<std::int32_t, 5> got{};
      for (auto& g : got) {
        reqs.push_back(c.recv_async(&g, 1, dtype::int32, 0, 1));
      }
      for (auto& r : reqs) {
        r.wait();
      }
      f.expect(got == std::array<std::int32_t, 5>{0, 1, 2, 3, 4}, "in order");
    }
    if (me == 2) {
      std::int32_t a = 1;
      std::int32_t b = 2;
      auto ra = c.send_async(&a, 1, dtype::int32, 0, 10);
      auto rb = c.send_async(&b, 1, dtype::int32, 0, 20);
      ra.wait();
      rb.wait();
    } else if (me == 0) {
      std::int32_t a = 0;
      std::int32_t b = 0;
      c.recv(&b, 1, dtype::int32, 2, 20);
      c.recv(&a, 1, dtype::int32, 2, 10);
      f.expect(a == 1 && b == 2, "tags");
    }
    // A message to oneself.
    std::int64_t self_out = 5 + me;
    std::int64_t self_in = 0;
    auto r = c.recv_async(&self_in, 1, dtype::int64, me, 3);
    c.send(&self_out, 1, dtype::int64, me, 3);
    r.wait();
    f.expect(self_in == 5 + me, "to oneself");
    c.barrier();
  });
  f.report();
}

TEST_CASE("threads: ring exchanges deliver every byte whichever side waits or arrives first") {
  // A blocked side is handed the copy by a late partner; an unblocked (asynchronous) side is
  // not. Mixes of both, with varied sizes and small random delays, must deliver every element.
  failures f;
  threads::run(4, [&](threads& c) {
    const int me = c.rank();
    const int next = (me + 1) % 4;
    const int prev = (me + 3) % 4;
    std::uint32_t seed = 12345u + static_cast<std::uint32_t>(me);
    const auto delay = [&] {
      seed = seed * 1664525u + 1013904223u;
      const auto until = clock_type::now() + std::chrono::microseconds((seed >> 16) % 60);
      while (clock_type::now() < until) {
      }
    };
    for (int round = 0; round < 240; ++round) {
      const std::size_t n = 1 + static_cast<std::size_t>(round * 97 % 20011);
      std::vector<float> out(n);
      std::vector<float> in(n, -1.0f);
      for (std::size_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(round * 8 + me) + static_cast<float>(i % 5) * 0.25f;
      }
      delay();
      switch (round % 3) {
        case 0: {  // send_async, then a blocking recv
          auto s = c.send_async(out.data(), n, dtype::float32, next, round);
          c.recv(in.data(), n, dtype::float32, prev, round);
          s.wait();
          break;
        }
        case 1: {  // recv_async, then a blocking send
          auto r = c.recv_async(in.data(), n, dtype::float32, prev, round);
          c.send(out.data(), n, dtype::float32, next, round);
          r.wait();
          break;
        }
        default:  // blocking both ways, in an order that cannot deadlock on a ring of 4
          if (me % 2 == 0) {
            c.send(out.data(), n, dtype::float32, next, round);
            c.recv(in.data(), n, dtype::float32, prev, round);
          } else {
            c.recv(in.data(), n, dtype::float32, prev, round);
            c.send(out.data(), n, dtype::float32, next, round);
          }
      }
      bool right = true;
      for (std::size_t i = 0; i < n; ++i) {
        right = right &&
                in[i] == static_cast<float>(round * 8 + prev) + static_cast<float>(i % 5) * 0.25f;
      }
      f.expect(right, "round " + std::to_string(round) + " on rank " + std::to_string(me));
    }
  });
  f.report();
}

TEST_CASE("threads: messages and pending collectives do not hold each other back") {
  failures f;
  threads::run(2,
               [&](threads& c) {
                 std::int32_t x = 0;
                 // A recv posted before a collective.
                 if (c.rank() == 0) {
                   auto r = c.recv_async(&x, 1, dtype::int32, 1, 0);
                   auto a = c.all_reduce_async(nullptr, nullptr, 0, dtype::float32, reduce_op::sum);
                   a.wait();
                   r.wait();
                   f.expect(x == 9, "recv after the collective");
                 } else {
                   c.all_reduce(nullptr, nullptr, 0, dtype::float32, reduce_op::sum);
                   x = 9;
                   c.send(&x, 1, dtype::int32, 0, 0);
                 }
                 // A blocking recv issued while a collective is pending, whose sender joins the
                 // collective only after the message.
                 std::vector<float> v(1000, 1.0f);
                 if (c.rank() == 0) {
                   auto a = c.all_reduce_async(v.data(), v.data(), v.size(), dtype::float32,
                                               reduce_op::sum);
                   c.recv(&x, 1, dtype::int32, 1, 1);
                   a.wait();
                   f.expect(x == 10 && v[999] == 2.0f, "recv while a collective is pending");
                 } else {
                   x = 10;
                   c.send(&x, 1, dtype::int32, 0, 1);
                   c.all_reduce(v.data(), v.data(), v.size(), dtype::float32, reduce_op::sum);
                 }
               },
               {.timeout = 5});
  f.report();
}

TEST_CASE("threads: non-blocking operations complete in issue order and overlap compute") {
  failures f;
  threads::run(2, [&](threads& c) {
    const std::size_t count = 1 << 20;
    std::vector<std::vector<float>> bufs(4, std::vector<float>(count, 1.0f));
    std::vector<threads::request> reqs;
    for (auto& b : bufs) {
      reqs.push_back(c.all_reduce_async(b.data(), b.data(), count, dtype::float32, reduce_op::sum));
    }
    // The last one finished implies all earlier ones finished.
    reqs.back().wait();
    for (auto& r : reqs) {
      f.expect(r.test(), "earlier request complete after a later one");
    }
    for (const auto& b : bufs) {
      f.expect(b[0] == 2.0f && b[count - 1] == 2.0f, "async all_reduce result");
    }
    // A blocking call issued while non-blocking ones are pending runs after them.
    std::vector<float> a(count, 1.0f);
    std::vector<float> b(count, 0.0f);
    auto ra = c.all_reduce_async(a.data(), a.data(), count, dtype::float32, reduce_op::sum);
    c.all_reduce(a.data(), b.data(), count, dtype::float32, reduce_op::sum);
    f.expect(b[17] == 4.0f, "blocking after non-blocking sees its result");
    ra.wait();
    // Overlap: the operation completes while this thread computes, without wait().
    std::vector<float> g(1 << 16, 1.0f);
    auto r = c.all_reduce_async(g.data(), g.data(), g.size(), dtype::float32, reduce_op::sum);
    volatile double sink = 0;
    const auto start = clock_type::now();
    bool done = false;
    while (!done && clock_type::now() - start < std::chrono::seconds(20)) {
      for (int i = 0; i < 10000; ++i) {
        sink = sink + std::sqrt(static_cast<double>(i));
      }
      done = r.test();
    }
    f.expect(done, "an async all_reduce completed while the caller computed");
    f.expect(g[100] == 2.0f, "overlapped result");
    f.expect(threads::request{}.test(), "a default request is complete");
  });
  f.report();
}

TEST_CASE("threads: 8 ranks on a small machine finish a few hundred all_reduces quickly") {
  const auto start = clock_type::now();
  failures f;
  threads::run(8, [&](threads& c) {
    std::vector<float> v(1024);
    for (int i = 0; i < 300; ++i) {
      std::fill(v.begin(), v.end(), static_cast<float>(c.rank()));
      c.all_reduce(v.data(), v.data(), v.size(), dtype::float32, reduce_op::sum);
      if (v[1000] != 28.0f) {
        f.add("wrong sum");
        break;
      }
    }
  });
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  MESSAGE("8 ranks, 300 all_reduces of 4 KiB: " << seconds << " s");
  CHECK(seconds < 10.0);
  f.report();
}

TEST_CASE("threads: run rethrows the root cause after joining every rank") {
  std::atomic<int> finished{0};
  try {
    threads::run(4,
                 [&](threads& c) {
                   struct count_exit {
                     std::atomic<int>& n;
                     ~count_exit() { ++n; }
                   } guard{finished};
                   if (c.rank() == 2) {
                     throw std::runtime_error("rank 2 broke");
                   }
                   c.barrier();
                 },
                 {.timeout = 2});
    FAIL("run did not throw");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "rank 2 broke");
  }
  CHECK(finished.load() == 4);
}

// ---- faults: each ends with the right comm_error kind on every rank, within timeout + 2 s -----

TEST_CASE("threads faults: a throwing rank fails every peer with peer_failed at once") {
  const strata::comm::scoped_faults faults(
      {{.rank = 1, .op = op_kind::all_reduce, .sequence = 3, .action = fault_action::throw_error}});
  const auto out = run_with_faults(3, [](threads& c) {
    for (int i = 0; i < 10; ++i) {
      auto v = ones(16);
      strata::comm::all_reduce(c, v);
    }
  });
  CHECK(out.seconds < 1.5);
  CHECK(!out.kinds[1].has_value());
  CHECK(out.messages[1].find("fault injection") != std::string::npos);
  for (const int r : {0, 2}) {
    CAPTURE(r);
    REQUIRE(out.kinds[static_cast<std::size_t>(r)].has_value());
    CHECK(*out.kinds[static_cast<std::size_t>(r)] == comm_error_kind::peer_failed);
    const auto& m = out.messages[static_cast<std::size_t>(r)];
    CHECK(m.find("all_reduce #3") != std::string::npos);
    CHECK(m.find("rank 1 failed") != std::string::npos);
    CHECK(m.find("last operations of rank") != std::string::npos);
  }
  // run rethrows the root cause, not an echo.
  try {
    threads::run(3,
                 [](threads& c) {
                   auto v = ones(4);
                   for (int i = 0; i < 5; ++i) {
                     strata::comm::all_reduce(c, v);
                   }
                 },
                 {.timeout = 2});
    FAIL("run did not throw");
  } catch (const comm_error&) {
    FAIL("run rethrew an echo");
  } catch (const strata::error& e) {
    CHECK(std::string(e.what()).find("fault injection") != std::string::npos);
  }
}

TEST_CASE("threads faults: a killed rank makes its peers time out naming it") {
  const strata::comm::scoped_faults faults(
      {{.rank = 2, .op = op_kind::all_reduce, .sequence = 1, .action = fault_action::kill}});
  const auto out = run_with_faults(3, [](threads& c) {
    for (int i = 0; i < 4; ++i) {
      auto v = ones(1000);
      strata::comm::all_reduce(c, v);
    }
  });
  CHECK(out.seconds < 4.0);
  CHECK(out.seconds > 1.9);
  CHECK(out.killed[2]);
  for (const int r : {0, 1}) {
    CAPTURE(r);
    REQUIRE(out.kinds[static_cast<std::size_t>(r)].has_value());
    CHECK(*out.kinds[static_cast<std::size_t>(r)] == comm_error_kind::timeout);
    CHECK(out.messages[static_cast<std::size_t>(r)].find("all_reduce #1") != std::string::npos);
    CHECK(out.messages[static_cast<std::size_t>(r)].find("missing: [2]") != std::string::npos);
    CHECK(out.messages[static_cast<std::size_t>(r)].find("arrived: [0, 1]") != std::string::npos);
  }
}

TEST_CASE("threads faults: a hung rank: peers time out, the world aborts, the hung rank too") {
  const strata::comm::scoped_faults faults(
      {{.rank = 0, .op = op_kind::broadcast, .sequence = 2, .action = fault_action::hang}});
  const auto out = run_with_faults(4, [](threads& c) {
    for (int i = 0; i < 5; ++i) {
      auto v = ones(100);
      strata::comm::broadcast(c, v, 0);
    }
  });
  CHECK(out.seconds < 4.0);
  REQUIRE(out.kinds[0].has_value());
  CHECK(*out.kinds[0] == comm_error_kind::aborted);
  for (const int r : {1, 2, 3}) {
    CAPTURE(r);
    REQUIRE(out.kinds[static_cast<std::size_t>(r)].has_value());
    CHECK(*out.kinds[static_cast<std::size_t>(r)] == comm_error_kind::timeout);
    CHECK(out.messages[static_cast<std::size_t>(r)].find("broadcast #2") != std::string::npos);
    CHECK(out.messages[static_cast<std::size_t>(r)].find("missing: [0]") != std::string::npos);
  }
  // run rethrows a timeout (the root cause), not the hung rank's abort.
  try {
    threads::run(2,
                 [](threads& c) {
                   for (int i = 0; i < 3; ++i) {
                     auto v = ones(10);
                     strata::comm::broadcast(c, v, 1);
                   }
                 },
                 {.timeout = 0.5});
    FAIL("run did not throw");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_error_kind::timeout);
    CHECK(e.rank() == 1);
  }
}

TEST_CASE("threads faults: a silent rank elsewhere gets aborted when it later waits") {
  // Rank 1 computes for longer than the timeout instead of joining the barrier: rank 0 times out,
  // and rank 1's late barrier is aborted.
  const auto out = run_with_faults(2,
                                   [](threads& c) {
                                     if (c.rank() == 1) {
                                       std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                                     }
                                     c.barrier();
                                   },
                                   {.timeout = 0.5});
  REQUIRE(out.kinds[0].has_value());
  CHECK(*out.kinds[0] == comm_error_kind::timeout);
  REQUIRE(out.kinds[1].has_value());
  CHECK(*out.kinds[1] == comm_error_kind::aborted);
  CHECK(out.messages[1].find("rank 0 waited") != std::string::npos);
}

TEST_CASE("threads faults: mismatched count, dtype, op, root give mismatch on every rank") {
  struct call {
    const char* name;
    void (*fn)(threads&);
  };
  const std::array<call, 5> calls = {{
      {"count",
       [](threads& c) {
         std::vector<float> v(c.rank() == 1 ? 11 : 10, 1.0f);
         c.all_reduce(v.data(), v.data(), v.size(), dtype::float32, reduce_op::sum);
       }},
      {"dtype",
       [](threads& c) {
         std::vector<double> v(10, 1.0);
         c.all_reduce(v.data(), v.data(), 10, c.rank() == 2 ? dtype::int64 : dtype::float64,
                      reduce_op::sum);
       }},
      {"reduction",
       [](threads& c) {
         std::vector<float> v(10, 1.0f);
         c.all_reduce(v.data(), v.data(), 10, dtype::float32,
                      c.rank() == 0 ? reduce_op::max : reduce_op::sum);
       }},
      {"root",
       [](threads& c) {
         std::vector<float> v(10, 1.0f);
         c.broadcast(v.data(), 10, dtype::float32, c.rank() == 1 ? 1 : 0);
       }},
      {"op",
       [](threads& c) {
         std::vector<float> v(30, 1.0f);
         if (c.rank() == 2) {
           c.all_gather(v.data(), v.data(), 10, dtype::float32);
         } else {
           c.all_reduce(v.data(), v.data(), 10, dtype::float32, reduce_op::sum);
         }
       }},
  }};
  for (const auto& k : calls) {
    CAPTURE(k.name);
    const auto out = run_with_faults(3, k.fn);
    CHECK(out.seconds < 1.5);
    for (std::size_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      REQUIRE(out.kinds[r].has_value());
      CHECK(*out.kinds[r] == comm_error_kind::mismatch);
      CHECK(out.messages[r].find("differs from rank 0") != std::string::npos);
    }
  }
}

TEST_CASE("threads faults: wrong_count is caught by the fingerprint") {
  const strata::comm::scoped_faults faults({{.rank = 1,
                                             .op = op_kind::reduce_scatter,
                                             .sequence = 1,
                                             .action = fault_action::wrong_count}});
  const auto out = run_with_faults(2, [](threads& c) {
    for (int i = 0; i < 3; ++i) {
      std::vector<float> in(20, 1.0f);
      std::vector<float> out(10);
      strata::comm::reduce_scatter(c, in, out);
    }
  });
  CHECK(out.seconds < 1.5);
  for (std::size_t r = 0; r < 2; ++r) {
    REQUIRE(out.kinds[r].has_value());
    CHECK(*out.kinds[r] == comm_error_kind::mismatch);
    CHECK(out.messages[r].find("reduce_scatter #1") != std::string::npos);
    CHECK(out.messages[r].find("count differs from rank 0") != std::string::npos);
  }
}

TEST_CASE("threads faults: one rank skipping a collective") {
  SUBCASE("in the middle: the next calls differ") {
    const auto out = run_with_faults(3, [](threads& c) {
      auto v = ones(8);
      if (c.rank() != 1) {
        strata::comm::all_reduce(c, v);
      }
      c.barrier();
    });
    CHECK(out.seconds < 1.5);
    for (std::size_t r = 0; r < 3; ++r) {
      REQUIRE(out.kinds[r].has_value());
      CHECK(*out.kinds[r] == comm_error_kind::mismatch);
    }
  }
  SUBCASE("at the end: the rank returns, its peers fail at once") {
    const auto out = run_with_faults(3, [](threads& c) {
      auto v = ones(8);
      strata::comm::all_reduce(c, v);
      if (c.rank() != 1) {
        strata::comm::all_reduce(c, v);
      }
    });
    CHECK(out.seconds < 1.5);
    CHECK(!out.kinds[1].has_value());
    for (const std::size_t r : {0u, 2u}) {
      REQUIRE(out.kinds[r].has_value());
      CHECK(*out.kinds[r] == comm_error_kind::peer_failed);
      CHECK(out.messages[r].find("returned from its function") != std::string::npos);
    }
  }
}

TEST_CASE("threads faults: a rank that destroys a communicator early fails its peers there") {
  const auto start = clock_type::now();
  double peers_failed_after = 0;
  std::mutex m;
  const auto out = run_with_faults(3, [&](threads& c) {
    {
      threads sub = c.split(0, 0);
      auto v = ones(8);
      strata::comm::all_reduce(sub, v);
      if (c.rank() != 2) {
        try {
          strata::comm::all_reduce(sub, v);  // rank 2 never joins
        } catch (const comm_error&) {
          const std::lock_guard lock(m);
          peers_failed_after = std::chrono::duration<double>(clock_type::now() - start).count();
          throw;
        }
      }
    }
    if (c.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // alive, not in run's exit
    }
  });
  CHECK(peers_failed_after < 0.9);
  CHECK(!out.kinds[2].has_value());
  for (const std::size_t r : {0u, 1u}) {
    REQUIRE(out.kinds[r].has_value());
    CHECK(*out.kinds[r] == comm_error_kind::peer_failed);
    CHECK(out.messages[r].find("rank 2 destroyed its communicator") != std::string::npos);
  }
}

TEST_CASE("threads faults: faults in messages and in non-blocking operations") {
  SUBCASE("an unmatched recv times out; the sender's side is aborted") {
    const auto out = run_with_faults(2, [](threads& c) {
      std::int32_t x = 0;
      if (c.rank() == 0) {
        c.recv(&x, 1, dtype::int32, 1, 4);
      } else {
        c.recv(&x, 1, dtype::int32, 0, 4);
      }
    });
    CHECK(out.seconds < 4.0);
    for (std::size_t r = 0; r < 2; ++r) {
      REQUIRE(out.kinds[r].has_value());
      CHECK(
          (*out.kinds[r] == comm_error_kind::timeout || *out.kinds[r] == comm_error_kind::aborted));
    }
  }
  SUBCASE("a message count mismatch") {
    const auto out = run_with_faults(2, [](threads& c) {
      std::vector<float> v(c.rank() == 0 ? 4 : 5);
      if (c.rank() == 0) {
        strata::comm::send(c, v, 1);
      } else {
        strata::comm::recv(c, v, 0);
      }
    });
    for (std::size_t r = 0; r < 2; ++r) {
      REQUIRE(out.kinds[r].has_value());
      CHECK(*out.kinds[r] == comm_error_kind::mismatch);
    }
  }
  SUBCASE("a late asynchronous send of another count than a waiting recv") {
    // The waiting side is handed the copy, finds the mismatch and reports it to both.
    const auto out = run_with_faults(2, [](threads& c) {
      std::vector<float> v(c.rank() == 0 ? 4 : 5);
      if (c.rank() == 0) {
        strata::comm::recv(c, v, 1);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        strata::comm::send_async(c, std::span<const float>(v), 0).wait();
      }
    });
    for (std::size_t r = 0; r < 2; ++r) {
      REQUIRE(out.kinds[r].has_value());
      CHECK(*out.kinds[r] == comm_error_kind::mismatch);
    }
  }
  SUBCASE("a throwing rank fails a peer's pending request") {
    const strata::comm::scoped_faults faults({{.rank = 0,
                                               .op = op_kind::all_gather,
                                               .sequence = 0,
                                               .action = fault_action::throw_error}});
    const auto out = run_with_faults(2, [](threads& c) {
      std::vector<float> in(4, 1.0f);
      std::vector<float> out(8);
      auto r = strata::comm::all_gather_async(c, in, out);
      r.wait();
    });
    CHECK(out.seconds < 1.5);
    CHECK(!out.kinds[0].has_value());
    REQUIRE(out.kinds[1].has_value());
    CHECK(*out.kinds[1] == comm_error_kind::peer_failed);
  }
  SUBCASE("a killed rank in a non-blocking send") {
    const strata::comm::scoped_faults faults(
        {{.rank = 1, .op = op_kind::send, .sequence = 0, .action = fault_action::kill}});
    const auto out = run_with_faults(2, [](threads& c) {
      std::int32_t x = 1;
      if (c.rank() == 1) {
        c.send_async(&x, 1, dtype::int32, 0, 0).wait();
      } else {
        c.recv(&x, 1, dtype::int32, 1, 0);
      }
    });
    CHECK(out.seconds < 4.0);
    CHECK(out.killed[1]);
    REQUIRE(out.kinds[0].has_value());
    CHECK(*out.kinds[0] == comm_error_kind::timeout);
  }
}

TEST_CASE("threads: destroying a communicator with pending requests neither hangs nor crashes") {
  const auto start = clock_type::now();
  failures f;
  threads::run(
      2,
      [&](threads& c) {
        std::vector<float> a(1 << 16, 1.0f);
        std::vector<float> b(1 << 16, 1.0f);
        std::int32_t x = 0;
        threads::request unmatched;
        {
          threads sub = c.split(0, c.rank());
          auto r1 =
              sub.all_reduce_async(a.data(), a.data(), a.size(), dtype::float32, reduce_op::sum);
          auto r2 =
              sub.all_reduce_async(b.data(), b.data(), b.size(), dtype::float32, reduce_op::sum);
          // A recv nobody will match; its request outlives the communicator.
          unmatched = sub.recv_async(&x, 1, dtype::int32, 1 - c.rank(), 99);
          threads moved = std::move(sub);
          (void)r1;
          r2 = threads::request();  // dropped while pending: the operation still runs
        }
        f.expect(a[5] == 2.0f && b[5] == 2.0f, "pending operations ran before destruction");
        try {
          unmatched.wait();
          f.add("an unmatched recv of a destroyed communicator completed");
        } catch (const comm_error& e) {
          f.expect(e.kind() == comm_error_kind::aborted, "withdrawn recv: aborted");
        }
        f.expect(unmatched.test(), "a finished request is complete");
        c.barrier();
      },
      {.timeout = 2});
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  CHECK(seconds < 1.5);
  f.report();
}

TEST_CASE("threads: invalid arguments are reported on the rank that made them") {
  const auto out = run_with_faults(2, [](threads& c) {
    std::vector<float> v(4);
    if (c.rank() == 0) {
      c.broadcast(v.data(), v.size(), dtype::float32, 5);
    } else {
      c.broadcast(v.data(), v.size(), dtype::float32, 0);
    }
  });
  REQUIRE(out.kinds[0].has_value());
  CHECK(*out.kinds[0] == comm_error_kind::invalid_argument);
  REQUIRE(out.kinds[1].has_value());
  CHECK(*out.kinds[1] == comm_error_kind::peer_failed);
}

TEST_CASE("threads: run rejects a non-positive rank count; a 1-rank world works alone") {
  CHECK_THROWS_AS(threads::run(0, [](threads&) {}), strata::error);
  threads::run(1, [](threads& c) {
    std::vector<float> v = {3.0f};
    strata::comm::all_reduce(c, v, reduce_op::avg);
    CHECK(v[0] == 3.0f);
    CHECK(c.history().find("all_reduce #0") != std::string::npos);
  });
}

TEST_CASE("threads: each rank accounts its host memory apart, inside the process tracker") {
  strata::memory_tracker& process = strata::host{}.memory();
  const std::size_t before = process.stats().in_use;
  std::array<std::size_t, 3> own{};
  std::array<std::size_t, 2> quiet{};  // the process total before and after the ranks allocate
  std::array<std::string, 3> names{};
  threads::run(3, [&](threads& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    CHECK(c.ranks_sharing_memory() == 3);
    CHECK(strata::comm::ranks_sharing_memory(strata::comm::any_comm(c)) == 3);
    strata::memory_tracker& mine = strata::host{}.memory();
    names[r] = mine.space();
    CHECK(mine.parent() == &process);
    const std::size_t start = mine.stats().in_use;
    c.barrier();
    if (r == 0) {
      quiet[0] = process.stats().in_use;
    }
    c.barrier();
    // Rank r holds (r + 1) x 64 KiB; a budget on one rank limits that rank alone.
    const strata::buffer<std::byte> held((r + 1) << 16);
    c.barrier();
    own[r] = mine.stats().in_use - start;
    if (r == 0) {
      quiet[1] = process.stats().in_use;
    }
    {
      // Rank 0's budget holds while every other rank allocates past it.
      std::optional<strata::scoped_budget> limit;
      if (r == 0) {
        limit.emplace(mine, mine.stats().in_use + 1024);
      }
      c.barrier();
      if (r == 0) {
        CHECK_THROWS_WITH_AS(strata::buffer<std::byte>(4096), doctest::Contains("host:rank0"),
                             strata::memory_error);
      } else {
        const strata::buffer<std::byte> more(4096);
        CHECK(mine.stats().in_use == start + ((r + 1) << 16) + 4096);
      }
      c.barrier();
    }
    // A split communicator's ranks still share the process with every rank of the run.
    threads half = c.split(c.rank() % 2, c.rank());
    CHECK(half.size() < 3);
    CHECK(half.ranks_sharing_memory() == 3);
    CHECK(half.ranks_sharing_cpus() == 3);
  });
  CHECK(names == std::array<std::string, 3>{"host:rank0", "host:rank1", "host:rank2"});
  CHECK(own == std::array<std::size_t, 3>{1 << 16, 2 << 16, 3 << 16});
  // Between two points where no rank allocates, the process total moved by exactly what the
  // ranks' accounts did.
  CHECK(quiet[1] - quiet[0] == 6 << 16);
  CHECK(process.stats().in_use == before);
}

TEST_CASE("threads: the ranks' accounts sit inside the caller's account") {
  strata::host_account outer("host:outer");
  std::array<const strata::memory_tracker*, 2> parents{};
  threads::run(2, [&](threads& c) {
    const strata::buffer<std::byte> held(4096);
    parents[static_cast<std::size_t>(c.rank())] = strata::host{}.memory().parent();
    c.barrier();
    if (c.rank() == 0) {
      CHECK(outer.memory().stats().in_use == 2 * 4096);
    }
    c.barrier();
  });
  CHECK(parents[0] == &outer.memory());
  CHECK(parents[1] == &outer.memory());
  CHECK(outer.memory().stats().in_use == 0);
  CHECK(outer.memory().stats().peak == 2 * 4096);
}
