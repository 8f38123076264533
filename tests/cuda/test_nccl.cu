// SPDX-License-Identifier: Apache-2.0
// The nccl comm backend on real GPUs, ranks as threads bootstrapped over the threads backend: one
// rank, then one rank per visible GPU (NCCL wants one rank per device). Every collective, every
// dtype and reduce_op, in place and out of place, point to point, non-blocking overlap, split,
// fingerprint mismatches and timeouts, each checked against a host reference. Rank threads never
// assert: each rank records its failures, reported after the run.
#include "strata/comm/nccl.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "conformance/reference.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/comm/threads.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/cuda.cuh"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/host.hpp"

static_assert(strata::comm::comm_backend<strata::comm::nccl>);
static_assert(strata::comm::check_comm_backend<strata::comm::nccl>());

namespace {

namespace comm = strata::comm;
using comm::reduce_op;
using strata::dtype;
using strata::conformance::expected;
using strata::conformance::value;

constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max,
                                 reduce_op::prod};
const std::vector<std::size_t> test_counts{0, 1, 7, 1000, 100003};

comm::comm_config test_config(double timeout = 120.0) {
  return comm::comm_config{.timeout = timeout, .fingerprint = comm::fingerprint_mode::always};
}

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// The rank counts to run: 1, and one rank per GPU (at most 4) when there are several.
std::vector<int> rank_counts() {
  std::vector<int> out{1};
  const int gpus = std::min(gpu_count(), 4);
  if (gpus > 1) {
    out.push_back(gpus);
  }
  return out;
}

struct rank_log {
  int rank = -1;
  std::vector<std::string> failures{};
  std::size_t checks = 0;

  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok && failures.size() < 20) {
      failures.push_back("rank " + std::to_string(rank) + ": " + what);
    }
  }
  std::string summary() const {
    std::string out;
    for (const auto& f : failures) {
      out += f + "\n";
    }
    return out;
  }
};

// Runs fn(gpu, host, log) on n ranks: threads for the bootstrap, an nccl communicator per rank.
template <class Fn>
void on_gpus(int n, Fn&& fn, comm::comm_config config = test_config()) {
  std::vector<rank_log> logs(static_cast<std::size_t>(n));
  comm::threads::run(
      n,
      [&](comm::threads& host) {
        rank_log& log = logs[static_cast<std::size_t>(host.rank())];
        log.rank = host.rank();
        try {
          comm::nccl gpu(host, config);
          log.expect(gpu.rank() == host.rank() && gpu.size() == host.size(), "rank and size");
          log.expect(gpu.device() == host.rank() % gpu_count(), "device");
          log.expect(gpu.native_handle() != nullptr && gpu.stream() != nullptr, "handles");
          fn(gpu, host, log);
        } catch (const std::exception& e) {
          log.expect(false, std::string("threw: ") + e.what());
        }
      },
      test_config());
  for (const rank_log& log : logs) {
    CHECK_MESSAGE(log.failures.empty(), log.summary());
    CHECK(log.checks > 0);
  }
}

// Device memory on the communicator's device, copied on the communicator's stream.
template <class T>
using device_buffer = strata::buffer<T, strata::cuda>;

strata::cuda space_of(const comm::nccl& gpu) {
  return strata::cuda(gpu.device(), gpu.stream());
}

template <class T>
device_buffer<T> to_device(const comm::nccl& gpu, const std::vector<T>& values) {
  device_buffer<T> out(space_of(gpu), values.size());
  if (!values.empty()) {
    out.copy_from_host(std::span<const T>(values));
  }
  return out;
}

template <class T>
std::vector<T> to_host(const device_buffer<T>& values, std::size_t count) {
  std::vector<T> out(count);
  if (count != 0) {
    values.copy_to_host(std::span<T>(out));
  }
  return out;
}

// Exact, except a floating-point avg: NCCL scales the inputs by 1/size before summing, which
// can differ from sum / size in the last bits. (Its integer avg is the sum divided with
// truncation toward zero, as in C++.)
template <class T>
bool agrees(const T& got, const T& want, reduce_op op) {
  if (op != reduce_op::avg || std::is_integral_v<T>) {
    return std::memcmp(&got, &want, sizeof(T)) == 0;
  }
  const double g = static_cast<double>(static_cast<comm::accumulator_t<T>>(got));
  const double w = static_cast<double>(static_cast<comm::accumulator_t<T>>(want));
  double tolerance = 1e-6;
  if constexpr (std::is_same_v<T, double>) {
    tolerance = 1e-12;
  } else if constexpr (std::is_same_v<T, strata::float16>) {
    tolerance = 4e-3;
  } else if constexpr (std::is_same_v<T, strata::bfloat16>) {
    tolerance = 2e-2;
  }
  return std::abs(g - w) <= tolerance * std::max(1.0, std::abs(w));
}

template <class T>
std::size_t count_wrong(const std::vector<T>& got, std::size_t offset, int n, reduce_op op) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    wrong += agrees(got[i], expected<T>(n, offset + i, op), op) ? 0 : 1;
  }
  return wrong;
}

template <class T>
void check_collectives(comm::nccl& gpu, rank_log& log) {
  const int n = gpu.size();
  const int me = gpu.rank();
  const auto un = static_cast<std::size_t>(n);
  const auto urank = static_cast<std::size_t>(me);
  const std::string type(strata::to_string(strata::dtype_of<T>));
  const dtype t = strata::dtype_of<T>;
  for (std::size_t count : test_counts) {
    const std::string at = type + " x " + std::to_string(count);
    for (reduce_op op : all_ops) {
      const std::string what = at + " " + std::string(comm::to_string(op));
      std::vector<T> mine(count);
      for (std::size_t i = 0; i < count; ++i) {
        mine[i] = value<T>(me, i, op);
      }
      // all_reduce, out of place and in place.
      {
        auto in = to_device(gpu, mine);
        device_buffer<T> out(space_of(gpu), count);
        gpu.all_reduce(in.data(), out.data(), count, t, op);
        log.expect(count_wrong(to_host(out, count), 0, n, op) == 0, "all_reduce " + what);
        log.expect(to_host(in, count) == mine || count == 0, "all_reduce changed its input");
        gpu.all_reduce(in.data(), in.data(), count, t, op);
        log.expect(count_wrong(to_host(in, count), 0, n, op) == 0, "all_reduce in place " + what);
      }
      // reduce_scatter: n slices of `count` in, this rank's slice out.
      {
        std::vector<T> all(count * un);
        for (std::size_t i = 0; i < all.size(); ++i) {
          all[i] = value<T>(me, i, op);
        }
        auto in = to_device(gpu, all);
        device_buffer<T> out(space_of(gpu), count);
        gpu.reduce_scatter(in.data(), out.data(), count, t, op);
        log.expect(count_wrong(to_host(out, count), urank * count, n, op) == 0,
                   "reduce_scatter " + what);
        gpu.reduce_scatter(in.data(), in.data() + urank * count, count, t, op);
        const auto back = to_host(in, all.size());
        const std::vector<T> slice(back.begin() + static_cast<std::ptrdiff_t>(urank * count),
                                   back.begin() + static_cast<std::ptrdiff_t>((urank + 1) * count));
        log.expect(count_wrong(slice, urank * count, n, op) == 0,
                   "reduce_scatter in place " + what);
      }
      // reduce to every root in turn.
      for (int root = 0; root < n; ++root) {
        auto in = to_device(gpu, mine);
        device_buffer<T> out(space_of(gpu), count);
        gpu.reduce(in.data(), me == root ? out.data() : nullptr, count, t, op, root);
        if (me == root) {
          log.expect(count_wrong(to_host(out, count), 0, n, op) == 0,
                     "reduce root " + std::to_string(root) + " " + what);
        }
      }
    }
    // all_gather, out of place and in place.
    {
      std::vector<T> part(count);
      for (std::size_t i = 0; i < count; ++i) {
        part[i] = value<T>(me, i, reduce_op::sum);
      }
      auto in = to_device(gpu, part);
      device_buffer<T> out(space_of(gpu), count * un);
      gpu.all_gather(in.data(), out.data(), count, t);
      const auto gathered = to_host(out, count * un);
      bool ok = true;
      for (std::size_t r = 0; r < un; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          const T want = value<T>(static_cast<int>(r), i, reduce_op::sum);
          ok = ok && std::memcmp(&gathered[r * count + i], &want, sizeof(T)) == 0;
        }
      }
      log.expect(ok, "all_gather " + at);
      device_buffer<T> whole(space_of(gpu), count * un);
      if (count != 0) {
        space_of(gpu).copy_from_host(whole.data() + urank * count, part.data(), count * sizeof(T));
      }
      gpu.all_gather(whole.data() + urank * count, whole.data(), count, t);
      log.expect(to_host(whole, count * un) == gathered, "all_gather in place " + at);
    }
    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<T> data(count);
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = value<T>(me, i, reduce_op::sum);
      }
      auto buffer = to_device(gpu, data);
      gpu.broadcast(buffer.data(), count, t, root);
      bool ok = true;
      const auto got = to_host(buffer, count);
      for (std::size_t i = 0; i < count; ++i) {
        const T want = value<T>(root, i, reduce_op::sum);
        ok = ok && std::memcmp(&got[i], &want, sizeof(T)) == 0;
      }
      log.expect(ok, "broadcast root " + std::to_string(root) + " " + at);
    }
    // all_to_all: slice r of rank q's input is value(q, r * count + i).
    {
      std::vector<T> data(count * un);
      for (std::size_t i = 0; i < data.size(); ++i) {
        data[i] = value<T>(me, i, reduce_op::sum);
      }
      auto in = to_device(gpu, data);
      device_buffer<T> out(space_of(gpu), count * un);
      gpu.all_to_all(in.data(), out.data(), count, t);
      const auto got = to_host(out, count * un);
      bool ok = true;
      for (std::size_t q = 0; q < un; ++q) {
        for (std::size_t i = 0; i < count; ++i) {
          const T want = value<T>(static_cast<int>(q), urank * count + i, reduce_op::sum);
          ok = ok && std::memcmp(&got[q * count + i], &want, sizeof(T)) == 0;
        }
      }
      log.expect(ok, "all_to_all " + at);
    }
  }
}

}  // namespace

TEST_CASE("nccl: every collective, dtype, op and count against a host reference") {
  for (int n : rank_counts()) {
    CAPTURE(n);
    on_gpus(n, [](comm::nccl& gpu, comm::threads&, rank_log& log) {
      check_collectives<float>(gpu, log);
      check_collectives<double>(gpu, log);
      check_collectives<strata::float16>(gpu, log);
      check_collectives<strata::bfloat16>(gpu, log);
      check_collectives<std::int32_t>(gpu, log);
      check_collectives<std::int64_t>(gpu, log);
      check_collectives<std::uint8_t>(gpu, log);
      gpu.barrier();
      log.expect(gpu.history().find("barrier") != std::string::npos, "history records ops");
    });
  }
}

TEST_CASE("nccl: bootstrapped over threads, one rank per GPU, device buffers") {
  const int n_gpus = std::min(gpu_count(), 4);
  REQUIRE(n_gpus >= 1);
  const std::size_t count = 1000;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(n_gpus),
                                          std::vector<float>(count));
  // snippet-begin: nccl
  strata::comm::threads::run(n_gpus, [&](strata::comm::threads& host) {
    strata::comm::nccl gpu(host, strata::comm::nccl_config{.device = host.rank()});
    strata::buffer<float, strata::cuda> grads(strata::cuda(gpu.device(), gpu.stream()), count);
    const std::vector<float> ones(count, 1.0f);
    grads.copy_from_host(ones);
    gpu.all_reduce(grads.data(), grads.data(), count, strata::dtype::float32,
                   strata::comm::reduce_op::sum);  // device pointers, on gpu.stream()
    grads.copy_to_host(results[static_cast<std::size_t>(host.rank())]);
  });
  // snippet-end: nccl
  for (const std::vector<float>& r : results) {
    CHECK(r == std::vector<float>(count, static_cast<float>(n_gpus)));
  }
}

TEST_CASE("nccl: send and recv between pairs of ranks") {
  for (int n : rank_counts()) {
    CAPTURE(n);
    on_gpus(n, [](comm::nccl& gpu, comm::threads&, rank_log& log) {
      const int n = gpu.size();
      const int me = gpu.rank();
      const std::size_t count = 4099;
      std::vector<std::int32_t> mine(count);
      for (std::size_t i = 0; i < count; ++i) {
        mine[i] = static_cast<std::int32_t>(i) * 10 + me;
      }
      auto out = to_device(gpu, mine);
      device_buffer<std::int32_t> in(space_of(gpu), count);
      // Pairs (0, 1), (2, 3): the lower rank sends first, the higher receives first. (A rank
      // alone has no partner: a send to itself would block the stream before its receive.)
      const int peer = me ^ 1;
      if (peer >= n) {
        log.expect(true, "no partner");
        return;
      }
      if (me < peer) {
        gpu.send(out.data(), count, dtype::int32, peer, 7);
        gpu.recv(in.data(), count, dtype::int32, peer, 7);
      } else {
        gpu.recv(in.data(), count, dtype::int32, peer, 7);
        gpu.send(out.data(), count, dtype::int32, peer, 7);
      }
      const auto got = to_host(in, count);
      bool ok = true;
      for (std::size_t i = 0; i < count; ++i) {
        ok = ok && got[i] == static_cast<std::int32_t>(i) * 10 + peer;
      }
      log.expect(ok, "message from the peer");
    });
  }
}

TEST_CASE("nccl: non-blocking collectives complete in order and overlap the host") {
  for (int n : rank_counts()) {
    CAPTURE(n);
    on_gpus(n, [](comm::nccl& gpu, comm::threads&, rank_log& log) {
      const int n = gpu.size();
      const std::size_t count = 1 << 20;
      std::vector<float> ones(count, 1.0f);
      auto a = to_device(gpu, ones);
      auto b = to_device(gpu, ones);
      std::vector<comm::nccl::request> pending;
      pending.push_back(
          gpu.all_reduce_async(a.data(), a.data(), count, dtype::float32, reduce_op::sum));
      pending.push_back(
          gpu.all_reduce_async(a.data(), a.data(), count, dtype::float32, reduce_op::sum));
      pending.push_back(gpu.broadcast_async(b.data(), count, dtype::float32, 0));
      pending.push_back(gpu.barrier_async());
      bool tested = false;
      for (auto& r : pending) {
        tested = r.test() || tested;
      }
      for (auto& r : pending) {
        r.wait();
        log.expect(r.test(), "a finished request tests true");
      }
      (void)tested;
      const auto got = to_host(a, count);
      const float want = static_cast<float>(n) * static_cast<float>(n);
      log.expect(std::all_of(got.begin(), got.end(), [&](float v) { return v == want; }),
                 "two all-reduces in issue order");
      comm::nccl::request idle;
      log.expect(idle.test(), "a default request is complete");
      idle.wait();
    });
  }
}

TEST_CASE("nccl: split makes sub-communicators ordered by key") {
  for (int n : rank_counts()) {
    CAPTURE(n);
    on_gpus(n, [](comm::nccl& gpu, comm::threads&, rank_log& log) {
      const int me = gpu.rank();
      // Reverse order by key: rank 0 of the parent is the last of its group.
      comm::nccl sub = gpu.split(me % 2, -me);
      const int members = (gpu.size() - me % 2 + 1) / 2;
      log.expect(sub.size() == members, "sub size");
      log.expect(sub.rank() == members - 1 - me / 2, "sub rank ordered by key");
      log.expect(sub.device() == gpu.device(), "same device");
      log.expect(sub.stream() != gpu.stream(), "own stream");
      std::vector<std::int64_t> v(33, me);
      auto d = to_device(sub, v);
      sub.all_reduce(d.data(), d.data(), v.size(), dtype::int64, reduce_op::sum);
      std::int64_t want = 0;
      for (int r = me % 2; r < gpu.size(); r += 2) {
        want += r;
      }
      const auto got = to_host(d, v.size());
      log.expect(std::all_of(got.begin(), got.end(), [&](std::int64_t x) { return x == want; }),
                 "all_reduce on the sub-communicator");
      // The parent still works after the split.
      gpu.barrier();
      try {
        (void)gpu.split(-1, 0);
        log.expect(false, "a negative color was accepted");
      } catch (const strata::comm_error& e) {
        log.expect(e.kind() == strata::comm_error_kind::invalid_argument, e.what());
      }
    });
  }
}

TEST_CASE("nccl: wrong roots and peers are invalid_argument on the calling rank") {
  on_gpus(1, [](comm::nccl& gpu, comm::threads&, rank_log& log) {
    device_buffer<float> d(space_of(gpu), 4);
    for (int bad : {-1, 1}) {
      try {
        gpu.broadcast(d.data(), 4, dtype::float32, bad);
        log.expect(false, "root accepted");
      } catch (const strata::comm_error& e) {
        log.expect(e.kind() == strata::comm_error_kind::invalid_argument, e.what());
      }
      try {
        gpu.send(d.data(), 4, dtype::float32, bad, 0);
        log.expect(false, "peer accepted");
      } catch (const strata::comm_error& e) {
        log.expect(e.kind() == strata::comm_error_kind::invalid_argument, e.what());
      }
    }
    gpu.barrier();
  });
}

TEST_CASE("nccl: ranks that call different collectives get mismatch before data moves") {
  const int gpus = std::min(gpu_count(), 4);
  if (gpus < 2) {
    return;  // needs two GPUs; the one-rank form cannot disagree with itself
  }
  on_gpus(gpus, [](comm::nccl& gpu, comm::threads&, rank_log& log) {
    device_buffer<float> d(space_of(gpu), 16);
    const std::size_t count = gpu.rank() == 0 ? 8 : 9;
    try {
      gpu.all_reduce(d.data(), d.data(), count, dtype::float32, reduce_op::sum);
      log.expect(false, "different counts were accepted");
    } catch (const strata::comm_error& e) {
      log.expect(e.kind() == strata::comm_error_kind::mismatch, e.what());
      const std::string what = e.what();
      log.expect(what.find("count") != std::string::npos, "the message names the field");
    }
    // The communicator is still usable.
    gpu.all_reduce(d.data(), d.data(), 16, dtype::float32, reduce_op::sum);
    log.expect(true, "after the mismatch");
  });
}

TEST_CASE("nccl: a rank that does not arrive makes the others time out and abort") {
  const int gpus = std::min(gpu_count(), 4);
  if (gpus < 2) {
    return;  // needs two GPUs
  }
  on_gpus(
      gpus,
      [](comm::nccl& gpu, comm::threads& host, rank_log& log) {
        device_buffer<float> d(space_of(gpu), 16);
        if (gpu.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(4));
          log.expect(true, "stayed away");
        } else {
          const auto start = std::chrono::steady_clock::now();
          try {
            gpu.all_reduce(d.data(), d.data(), 16, dtype::float32, reduce_op::sum);
            log.expect(false, "no timeout");
          } catch (const strata::comm_error& e) {
            log.expect(e.kind() == strata::comm_error_kind::timeout, e.what());
            log.expect(e.op() == "all_reduce", "names the op");
            log.expect(gpu.native_handle() == nullptr, "aborted");
          }
          const double waited =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          log.expect(waited < 30.0, "the deadline holds");
          try {
            gpu.barrier();
            log.expect(false, "usable after abort");
          } catch (const strata::comm_error& e) {
            log.expect(e.kind() == strata::comm_error_kind::aborted, e.what());
          }
        }
        host.barrier();
      },
      test_config(2.0));
}
