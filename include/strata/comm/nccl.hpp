// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata's NCCL layer. This is the only strata header that includes <nccl.h>; everything that
// speaks NCCL lives here, in sections:
//
//   1. dtype mapping   the NCCL datatype of each strata::dtype
//   2. the nccl comm backend (follows the dtype mapping)
//
// <nccl.h> includes <cuda_runtime.h>, so this header needs the CUDA include directory but not
// nvcc: it compiles with the host compiler.

#include <nccl.h>

#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

// ---------------------------------------------------------------------------------------------
// 1. dtype mapping
//
// NCCL reduces every strata dtype natively, float16 and bfloat16 included (ncclBfloat16 since
// NCCL 2.10).

// The NCCL datatype of `type`. Throws strata::error for a value outside the enum.
constexpr ncclDataType_t nccl_datatype(dtype type) {
  switch (type) {
    case dtype::float32:
      return ncclFloat32;
    case dtype::float64:
      return ncclFloat64;
    case dtype::float16:
      return ncclFloat16;
    case dtype::bfloat16:
      return ncclBfloat16;
    case dtype::int32:
      return ncclInt32;
    case dtype::int64:
      return ncclInt64;
    case dtype::uint8:
      return ncclUint8;
  }
  throw error("nccl_datatype: invalid dtype value " + std::to_string(static_cast<unsigned>(type)));
}

// nccl_datatype(dtype_of<T>); a T that is not an element type fails to compile, with the list of
// the allowed ones.
template <class T>
constexpr ncclDataType_t nccl_datatype_of() {
  return nccl_datatype(dtype_of<T>);
}

// ---------------------------------------------------------------------------------------------
// 2. the nccl comm backend

}  // namespace strata::comm
