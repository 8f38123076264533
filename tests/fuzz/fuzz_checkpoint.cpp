// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the checkpoint reader (train::checkpoint_store::load and load_latest). The
// input is a checkpoint directory in a small archive: records of (name line, size line, bytes),
// written under <tmp>/strata_fuzz_checkpoint_<pid>/epoch-1/ ("manifest.json", shards) and, for
// the name "latest", into the store's directory. Every bad checkpoint must be a
// checkpoint_error naming the file and the check (load) or be skipped (load_latest).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "strata/train/checkpoint.hpp"

namespace {

// Reads "name\nsize\n<size bytes>" records; false at the end of the input.
bool next_record(std::string_view& in, std::string& name, std::string_view& bytes) {
  const std::size_t a = in.find('\n');
  if (a == std::string_view::npos) {
    return false;
  }
  const std::size_t b = in.find('\n', a + 1);
  if (b == std::string_view::npos) {
    return false;
  }
  name = std::string(in.substr(0, a));
  std::size_t size = 0;
  for (const char c : in.substr(a + 1, b - a - 1)) {
    if (c < '0' || c > '9' || size > (1U << 20)) {
      return false;
    }
    size = size * 10 + static_cast<std::size_t>(c - '0');
  }
  in.remove_prefix(b + 1);
  size = std::min(size, in.size());
  bytes = in.substr(0, size);
  in.remove_prefix(size);
  return true;
}

bool safe_name(const std::string& name) {
  return !name.empty() && name.size() < 64 && name.find('/') == std::string::npos && name != "." &&
         name != "..";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  static const fs::path root =
      fs::temp_directory_path() / ("strata_fuzz_checkpoint_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path dir = root / "epoch-1";
  fs::create_directories(dir);
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string name;
  std::string_view bytes;
  while (next_record(in, name, bytes)) {
    if (!safe_name(name)) {
      continue;
    }
    std::ofstream out(name == "latest" ? root / name : dir / name,
                      std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const strata::train::checkpoint_store store(strata::train::checkpoint_config{.dir = root});
  try {
    (void)store.load(dir);
  } catch (const strata::checkpoint_error&) {
  }
  std::vector<strata::checkpoint_error> skipped;
  (void)store.load_latest(&skipped);
  return 0;
}
