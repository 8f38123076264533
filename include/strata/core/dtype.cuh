// SPDX-License-Identifier: Apache-2.0
#pragma once

// strata's 16-bit float types next to CUDA's: strata::float16 <-> __half and strata::bfloat16 <->
// __nv_bfloat16, by bits (no rounding, NaN payloads kept), callable on host and device; and
// cuda_type_t, the CUDA spelling of an element type, for kernels written over cuda_type_t<T>.
//
// The bits are copied with memcpy rather than read through the members of strata::float16, which
// are host constexpr functions: device code may call them only with --expt-relaxed-constexpr,
// and this header does not ask for it. A 2-byte memcpy compiles to a plain register move.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "strata/core/dtype.hpp"

namespace strata {

namespace detail {

template <class To, class From>
__host__ __device__ inline To copy_bits(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "copy_bits: the two types differ in size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

}  // namespace detail

// The CUDA type of an element type: __half for float16, __nv_bfloat16 for bfloat16, the type
// itself for every other one.
template <class T>
struct cuda_type {
  using type = T;
};
template <>
struct cuda_type<float16> {
  using type = __half;
};
template <>
struct cuda_type<bfloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using cuda_type_t = typename cuda_type<T>::type;

static_assert(sizeof(__half) == sizeof(float16) && alignof(__half) == alignof(float16));
static_assert(sizeof(__nv_bfloat16) == sizeof(bfloat16));
static_assert(alignof(__nv_bfloat16) == alignof(bfloat16));

// strata -> CUDA. The identity for the other element types, so generic code can call to_cuda on
// any T and get a cuda_type_t<T>.
__host__ __device__ inline __half to_cuda(float16 x) noexcept {
  return detail::copy_bits<__half>(x);
}
__host__ __device__ inline __nv_bfloat16 to_cuda(bfloat16 x) noexcept {
  return detail::copy_bits<__nv_bfloat16>(x);
}
template <class T>
__host__ __device__ inline T to_cuda(T x) noexcept {
  return x;
}

// CUDA -> strata. The identity for the other element types.
__host__ __device__ inline float16 from_cuda(__half x) noexcept {
  return detail::copy_bits<float16>(x);
}
__host__ __device__ inline bfloat16 from_cuda(__nv_bfloat16 x) noexcept {
  return detail::copy_bits<bfloat16>(x);
}
template <class T>
__host__ __device__ inline T from_cuda(T x) noexcept {
  return x;
}

}  // namespace strata
