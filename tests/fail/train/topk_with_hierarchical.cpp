// expect-error: takes compress::none or compress::cast<float16 | bfloat16>, not top-k
// SPDX-License-Identifier: Apache-2.0
// Top-k compressed gradients paired with the hierarchical all-reduce, which sums.
#include "strata/parallel/data.hpp"

strata::parallel::data<strata::parallel::hierarchical, strata::parallel::compress::topk> policy;
