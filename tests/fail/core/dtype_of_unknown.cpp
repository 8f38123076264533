// expect-error: dtype_of<T>: T must be one of
// SPDX-License-Identifier: Apache-2.0
#include "strata/core/dtype.hpp"

constexpr auto bad = strata::dtype_of<long double>;
