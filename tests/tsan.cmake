# SPDX-License-Identifier: Apache-2.0
# The ThreadSanitizer job (STRATA_TSAN=ON, scripts/test --tsan; included by tests/CMakeLists.txt
# in place of everything else): the tests of the code where threads meet, label `tsan`.
#   tsan.comm.threads          the threads backend: collectives, messages, non-blocking requests
#                              and their progress thread, faults (the conformance suite with a
#                              smaller largest count, tests/conformance/comm_backend.hpp)
#   tsan.comm.algorithms       collectives built on point-to-point
#   tsan.data.prefetch_loader  loader workers, prefetching, a worker's exception and a stall
#   tsan.parallel.data_parallel  the trainer on thread ranks: buckets reduced while backward
#                              runs, hierarchical and parameter-server overlap, zero1
# Left out here (they run in the regular and ASan jobs): the cases of the "timing" suite, which
# measure time, and two cases that only move large buffers (one thread per rank, no new
# interleavings). The first report ends the test as failed (halt_on_error; a race let run on can
# corrupt a queue and hang instead). No suppressions: the job builds with Eigen's GEMM alone
# (scripts/test --tsan turns oneDNN and OpenBLAS off), so every line that runs is instrumented;
# oneDNN and OpenBLAS are prebuilt without TSan, which cannot see their own synchronisation (it
# reported oneDNN's primitive cache when they were in).
set(_tsan_tests
  "comm|threads|--test-case-exclude=*large counts*,*buffers too large for caches*"
  "comm|algorithms|"
  "data|prefetch_loader|"
  "parallel|data_parallel|")
# Each program is built from the test files it runs, nothing else.
set(_tsan_files_comm unit/comm/test_threads.cpp unit/comm/test_algorithms.cpp)
set(_tsan_files_data unit/data/test_prefetch_loader.cpp)
set(_tsan_files_parallel unit/parallel/test_data_parallel.cpp)
foreach(_family comm data parallel)
  add_executable(unit_${_family} unit/main.cpp ${_tsan_files_${_family}})
  target_link_libraries(unit_${_family} PRIVATE strata::core doctest::doctest strata_build_flags)
  target_include_directories(unit_${_family} PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
  target_compile_definitions(unit_${_family} PRIVATE STRATA_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    STRATA_TEST_WORK_DIR="${CMAKE_CURRENT_BINARY_DIR}/work")
  strata_label_targets(LABELS tsan TARGETS unit_${_family})
endforeach()
foreach(_case IN LISTS _tsan_tests)
  string(REPLACE "|" ";" _parts "${_case}")
  list(GET _parts 0 _family)
  list(GET _parts 1 _entity)
  list(LENGTH _parts _n)
  set(_extra "")
  if(_n GREATER 2)
    list(GET _parts 2 _extra)
  endif()
  add_test(NAME tsan.${_family}.${_entity} COMMAND unit_${_family}
    --source-file=*/test_${_entity}.cpp --no-version --test-suite-exclude=timing ${_extra})
  set_tests_properties(tsan.${_family}.${_entity} PROPERTIES LABELS "tsan;${_family}"
    TIMEOUT 600 ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1 second_deadlock_stack=1")
endforeach()
