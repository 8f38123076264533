// SPDX-License-Identifier: Apache-2.0
#pragma once

// round_through(values, type): replaces every float by the nearest value of a narrower floating
// type, in place, exactly as converting to that type and back would (round to nearest, ties to
// even; beyond the largest finite value, infinity; NaN stays NaN). This is how host code keeps
// the numerics of a 16-bit tensor while computing in float: mixed precision on the host rounds
// parameters, activations and gradients through float16 or bfloat16 at the points where a
// device would store them in that type.
//
//   strata::round_through(grads, strata::dtype::float16);  // |g| > 65504 becomes +-inf
//
// convert_floats(from, to, n): n values from float to float16 / bfloat16 or back, the same values
// as the element conversions of core/dtype.hpp, for buffers (gradients on a 16-bit wire, the
// reductions of comm/reduce.hpp).
//
// Speed: bfloat16 is integer arithmetic on the bits, branch-free, which the compiler vectorizes.
// float16 uses the F16C conversion instructions where the processor has them (checked once at
// run time, so a portable build uses them too), else the exact software conversion of
// core/dtype.hpp. Both give the same values; NaN payloads may differ.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "strata/core/dtype.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDACC__)
#define STRATA_ROUND_F16C 1
#include <immintrin.h>
#endif

namespace strata {

namespace detail {

// to[i] = from[i] rounded through bfloat16; to may be from.
inline void round_through_bfloat16(const float* from, float* to, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(from[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const std::uint32_t quiet = (u | 0x00400000u) & 0xffff0000u;
    to[i] = std::bit_cast<float>(nan ? quiet : rounded);
  }
}

inline void round_through_float16_portable(const float* from, float* to, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    to[i] = half_bits_to_float(float_to_half_bits(from[i]));
  }
}

#ifdef STRATA_ROUND_F16C
__attribute__((target("avx,f16c"))) inline void round_through_float16_f16c(const float* from,
                                                                           float* to,
                                                                           std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(from + i);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    const __m128 x = _mm_set_ss(from[i]);
    const __m128i h = _mm_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    to[i] = _mm_cvtss_f32(_mm_cvtph_ps(h));
  }
}

__attribute__((target("avx,f16c"))) inline void float_to_half_f16c(const float* from,
                                                                   std::uint16_t* to,
                                                                   std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i), h);
  }
  for (; i < n; ++i) {
    const __m128i h =
        _mm_cvtps_ph(_mm_set_ss(from[i]), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    to[i] = static_cast<std::uint16_t>(_mm_extract_epi16(h, 0));
  }
}

__attribute__((target("avx,f16c"))) inline void half_to_float_f16c(const std::uint16_t* from,
                                                                   float* to,
                                                                   std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i));
    _mm256_storeu_ps(to + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    to[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(from[i])));
  }
}

inline bool has_f16c() noexcept {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

}  // namespace detail

// Whether float16 rounding runs on the F16C instructions here.
inline bool round_through_uses_f16c() noexcept {
#ifdef STRATA_ROUND_F16C
  return detail::has_f16c();
#else
  return false;
#endif
}

// to[i] = T(from[i]) / float(from[i]) for i < n, T = float16 or bfloat16.
inline void convert_floats(const float* from, float16* to, std::size_t n) noexcept {
  static_assert(sizeof(float16) == sizeof(std::uint16_t));
#ifdef STRATA_ROUND_F16C
  if (detail::has_f16c()) {
    detail::float_to_half_f16c(from, reinterpret_cast<std::uint16_t*>(to), n);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) {
    to[i] = float16(from[i]);
  }
}

inline void convert_floats(const float16* from, float* to, std::size_t n) noexcept {
#ifdef STRATA_ROUND_F16C
  if (detail::has_f16c()) {
    detail::half_to_float_f16c(reinterpret_cast<const std::uint16_t*>(from), to, n);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) {
    to[i] = static_cast<float>(from[i]);
  }
}

inline void convert_floats(const float* from, bfloat16* to, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    to[i] = bfloat16(from[i]);
  }
}

inline void convert_floats(const bfloat16* from, float* to, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    to[i] = static_cast<float>(from[i]);
  }
}

// The same with the 16-bit type given at run time (a wire buffer of float16 or bfloat16 values):
// from float into `to`, or from `from` into float. Other types throw std::invalid_argument.
inline void convert_floats(const float* from, void* to, std::size_t n, dtype type) {
  switch (type) {
    case dtype::float16:
      return convert_floats(from, static_cast<float16*>(to), n);
    case dtype::bfloat16:
      return convert_floats(from, static_cast<bfloat16*>(to), n);
    default:
      break;
  }
  throw std::invalid_argument("convert_floats: float converts to float16 or bfloat16, not " +
                              std::string(to_string(type)));
}

inline void convert_floats(const void* from, float* to, std::size_t n, dtype type) {
  switch (type) {
    case dtype::float16:
      return convert_floats(static_cast<const float16*>(from), to, n);
    case dtype::bfloat16:
      return convert_floats(static_cast<const bfloat16*>(from), to, n);
    default:
      break;
  }
  throw std::invalid_argument("convert_floats: float16 or bfloat16 convert to float, not " +
                              std::string(to_string(type)));
}

// to[i] = from[i] rounded through `type` (one pass: a copy that rounds); from and to have the
// same size and may be the same span. float32 copies; float16 and bfloat16 round as described
// above. Other types throw std::invalid_argument.
inline void round_through(std::span<const float> from, std::span<float> to, dtype type) {
  if (from.size() != to.size()) {
    throw std::invalid_argument("round_through: from holds " + std::to_string(from.size()) +
                                " floats, to holds " + std::to_string(to.size()));
  }
  switch (type) {
    case dtype::float32:
      if (from.data() != to.data()) {
        std::copy(from.begin(), from.end(), to.begin());
      }
      return;
    case dtype::bfloat16:
      detail::round_through_bfloat16(from.data(), to.data(), from.size());
      return;
    case dtype::float16:
#ifdef STRATA_ROUND_F16C
      if (detail::has_f16c()) {
        detail::round_through_float16_f16c(from.data(), to.data(), from.size());
        return;
      }
#endif
      detail::round_through_float16_portable(from.data(), to.data(), from.size());
      return;
    default:
      break;
  }
  throw std::invalid_argument(
      "round_through: values can be rounded through float32, float16 or bfloat16, not " +
      std::string(to_string(type)));
}

// Rounds every value through `type` in place: float32 leaves them as they are; float16 and
// bfloat16 round as described above. Other types throw std::invalid_argument.
inline void round_through(std::span<float> values, dtype type) {
  round_through(std::span<const float>(values), values, type);
}

}  // namespace strata
