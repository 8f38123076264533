# SPDX-License-Identifier: Apache-2.0
# Runs one must-not-compile test: cmake -DCOMPILER=... -DFLAGS=... -DSOURCE=... -P this file.
# The source's first line is `// expect-error: <regex>`; the compile must fail and its output
# must match the regex (so a test cannot pass by failing for another reason).
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
file(STRINGS "${SOURCE}" _first LIMIT_COUNT 1)
if(NOT _first MATCHES "^// expect-error: (.+)$")
  message(FATAL_ERROR "${SOURCE}: first line must be '// expect-error: <regex>'")
endif()
set(_regex "${CMAKE_MATCH_1}")
execute_process(COMMAND "${COMPILER}" ${FLAGS} "${SOURCE}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(_rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must fail with: ${_regex}")
endif()
if(NOT "${_out}${_err}" MATCHES "${_regex}")
  message(FATAL_ERROR "${SOURCE} failed to compile, but without '${_regex}':\n${_out}${_err}")
endif()
message(STATUS "${SOURCE}: rejected with '${_regex}' as expected")
