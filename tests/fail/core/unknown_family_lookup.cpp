// expect-error: get<Tag> names a family this component does not take
// SPDX-License-Identifier: Apache-2.0
#include "strata/core/policy.hpp"

struct batch_a {
  using policy_category = strata::batch_policy_tag;
};
using set = strata::policy_set<strata::type_list<batch_a>>;
using missing = set::get<strata::comm_backend_tag>;
missing* unused = nullptr;
