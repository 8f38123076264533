// expect-error: parallel::tensor<Inner>: Inner must span ranks
// SPDX-License-Identifier: Apache-2.0
// Tensor parallelism composed with a policy that runs one rank: the ranks of one tensor index
// would have nobody to be the world of, so the composition names what Inner must be.
#include "strata/parallel/single_rank.hpp"
#include "strata/parallel/tensor_parallel.hpp"

int main() {
  using policy = strata::parallel::tensor<strata::parallel::single_rank>;
  static_assert(sizeof(policy) > 0);
}
