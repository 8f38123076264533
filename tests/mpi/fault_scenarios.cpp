// SPDX-License-Identifier: Apache-2.0
// Jobs that go wrong on purpose, one per scenario (the first argument); run_fault.cmake launches
// each under mpiexec with a time limit and checks the exit status and what the ranks printed.
//
//   mismatches (every rank must catch comm_error kind mismatch, and the communicator still works):
//     count_1001 count_100000 dtype op root skip wrong_count
//   the job must end, not hang (the detecting rank prints the error, then MPI_Abort; or mpiexec
//   ends the job because a rank died):
//     kill hang throw skip_last recv_timeout unchecked_100000
//     hang_alone (one process: nobody else can notice, so the hung rank ends the job itself)
//   late_count_1001 late_count_100000 late_skip, with a second argument `always` or `sampled`:
//     the mismatch at collective #100, after 100 that agree. With fingerprint = always it is
//     the mismatch above; with sampled (#100 is not a sampled collective) MPI meets it, and
//     the job must still end with an error (exit status 3) within the deadline.
//
// Faults come from STRATA_COMM_FAULT, set by the driver, except where the scenario is a wrong
// call written here.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "strata/comm/mpi.hpp"

namespace {

using strata::dtype;
using strata::comm::comm_config;
using strata::comm::fingerprint_mode;
using strata::comm::mpi;
using strata::comm::reduce_op;

void say(const mpi& comm, const std::string& what) {
  std::printf("rank %d: %s\n", comm.rank(), what.c_str());
  std::fflush(stdout);
}

// The wrong call of a mismatch scenario; every rank must throw comm_error (mismatch).
void mismatch(mpi& comm, const std::string& scenario) {
  const bool odd = comm.rank() % 2 == 1;
  std::vector<double> data(100000, 1.0);
  if (scenario == "count_1001") {
    comm.all_reduce(data.data(), data.data(), odd ? 1001 : 1000, dtype::float32, reduce_op::sum);
  } else if (scenario == "count_100000") {
    comm.all_reduce(data.data(), data.data(), odd ? 100000 : 1000, dtype::float32, reduce_op::sum);
  } else if (scenario == "dtype") {
    comm.all_reduce(data.data(), data.data(), 1000, odd ? dtype::float64 : dtype::float32,
                    reduce_op::sum);
  } else if (scenario == "op") {
    comm.all_reduce(data.data(), data.data(), 1000, dtype::float32,
                    odd ? reduce_op::max : reduce_op::sum);
  } else if (scenario == "root") {
    comm.broadcast(data.data(), 1000, dtype::float32, odd ? 1 : 0);
  } else if (scenario == "skip") {
    // Odd ranks skip the second all_reduce and go on to the barrier.
    comm.all_reduce(data.data(), data.data(), 1000, dtype::float32, reduce_op::sum);
    if (!odd) {
      comm.all_reduce(data.data(), data.data(), 1000, dtype::float32, reduce_op::sum);
    }
    comm.barrier();
  } else if (scenario == "wrong_count") {
    // STRATA_COMM_FAULT=rank=1,op=all_reduce,seq=0,action=wrong_count
    comm.all_reduce(data.data(), data.data(), 1000, dtype::float32, reduce_op::sum);
  }
}

enum class wrong_call_outcome { no_error, mismatch, other_error };

// Makes the wrong call of `scenario`; a rank that catches comm_error prints it.
wrong_call_outcome wrong_call(mpi& comm, const std::string& scenario) {
  try {
    mismatch(comm, scenario);
    return wrong_call_outcome::no_error;
  } catch (const strata::comm_error& e) {
    say(comm, std::string("caught ") + e.what());
    return e.kind() == strata::comm_error_kind::mismatch ? wrong_call_outcome::mismatch
                                                         : wrong_call_outcome::other_error;
  }
}

// After a mismatch the communicator is still in step on every rank: 0 when an all_reduce of 1s
// gives the rank count.
int in_step(mpi& comm) {
  std::vector<std::int32_t> one{1};
  comm.all_reduce(one.data(), one.data(), 1, dtype::int32, reduce_op::sum);
  say(comm, "after the mismatch, all_reduce gives " + std::to_string(one[0]));
  return one[0] == comm.size() ? 0 : 1;
}

// The mismatch of a late_* scenario at collective #100. Like a user's program, a rank that
// catches comm_error prints it and returns 1; a rank whose call completed goes on to the next
// collective.
int late(const std::string& scenario, mpi& comm) {
  std::vector<float> data(1000, 1.0f);
  for (int i = 0; i < 100; ++i) {
    comm.all_reduce(data.data(), data.data(), data.size(), dtype::float32, reduce_op::sum);
  }
  const wrong_call_outcome outcome = wrong_call(comm, scenario.substr(std::string("late_").size()));
  if (outcome == wrong_call_outcome::other_error) {
    return 1;
  }
  if (outcome == wrong_call_outcome::no_error) {
    say(comm, "no error at #100");
  }
  return in_step(comm);
}

int run(const std::string& scenario, mpi& comm) {
  if (scenario.starts_with("late_")) {
    return late(scenario, comm);
  }
  std::vector<float> data(1000, 1.0f);
  if (scenario == "kill" || scenario == "hang" || scenario == "throw" || scenario == "hang_alone") {
    // STRATA_COMM_FAULT=rank=1,op=all_reduce,seq=1,action=<kill|hang|throw> (hang_alone: rank 0)
    for (int i = 0; i < 3; ++i) {
      comm.all_reduce(data.data(), data.data(), data.size(), dtype::float32, reduce_op::sum);
    }
    say(comm, "not reached: every all_reduce completed");
    return 1;
  }
  if (scenario == "skip_last") {
    // Odd ranks skip the last all_reduce and leave.
    comm.all_reduce(data.data(), data.data(), data.size(), dtype::float32, reduce_op::sum);
    if (comm.rank() % 2 == 0) {
      comm.all_reduce(data.data(), data.data(), data.size(), dtype::float32, reduce_op::sum);
      say(comm, "not reached: the last all_reduce completed");
    }
    return 1;
  }
  if (scenario == "recv_timeout") {
    // Rank 0 waits for a message that rank 1 never sends.
    if (comm.rank() == 0) {
      comm.recv(data.data(), data.size(), dtype::float32, 1, 7);
      say(comm, "not reached: received");
    } else {
      comm.recv(data.data(), data.size(), dtype::float32, 0, 8);
    }
    return 1;
  }
  if (scenario == "unchecked_100000") {
    // Without fingerprints, MPI itself sees 100000 vs 1000 elements.
    std::vector<float> big(100000, 1.0f);
    comm.all_reduce(big.data(), big.data(), comm.rank() == 1 ? 100000 : 1000, dtype::float32,
                    reduce_op::sum);
    say(comm, "completed the all_reduce: " + std::to_string(big[0]));
    return 1;
  }
  switch (wrong_call(comm, scenario)) {
    case wrong_call_outcome::no_error:
      say(comm, "not reached: no error");
      return 1;
    case wrong_call_outcome::other_error:
      return 1;
    case wrong_call_outcome::mismatch:
      break;
  }
  return in_step(comm);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SCENARIO (see the source)\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  int status = 1;
  try {
    strata::comm::mpi_environment env(argc, argv);
    {
      // Every process is up before the short deadlines below start counting: on a loaded
      // machine the processes of one job can start seconds apart.
      auto start = mpi::world(comm_config{.timeout = 120.0});
      start.barrier();
    }
    fingerprint_mode mode = fingerprint_mode::always;
    if (scenario == "unchecked_100000" || (argc > 2 && std::strcmp(argv[2], "off") == 0)) {
      mode = fingerprint_mode::off;
    } else if (argc > 2 && std::strcmp(argv[2], "sampled") == 0) {
      mode = fingerprint_mode::sampled;
    }
    auto comm = mpi::world(comm_config{.timeout = scenario == "hang_alone" ? 1.0 : 3.0,
                                       .fingerprint = mode,
                                       .sample_first = 64,
                                       .sample_every = 256});
    status = run(scenario, comm);
  } catch (const std::exception& e) {
    // mpi_environment's destructor aborts the job when an exception leaves it: not reached.
    std::fprintf(stderr, "not reached: %s\n", e.what());
    return 1;
  }
  return status;
}
