// expect-error: trainer: this version runs the batch policies 'batch::fixed',
// SPDX-License-Identifier: Apache-2.0
// A batch policy the trainer does not run yet goes into its slot.
#include "strata/model/layers.hpp"
#include "strata/model/sequential.hpp"
#include "strata/train/trainer.hpp"

struct my_batch_policy {
  using policy_category = strata::batch_policy_tag;
};

using model = strata::model::sequential<strata::model::linear>;
template class strata::train::trainer<model, my_batch_policy>;
