// expect-error: this type is not a policy: it has no 'policy_category'
// SPDX-License-Identifier: Apache-2.0
#include "strata/core/policy.hpp"

struct batch_a {
  using policy_category = strata::batch_policy_tag;
};
struct forgot_the_tag {};
using set = strata::policy_set<strata::type_list<batch_a>, forgot_the_tag>;
static_assert(set::valid);
