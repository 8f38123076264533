// SPDX-License-Identifier: Apache-2.0
#pragma once

// xxh3_hex: the 64-bit XXH3 of a float range as 16 hex digits (the summary's params_xxh3).
// xxHash is used header-only (XXH_INLINE_ALL), as everywhere in the library.

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

namespace strata {

inline std::string xxh3_hex(std::span<const float> values) {
  const std::uint64_t h = XXH3_64bits(values.data(), values.size_bytes());
  char text[17] = {};
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace strata
