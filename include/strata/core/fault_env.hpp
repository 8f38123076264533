// SPDX-License-Identifier: Apache-2.0
#pragma once

// The text of the fault suite's environment variables: comma-separated fields, each `key=value`
// or a bare flag ("rank=1,step=40,every"). Shared by train/checkpoint_fault.hpp,
// train/gradient_fault.hpp and data/loader_fault.hpp; every error names the variable and its
// whole value.

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"

namespace strata::detail {

class fault_text {
 public:
  fault_text(std::string_view variable, std::string_view text) : variable_(variable), text_(text) {}

  // strata::error "<VARIABLE>='<text>': <why>".
  error fail(const std::string& why) const { return error(variable_ + "='" + text_ + "': " + why); }

  // `value` as a non-negative integer (at most 2^40); else fail() naming `key`.
  std::uint64_t number(std::string_view key, std::string_view value) const {
    std::uint64_t n = 0;
    if (value.empty()) {
      throw fail(std::string(key) + " needs a value");
    }
    for (const char c : value) {
      if (c < '0' || c > '9') {
        throw fail(std::string(key) + " must be a non-negative integer, not '" +
                   std::string(value) + "'");
      }
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
      if (n > (std::uint64_t{1} << 40)) {
        throw fail(std::string(key) + " " + std::string(value) + " is more than 2^40");
      }
    }
    return n;
  }

  // Calls f(field, key, value) for each comma-separated field (value empty for a bare flag).
  template <class F>
  void each_field(F&& f) const {
    std::string_view rest = text_;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string_view field = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      const std::size_t eq = field.find('=');
      f(field, field.substr(0, eq),
        eq == std::string_view::npos ? std::string_view() : field.substr(eq + 1));
    }
  }

 private:
  std::string variable_;
  std::string text_;
};

// `parse(text)` of the environment variable `variable`, or nullopt when it is unset or empty.
template <class Parse>
auto parse_fault_variable(const char* variable, Parse&& parse)
    -> std::optional<decltype(parse(std::string_view()))> {
  const char* env = std::getenv(variable);
  if (env == nullptr || *env == '\0') {
    return std::nullopt;
  }
  return parse(std::string_view(env));
}

}  // namespace strata::detail
