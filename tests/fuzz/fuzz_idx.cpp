// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the IDX reader, plain and gzip (data::read_idx). The input is written to a
// file of this process and read back; every bad input must be a data_error naming the file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "strata/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("strata_fuzz_idx_" + std::to_string(::getpid()) + ".idx");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const strata::data::idx_array array = strata::data::read_idx(path);
    (void)array;
  } catch (const strata::data_error&) {
  }
  return 0;
}
