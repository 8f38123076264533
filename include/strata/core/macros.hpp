// SPDX-License-Identifier: Apache-2.0
#pragma once

// The few macros strata needs, all of them about where and how a function is compiled.
//
// STRATA_HOST_DEVICE  marks a function callable from host code and from CUDA device code. Under
//                     nvcc (__CUDACC__) it is `__host__ __device__`; with any other compiler it
//                     is empty, so the same header compiles with plain g++ or clang++.
// STRATA_FORCEINLINE  asks the compiler to inline a small hot function (a round of a block
//                     cipher, say) whether or not its heuristics would. It includes `inline`.

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

#if defined(__CUDACC__)
#define STRATA_FORCEINLINE __forceinline__
#elif defined(_MSC_VER)
#define STRATA_FORCEINLINE __forceinline
#elif defined(__GNUC__) || defined(__clang__)
#define STRATA_FORCEINLINE inline __attribute__((always_inline))
#else
#define STRATA_FORCEINLINE inline
#endif
