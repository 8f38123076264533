// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata's MPI layer. This is the only strata header that includes <mpi.h>; everything that
// speaks MPI lives here, in sections:
//
//   1. dtype mapping   the MPI datatype of each strata::dtype, and which of them MPI can reduce
//   2. the mpi comm backend (follows the dtype mapping)

// Open MPI's deprecated C++ bindings are not used: keep <mpi.h> from pulling them in, so that a
// program needs only the C library. (MPI_CXX_SKIP_MPICXX in CMake's FindMPI sets the same.)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif

#include <mpi.h>

#include <string>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

// ---------------------------------------------------------------------------------------------
// 1. dtype mapping
//
// float16 and bfloat16 have no MPI datatype that MPI_Reduce understands (Open MPI 4.1 has none;
// MPI 4.1's MPIX_C_FLOAT16 is not portable). They travel as MPI_UINT16_T, which moves the bits
// exactly; a reduction over them must install its own MPI_Op (widen to float, combine, round
// back), and mpi_reduces_natively tells it when.

// The MPI datatype that carries one element of `type`. Throws strata::error for a value outside
// the enum.
inline MPI_Datatype mpi_datatype(dtype type) {
  switch (type) {
    case dtype::float32:
      return MPI_FLOAT;
    case dtype::float64:
      return MPI_DOUBLE;
    case dtype::float16:
      return MPI_UINT16_T;
    case dtype::bfloat16:
      return MPI_UINT16_T;
    case dtype::int32:
      return MPI_INT32_T;
    case dtype::int64:
      return MPI_INT64_T;
    case dtype::uint8:
      return MPI_UINT8_T;
  }
  throw error("mpi_datatype: invalid dtype value " + std::to_string(static_cast<unsigned>(type)));
}

// mpi_datatype(dtype_of<T>); a T that is not an element type fails to compile, with the list of
// the allowed ones.
template <class T>
MPI_Datatype mpi_datatype_of() {
  return mpi_datatype(dtype_of<T>);
}

// True when MPI's predefined reduction operations (MPI_SUM, MPI_MAX, ...) work on
// mpi_datatype(type) with the element's own arithmetic. False for float16 and bfloat16, whose
// MPI_UINT16_T would be summed as integers; false for a value outside the enum.
constexpr bool mpi_reduces_natively(dtype type) noexcept {
  switch (type) {
    case dtype::float32:
    case dtype::float64:
    case dtype::int32:
    case dtype::int64:
    case dtype::uint8:
      return true;
    case dtype::float16:
    case dtype::bfloat16:
      return false;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// 2. the mpi comm backend

}  // namespace strata::comm
