// SPDX-License-Identifier: Apache-2.0
// The all-reduce algorithms over point-to-point messages (ring, recursive halving/doubling,
// hierarchical, automatic, and the selector) on 1 to 5 ranks of the threads backend: every dtype,
// every reduce_op, counts 0, 1, 7, 1000 and 1031, in place and out of place, against a serial
// reference; results bit-identical on every rank; the hierarchical form equal to the flat one.
// Rank threads never assert: each rank records its failures, reported after the run.
#include "strata/comm/algorithms.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "conformance/reference.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/reduce.hpp"
#include "strata/comm/threads.hpp"
#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace {

namespace comm = strata::comm;
using comm::all_reduce_algorithm;
using comm::all_reduce_config;
using comm::reduce_op;
using strata::dtype;
using strata::conformance::expected;
using strata::conformance::value;

constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max,
                                 reduce_op::prod};
const std::vector<std::size_t> test_counts{0, 1, 7, 1000, 1031};

comm::comm_config test_config() {
  return comm::comm_config{.timeout = 120.0, .fingerprint = comm::fingerprint_mode::always};
}

// What one rank saw; rank threads record, the test thread asserts.
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

// Runs fn(comm, log) on n ranks of the threads backend and reports what every rank recorded.
template <class Fn>
void on_ranks(int n, Fn&& fn) {
  std::vector<rank_log> logs(static_cast<std::size_t>(n));
  comm::threads::run(
      n,
      [&](comm::threads& c) {
        rank_log& log = logs[static_cast<std::size_t>(c.rank())];
        log.rank = c.rank();
        try {
          fn(c, log);
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

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::string show(const T& v) {
  if constexpr (std::is_same_v<T, strata::float16> || std::is_same_v<T, strata::bfloat16>) {
    return std::to_string(static_cast<float>(v));
  } else {
    return std::to_string(v);
  }
}

// An all-reduce under test: run(comm, send, recv, count, dtype, op).
template <class C, class T, class Run>
void check_dtype(C& c, int world_size, const Run& run, rank_log& log, const std::string& name) {
  const std::string type(strata::to_string(strata::dtype_of<T>));
  for (reduce_op op : all_ops) {
    for (std::size_t count : test_counts) {
      const std::string what = name + " " + type + " " + std::string(comm::to_string(op)) + " x " +
                               std::to_string(count);
      // In place.
      std::vector<T> data(count);
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = value<T>(c.rank(), i, op);
      }
      run(c, data.data(), data.data(), count, strata::dtype_of<T>, op);
      std::size_t wrong = 0;
      std::size_t first = 0;
      for (std::size_t i = 0; i < count; ++i) {
        if (!same_bits(data[i], expected<T>(world_size, i, op)) && wrong++ == 0) {
          first = i;
        }
      }
      log.expect(wrong == 0, what + " in place: " + std::to_string(wrong) + " wrong, first at " +
                                 std::to_string(first) +
                                 (wrong != 0 ? " (" + show(data[first]) + " vs " +
                                                   show(expected<T>(world_size, first, op)) + ")"
                                             : std::string{}));
      // Out of place: the input is left alone.
      std::vector<T> in(count);
      for (std::size_t i = 0; i < count; ++i) {
        in[i] = value<T>(c.rank(), i, op);
      }
      const std::vector<T> original = in;
      std::vector<T> out(count, T{});
      run(c, in.data(), out.data(), count, strata::dtype_of<T>, op);
      wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        if (!same_bits(out[i], expected<T>(world_size, i, op))) {
          ++wrong;
        }
      }
      log.expect(wrong == 0, what + " out of place: " + std::to_string(wrong) + " wrong");
      log.expect(count == 0 || std::memcmp(in.data(), original.data(), count * sizeof(T)) == 0,
                 what + " out of place changed the input");
    }
  }
}

template <class C, class Run>
void check_every_dtype(C& c, int world_size, Run&& run, rank_log& log, const std::string& name) {
  check_dtype<C, float>(c, world_size, run, log, name);
  check_dtype<C, double>(c, world_size, run, log, name);
  check_dtype<C, strata::float16>(c, world_size, run, log, name);
  check_dtype<C, strata::bfloat16>(c, world_size, run, log, name);
  check_dtype<C, std::int32_t>(c, world_size, run, log, name);
  check_dtype<C, std::int64_t>(c, world_size, run, log, name);
  check_dtype<C, std::uint8_t>(c, world_size, run, log, name);
}

// Chunks of 40 bytes: pieces of 1000 elements travel as many pipelined chunks.
const all_reduce_config small_chunks{.chunk_bytes = 40};

}  // namespace

TEST_CASE("automatic picks halving/doubling for small messages and the ring for large ones") {
  using comm::choose_all_reduce_algorithm;
  constexpr all_reduce_config defaults{};
  static_assert(choose_all_reduce_algorithm(4, 1000, 4) ==
                all_reduce_algorithm::recursive_halving_doubling);
  static_assert(choose_all_reduce_algorithm(4, defaults.small_message_bytes / 4, 4) ==
                all_reduce_algorithm::recursive_halving_doubling);
  static_assert(choose_all_reduce_algorithm(4, defaults.small_message_bytes / 4 + 1, 4) ==
                all_reduce_algorithm::ring);
  static_assert(choose_all_reduce_algorithm(5, std::size_t{1} << 24, 2) ==
                all_reduce_algorithm::ring);
  static_assert(choose_all_reduce_algorithm(1, std::size_t{1} << 24, 4) ==
                all_reduce_algorithm::recursive_halving_doubling);
  // Fewer elements than ranks: halving/doubling even when the elements are large.
  CHECK(choose_all_reduce_algorithm(8, 7, std::size_t{1} << 20) ==
        all_reduce_algorithm::recursive_halving_doubling);
  CHECK(choose_all_reduce_algorithm(2, 1000, 4, {.small_message_bytes = 100}) ==
        all_reduce_algorithm::ring);
}

TEST_CASE("even_partition cuts a buffer into pieces that differ by at most one, longer first") {
  const comm::even_partition p{.count = 10, .parts = 4};
  CHECK(p.offset(0) == 0);
  CHECK(p.length(0) == 3);
  CHECK(p.offset(1) == 3);
  CHECK(p.length(1) == 3);
  CHECK(p.offset(2) == 6);
  CHECK(p.length(2) == 2);
  CHECK(p.offset(3) == 8);
  CHECK(p.length(3) == 2);
  CHECK(p.offset(4) == 10);
  const comm::even_partition few{.count = 2, .parts = 3};
  CHECK(few.length(0) == 1);
  CHECK(few.length(1) == 1);
  CHECK(few.length(2) == 0);
  CHECK(few.offset(2) == 2);
  const comm::even_partition none{.count = 0, .parts = 5};
  CHECK(none.offset(5) == 0);
}

TEST_CASE("default_group_size is the largest divisor not above the square root") {
  CHECK(comm::default_group_size(1) == 1);
  CHECK(comm::default_group_size(2) == 1);
  CHECK(comm::default_group_size(4) == 2);
  CHECK(comm::default_group_size(6) == 2);
  CHECK(comm::default_group_size(8) == 2);
  CHECK(comm::default_group_size(9) == 3);
  CHECK(comm::default_group_size(12) == 3);
  CHECK(comm::default_group_size(16) == 4);
  CHECK(comm::default_group_size(7) == 1);
}

TEST_CASE("the algorithm names and the config print") {
  CHECK(comm::to_string(all_reduce_algorithm::native) == "native");
  CHECK(comm::to_string(all_reduce_algorithm::ring) == "ring");
  CHECK(comm::to_string(all_reduce_algorithm::recursive_halving_doubling) ==
        "recursive_halving_doubling");
  CHECK(comm::to_string(all_reduce_algorithm::hierarchical) == "hierarchical");
  CHECK(comm::to_string(all_reduce_algorithm::automatic) == "automatic");
  const all_reduce_config c{.chunk_bytes = 4096, .group_size = 2};
  CHECK(comm::to_string(c) ==
        "all_reduce_config{.chunk_bytes = 4096, .small_message_bytes = 65536, .group_size = 2, "
        ".cross = automatic, .narrow_floats = widen, .tag = 32000}");
  CHECK(c == all_reduce_config{.chunk_bytes = 4096, .group_size = 2});
  CHECK_FALSE(c == all_reduce_config{});
}

TEST_CASE("ring all-reduce: every dtype, op and count on 1 to 5 ranks") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    on_ranks(n, [n](comm::threads& c, rank_log& log) {
      check_every_dtype(
          c, n,
          [](comm::threads& cc, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
            comm::ring_all_reduce(cc, s, r, k, t, op, small_chunks);
          },
          log, "ring");
    });
  }
}

TEST_CASE("ring all-reduce with the default chunks over a message of several chunks") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    on_ranks(n, [n](comm::threads& c, rank_log& log) {
      const std::size_t count = 300007;  // > 256 KiB per piece for float on 2 and 3 ranks
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) {
        data[i] = static_cast<float>((i * 7 + static_cast<std::size_t>(c.rank())) % 13);
      }
      comm::ring_all_reduce(c, data.data(), data.data(), count, dtype::float32, reduce_op::sum);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0.0f;
        for (int r = 0; r < n; ++r) {
          want += static_cast<float>((i * 7 + static_cast<std::size_t>(r)) % 13);
        }
        wrong += data[i] == want ? 0 : 1;
      }
      log.expect(wrong == 0, std::to_string(wrong) + " wrong elements");
    });
  }
}

TEST_CASE("recursive halving/doubling all-reduce: every dtype, op and count on 1 to 5 ranks") {
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    on_ranks(n, [n](comm::threads& c, rank_log& log) {
      check_every_dtype(
          c, n,
          [](comm::threads& cc, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
            comm::recursive_halving_doubling_all_reduce(cc, s, r, k, t, op);
          },
          log, "recursive_halving_doubling");
    });
  }
}

TEST_CASE("hierarchical all-reduce with groups of 2 equals the flat result on 1 to 5 ranks") {
  // Groups of 2: uniform on 2 and 4 ranks, a shorter last group on 1, 3 and 5.
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    on_ranks(n, [n](comm::threads& c, rank_log& log) {
      auto groups = comm::make_hierarchy(c, 2);
      log.expect(groups.size() == n, "hierarchy size");
      log.expect(groups.uniform() == (n % 2 == 0 || n == 1), "hierarchy uniform()");
      log.expect(groups.local().size() == std::min(2, n - (c.rank() / 2) * 2), "local group size");
      log.expect(groups.local().rank() == c.rank() % 2, "local rank");
      check_every_dtype(
          c, n,
          [&groups](comm::threads&, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
            comm::hierarchical_all_reduce(groups, s, r, k, t, op, small_chunks);
          },
          log, "hierarchical(2)");
      // Against the flat algorithm on the same data, element for element.
      std::vector<double> flat(1031);
      std::vector<double> tiered(1031);
      for (std::size_t i = 0; i < flat.size(); ++i) {
        flat[i] = tiered[i] = value<double>(c.rank(), i, reduce_op::sum);
      }
      comm::ring_all_reduce(c, flat.data(), flat.data(), flat.size(), dtype::float64,
                            reduce_op::sum);
      comm::hierarchical_all_reduce(groups, tiered, reduce_op::sum);
      log.expect(flat == tiered, "hierarchical differs from ring");
    });
  }
}

TEST_CASE("hierarchical all-reduce from sub-communicators, every cross algorithm") {
  for (int n : {4, 5}) {
    CAPTURE(n);
    on_ranks(n, [n](comm::threads& c, rank_log& log) {
      // Groups of 2 made by hand: local = rank / 2, cross = rank % 2.
      comm::hierarchy<comm::threads> groups(c.split(c.rank() / 2, c.rank()),
                                            c.split(c.rank() % 2, c.rank()));
      log.expect(groups.size() == n, "hierarchy size");
      log.expect(groups.uniform() == (n == 4), "hierarchy uniform()");
      for (all_reduce_algorithm cross :
           {all_reduce_algorithm::ring, all_reduce_algorithm::recursive_halving_doubling,
            all_reduce_algorithm::native, all_reduce_algorithm::automatic}) {
        const all_reduce_config config{.chunk_bytes = 16, .cross = cross};
        check_dtype<comm::threads, float>(
            c, n,
            [&](comm::threads&, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
              comm::hierarchical_all_reduce(groups, s, r, k, t, op, config);
            },
            log, "hierarchical cross " + std::string(comm::to_string(cross)));
      }
    });
  }
}

TEST_CASE("all_reduce selects the algorithm per call, typed and untyped") {
  const all_reduce_algorithm algorithms[] = {
      all_reduce_algorithm::native, all_reduce_algorithm::ring,
      all_reduce_algorithm::recursive_halving_doubling, all_reduce_algorithm::hierarchical,
      all_reduce_algorithm::automatic};
  for (int n = 1; n <= 5; ++n) {
    CAPTURE(n);
    on_ranks(n, [&](comm::threads& c, rank_log& log) {
      for (all_reduce_algorithm a : algorithms) {
        const std::string name = "all_reduce(" + std::string(comm::to_string(a)) + ")";
        for (int group_size : {0, 2}) {
          const all_reduce_config config{.chunk_bytes = 64, .group_size = group_size};
          check_dtype<comm::threads, std::int32_t>(
              c, n,
              [&](comm::threads& cc, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
                comm::all_reduce(cc, s, r, k, t, op, a, config);
              },
              log, name);
        }
        // Typed, in place and out of place.
        std::vector<strata::bfloat16> data(777);
        for (std::size_t i = 0; i < data.size(); ++i) {
          data[i] = value<strata::bfloat16>(c.rank(), i, reduce_op::max);
        }
        const std::vector<strata::bfloat16> input = data;
        comm::all_reduce(c, data, reduce_op::max, a);
        std::vector<strata::bfloat16> out(input.size());
        comm::all_reduce(c, input, out, reduce_op::max, a);
        bool ok = true;
        for (std::size_t i = 0; i < data.size(); ++i) {
          const auto want = expected<strata::bfloat16>(n, i, reduce_op::max);
          ok = ok && same_bits(data[i], want) && same_bits(out[i], want);
        }
        log.expect(ok, name + " typed");
      }
    });
  }
}

TEST_CASE("the result is bit-identical on every rank for data that does not reduce exactly") {
  const all_reduce_algorithm algorithms[] = {all_reduce_algorithm::ring,
                                             all_reduce_algorithm::recursive_halving_doubling,
                                             all_reduce_algorithm::hierarchical};
  for (int n : {3, 4, 5}) {
    CAPTURE(n);
    for (all_reduce_algorithm a : algorithms) {
      CAPTURE(comm::to_string(a));
      for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::prod}) {
        CAPTURE(comm::to_string(op));
        const std::size_t count = 2053;
        std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
        std::vector<std::vector<strata::float16>> halves(static_cast<std::size_t>(n));
        on_ranks(n, [&](comm::threads& c, rank_log& log) {
          std::mt19937 rng(static_cast<unsigned>(c.rank()) * 7919u + 1u);
          std::uniform_real_distribution<float> dist(0.5f, 1.5f);
          std::vector<float> data(count);
          std::vector<strata::float16> half(count);
          for (std::size_t i = 0; i < count; ++i) {
            data[i] = dist(rng);
            half[i] = strata::float16(data[i]);
          }
          const all_reduce_config config{.chunk_bytes = 128, .group_size = 2};
          comm::all_reduce(c, data, op, a, config);
          comm::all_reduce(c, half, op, a, config);
          results[static_cast<std::size_t>(c.rank())] = data;
          halves[static_cast<std::size_t>(c.rank())] = half;
          log.expect(true, "ran");
        });
        // Every rank holds the same bits, close to the serial reduction in double.
        std::vector<std::vector<float>> inputs(static_cast<std::size_t>(n),
                                               std::vector<float>(count));
        for (int r = 0; r < n; ++r) {
          std::mt19937 rng(static_cast<unsigned>(r) * 7919u + 1u);
          std::uniform_real_distribution<float> dist(0.5f, 1.5f);
          for (std::size_t i = 0; i < count; ++i) {
            inputs[static_cast<std::size_t>(r)][i] = dist(rng);
          }
        }
        std::size_t differ = 0;
        std::size_t far = 0;
        std::size_t far_half = 0;
        for (std::size_t i = 0; i < count; ++i) {
          double want = op == reduce_op::prod ? 1.0 : 0.0;
          double want_half = want;
          for (int r = 0; r < n; ++r) {
            const double v = inputs[static_cast<std::size_t>(r)][i];
            const double h = static_cast<float>(strata::float16(static_cast<float>(v)));
            want = op == reduce_op::prod ? want * v : want + v;
            want_half = op == reduce_op::prod ? want_half * h : want_half + h;
          }
          if (op == reduce_op::avg) {
            want /= n;
            want_half /= n;
          }
          for (int r = 1; r < n; ++r) {
            const auto& a0 = results[0];
            const auto& ar = results[static_cast<std::size_t>(r)];
            const auto& h0 = halves[0];
            const auto& hr = halves[static_cast<std::size_t>(r)];
            differ += same_bits(a0[i], ar[i]) && same_bits(h0[i], hr[i]) ? 0 : 1;
          }
          far += std::abs(results[0][i] - want) <= 1e-5 * std::abs(want) ? 0 : 1;
          // float16 accumulates in float and is rounded once: half an ulp, 2^-11 relative.
          far_half +=
              std::abs(static_cast<float>(halves[0][i]) - want_half) <= 6e-4 * std::abs(want_half)
                  ? 0
                  : 1;
        }
        CHECK(differ == 0);
        CHECK(far == 0);
        CHECK(far_half == 0);
      }
    }
  }
}

TEST_CASE("the algorithms' messages do not mix with other tags") {
  on_ranks(3, [](comm::threads& c, rank_log& log) {
    const int right = (c.rank() + 1) % c.size();
    const int left = (c.rank() + c.size() - 1) % c.size();
    std::int64_t mine = 100 + c.rank();
    std::int64_t theirs = -1;
    // A user message in flight on tag 5 while the ring and halving/doubling run.
    auto sent = c.send_async(&mine, 1, dtype::int64, right, 5);
    std::vector<std::int64_t> data(50, c.rank() + 1);
    comm::ring_all_reduce(c, data.data(), data.data(), data.size(), dtype::int64, reduce_op::sum,
                          small_chunks);
    comm::recursive_halving_doubling_all_reduce(c, data.data(), data.data(), data.size(),
                                                dtype::int64, reduce_op::max);
    c.recv(&theirs, 1, dtype::int64, left, 5);
    sent.wait();
    log.expect(theirs == 100 + left, "user message on tag 5");
    log.expect(data == std::vector<std::int64_t>(50, 6), "all-reduce next to user messages");
  });
}

TEST_CASE("wrong arguments are invalid_argument on the calling rank") {
  on_ranks(2, [](comm::threads& c, rank_log& log) {
    std::vector<float> in(4);
    std::vector<float> out(5);
    try {
      comm::all_reduce(c, in, out, reduce_op::sum, all_reduce_algorithm::ring);
      log.expect(false, "sizes that differ were accepted");
    } catch (const strata::comm_error& e) {
      log.expect(e.kind() == strata::comm_error_kind::invalid_argument, e.what());
    }
    try {
      (void)comm::make_hierarchy(c, 0);
      log.expect(false, "group size 0 was accepted");
    } catch (const strata::comm_error& e) {
      log.expect(e.kind() == strata::comm_error_kind::invalid_argument, e.what());
    }
  });
}

TEST_CASE("a rank that fails inside an algorithm fails every rank instead of hanging") {
  for (all_reduce_algorithm a :
       {all_reduce_algorithm::ring, all_reduce_algorithm::recursive_halving_doubling}) {
    CAPTURE(comm::to_string(a));
    // Rank 1 throws at its fourth message of the call.
    const comm::scoped_faults faults{{.rank = 1,
                                      .op = comm::op_kind::send,
                                      .sequence = 3,
                                      .action = comm::fault_action::throw_error}};
    const auto outcomes = comm::threads::try_run(
        4,
        [a](comm::threads& c) {
          std::vector<float> data(4000, 1.0f);
          comm::all_reduce(c, data, reduce_op::sum, a, {.chunk_bytes = 400});
        },
        comm::comm_config{.timeout = 20.0});
    // Every rank ends with an error that names the failed rank (the fault of an asynchronous
    // send may surface on rank 1 itself through another of its requests, as peer_failed).
    REQUIRE(outcomes.size() == 4);
    for (std::size_t r = 0; r < outcomes.size(); ++r) {
      CAPTURE(r);
      REQUIRE(outcomes[r] != nullptr);
      try {
        std::rethrow_exception(outcomes[r]);
      } catch (const strata::error& e) {
        const std::string what = e.what();
        CHECK(what.find("rank 1") != std::string::npos);
      }
    }
  }
}

TEST_CASE("16-bit floats accumulate in float unless the config says in_type") {
  // 2048 + 1 + 1 + 1 + 1: float16 has a spacing of 2 at 2048, so only a float accumulation
  // reaches 2052 whatever the order; in_type rounds at each step.
  const all_reduce_algorithm algorithms[] = {all_reduce_algorithm::ring,
                                             all_reduce_algorithm::recursive_halving_doubling,
                                             all_reduce_algorithm::hierarchical};
  on_ranks(5, [&](comm::threads& c, rank_log& log) {
    for (all_reduce_algorithm a : algorithms) {
      const std::string name(comm::to_string(a));
      std::vector<strata::float16> data(9, strata::float16(c.rank() == 0 ? 2048.0f : 1.0f));
      comm::all_reduce(c, data, reduce_op::sum, a, {.chunk_bytes = 4, .group_size = 2});
      bool exact = true;
      for (const auto& v : data) {
        exact = exact && static_cast<float>(v) == 2052.0f;
      }
      log.expect(exact, name + " widen");
      // in_type: exact small integers still reduce exactly.
      const all_reduce_config in_type{
          .chunk_bytes = 4, .group_size = 2, .narrow_floats = comm::narrow_float_mode::in_type};
      check_dtype<comm::threads, strata::float16>(
          c, 5,
          [&](comm::threads& cc, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
            comm::all_reduce(cc, s, r, k, t, op, a, in_type);
          },
          log, name + " in_type");
      check_dtype<comm::threads, strata::bfloat16>(
          c, 5,
          [&](comm::threads& cc, const void* s, void* r, std::size_t k, dtype t, reduce_op op) {
            comm::all_reduce(cc, s, r, k, t, op, a, in_type);
          },
          log, name + " in_type");
    }
  });
}
