// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the configuration readers. The first byte picks the reader: even, the rest
// is a TOML document (parse_toml); odd, the rest is a command line, one argument per line
// (config::cli::parse). Every bad input must be a config_error; any other exception, a crash or
// a sanitizer report is a defect.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/config/command_line.hpp"
#include "strata/config/toml_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1U) == 0) {
    try {
      (void)strata::config::parse_toml(input, "fuzz.toml");
    } catch (const strata::config_error&) {
    }
    return 0;
  }
  std::vector<std::string> args{"fuzz"};
  std::size_t at = 0;
  while (at <= input.size()) {
    const std::size_t end = std::min(input.find('\n', at), input.size());
    std::string arg(input.substr(at, end - at));
    // A file named on the command line would make the target read whatever path the input
    // spells (a FIFO, /dev/zero); the TOML reader is fuzzed through the other branch.
    if (arg.starts_with("--config")) {
      arg = "--seed";
    }
    args.push_back(std::move(arg));
    at = end + 1;
  }
  std::vector<const char*> argv;
  for (const auto& a : args) {
    argv.push_back(a.c_str());
  }
  try {
    strata::config::cli parser("fuzz");
    (void)parser.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const strata::config_error&) {
  }
  return 0;
}
