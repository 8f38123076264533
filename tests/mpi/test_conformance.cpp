// SPDX-License-Identifier: Apache-2.0
// The comm_backend conformance suite (tests/conformance/comm_backend.hpp) for strata::comm::mpi,
// run by every rank of the job (ctest runs it with 2, 3 and 4 ranks).
#include <doctest/doctest.h>

#include "conformance/comm_backend.hpp"
#include "strata/comm/mpi.hpp"

static_assert(strata::comm::check_comm_backend<strata::comm::mpi>());

TEST_CASE("mpi passes the comm_backend conformance suite") {
  auto comm = strata::comm::mpi::world(strata::comm::comm_config{
      .timeout = 60.0, .fingerprint = strata::comm::fingerprint_mode::always});
  const auto rep = strata::conformance::run_all(comm);
  INFO(rep.summary());
  CHECK(rep.ok());
  CHECK(rep.checks > 0);
}
