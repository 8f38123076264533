# SPDX-License-Identifier: Apache-2.0
# Flags for strata's own tests, examples and benchmarks (never imposed on consumers).
# Warnings are errors only where the project asks for it: scripts/test (and so CI) configures
# with STRATA_WERROR=ON; a build by hand (the benchmarks' documented one included) warns and goes
# on, so that a compiler's false positive (GCC 12's -Wrestrict at -O3, say) never stops it.
option(STRATA_WERROR "Make warnings errors in strata's own tests, examples and benchmarks" OFF)
add_library(strata_build_flags INTERFACE)
target_compile_options(strata_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic $<$<BOOL:${STRATA_WERROR}>:-Werror>>)
# The sanitizers: AddressSanitizer and UndefinedBehaviorSanitizer without its `vptr` check. That
# check verifies the dynamic type behind every member access and cast of a polymorphic class; it
# was 16 of the 38 s that UBSan adds to test_trainer.cpp's compile at -O0 (22 s alone, 60 s with
# both sanitizers). strata's only polymorphic classes are any_comm's type-erasing holders, which
# are never cast downwards; a stale or freed object behind them is ASan's to find.
if(STRATA_SANITIZE)
  target_compile_options(strata_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize=vptr
    -fno-sanitize-recover=all -fno-omit-frame-pointer>)
  target_link_options(strata_build_flags INTERFACE -fsanitize=address,undefined
    -fno-sanitize=vptr)
endif()

# ThreadSanitizer (the TSan job builds only the tests of code where threads meet: tests/tsan.cmake).
if(STRATA_TSAN)
  if(STRATA_SANITIZE)
    message(FATAL_ERROR "STRATA_TSAN and STRATA_SANITIZE cannot be combined (one build each)")
  endif()
  target_compile_options(strata_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_link_options(strata_build_flags INTERFACE -fsanitize=thread)
endif()

# CMake 3.25 does not know nvcc's C++20 flag (cuda_std_20 needs 3.26+), so say it directly.
add_library(strata_cuda_flags INTERFACE)
target_compile_options(strata_cuda_flags INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)

# Examples and benchmarks are measured programs: -O3 and the build machine's instruction set
# (Eigen's elementwise kernels use AVX-512 / AVX2 and FMA where the CPU has them), without debug
# information (-g0: it was 40% of example 01's compile time; build with STRATA_NATIVE=OFF and
# CMAKE_BUILD_TYPE=Debug to debug them). Benchmarks also drop assertions (NDEBUG). Off under the
# sanitizers.
option(STRATA_NATIVE "Build examples and benchmarks with -O3 -march=native" ON)
add_library(strata_release_flags INTERFACE)
if(STRATA_NATIVE AND NOT STRATA_SANITIZE)
  # GCC 12 warns falsely about uninitialized values inside its own AVX-512 intrinsics headers
  # as Eigen uses them; the warning stays on for every other build of the tests.
  target_compile_options(strata_release_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-O3 -march=native -g0 -Wno-maybe-uninitialized -Wno-uninitialized>)
endif()
add_library(strata_bench_flags INTERFACE)
target_link_libraries(strata_bench_flags INTERFACE strata_release_flags)
target_compile_definitions(strata_bench_flags INTERFACE NDEBUG)
