// expect-error: this policy's family is not accepted here
// SPDX-License-Identifier: Apache-2.0
#include "strata/core/policy.hpp"

struct batch_a {
  using policy_category = strata::batch_policy_tag;
};
struct my_comm {
  using policy_category = strata::comm_backend_tag;
};
using set = strata::policy_set<strata::type_list<batch_a>, my_comm>;
static_assert(set::valid);
