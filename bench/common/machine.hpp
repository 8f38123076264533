// SPDX-License-Identifier: Apache-2.0
#pragma once

// What every benchmark says of the machine it ran on: the CPU's model name (and, through
// strata's own detection, its vector units and the GEMM kernels).

#include <fstream>
#include <string>

namespace bench {

// The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("model name")) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

}  // namespace bench
