// SPDX-License-Identifier: Apache-2.0
// bench_collectives: the time and bandwidth of strata's collectives, in the shape of nccl-tests,
// with the baselines measured in the same run.
//
//   bench_collectives --backend threads --ranks 2        threads backend; raw MPI baseline from a
//                                                        child `mpiexec -n 2` of this binary
//   mpiexec -n 2 bench_collectives --backend mpi         strata's MPI backend and raw MPI, same
//                                                        processes, same buffers, in turns
//   ... --min 4K --max 64M --ops all_reduce,all_gather --place both --json out.json
//   ... --fingerprint always|sampled|off      the MPI backend's check mode (default: the
//                                             library's); with --backend mpi the same calls run
//                                             with fingerprints off too, in turns, and a second
//                                             table prints what the checks add per call
//
// Columns: size (bytes of the largest buffer, as nccl-tests), time (us per call, max over ranks,
// median of repeats), algbw = size / time, busbw = algbw x factor(op, n), #wrong (elements that
// differ from the reference in a checked call), then the baseline's time and busbw and the ratio
// of busbw. all_reduce and all_gather run out of place and in place (column "place"; the
// baseline with MPI_IN_PLACE), as nccl-tests does. Formulas: docs/benchmarks.md.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <strata/comm/collectives.hpp>
#include <strata/comm/mpi.hpp>
#include <strata/comm/threads.hpp>

// The baseline calls Open MPI directly (comm/mpi.hpp includes <mpi.h>).

namespace {

namespace sc = strata::comm;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string backend = "threads";
  int ranks = 2;
  std::size_t min_bytes = 4 << 10;
  std::size_t max_bytes = 64 << 20;
  std::vector<std::string> ops{"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                               "send_recv"};
  std::string json_path;
  bool baseline = true;
  double seconds_per_size = 0.25;
  std::string place = "both";                       // out | in | both (all_reduce and all_gather)
  std::optional<sc::fingerprint_mode> fingerprint;  // the MPI backend's; unset: the default
  std::string self;                                 // argv[0], to launch the baseline
};

struct row {
  std::string op;
  bool in_place = false;
  std::size_t bytes = 0;
  double seconds = 0.0;
  std::size_t wrong = 0;
};

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") {
    return 2.0 * (n - 1) / n;
  }
  if (op == "reduce_scatter" || op == "all_gather") {
    return static_cast<double>(n - 1) / n;
  }
  return 1.0;  // broadcast, send_recv
}

std::size_t parse_size(const std::string& text) {
  std::size_t value = std::stoull(text);
  const char unit = text.empty() ? ' ' : text.back();
  if (unit == 'K' || unit == 'k') {
    value <<= 10;
  } else if (unit == 'M' || unit == 'm') {
    value <<= 20;
  } else if (unit == 'G' || unit == 'g') {
    value <<= 30;
  }
  return value;
}

std::vector<std::size_t> sizes(const options& o) {
  std::vector<std::size_t> out;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes; s *= 4) {
    out.push_back(s);
  }
  return out;
}

// The places an op is measured in: in place only where both strata and MPI have it with the
// same meaning (all_reduce: one buffer; all_gather: the input is this rank's block of the output).
std::vector<bool> places(const options& o, const std::string& op) {
  const bool both_ways = op == "all_reduce" || op == "all_gather";
  std::vector<bool> out;
  if (o.place != "in" || !both_ways) {
    out.push_back(false);
  }
  if (o.place != "out" && both_ways) {
    out.push_back(true);
  }
  return out;
}

// One operation of the sweep over float buffers of `bytes` (the largest buffer of the call).
// `call` runs the operation once; buffers are set up by the caller.
struct op_buffers {
  std::vector<float> in;
  std::vector<float> out;
};

// The number of calls that take about `seconds`, agreed by all ranks (the max of local guesses).
template <class AllMax>
int agree_iterations(double one_call_seconds, double seconds, AllMax&& all_max) {
  double guess = one_call_seconds > 0 ? seconds / one_call_seconds : 1000.0;
  guess = std::clamp(guess, 5.0, 20000.0);
  return static_cast<int>(all_max(guess));
}

// run(op, in_place, buffers) performs one call (in place: on `out` alone).
using runner = std::function<void(const std::string&, bool, op_buffers&)>;

// Runs every op and size on one or more runners (strata, raw MPI) through all_max(x), a max
// all-reduce of a double, and barrier(); returns each runner's rows. With several runners each
// size is timed in turns, a block of calls of each runner after the other, so that slow spells
// of the machine hit them alike.
template <class AllMax, class Barrier>
std::vector<std::vector<row>> sweep_many(const options& o, int rank, int n,
                                         const std::vector<runner>& runs, AllMax&& all_max,
                                         Barrier&& barrier) {
  constexpr int turns = 11;
  std::vector<std::vector<row>> rows(runs.size());
  for (const auto& op : o.ops) {
    if (op == "send_recv" && n < 2) {
      continue;
    }
    for (const bool in_place : places(o, op)) {
      for (const std::size_t bytes : sizes(o)) {
        const std::size_t total = bytes / sizeof(float);
        const auto un = static_cast<std::size_t>(n);
        op_buffers b;
        std::size_t in_count = total;
        std::size_t out_count = total;
        if (op == "reduce_scatter") {
          out_count = total / un;
          in_count = out_count * un;
        } else if (op == "all_gather") {
          in_count = total / un;
          out_count = in_count * un;
        }
        std::vector<std::size_t> wrong(runs.size(), 0);
        std::vector<int> per_chunk(runs.size(), 1);
        for (std::size_t k = 0; k < runs.size(); ++k) {
          const runner& run = runs[k];
          b.in.assign(in_count, 0.0f);
          b.out.assign(out_count, 0.0f);
          // Correctness: inputs rank + 1 (+ index pattern), checked once.
          for (std::size_t i = 0; i < in_count; ++i) {
            b.in[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 3);
          }
          if (in_place) {  // the input where the call reads it: all of `out`, or this rank's block
            const std::size_t at =
                op == "all_gather" ? static_cast<std::size_t>(rank) * in_count : 0;
            std::copy(b.in.begin(), b.in.end(), b.out.begin() + static_cast<std::ptrdiff_t>(at));
          }
          run(op, in_place, b);
          const float rank_sum = static_cast<float>(n * (n + 1) / 2);
          for (std::size_t i = 0; i < out_count; ++i) {
            float want = 0.0f;
            if (op == "all_reduce") {
              want = rank_sum + static_cast<float>(n) * static_cast<float>(i % 3);
            } else if (op == "reduce_scatter") {
              const std::size_t g = static_cast<std::size_t>(rank) * out_count + i;
              want = rank_sum + static_cast<float>(n) * static_cast<float>(g % 3);
            } else if (op == "all_gather") {
              const std::size_t src = in_count == 0 ? 0 : i / in_count;
              want = static_cast<float>(src + 1) + static_cast<float>((i % in_count) % 3);
            } else if (op == "broadcast") {
              want = 1.0f + static_cast<float>(i % 3);  // from root 0
            } else {                                    // send_recv: ring, from the left neighbour
              const int left = (rank + n - 1) % n;
              want = static_cast<float>(left + 1) + static_cast<float>(i % 3);
            }
            wrong[k] += b.out[i] == want ? 0 : 1;
          }
          // Warm-up apart from measurement.
          barrier();
          const auto t0 = clock_type::now();
          run(op, in_place, b);
          run(op, in_place, b);
          const double warm = std::chrono::duration<double>(clock_type::now() - t0).count() / 2;
          per_chunk[k] = std::max(1, agree_iterations(warm, o.seconds_per_size, all_max) / turns);
        }
        // Repeats: `turns` blocks of calls per runner, in turns, the order reversed every other
        // turn (a block right after another runner's is slightly slower); the median block counts.
        std::vector<std::vector<double>> repeats(runs.size());
        for (int c = 0; c < turns; ++c) {
          for (std::size_t j = 0; j < runs.size(); ++j) {
            const std::size_t k = c % 2 == 0 ? j : runs.size() - 1 - j;
            barrier();
            const auto start = clock_type::now();
            for (int i = 0; i < per_chunk[k]; ++i) {
              runs[k](op, in_place, b);
            }
            const double local = std::chrono::duration<double>(clock_type::now() - start).count();
            repeats[k].push_back(all_max(local) / per_chunk[k]);
          }
        }
        for (std::size_t k = 0; k < runs.size(); ++k) {
          std::sort(repeats[k].begin(), repeats[k].end());
          rows[k].push_back(
              row{.op = op,
                  .in_place = in_place,
                  .bytes = bytes,
                  .seconds = repeats[k][repeats[k].size() / 2],
                  .wrong = static_cast<std::size_t>(all_max(static_cast<double>(wrong[k])))});
        }
      }
    }
  }
  return rows;
}

// ---- strata backends ----------------------------------------------------------------------------

template <sc::comm_backend C>
runner strata_runner(C& c) {
  const int n = c.size();
  const int rank = c.rank();
  return [&c, n, rank](const std::string& op, bool in_place, op_buffers& b) {
    if (op == "all_reduce" && in_place) {
      sc::all_reduce(c, b.out, sc::reduce_op::sum);
    } else if (op == "all_gather" && in_place) {
      const std::size_t block = b.out.size() / static_cast<std::size_t>(n);
      sc::all_gather(
          c, std::span<const float>(b.out).subspan(static_cast<std::size_t>(rank) * block, block),
          b.out);
    } else if (op == "all_reduce") {
      sc::all_reduce(c, std::span<const float>(b.in), b.out, sc::reduce_op::sum);
    } else if (op == "reduce_scatter") {
      sc::reduce_scatter(c, std::span<const float>(b.in), b.out, sc::reduce_op::sum);
    } else if (op == "all_gather") {
      sc::all_gather(c, std::span<const float>(b.in), b.out);
    } else if (op == "broadcast") {
      if (rank == 0) {
        std::copy(b.in.begin(), b.in.end(), b.out.begin());
      }
      sc::broadcast(c, b.out, 0);
    } else {
      auto r = sc::send_async(c, std::span<const float>(b.in), (rank + 1) % n, 1);
      sc::recv(c, b.out, (rank + n - 1) % n, 1);
      r.wait();
    }
  };
}

template <sc::comm_backend C>
std::vector<row> sweep_strata(const options& o, C& c) {
  auto all_max = [&](double x) {
    std::vector<double> v{x};
    sc::all_reduce(c, v, sc::reduce_op::max);
    return v[0];
  };
  auto barrier = [&] { c.barrier(); };
  return sweep_many(o, c.rank(), c.size(), {strata_runner(c)}, all_max, barrier)[0];
}

// ---- the bare reduction, the limit of all_reduce -------------------------------------------

// all_reduce as plain loops: n threads, thread r sums slice r of every input and stores the sum
// into every output, between two spin barriers; no checks, no fingerprint, no bookkeeping. What
// the memory system allows for the same traffic as the threads backend's algorithm.
std::vector<row> sweep_bare(const options& o) {
  const int n = o.ranks;
  const auto un = static_cast<std::size_t>(n);
  const bool crowded = static_cast<unsigned>(n) > std::max(1u, std::thread::hardware_concurrency());
  std::vector<row> rows;
  for (const bool in_place : places(o, "all_reduce")) {
    for (const std::size_t bytes : sizes(o)) {
      const std::size_t count = bytes / sizeof(float);
      std::vector<std::vector<float>> in(un, std::vector<float>(count));
      std::vector<std::vector<float>> out(un, std::vector<float>(count));
      for (std::size_t q = 0; q < un; ++q) {
        std::fill(in[q].begin(), in[q].end(), static_cast<float>(q + 1));
        std::fill(out[q].begin(), out[q].end(), static_cast<float>(q + 1));
      }
      std::vector<const float*> inputs(un);
      std::vector<float*> outputs(un);
      for (std::size_t q = 0; q < un; ++q) {
        outputs[q] = out[q].data();
        inputs[q] = in_place ? out[q].data() : in[q].data();
      }
      std::atomic<std::uint64_t> arrived{0};
      auto barrier = [&](std::uint64_t& generation) {
        ++generation;
        arrived.fetch_add(1, std::memory_order_acq_rel);
        while (arrived.load(std::memory_order_acquire) < generation * un) {
          if (crowded) {
            std::this_thread::yield();
          }
        }
      };
      // Blocks of 64 floats with a fixed trip count (so that the loops vectorize); the last slice
      // takes the tail element by element.
      auto reduce_slice = [&](std::size_t r) {
        constexpr std::size_t block = 64;
        const float* const* from = inputs.data();
        float* const* to = outputs.data();
        const std::size_t lo = count * r / un / block * block;
        const std::size_t hi = r + 1 == un ? count : count * (r + 1) / un / block * block;
        std::size_t i = lo;
        for (; i + block <= hi; i += block) {
          alignas(64) float sum[block];
          for (std::size_t e = 0; e < block; ++e) {
            sum[e] = from[0][i + e];
          }
          for (std::size_t q = 1; q < un; ++q) {
            for (std::size_t e = 0; e < block; ++e) {
              sum[e] += from[q][i + e];
            }
          }
          for (std::size_t q = 0; q < un; ++q) {
            for (std::size_t e = 0; e < block; ++e) {
              to[q][i + e] = sum[e];
            }
          }
        }
        for (; i < hi; ++i) {
          float sum = from[0][i];
          for (std::size_t q = 1; q < un; ++q) {
            sum += from[q][i];
          }
          for (std::size_t q = 0; q < un; ++q) {
            to[q][i] = sum;
          }
        }
      };
      std::atomic<int> iterations{0};
      std::size_t wrong = 0;
      std::vector<double> repeats;
      std::vector<std::thread> pool;
      for (std::size_t r = 0; r < un; ++r) {
        pool.emplace_back([&, r] {
          std::uint64_t generation = 0;
          // One checked call: every output holds 1 + 2 + ... + n (the inputs are q + 1).
          barrier(generation);
          reduce_slice(r);
          barrier(generation);
          if (r == 0) {
            const auto want = static_cast<float>(un * (un + 1) / 2);
            for (const auto& o_q : out) {
              wrong += static_cast<std::size_t>(
                  std::count_if(o_q.begin(), o_q.end(), [want](float v) { return v != want; }));
            }
          }
          barrier(generation);
          const auto t0 = clock_type::now();
          reduce_slice(r);
          reduce_slice(r);
          barrier(generation);
          if (r == 0) {
            const double warm = std::chrono::duration<double>(clock_type::now() - t0).count() / 2;
            iterations = agree_iterations(warm, o.seconds_per_size, [](double x) { return x; });
          }
          barrier(generation);
          const int per_chunk = std::max(1, iterations.load() / 5);
          for (int c = 0; c < 5; ++c) {
            barrier(generation);
            const auto start = clock_type::now();
            for (int i = 0; i < per_chunk; ++i) {
              reduce_slice(r);
              barrier(generation);
            }
            if (r == 0) {
              repeats.push_back(std::chrono::duration<double>(clock_type::now() - start).count() /
                                per_chunk);
            }
          }
        });
      }
      for (auto& t : pool) {
        t.join();
      }
      std::sort(repeats.begin(), repeats.end());
      rows.push_back(row{.op = "all_reduce",
                         .in_place = in_place,
                         .bytes = bytes,
                         .seconds = repeats[repeats.size() / 2],
                         .wrong = wrong});
    }
  }
  return rows;
}

// ---- raw MPI, the baseline ---------------------------------------------------------------------

runner raw_mpi_runner() {
  int rank = 0;
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return [rank, n](const std::string& op, bool in_place, op_buffers& b) {
    const int in = static_cast<int>(b.in.size());
    const int out = static_cast<int>(b.out.size());
    if (op == "all_reduce" && in_place) {
      MPI_Allreduce(MPI_IN_PLACE, b.out.data(), out, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "all_gather" && in_place) {
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.out.data(), in, MPI_FLOAT,
                    MPI_COMM_WORLD);
    } else if (op == "all_reduce") {
      MPI_Allreduce(b.in.data(), b.out.data(), in, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "reduce_scatter") {
      MPI_Reduce_scatter_block(b.in.data(), b.out.data(), out, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op == "all_gather") {
      MPI_Allgather(b.in.data(), in, MPI_FLOAT, b.out.data(), in, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op == "broadcast") {
      if (rank == 0) {
        std::copy(b.in.begin(), b.in.end(), b.out.begin());
      }
      MPI_Bcast(b.out.data(), out, MPI_FLOAT, 0, MPI_COMM_WORLD);
    } else {
      MPI_Sendrecv(b.in.data(), in, MPI_FLOAT, (rank + 1) % n, 1, b.out.data(), out, MPI_FLOAT,
                   (rank + n - 1) % n, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  };
}

double raw_all_max(double x) {
  double y = 0.0;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return y;
}

void raw_barrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

// Raw MPI alone (the baseline of the threads backend, in a child mpiexec), or raw MPI and
// strata's MPI backend (each communicator given) in the same processes and buffers, in turns:
// {raw rows, rows of each communicator}.
std::vector<std::vector<row>> sweep_mpi(const options& o, const std::vector<sc::mpi*>& strata) {
  int rank = 0;
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<runner> runs{raw_mpi_runner()};
  for (sc::mpi* c : strata) {
    runs.push_back(strata_runner(*c));
  }
  return sweep_many(o, rank, n, runs, raw_all_max, raw_barrier);
}

// ---- output -------------------------------------------------------------------------------------

double memcpy_bandwidth() {
  const std::size_t bytes = 64 << 20;
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = clock_type::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return static_cast<double>(bytes) / best / 1e9;
}

nlohmann::json to_json(const std::vector<row>& rows, int n) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    const double algbw = static_cast<double>(r.bytes) / r.seconds / 1e9;
    out.push_back({{"op", r.op},
                   {"in_place", r.in_place},
                   {"bytes", r.bytes},
                   {"time_us", r.seconds * 1e6},
                   {"algbw_gbs", algbw},
                   {"busbw_gbs", algbw * bus_factor(r.op, n)},
                   {"wrong", r.wrong}});
  }
  return out;
}

std::vector<row> from_json(const nlohmann::json& j) {
  std::vector<row> rows;
  for (const auto& e : j) {
    rows.push_back(row{.op = e.at("op").get<std::string>(),
                       .in_place = e.value("in_place", false),
                       .bytes = e.at("bytes").get<std::size_t>(),
                       .seconds = e.at("time_us").get<double>() / 1e6,
                       .wrong = e.at("wrong").get<std::size_t>()});
  }
  return rows;
}

void print_table(const std::string& title, const std::vector<row>& rows, int n,
                 const std::vector<row>* baseline, const std::string& baseline_name,
                 double copy_gbs, const std::vector<row>* bare = nullptr) {
  std::printf("\n# %s, %d ranks; baseline: %s; single-thread memcpy %.2f GB/s\n", title.c_str(), n,
              baseline_name.c_str(), copy_gbs);
  if (bare != nullptr) {
    std::printf(
        "# bare: all_reduce as plain loops on %d threads (same traffic, no checks); "
        "of-bare = bare time / strata time\n",
        n);
  }
  std::printf("%-15s %5s %12s %11s %9s %9s %7s %11s %9s %8s", "op", "place", "size(B)", "time(us)",
              "algbw", "busbw", "#wrong", "base(us)", "base-bus", "ratio");
  std::printf(bare != nullptr ? " %10s %7s\n" : "\n", "bare(us)", "of-bare");
  for (const auto& r : rows) {
    const double algbw = static_cast<double>(r.bytes) / r.seconds / 1e9;
    const double busbw = algbw * bus_factor(r.op, n);
    const row* b = nullptr;
    if (baseline != nullptr) {
      for (const auto& x : *baseline) {
        if (x.op == r.op && x.in_place == r.in_place && x.bytes == r.bytes) {
          b = &x;
        }
      }
    }
    if (b != nullptr) {
      const double bbus = static_cast<double>(b->bytes) / b->seconds / 1e9 * bus_factor(b->op, n);
      std::printf("%-15s %5s %12zu %11.2f %9.2f %9.2f %7zu %11.2f %9.2f %7.2fx", r.op.c_str(),
                  r.in_place ? "in" : "out", r.bytes, r.seconds * 1e6, algbw, busbw, r.wrong,
                  b->seconds * 1e6, bbus, busbw / bbus);
    } else {
      std::printf("%-15s %5s %12zu %11.2f %9.2f %9.2f %7zu %11s %9s %8s", r.op.c_str(),
                  r.in_place ? "in" : "out", r.bytes, r.seconds * 1e6, algbw, busbw, r.wrong, "-",
                  "-", "-");
    }
    if (bare != nullptr) {
      const row* limit = nullptr;
      for (const auto& x : *bare) {
        if (x.op == r.op && x.in_place == r.in_place && x.bytes == r.bytes) {
          limit = &x;
        }
      }
      if (limit != nullptr && limit->wrong != 0) {
        std::printf(" %10s %7s", "wrong", "-");  // a limit that computed garbage is no limit
      } else if (limit != nullptr) {
        std::printf(" %10.2f %6.0f%%", limit->seconds * 1e6, 100.0 * limit->seconds / r.seconds);
      }
    }
    std::printf("\n");
  }
}

const char* fingerprint_name(sc::fingerprint_mode m) {
  return m == sc::fingerprint_mode::always    ? "always"
         : m == sc::fingerprint_mode::sampled ? "sampled"
                                              : "off";
}

// What the fingerprint checks add to each call: the same communicator kind with checks off,
// measured in turns with the checked one.
void print_check_cost(const std::vector<row>& checked, const std::vector<row>& off,
                      sc::fingerprint_mode mode) {
  std::printf("\n# cost of fingerprint = %s: the same calls with fingerprint = off, in turns\n",
              fingerprint_name(mode));
  std::printf("%-15s %5s %12s %11s %11s %11s %8s\n", "op", "place", "size(B)", "checked(us)",
              "off(us)", "added(us)", "ratio");
  for (const auto& r : checked) {
    for (const auto& x : off) {
      if (x.op == r.op && x.in_place == r.in_place && x.bytes == r.bytes) {
        std::printf("%-15s %5s %12zu %11.2f %11.2f %11.2f %7.3fx\n", r.op.c_str(),
                    r.in_place ? "in" : "out", r.bytes, r.seconds * 1e6, x.seconds * 1e6,
                    (r.seconds - x.seconds) * 1e6, r.seconds / x.seconds);
      }
    }
  }
}

options parse(int argc, char** argv) {
  options o;
  o.self = argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_collectives: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--backend") {
      o.backend = next();
    } else if (a == "--ranks") {
      o.ranks = std::stoi(next());
    } else if (a == "--min") {
      o.min_bytes = parse_size(next());
    } else if (a == "--max") {
      o.max_bytes = parse_size(next());
    } else if (a == "--json") {
      o.json_path = next();
    } else if (a == "--no-baseline") {
      o.baseline = false;
    } else if (a == "--place") {
      o.place = next();
      if (o.place != "out" && o.place != "in" && o.place != "both") {
        std::fprintf(stderr, "bench_collectives: --place must be out, in or both, not '%s'\n",
                     o.place.c_str());
        std::exit(2);
      }
    } else if (a == "--fingerprint") {
      const std::string mode = next();
      if (mode == "always") {
        o.fingerprint = sc::fingerprint_mode::always;
      } else if (mode == "sampled") {
        o.fingerprint = sc::fingerprint_mode::sampled;
      } else if (mode == "off") {
        o.fingerprint = sc::fingerprint_mode::off;
      } else {
        std::fprintf(stderr,
                     "bench_collectives: --fingerprint must be always, sampled or off, not '%s'\n",
                     mode.c_str());
        std::exit(2);
      }
    } else if (a == "--seconds") {
      o.seconds_per_size = std::stod(next());
    } else if (a == "--ops") {
      o.ops.clear();
      std::stringstream list(next());
      for (std::string op; std::getline(list, op, ',');) {
        o.ops.push_back(op);
      }
    } else {
      std::fprintf(stderr,
                   "bench_collectives: unknown argument '%s'\n"
                   "usage: bench_collectives [--backend threads|mpi|raw-mpi] [--ranks N] "
                   "[--min 4K] [--max 64M] [--ops a,b] [--place out|in|both] [--seconds S] "
                   "[--fingerprint always|sampled|off] [--json FILE] "
                   "[--no-baseline]\n",
                   a.c_str());
      std::exit(2);
    }
  }
  return o;
}

// Runs this binary under mpiexec in raw-mpi mode and reads its rows.
std::optional<std::vector<row>> launch_raw_mpi(const options& o) {
  const std::string out = "/tmp/strata_bench_raw_mpi_" + std::to_string(::getpid()) + ".json";
  std::string ops;
  for (const auto& op : o.ops) {
    ops += (ops.empty() ? "" : ",") + op;
  }
  const std::string cmd = "mpiexec --allow-run-as-root --oversubscribe -n " +
                          std::to_string(o.ranks) + " " + o.self + " --backend raw-mpi --min " +
                          std::to_string(o.min_bytes) + " --max " + std::to_string(o.max_bytes) +
                          " --ops " + ops + " --place " + o.place + " --seconds " +
                          std::to_string(o.seconds_per_size) + " --json " + out + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) {
    return std::nullopt;
  }
  std::ifstream in(out);
  if (!in) {
    return std::nullopt;
  }
  const auto j = nlohmann::json::parse(in);
  std::remove(out.c_str());
  return from_json(j.at("rows"));
}

void write_json(const options& o, const std::string& backend, int n, const std::vector<row>& rows,
                const std::vector<row>* baseline, double copy_gbs,
                const std::vector<row>* bare = nullptr) {
  if (o.json_path.empty()) {
    return;
  }
  nlohmann::json j{
      {"backend", backend}, {"ranks", n}, {"memcpy_gbs", copy_gbs}, {"rows", to_json(rows, n)}};
  if (baseline != nullptr) {
    j["baseline"] = {{"name", "raw MPI (Open MPI)"}, {"rows", to_json(*baseline, n)}};
  }
  if (bare != nullptr) {
    j["bare"] = {{"name", "all_reduce as plain loops on threads"}, {"rows", to_json(*bare, n)}};
  }
  std::ofstream(o.json_path) << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (o.backend == "threads") {
    std::vector<row> rows;
    sc::threads::run(
        o.ranks,
        [&](sc::threads& c) {
          auto mine = sweep_strata(o, c);
          if (c.rank() == 0) {
            rows = std::move(mine);
          }
        },
        sc::comm_config{.timeout = 120.0, .fingerprint = sc::fingerprint_mode::sampled});
    std::optional<std::vector<row>> baseline;
    if (o.baseline) {
      baseline = launch_raw_mpi(o);
      if (!baseline) {
        std::fprintf(stderr, "bench_collectives: the raw MPI baseline could not be run\n");
      }
    }
    const double copy = memcpy_bandwidth();
    const bool reduces = std::find(o.ops.begin(), o.ops.end(), "all_reduce") != o.ops.end();
    const std::vector<row> bare = reduces ? sweep_bare(o) : std::vector<row>{};
    print_table("strata threads backend", rows, o.ranks, baseline ? &*baseline : nullptr,
                baseline ? "raw MPI (Open MPI), same sizes, separate processes" : "none", copy,
                reduces ? &bare : nullptr);
    write_json(o, "threads", o.ranks, rows, baseline ? &*baseline : nullptr, copy,
               reduces ? &bare : nullptr);
    return 0;
  }
  if (o.backend == "raw-mpi" || o.backend == "mpi") {
    const sc::mpi_environment environment(argc, argv);
    int rank = 0;
    int n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (o.backend == "raw-mpi") {
      const auto raw = sweep_mpi(o, {})[0];
      if (rank == 0) {
        write_json(o, "raw-mpi", n, raw, nullptr, 0.0);
      }
      return 0;
    }
    std::vector<row> raw;
    std::vector<row> rows;
    std::vector<row> unchecked;
    sc::comm_config checked_config{.timeout = 120.0};
    if (o.fingerprint) {
      checked_config.fingerprint = *o.fingerprint;
    }
    const sc::fingerprint_mode mode = checked_config.fingerprint;
    {
      auto world = sc::mpi::world(checked_config);
      auto world_off = sc::mpi::world(
          sc::comm_config{.timeout = 120.0, .fingerprint = sc::fingerprint_mode::off});
      std::vector<sc::mpi*> comms{&world};
      if (mode != sc::fingerprint_mode::off) {
        comms.push_back(&world_off);
      }
      auto all = sweep_mpi(o, comms);
      raw = std::move(all[0]);
      rows = std::move(all[1]);
      if (all.size() > 2) {
        unchecked = std::move(all[2]);
      }
    }
    if (rank == 0) {
      const double copy = memcpy_bandwidth();
      const std::string title =
          std::string("strata MPI backend, fingerprint = ") + fingerprint_name(mode);
      print_table(title, rows, n, &raw, "raw MPI, same processes and buffers", copy);
      if (!unchecked.empty()) {
        print_check_cost(rows, unchecked, mode);
      }
      write_json(o, "mpi", n, rows, &raw, copy);
    }
    return 0;
  }
  std::fprintf(stderr, "bench_collectives: backend '%s' is not available here (threads | mpi)\n",
               o.backend.c_str());
  return 2;
}
