// SPDX-License-Identifier: Apache-2.0
// The main of every MPI test program: MPI for the whole run, and every rank runs the doctest
// session (any failing rank makes mpiexec fail). Rank 0 prints doctest's report; the other ranks
// print their failures only.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "strata/comm/mpi.hpp"

int main(int argc, char** argv) {
  strata::comm::mpi_environment env(argc, argv);
  doctest::Context context(argc, argv);
  if (env.world_rank() != 0) {
    context.setOption("minimal", true);
    context.setOption("no-colors", true);
  }
  return context.run();
}
