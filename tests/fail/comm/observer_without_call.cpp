// expect-error: comm::observed Observer: missing 'void operator\(\)\(const
// strata::comm::op_event&\)' SPDX-License-Identifier: Apache-2.0 A user's comm wrapper whose
// observer takes no op_event: the wrapper names the requirement.
#include <cstdint>
#include <utility>

#include "strata/comm/observed.hpp"
#include "strata/comm/threads.hpp"

struct counts_nothing {
  std::uint64_t bytes = 0;
  void operator()(std::uint64_t n) { bytes += n; }  // not an op_event
};

int main() {
  strata::comm::threads::run(1, [](strata::comm::threads& t) {
    strata::comm::observed<strata::comm::threads, counts_nothing> c(std::move(t));
    c.barrier();
  });
}
