// SPDX-License-Identifier: Apache-2.0
// The one doctest main shared by every unit-test executable. After the run it names the cases
// of the files it ran that were not run because this CPU or build lacks what they need
// (common/needs.hpp): doctest counts them as skipped, and the output says which and why.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "unit/common/needs.hpp"

namespace {

// Whether `file` is among the files --source-file=PATTERN,... selects (the patterns ctest passes
// are "*/test_<entity>.cpp": a leading * matches any prefix); no such option selects every file.
bool selected(std::string_view file, const std::vector<std::string>& patterns) {
  if (patterns.empty()) {
    return true;
  }
  for (const std::string& p : patterns) {
    const std::string_view tail =
        std::string_view(p).starts_with("*") ? std::string_view(p).substr(1) : std::string_view(p);
    if (p.starts_with("*") ? file.ends_with(tail) : file == tail) {
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> patterns;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    for (const std::string_view flag : {"--source-file=", "-sf="}) {
      if (arg.starts_with(flag)) {
        std::string_view rest = arg.substr(flag.size());
        while (!rest.empty()) {
          const auto comma = rest.find(',');
          patterns.emplace_back(rest.substr(0, comma));
          rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        }
      }
    }
  }
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) {
    return status;
  }
  for (const strata::test::lacking_case& c : strata::test::lacking_cases()) {
    if (selected(c.file, patterns)) {
      std::printf("[strata] not run (skipped, not passed): \"%s\" (%s): %s\n", c.name.c_str(),
                  c.file.c_str(), c.why.c_str());
    }
  }
  return status;
}
