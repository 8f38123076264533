// SPDX-License-Identifier: Apache-2.0
// What a user's program does first: include strata, read a config, compose policies.
#include <cstdio>
#include <type_traits>

#include <strata/config.hpp>
#include <strata/strata.hpp>
#ifdef STRATA_CONSUMER_MPI
#include <strata/comm/mpi.hpp>
#endif

struct my_batch {
  using policy_category = strata::batch_policy_tag;
};
struct my_other_batch {
  using policy_category = strata::batch_policy_tag;
};
struct my_precision {
  using policy_category = strata::precision_policy_tag;
};

int main() {
  const auto cfg = strata::config::parse_toml("batch_size_per_gpu = 32\nworld_size = 2\n");
  using set = strata::policy_set<strata::type_list<my_batch, my_precision>, my_other_batch>;
  static_assert(std::is_same_v<set::get<strata::batch_policy_tag>, my_other_batch>);
#ifdef STRATA_CONSUMER_MPI
  if (strata::comm::mpi_datatype(strata::dtype::float32) != MPI_FLOAT) {
    return 1;
  }
#endif
  std::printf("consumer: batch_size_per_gpu=%lld world_size=%lld\n",
              static_cast<long long>(cfg.batch_size_per_gpu),
              static_cast<long long>(cfg.world_size));
  return cfg.batch_size_per_gpu == 32 && cfg.world_size == 2 ? 0 : 1;
}
