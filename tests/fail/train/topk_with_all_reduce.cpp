// expect-error: top-k output is not summable
// SPDX-License-Identifier: Apache-2.0
// Top-k compressed gradients paired with a summing all-reduce.
#include "strata/parallel/data.hpp"

strata::parallel::data<strata::parallel::all_reduce, strata::parallel::compress::topk> policy;
