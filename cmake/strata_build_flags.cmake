# SPDX-License-Identifier: Apache-2.0
# Flags for strata's own tests, examples and benchmarks (never imposed on consumers).
add_library(strata_build_flags INTERFACE)
target_compile_options(strata_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror>)
if(STRATA_SANITIZE)
  target_compile_options(strata_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=all
    -fno-omit-frame-pointer>)
  target_link_options(strata_build_flags INTERFACE -fsanitize=address,undefined)
endif()

# CMake 3.25 does not know nvcc's C++20 flag (cuda_std_20 needs 3.26+), so say it directly.
add_library(strata_cuda_flags INTERFACE)
target_compile_options(strata_cuda_flags INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
