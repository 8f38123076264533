# SPDX-License-Identifier: Apache-2.0
# The README's training commands, as a new user runs them: every line of a ```sh block of
# README.md that starts with build/examples/ runs in the order written, in one scratch
# directory, with only EXTRA appended (a training subset, so the test is quick). Each must exit
# 0 and print a summary line; a command whose comment says it "continues" must resume, one that
# says "another run" or "afresh" must start afresh, and --resume false must keep the earlier run
# of its settings aside (run-<fingerprint>.1).
#   cmake -DSOURCE_DIR=... -DBINARY_DIR=<build> -DWORK=dir "-DEXTRA=--max_train_samples;512"
#         -P this file
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(STRINGS "${SOURCE_DIR}/README.md" lines)
set(in_sh FALSE)
set(count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^```sh")
    set(in_sh TRUE)
    continue()
  elseif(line MATCHES "^```")
    set(in_sh FALSE)
    continue()
  endif()
  if(NOT in_sh OR NOT line MATCHES "^build/examples/")
    continue()
  endif()
  set(comment "")
  if(line MATCHES "#(.*)$")
    set(comment "${CMAKE_MATCH_1}")
  endif()
  string(REGEX REPLACE "[ ]*#.*$" "" command "${line}")
  separate_arguments(argv UNIX_COMMAND "${command}")
  list(POP_FRONT argv program)
  string(REGEX REPLACE "^build/" "" program "${program}")  # the README's build/ is BINARY_DIR
  math(EXPR count "${count} + 1")
  message(STATUS "README command ${count}: ${command} ${EXTRA}")
  execute_process(COMMAND "${BINARY_DIR}/${program}" ${argv} ${EXTRA}
    WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "summary: test_accuracy")
    message(FATAL_ERROR "README command ${count} failed (exit ${rc}): ${command}\n${out}\n${err}")
  endif()
  if(comment MATCHES "continues" AND NOT out MATCHES "resumed from")
    message(FATAL_ERROR "README command ${count} says it continues, but it did not resume:\n${out}")
  endif()
  if(comment MATCHES "another run|afresh" AND NOT out MATCHES "starting afresh")
    message(FATAL_ERROR "README command ${count} says it starts afresh, but:\n${out}")
  endif()
  # --resume false over an earlier run of the same settings keeps that run's checkpoints aside.
  if(command MATCHES "--resume false" AND NOT out MATCHES "earlier checkpoints of this name are kept in [^\n]*run-[0-9a-f]+\\.1")
    message(FATAL_ERROR "README command ${count} did not keep the earlier run aside:\n${out}")
  endif()
  string(REGEX MATCH "summary: [^\n]*" summary "${out}")
  message(STATUS "  ${summary}")
endforeach()
if(count LESS 2)
  message(FATAL_ERROR "found ${count} build/examples/ command(s) in README.md's sh blocks")
endif()
