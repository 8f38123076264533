// SPDX-License-Identifier: Apache-2.0
#pragma once

// For a benchmark that runs another program (itself again under mpiexec, or a Python baseline):
// its own path, and the JSON object the child printed last.

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

namespace bench {

// The last line of a command's output that parses as a JSON object; nullopt if none.
inline std::optional<nlohmann::json> run_json(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) {
    return std::nullopt;
  }
  std::string out;
  char chunk[4096];
  while (std::fgets(chunk, sizeof chunk, pipe.get()) != nullptr) {
    out += chunk;
  }
  std::optional<nlohmann::json> last;
  std::size_t start = 0;
  while (start < out.size()) {
    std::size_t end = out.find('\n', start);
    if (end == std::string::npos) {
      end = out.size();
    }
    const std::string line = out.substr(start, end - start);
    if (!line.empty() && line.front() == '{') {
      try {
        last = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
      }
    }
    start = end + 1;
  }
  return last;
}

// This program's path (`fallback` where /proc says nothing).
inline std::string self_path(const std::string& fallback) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? fallback : exe.string();
}

}  // namespace bench
