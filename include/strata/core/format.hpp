// SPDX-License-Identifier: Apache-2.0
#pragma once

// format_shortest: the shortest text that reads back as the same value ("0.1", "1e-08",
// "65536", "inf", "nan"), for the to_string printers of config aggregates and error messages.

#include <charconv>
#include <concepts>
#include <string>

namespace strata {

template <std::floating_point T>
std::string format_shortest(T value) {
  char text[64] = {};
  const auto result = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, result.ptr);
}

}  // namespace strata
