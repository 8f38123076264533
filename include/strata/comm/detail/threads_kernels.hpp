// SPDX-License-Identifier: Apache-2.0
#pragma once

// Data movement of the threads comm backend (not API): a reduction that writes its result to
// several buffers in one pass, and a copy, each optionally with streaming (non-temporal) stores
// for buffers too large to stay in cache. The arithmetic is reduce.hpp's (combine,
// accumulator_t, avg as a division at the end), element by element in input order, so results
// are bit-identical to reduce_many.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "strata/comm/reduce.hpp"
#include "strata/comm/types.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace strata::comm::detail {

// Working sets (send and receive buffers of every rank) above this size are written with
// streaming stores: they would not stay in cache anyway, and streaming saves reading each
// destination line before overwriting it.
inline constexpr std::size_t streaming_footprint = std::size_t{64} << 20;

inline bool can_stream(const void* to) noexcept {
#if defined(__SSE2__)
  return (reinterpret_cast<std::uintptr_t>(to) & 15u) == 0;
#else
  (void)to;
  return false;
#endif
}

// Copies `bytes` (a multiple of 16 when streaming; `to` 16-byte aligned when streaming).
inline void store_block(void* to, const void* from, std::size_t bytes, bool streaming) noexcept {
#if defined(__SSE2__)
  if (streaming) {
    auto* d = static_cast<__m128i*>(to);
    const auto* s = static_cast<const std::byte*>(from);
    for (std::size_t i = 0; i < bytes / 16; ++i) {
      _mm_stream_si128(d + i, _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * i)));
    }
    return;
  }
#else
  (void)streaming;
#endif
  std::memcpy(to, from, bytes);
}

inline void streaming_done() noexcept {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Elements reduced at a time: 256 bytes of T. Smaller blocks make the compiler unroll the block
// completely and give up vectorizing; larger ones interleave reads and streaming writes worse.
template <class T>
inline constexpr std::size_t fanout_block = 256 / sizeof(T);

// acc = inputs[0][i..i+n) op ... op inputs[k-1][i..i+n), converted to T into `result`. `n` is
// either a std::integral_constant (whole blocks: fixed trip counts) or a std::size_t (the
// tail).
template <reduce_op Op, class T, class Count>
inline void reduce_block(const T* const* inputs, std::size_t k, std::size_t i, Count n, T* result) {
  using A = accumulator_t<T>;
  A acc[fanout_block<T>];
  if constexpr (is_narrow_float<T>) {
    // 16-bit floats: whole blocks through the buffer conversions (F16C for float16).
    A wide[fanout_block<T>];
    widen(inputs[0] + i, acc, n);
    for (std::size_t j = 1; j < k; ++j) {
      widen(inputs[j] + i, wide, n);
      for (std::size_t e = 0; e < n; ++e) {
        acc[e] = combine<A>(acc[e], wide[e], Op);
      }
    }
  } else {
    for (std::size_t e = 0; e < n; ++e) {
      acc[e] = static_cast<A>(inputs[0][i + e]);
    }
    for (std::size_t j = 1; j < k; ++j) {
      const T* in = inputs[j] + i;
      for (std::size_t e = 0; e < n; ++e) {
        acc[e] = combine<A>(acc[e], static_cast<A>(in[e]), Op);
      }
    }
  }
  if constexpr (Op == reduce_op::avg) {
    for (std::size_t e = 0; e < n; ++e) {
      acc[e] = static_cast<A>(acc[e] / static_cast<A>(k));
    }
  }
  narrow(acc, result, static_cast<std::size_t>(n));
}

// outputs[o][i] = inputs[0][i] op inputs[1][i] op ... op inputs[k-1][i] (divided by k for avg)
// for every output o, computed once per element, one block of elements at a time. An output may
// alias an input at the same index (in place).
template <reduce_op Op, class T>
void reduce_fanout_with(T* const* outputs, std::size_t m, const T* const* inputs, std::size_t k,
                        std::size_t count, bool streaming) {
  constexpr std::size_t block = fanout_block<T>;
  std::size_t i = 0;
  for (; i + block <= count; i += block) {
    alignas(64) T result[block];
    reduce_block<Op>(inputs, k, i, std::integral_constant<std::size_t, block>{}, result);
    for (std::size_t o = 0; o < m; ++o) {
      store_block(outputs[o] + i, result, sizeof(result), streaming && can_stream(outputs[o]));
    }
  }
  if (i < count) {
    alignas(64) T result[block];
    reduce_block<Op>(inputs, k, i, count - i, result);
    for (std::size_t o = 0; o < m; ++o) {
      std::memcpy(outputs[o] + i, result, (count - i) * sizeof(T));
    }
  }
  if (streaming) {
    streaming_done();
  }
}

template <class T>
void reduce_fanout(T* const* outputs, std::size_t m, const T* const* inputs, std::size_t k,
                   std::size_t count, reduce_op op, bool streaming) {
  if (k == 0 || count == 0) {
    return;
  }
  switch (op) {
    case reduce_op::sum:
      return reduce_fanout_with<reduce_op::sum>(outputs, m, inputs, k, count, streaming);
    case reduce_op::avg:
      return reduce_fanout_with<reduce_op::avg>(outputs, m, inputs, k, count, streaming);
    case reduce_op::min:
      return reduce_fanout_with<reduce_op::min>(outputs, m, inputs, k, count, streaming);
    case reduce_op::max:
      return reduce_fanout_with<reduce_op::max>(outputs, m, inputs, k, count, streaming);
    case reduce_op::prod:
      return reduce_fanout_with<reduce_op::prod>(outputs, m, inputs, k, count, streaming);
  }
}

// memcpy, with streaming stores for the aligned middle when `streaming`.
inline void copy_streaming(void* to, const void* from, std::size_t bytes, bool streaming) {
  if (bytes == 0 || to == from) {
    return;
  }
  if (!streaming || bytes < 4096) {
    std::memcpy(to, from, bytes);
    return;
  }
  auto* d = static_cast<std::byte*>(to);
  const auto* s = static_cast<const std::byte*>(from);
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15u)) & 15u;
  std::memcpy(d, s, head);
  const std::size_t body = (bytes - head) & ~std::size_t{63};
  store_block(d + head, s + head, body, true);
  std::memcpy(d + head + body, s + head + body, bytes - head - body);
  streaming_done();
}

}  // namespace strata::comm::detail
