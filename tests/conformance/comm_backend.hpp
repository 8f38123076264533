// SPDX-License-Identifier: Apache-2.0
#pragma once

// The conformance suite of the comm_backend concept: every collective, every dtype, counts 0, 1,
// 7 and 1000003 (100003 under AddressSanitizer), in place and out of place, against a serial
// reference; split groups; non-blocking operations overlapping compute. Run by every rank of a
// communicator of any backend; failures are collected per rank (not asserted from rank threads) and
// reported by the driver (tests/unit/comm/test_threads.cpp, tests/mpi/...).

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "conformance/reference.hpp"
#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/core/dtype.hpp"

namespace strata::conformance {

struct report {
  int rank = -1;
  std::vector<std::string> failures{};
  std::size_t checks = 0;

  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok && failures.size() < 50) {
      failures.push_back("rank " + std::to_string(rank) + ": " + what);
    }
  }
  bool ok() const noexcept { return failures.empty(); }
  std::string summary() const {
    std::string out;
    for (const auto& f : failures) {
      out += f + "\n";
    }
    return out;
  }
};

struct suite_options {
#if defined(__SANITIZE_THREAD__)
  // The ThreadSanitizer job checks how ranks meet, not how much they move: the large count
  // still spans many 256-byte blocks of every rank's slice (up to 4 ranks).
  std::vector<std::size_t> counts{0, 1, 7, 10007};
#elif defined(__SANITIZE_ADDRESS__)
  // The sanitizer job (unoptimised, every access checked) takes a tenth of the largest count: the
  // same paths (many 256-byte blocks per slice; streaming starts at 64 MiB either way, and has a
  // test of its own). The full count took 129 s of that job on 2 cores.
  std::vector<std::size_t> counts{0, 1, 7, 100003};
#else
  std::vector<std::size_t> counts{0, 1, 7, 1000003};
#endif
  // The largest count runs for these ops only (the small counts run for every op).
  bool large_for_every_op = false;
};

namespace detail {

template <class T>
bool close(T got, T want) {
  if constexpr (std::is_integral_v<T>) {
    return got == want;
  } else {
    const double g = static_cast<double>(static_cast<float>(got));
    const double w = static_cast<double>(static_cast<float>(want));
    const double tol = (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) ? 1e-2 : 1e-6;
    return std::abs(g - w) <= tol * std::max(1.0, std::abs(w));
  }
}

template <class T>
std::string name() {
  return std::string(to_string(dtype_of<T>));
}

// First index where `data` differs from `want(i)`, or npos.
template <class T, class Want>
std::size_t first_wrong(std::span<const T> data, Want&& want) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (!close(data[i], want(i))) {
      return i;
    }
  }
  return static_cast<std::size_t>(-1);
}

constexpr comm::reduce_op all_ops[] = {comm::reduce_op::sum, comm::reduce_op::avg,
                                       comm::reduce_op::min, comm::reduce_op::max,
                                       comm::reduce_op::prod};

template <comm::comm_backend C, class T>
void all_reduce_suite(C& c, report& rep, const suite_options& opt) {
  const int n = c.size();
  const int me = c.rank();
  for (const auto count : opt.counts) {
    const bool large = count > 1000;
    for (const auto op : all_ops) {
      if (large && !opt.large_for_every_op && op != comm::reduce_op::sum &&
          op != comm::reduce_op::avg) {
        continue;
      }
      for (const bool in_place : {false, true}) {
        const int salt = static_cast<int>(count % 13);
        std::vector<T> in(count);
        for (std::size_t i = 0; i < count; ++i) {
          in[i] = value<T>(me, i, op, salt);
        }
        std::vector<T> out(count);
        if (in_place) {
          comm::all_reduce(c, in, op);
          out = in;
        } else {
          comm::all_reduce(c, std::span<const T>(in), out, op);
        }
        const reference<T> want(n, op, salt);
        const auto bad = first_wrong<T>(out, want);
        rep.expect(
            bad == static_cast<std::size_t>(-1),
            "all_reduce " + name<T>() + " op " + std::string(to_string(op)) + " count " +
                std::to_string(count) + (in_place ? " in place" : " out of place") +
                (bad == static_cast<std::size_t>(-1) ? std::string()
                                                     : " wrong at index " + std::to_string(bad)));
      }
    }
  }
}

template <comm::comm_backend C, class T>
void reduce_scatter_suite(C& c, report& rep, const suite_options& opt) {
  const int n = c.size();
  const int me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (const auto total : opt.counts) {
    const std::size_t count = total > 1000 ? total / un : total;  // per rank
    for (const auto op : {comm::reduce_op::sum, comm::reduce_op::max}) {
      for (const bool in_place : {false, true}) {
        std::vector<T> in(count * un);
        for (std::size_t i = 0; i < in.size(); ++i) {
          in[i] = value<T>(me, i, op, 1);
        }
        std::vector<T> out(count);
        if (in_place) {
          std::span<T> mine(in.data() + static_cast<std::size_t>(me) * count, count);
          c.reduce_scatter(in.data(), mine.data(), count, dtype_of<T>, op);
          std::copy(mine.begin(), mine.end(), out.begin());
        } else {
          comm::reduce_scatter(c, std::span<const T>(in), out, op);
        }
        const std::size_t base = static_cast<std::size_t>(me) * count;
        const reference<T> want(n, op, 1);
        const auto bad = first_wrong<T>(out, [&](std::size_t i) { return want(base + i); });
        rep.expect(
            bad == static_cast<std::size_t>(-1),
            "reduce_scatter " + name<T>() + " op " + std::string(to_string(op)) + " count " +
                std::to_string(count) + (in_place ? " in place" : "") +
                (bad == static_cast<std::size_t>(-1) ? std::string()
                                                     : " wrong at index " + std::to_string(bad)));
      }
    }
  }
}

template <comm::comm_backend C, class T>
void all_gather_suite(C& c, report& rep, const suite_options& opt) {
  const int me = c.rank();
  const auto un = static_cast<std::size_t>(c.size());
  for (const auto total : opt.counts) {
    const std::size_t count = total > 1000 ? total / un : total;
    for (const bool in_place : {false, true}) {
      std::vector<T> in(count);
      for (std::size_t i = 0; i < count; ++i) {
        in[i] = value<T>(me, i, comm::reduce_op::sum, 2);
      }
      std::vector<T> out(count * un);
      if (in_place) {
        std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(me * count));
        c.all_gather(out.data() + static_cast<std::size_t>(me) * count, out.data(), count,
                     dtype_of<T>);
      } else {
        comm::all_gather(c, std::span<const T>(in), out);
      }
      const auto bad = first_wrong<T>(out, [&](std::size_t i) {
        return value<T>(static_cast<int>(i / std::max<std::size_t>(count, 1)),
                        i % std::max<std::size_t>(count, 1), comm::reduce_op::sum, 2);
      });
      rep.expect(
          bad == static_cast<std::size_t>(-1),
          "all_gather " + name<T>() + " count " + std::to_string(count) +
              (in_place ? " in place" : "") +
              (bad == static_cast<std::size_t>(-1) ? std::string()
                                                   : " wrong at index " + std::to_string(bad)));
    }
  }
}

template <comm::comm_backend C, class T>
void broadcast_and_reduce_suite(C& c, report& rep, const suite_options& opt) {
  const int n = c.size();
  const int me = c.rank();
  for (const auto count : opt.counts) {
    for (int root = 0; root < n; ++root) {
      if (count > 1000 && root != n - 1) {
        continue;  // the large count once per op, from the last rank
      }
      std::vector<T> data(count);
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = me == root ? value<T>(root, i, comm::reduce_op::sum, 3) : T{};
      }
      comm::broadcast(c, data, root);
      const auto bad = first_wrong<T>(
          data, [&](std::size_t i) { return value<T>(root, i, comm::reduce_op::sum, 3); });
      rep.expect(bad == static_cast<std::size_t>(-1), "broadcast " + name<T>() + " count " +
                                                          std::to_string(count) + " root " +
                                                          std::to_string(root));

      for (const auto op : {comm::reduce_op::sum, comm::reduce_op::min}) {
        for (const bool in_place : {false, true}) {
          std::vector<T> in(count);
          for (std::size_t i = 0; i < count; ++i) {
            in[i] = value<T>(me, i, op, 4);
          }
          std::vector<T> out(me == root ? count : 0);
          if (in_place && me == root) {
            c.reduce(in.data(), in.data(), count, dtype_of<T>, op, root);
            out = in;
          } else {
            comm::reduce(c, std::span<const T>(in), out, op, root);
          }
          if (me == root) {
            const auto wrong = first_wrong<T>(out, reference<T>(n, op, 4));
            rep.expect(wrong == static_cast<std::size_t>(-1),
                       "reduce " + name<T>() + " op " + std::string(to_string(op)) + " count " +
                           std::to_string(count) + " root " + std::to_string(root) +
                           (in_place ? " in place" : ""));
          }
        }
      }
    }
  }
}

template <comm::comm_backend C, class T>
void all_to_all_suite(C& c, report& rep, const suite_options& opt) {
  const int me = c.rank();
  const auto un = static_cast<std::size_t>(c.size());
  for (const auto total : opt.counts) {
    const std::size_t per = total > 1000 ? total / un : total;
    std::vector<T> in(per * un);
    // Slice d of rank s carries value(s * 16 + d, i).
    for (std::size_t d = 0; d < un; ++d) {
      for (std::size_t i = 0; i < per; ++i) {
        in[d * per + i] = value<T>(me * 16 + static_cast<int>(d), i, comm::reduce_op::sum, 5);
      }
    }
    std::vector<T> out(per * un);
    comm::all_to_all(c, std::span<const T>(in), out);
    const auto bad = first_wrong<T>(out, [&](std::size_t i) {
      const std::size_t s = per == 0 ? 0 : i / per;
      return value<T>(static_cast<int>(s) * 16 + me, per == 0 ? 0 : i % per, comm::reduce_op::sum,
                      5);
    });
    rep.expect(bad == static_cast<std::size_t>(-1),
               "all_to_all " + name<T>() + " count per rank " + std::to_string(per));
  }
}

template <comm::comm_backend C, class T>
void send_recv_suite(C& c, report& rep, const suite_options& opt) {
  const int n = c.size();
  const int me = c.rank();
  if (n < 2) {
    return;
  }
  const int right = (me + 1) % n;
  const int left = (me + n - 1) % n;
  for (const auto count : opt.counts) {
    // Two messages with different tags, received in the opposite order of sending.
    std::vector<T> a(count);
    std::vector<T> b(count);
    for (std::size_t i = 0; i < count; ++i) {
      a[i] = value<T>(me, i, comm::reduce_op::sum, 6);
      b[i] = value<T>(me, i, comm::reduce_op::sum, 7);
    }
    std::vector<T> got_a(count);
    std::vector<T> got_b(count);
    auto sa = comm::send_async(c, std::span<const T>(a), right, 10);
    auto sb = comm::send_async(c, std::span<const T>(b), right, 11);
    comm::recv(c, got_b, left, 11);
    comm::recv(c, got_a, left, 10);
    sa.wait();
    sb.wait();
    const auto bad_a = first_wrong<T>(
        got_a, [&](std::size_t i) { return value<T>(left, i, comm::reduce_op::sum, 6); });
    const auto bad_b = first_wrong<T>(
        got_b, [&](std::size_t i) { return value<T>(left, i, comm::reduce_op::sum, 7); });
    rep.expect(bad_a == static_cast<std::size_t>(-1) && bad_b == static_cast<std::size_t>(-1),
               "send/recv with tags " + name<T>() + " count " + std::to_string(count));
  }
}

template <comm::comm_backend C, class T>
void dtype_suite(C& c, report& rep, const suite_options& opt) {
  all_reduce_suite<C, T>(c, rep, opt);
  reduce_scatter_suite<C, T>(c, rep, opt);
  all_gather_suite<C, T>(c, rep, opt);
  broadcast_and_reduce_suite<C, T>(c, rep, opt);
  all_to_all_suite<C, T>(c, rep, opt);
  send_recv_suite<C, T>(c, rep, opt);
}

}  // namespace detail

// Every collective over every dtype.
template <comm::comm_backend C>
void collectives(C& c, report& rep, const suite_options& opt = {}) {
  detail::dtype_suite<C, float>(c, rep, opt);
  detail::dtype_suite<C, double>(c, rep, opt);
  detail::dtype_suite<C, float16>(c, rep, opt);
  detail::dtype_suite<C, bfloat16>(c, rep, opt);
  detail::dtype_suite<C, std::int32_t>(c, rep, opt);
  detail::dtype_suite<C, std::int64_t>(c, rep, opt);
  detail::dtype_suite<C, std::uint8_t>(c, rep, opt);
  c.barrier();
}

// split: even and odd ranks form groups; keys reverse the order inside each group.
template <comm::comm_backend C>
void split_groups(C& c, report& rep) {
  const int n = c.size();
  const int me = c.rank();
  const int color = me % 2;
  C group = c.split(color, n - me);
  const int expected_size = (n - color + 1) / 2;
  rep.expect(group.size() == expected_size, "split: group size " + std::to_string(group.size()) +
                                                " expected " + std::to_string(expected_size));
  // Reversed keys: the highest old rank of the color is new rank 0.
  int members_above = 0;
  for (int r = me + 1; r < n; ++r) {
    members_above += (r % 2 == color) ? 1 : 0;
  }
  rep.expect(group.rank() == members_above, "split: new rank " + std::to_string(group.rank()) +
                                                " expected " + std::to_string(members_above));
  std::vector<std::int64_t> v{me};
  comm::all_reduce(group, v, comm::reduce_op::sum);
  std::int64_t want = 0;
  for (int r = color; r < n; r += 2) {
    want += r;
  }
  rep.expect(v[0] == want,
             "split: group sum " + std::to_string(v[0]) + " expected " + std::to_string(want));
  // The parent still works after the split, and the group after the parent's next call.
  std::vector<std::int32_t> w{1};
  comm::all_reduce(c, w, comm::reduce_op::sum);
  rep.expect(w[0] == n, "split: parent all_reduce after split");
  group.barrier();
}

// Non-blocking: requests complete in order and compute overlaps them.
template <comm::comm_backend C>
void nonblocking(C& c, report& rep) {
  const int n = c.size();
  const std::size_t count = 1 << 16;
  std::vector<float> a(count, 1.0f);
  std::vector<float> b(count, 2.0f);
  std::vector<float> gathered(count * static_cast<std::size_t>(n));
  auto ra = comm::all_reduce_async(c, a, comm::reduce_op::sum);
  auto rb = comm::all_reduce_async(c, b, comm::reduce_op::max);
  auto rg = comm::all_gather_async(c, std::span<const float>(b.data(), count), gathered);
  // Compute while the operations run (results must not depend on it).
  volatile double busy = 0.0;
  for (int i = 0; i < 200000; ++i) {
    busy = busy + std::sqrt(static_cast<double>(i));
  }
  ra.wait();
  rb.wait();
  rg.wait();
  rep.expect(a[0] == static_cast<float>(n) && a[count - 1] == static_cast<float>(n),
             "nonblocking: all_reduce sum result");
  rep.expect(b[0] == 2.0f, "nonblocking: all_reduce max result");
  // rg was issued after rb, so it gathered b's reduced (unchanged) values.
  rep.expect(gathered[count * static_cast<std::size_t>(n) - 1] == 2.0f,
             "nonblocking: all_gather result");
  // test() eventually says done, and a completed request can be waited again.
  auto rt = c.barrier_async();
  const auto start = std::chrono::steady_clock::now();
  while (!rt.test()) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
      rep.expect(false, "nonblocking: barrier_async never completed");
      break;
    }
  }
  rt.wait();
  typename C::request_type empty;
  rep.expect(empty.test(), "nonblocking: a default request is complete");
  empty.wait();
}

// Everything.
template <comm::comm_backend C>
report run_all(C& c, const suite_options& opt = {}) {
  report rep;
  rep.rank = c.rank();
  collectives(c, rep, opt);
  split_groups(c, rep);
  nonblocking(c, rep);
  c.barrier();
  return rep;
}

}  // namespace strata::conformance
