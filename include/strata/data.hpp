// SPDX-License-Identifier: Apache-2.0
#pragma once

// The data family: datasets, transforms, the distributed sampler and the prefetching loader
// (docs/data.md). device_prefetcher.cuh needs nvcc and is included on its own.

#include "strata/data/concepts.hpp"
#include "strata/data/idx.hpp"
#include "strata/data/prefetch_loader.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/transforms.hpp"
