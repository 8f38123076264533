// expect-error: two policies of one family were given
// SPDX-License-Identifier: Apache-2.0
#include "strata/core/policy.hpp"

struct batch_a {
  using policy_category = strata::batch_policy_tag;
};
struct batch_b {
  using policy_category = strata::batch_policy_tag;
};
using set = strata::policy_set<strata::type_list<batch_a>, batch_b, batch_a>;
static_assert(set::valid);
