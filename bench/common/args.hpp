// SPDX-License-Identifier: Apache-2.0
#pragma once

// Command-line helpers shared by the benchmarks.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

// The value after argv[i] (advancing i); exits with status 2 and a message when there is none.
inline std::string next_value(int argc, char** argv, int& i, const char* program) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s: %s needs a value\n", program, argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

// "1,2,4" as numbers.
template <class T>
std::vector<T> comma_list(const std::string& text) {
  std::vector<T> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    out.push_back(static_cast<T>(std::stoll(text.substr(start, comma - start))));
    start = comma + 1;
  }
  return out;
}

}  // namespace bench
