// expect-error: CommBackend: missing 'int rank\(\) const noexcept'
// SPDX-License-Identifier: Apache-2.0
#include "strata/comm/concepts.hpp"

struct half_a_backend {
  using policy_category = strata::comm_backend_tag;
  int size() const noexcept { return 1; }
};

static_assert(strata::comm::check_comm_backend<half_a_backend>());
