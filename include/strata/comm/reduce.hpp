// SPDX-License-Identifier: Apache-2.0
#pragma once

// Element-wise reductions over every dtype of core/, shared by the backends that reduce on the
// host (threads, the point-to-point algorithms, MPI's operators for the 16-bit floats).
// 16-bit floats are accumulated in float and rounded once per result; avg is a sum divided by
// the number of contributions at the end (integers: truncating division).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "strata/comm/types.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/round.hpp"

namespace strata::comm {

namespace detail {
template <class T>
inline constexpr bool is_narrow_float = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;
}  // namespace detail

// The type a reduction accumulates T in.
template <class T>
using accumulator_t = std::conditional_t<detail::is_narrow_float<T>, float, T>;

// Calls f(T{}) with the C++ type of `type`.
template <class F>
decltype(auto) visit_dtype(dtype type, F&& f) {
  switch (type) {
    case dtype::float32:
      return f(float{});
    case dtype::float64:
      return f(double{});
    case dtype::float16:
      return f(float16{});
    case dtype::bfloat16:
      return f(bfloat16{});
    case dtype::int32:
      return f(std::int32_t{});
    case dtype::int64:
      return f(std::int64_t{});
    case dtype::uint8:
      return f(std::uint8_t{});
  }
  throw error("strata::comm: unknown dtype value " + std::to_string(static_cast<int>(type)));
}

template <class A>
constexpr A combine(A a, A b, reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg:
      return static_cast<A>(a + b);
    case reduce_op::prod:
      return static_cast<A>(a * b);
    case reduce_op::min:
      return b < a ? b : a;
    case reduce_op::max:
      return a < b ? b : a;
  }
  return a;
}

namespace detail {

// Elements per pass of the loops below (16-bit floats go through float buffers of this size).
inline constexpr std::size_t reduce_chunk = 256;

// to[i] = A(from[i]): the 16-bit floats by the buffer conversions of core/round.hpp.
template <class T, class A>
void widen(const T* from, A* to, std::size_t n) noexcept {
  if constexpr (is_narrow_float<T>) {
    convert_floats(from, to, n);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      to[i] = static_cast<A>(from[i]);
    }
  }
}

template <class A, class T>
void narrow(const A* from, T* to, std::size_t n) noexcept {
  if constexpr (is_narrow_float<T>) {
    convert_floats(from, to, n);
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      to[i] = static_cast<T>(from[i]);
    }
  }
}

// The loops below take the operator as a template argument so that they vectorize.
template <reduce_op Op, class T>
void reduce_many_with(T* out, const T* const* inputs, std::size_t k, std::size_t count) {
  using A = accumulator_t<T>;
  constexpr std::size_t chunk = reduce_chunk;
  A acc[chunk];
  [[maybe_unused]] A wide[is_narrow_float<T> ? chunk : 1];
  for (std::size_t base = 0; base < count; base += chunk) {
    const std::size_t n = std::min(chunk, count - base);
    widen(inputs[0] + base, acc, n);
    for (std::size_t j = 1; j < k; ++j) {
      if constexpr (is_narrow_float<T>) {
        widen(inputs[j] + base, wide, n);
        for (std::size_t i = 0; i < n; ++i) {
          acc[i] = combine<A>(acc[i], wide[i], Op);
        }
      } else {
        const T* in = inputs[j] + base;
        for (std::size_t i = 0; i < n; ++i) {
          acc[i] = combine<A>(acc[i], static_cast<A>(in[i]), Op);
        }
      }
    }
    if constexpr (Op == reduce_op::avg) {
      for (std::size_t i = 0; i < n; ++i) {
        acc[i] = static_cast<A>(acc[i] / static_cast<A>(k));
      }
    }
    narrow(acc, out + base, n);
  }
}

template <reduce_op Op, class T>
void reduce_into_with(T* acc, const T* in, std::size_t count) {
  using A = accumulator_t<T>;
  if constexpr (is_narrow_float<T>) {
    A a[reduce_chunk];
    A b[reduce_chunk];
    for (std::size_t base = 0; base < count; base += reduce_chunk) {
      const std::size_t n = std::min(reduce_chunk, count - base);
      widen(acc + base, a, n);
      widen(in + base, b, n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = combine<A>(a[i], b[i], Op);
      }
      narrow(a, acc + base, n);
    }
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      acc[i] = static_cast<T>(combine<A>(static_cast<A>(acc[i]), static_cast<A>(in[i]), Op));
    }
  }
}

// Calls f(std::integral_constant<reduce_op, op>{}).
template <class F>
void with_op(reduce_op op, F&& f) {
  switch (op) {
    case reduce_op::sum:
      return f(std::integral_constant<reduce_op, reduce_op::sum>{});
    case reduce_op::avg:
      return f(std::integral_constant<reduce_op, reduce_op::avg>{});
    case reduce_op::min:
      return f(std::integral_constant<reduce_op, reduce_op::min>{});
    case reduce_op::max:
      return f(std::integral_constant<reduce_op, reduce_op::max>{});
    case reduce_op::prod:
      return f(std::integral_constant<reduce_op, reduce_op::prod>{});
  }
}

}  // namespace detail

// out[i] = inputs[0][i] op inputs[1][i] op ... op inputs[k-1][i], in input order (so the result
// is the same on every rank that reduces the same inputs), divided by `k` for avg.
// `out` may alias any input.
template <class T>
void reduce_many(T* out, const T* const* inputs, std::size_t k, std::size_t count, reduce_op op) {
  if (k == 0) {
    return;
  }
  detail::with_op(
      op, [&](auto o) { detail::reduce_many_with<decltype(o)::value>(out, inputs, k, count); });
}

// acc[i] = acc[i] op in[i] (no division for avg: call finish_avg once at the end).
template <class T>
void reduce_into(T* acc, const T* in, std::size_t count, reduce_op op) {
  detail::with_op(op,
                  [&](auto o) { detail::reduce_into_with<decltype(o)::value>(acc, in, count); });
}

// data[i] /= contributions, for avg after a sequence of reduce_into.
template <class T>
void finish_avg(T* data, std::size_t count, std::size_t contributions) {
  using A = accumulator_t<T>;
  if constexpr (detail::is_narrow_float<T>) {
    A a[detail::reduce_chunk];
    for (std::size_t base = 0; base < count; base += detail::reduce_chunk) {
      const std::size_t n = std::min(detail::reduce_chunk, count - base);
      detail::widen(data + base, a, n);
      for (std::size_t i = 0; i < n; ++i) {
        a[i] = a[i] / static_cast<A>(contributions);
      }
      detail::narrow(a, data + base, n);
    }
  } else {
    for (std::size_t i = 0; i < count; ++i) {
      data[i] = static_cast<T>(static_cast<A>(data[i]) / static_cast<A>(contributions));
    }
  }
}

// Untyped forms for backends that carry a runtime dtype.
inline void reduce_into(void* acc, const void* in, std::size_t count, dtype type, reduce_op op) {
  visit_dtype(type, [&](auto tag) {
    using T = decltype(tag);
    reduce_into(static_cast<T*>(acc), static_cast<const T*>(in), count, op);
  });
}

inline void finish_avg(void* data, std::size_t count, dtype type, std::size_t contributions) {
  visit_dtype(type, [&](auto tag) {
    using T = decltype(tag);
    finish_avg(static_cast<T*>(data), count, contributions);
  });
}

}  // namespace strata::comm
