// SPDX-License-Identifier: Apache-2.0
#pragma once

// Every built-in layer of the model family, and the loss.

#include "strata/model/activations.hpp"
#include "strata/model/attention.hpp"
#include "strata/model/blas.hpp"
#include "strata/model/concepts.hpp"
#include "strata/model/conv2d.hpp"
#include "strata/model/dropout.hpp"
#include "strata/model/flatten.hpp"
#include "strata/model/layer_norm.hpp"
#include "strata/model/linear.hpp"
#include "strata/model/max_pool2d.hpp"
#include "strata/model/patch_embedding.hpp"
#include "strata/model/residual.hpp"
#include "strata/model/softmax_cross_entropy.hpp"
#include "strata/model/token_mean.hpp"
