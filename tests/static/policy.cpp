// SPDX-License-Identifier: Apache-2.0
// The order-free policy list: defaults, any order, one per family. Static checks only.
#include <type_traits>

#include "strata/core/policy.hpp"

// snippet-begin: compose
#include <strata/core/policy.hpp>

// Policies say their family with a tag; numbers live in config structs or members.
struct fixed_batch {
  using policy_category = strata::batch_policy_tag;
  static constexpr int size = 64;
};
struct fp32 {
  using policy_category = strata::precision_policy_tag;
};
struct bf16_mixed {
  using policy_category = strata::precision_policy_tag;
};
struct threads_comm {
  using policy_category = strata::comm_backend_tag;
};

// A component names one default per family; users pass policies in any order.
using defaults = strata::type_list<fixed_batch, fp32, threads_comm>;
using chosen = strata::policy_set<defaults, bf16_mixed>;

static_assert(std::is_same_v<chosen::get<strata::precision_policy_tag>, bf16_mixed>);
static_assert(std::is_same_v<chosen::get<strata::batch_policy_tag>, fixed_batch>);
static_assert(chosen::given<strata::precision_policy_tag>);
static_assert(!chosen::given<strata::comm_backend_tag>);
// snippet-end: compose

struct big_batch {
  using policy_category = strata::batch_policy_tag;
  static constexpr int size = 512;
};

// Order does not matter.
using ab = strata::policy_set<defaults, big_batch, bf16_mixed>;
using ba = strata::policy_set<defaults, bf16_mixed, big_batch>;
static_assert(std::is_same_v<ab::get<strata::batch_policy_tag>, ba::get<strata::batch_policy_tag>>);
static_assert(
    std::is_same_v<ab::get<strata::precision_policy_tag>, ba::get<strata::precision_policy_tag>>);
static_assert(ab::valid && ba::valid);

// No policies at all: every default.
using none = strata::policy_set<defaults>;
static_assert(std::is_same_v<none::get<strata::batch_policy_tag>, fixed_batch>);
static_assert(std::is_same_v<none::get<strata::comm_backend_tag>, threads_comm>);
static_assert(!none::given<strata::batch_policy_tag>);

// Every family replaced.
using all = strata::policy_set<defaults, threads_comm, big_batch, bf16_mixed>;
static_assert(std::is_same_v<all::get<strata::batch_policy_tag>, big_batch>);

// policy / policy_of concepts.
static_assert(strata::policy<fixed_batch>);
static_assert(!strata::policy<int>);
static_assert(strata::policy_of<fixed_batch, strata::batch_policy_tag>);
static_assert(!strata::policy_of<fixed_batch, strata::comm_backend_tag>);
static_assert(strata::comm_backend_tag::family_name == "CommBackend");

int main() {
  return 0;
}
