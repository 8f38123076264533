// SPDX-License-Identifier: Apache-2.0
// bench_collectives: the time and bandwidth of strata's collectives, in the shape of nccl-tests,
// with the baselines measured in the same run.
//
//   bench_collectives --backend threads --ranks 2        threads backend; raw MPI baseline from a
//                                                        child `mpiexec -n 2` of this binary
//   mpiexec -n 2 bench_collectives --backend mpi         strata's MPI backend and raw MPI, same
//                                                        processes, same buffers
//   ... --min 4K --max 64M --ops all_reduce,all_gather --json out.json
//
// Columns: size (bytes of the largest buffer, as nccl-tests), time (us per call, max over ranks,
// median of repeats), algbw = size / time, busbw = algbw x factor(op, n), #wrong (elements that
// differ from the reference in a checked call), then the baseline's time and busbw and the ratio
// of busbw. Formulas: docs/benchmarks.md.

#include <algorithm>
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
  std::string self;  // argv[0], to launch the baseline
};

struct row {
  std::string op;
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

// Runs one op on a backend (strata or raw MPI) through three callables:
// run(op, buffers) performs the call; all_max(x) is a max all-reduce of a double; barrier().
template <class Run, class AllMax, class Barrier>
std::vector<row> sweep(const options& o, int rank, int n, Run&& run, AllMax&& all_max,
                       Barrier&& barrier) {
  std::vector<row> rows;
  for (const auto& op : o.ops) {
    if (op == "send_recv" && n < 2) {
      continue;
    }
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
      b.in.assign(in_count, 0.0f);
      b.out.assign(out_count, 0.0f);
      // Correctness: inputs rank + 1 (+ index pattern), checked once.
      for (std::size_t i = 0; i < in_count; ++i) {
        b.in[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 3);
      }
      run(op, b);
      std::size_t wrong = 0;
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
        wrong += b.out[i] == want ? 0 : 1;
      }
      // Warm-up apart from measurement, then repeats.
      barrier();
      const auto t0 = clock_type::now();
      run(op, b);
      run(op, b);
      const double warm = std::chrono::duration<double>(clock_type::now() - t0).count() / 2;
      const int iters = agree_iterations(warm, o.seconds_per_size, all_max);
      std::vector<double> repeats;
      const int chunks = 5;
      const int per_chunk = std::max(1, iters / chunks);
      for (int c = 0; c < chunks; ++c) {
        barrier();
        const auto start = clock_type::now();
        for (int i = 0; i < per_chunk; ++i) {
          run(op, b);
        }
        const double local = std::chrono::duration<double>(clock_type::now() - start).count();
        repeats.push_back(all_max(local) / per_chunk);
      }
      std::sort(repeats.begin(), repeats.end());
      rows.push_back(row{.op = op,
                         .bytes = bytes,
                         .seconds = repeats[repeats.size() / 2],
                         .wrong = static_cast<std::size_t>(all_max(static_cast<double>(wrong)))});
    }
  }
  return rows;
}

// ---- strata backends ----------------------------------------------------------------------------

template <sc::comm_backend C>
std::vector<row> sweep_strata(const options& o, C& c) {
  const int n = c.size();
  const int rank = c.rank();
  auto run = [&](const std::string& op, op_buffers& b) {
    if (op == "all_reduce") {
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
  auto all_max = [&](double x) {
    std::vector<double> v{x};
    sc::all_reduce(c, v, sc::reduce_op::max);
    return v[0];
  };
  auto barrier = [&] { c.barrier(); };
  return sweep(o, rank, n, run, all_max, barrier);
}

// ---- raw MPI, the baseline ---------------------------------------------------------------------

std::vector<row> sweep_raw_mpi(const options& o) {
  int rank = 0;
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  auto run = [&](const std::string& op, op_buffers& b) {
    const int in = static_cast<int>(b.in.size());
    const int out = static_cast<int>(b.out.size());
    if (op == "all_reduce") {
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
  auto all_max = [&](double x) {
    double y = 0.0;
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return y;
  };
  auto barrier = [&] { MPI_Barrier(MPI_COMM_WORLD); };
  return sweep(o, rank, n, run, all_max, barrier);
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
                       .bytes = e.at("bytes").get<std::size_t>(),
                       .seconds = e.at("time_us").get<double>() / 1e6,
                       .wrong = e.at("wrong").get<std::size_t>()});
  }
  return rows;
}

void print_table(const std::string& title, const std::vector<row>& rows, int n,
                 const std::vector<row>* baseline, const std::string& baseline_name,
                 double copy_gbs) {
  std::printf("\n# %s, %d ranks; baseline: %s; single-thread memcpy %.2f GB/s\n", title.c_str(), n,
              baseline_name.c_str(), copy_gbs);
  std::printf("%-15s %12s %11s %9s %9s %7s %11s %9s %8s\n", "op", "size(B)", "time(us)", "algbw",
              "busbw", "#wrong", "base(us)", "base-bus", "ratio");
  for (const auto& r : rows) {
    const double algbw = static_cast<double>(r.bytes) / r.seconds / 1e9;
    const double busbw = algbw * bus_factor(r.op, n);
    const row* b = nullptr;
    if (baseline != nullptr) {
      for (const auto& x : *baseline) {
        if (x.op == r.op && x.bytes == r.bytes) {
          b = &x;
        }
      }
    }
    if (b != nullptr) {
      const double bbus = static_cast<double>(b->bytes) / b->seconds / 1e9 * bus_factor(b->op, n);
      std::printf("%-15s %12zu %11.2f %9.2f %9.2f %7zu %11.2f %9.2f %7.2fx\n", r.op.c_str(),
                  r.bytes, r.seconds * 1e6, algbw, busbw, r.wrong, b->seconds * 1e6, bbus,
                  busbw / bbus);
    } else {
      std::printf("%-15s %12zu %11.2f %9.2f %9.2f %7zu %11s %9s %8s\n", r.op.c_str(), r.bytes,
                  r.seconds * 1e6, algbw, busbw, r.wrong, "-", "-", "-");
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
                   "[--min 4K] [--max 64M] [--ops a,b] [--seconds S] [--json FILE] "
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
                          " --ops " + ops + " --seconds " + std::to_string(o.seconds_per_size) +
                          " --json " + out + " > /dev/null";
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
                const std::vector<row>* baseline, double copy_gbs) {
  if (o.json_path.empty()) {
    return;
  }
  nlohmann::json j{
      {"backend", backend}, {"ranks", n}, {"memcpy_gbs", copy_gbs}, {"rows", to_json(rows, n)}};
  if (baseline != nullptr) {
    j["baseline"] = {{"name", "raw MPI (Open MPI)"}, {"rows", to_json(*baseline, n)}};
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
    print_table("strata threads backend", rows, o.ranks, baseline ? &*baseline : nullptr,
                baseline ? "raw MPI (Open MPI), same sizes, separate processes" : "none", copy);
    write_json(o, "threads", o.ranks, rows, baseline ? &*baseline : nullptr, copy);
    return 0;
  }
  if (o.backend == "raw-mpi" || o.backend == "mpi") {
    const sc::mpi_environment environment(argc, argv);
    int rank = 0;
    int n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const auto raw = sweep_raw_mpi(o);
    if (o.backend == "raw-mpi") {
      if (rank == 0) {
        write_json(o, "raw-mpi", n, raw, nullptr, 0.0);
      }
      return 0;
    }
    std::vector<row> rows;
    {
      auto world = sc::mpi::world(
          sc::comm_config{.timeout = 120.0, .fingerprint = sc::fingerprint_mode::sampled});
      rows = sweep_strata(o, world);
    }
    if (rank == 0) {
      const double copy = memcpy_bandwidth();
      print_table("strata MPI backend", rows, n, &raw, "raw MPI, same processes and buffers", copy);
      write_json(o, "mpi", n, rows, &raw, copy);
    }
    return 0;
  }
  std::fprintf(stderr, "bench_collectives: backend '%s' is not available here (threads | mpi)\n",
               o.backend.c_str());
  return 2;
}
