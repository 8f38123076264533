# SPDX-License-Identifier: Apache-2.0
# Runs PROGRAM with ARGS and checks that it exits with status EXPECT and prints an error line
# (matching MESSAGE when given; with ONE_LINE, nothing else on stderr), and that the path ABSENT
# (when given) does not exist after it.
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
execute_process(COMMAND "${PROGRAM}" ${ARGS} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
  ERROR_VARIABLE _err)
if(NOT _rc STREQUAL "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: exit status ${_rc}, expected ${EXPECT}\n${_out}${_err}")
endif()
if(NOT _err MATCHES "config error")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: no 'config error' message on stderr:\n${_err}")
endif()
if(DEFINED MESSAGE AND NOT _err MATCHES "${MESSAGE}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: the message does not match '${MESSAGE}':\n${_err}")
endif()
if(ONE_LINE)
  string(STRIP "${_err}" _stripped)
  if(_stripped MATCHES "\n")
    message(FATAL_ERROR "${PROGRAM} ${ARGS}: more than one line on stderr:\n${_err}")
  endif()
endif()
if(DEFINED ABSENT AND EXISTS "${ABSENT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: it wrote ${ABSENT}, which it must not:\n${_err}")
endif()
message(STATUS "exit ${_rc} as expected: ${_err}")
