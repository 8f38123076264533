// expect-error: precision::mixed<float16>: float16 needs a loss scaler
// SPDX-License-Identifier: Apache-2.0
// float16 mixed precision without a loss scaler.
#include "strata/precision/mixed.hpp"

strata::precision::mixed<strata::float16> policy;
