# SPDX-License-Identifier: Apache-2.0
# One case of the fault suite: runs an example trainer (under a launcher or alone) with a fault
# injected from outside (STRATA_COMM_FAULT, given to every rank), within a time limit, and judges
# what a user would meet: the exit status, the messages, the time it took; then, when asked,
# runs the same command again without the fault and requires it to continue from the last
# committed checkpoint and end with the parameters of a run that was never interrupted.
#
#   cmake -DPROGRAM=fashion_mnist_mlp "-DLAUNCHER=mpiexec;-n;2;..." "-DARGS=..." -DWORK=dir
#         -DFAULT=rank=1,op=all_reduce,seq=70,action=kill -DEXPECT_EXIT=nonzero|abort|N
#         "-DEXPECT=regex;regex" [-DLIMIT=60] [-DRESUME=ON] -P run_example_fault.cmake
#
# The runs write checkpoints under WORK/checkpoints (emptied first): run "faulty" (the fault
# and its rerun) and run "straight" (uninterrupted, only with RESUME).
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
foreach(_var PROGRAM WORK FAULT EXPECT_EXIT)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "run_example_fault.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT DEFINED LIMIT)
  set(LIMIT 60)
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(_dir "${WORK}/checkpoints")
set(_failures "")

# Runs the command for run `name` (with the fault when `fault` is not empty); sets out_<name>,
# rc_<name> and seconds_<name>.
function(run_case name fault)
  set(_command ${LAUNCHER})
  if(fault)
    set(ENV{STRATA_COMM_FAULT} "${fault}")
    if(LAUNCHER)
      list(APPEND _command -x STRATA_COMM_FAULT)
    endif()
  else()
    unset(ENV{STRATA_COMM_FAULT})
  endif()
  list(APPEND _command "${PROGRAM}" ${ARGS} --checkpoint_dir "${_dir}" --run_name ${name})
  string(TIMESTAMP _start "%s")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
    ERROR_VARIABLE _out TIMEOUT ${LIMIT})
  string(TIMESTAMP _end "%s")
  math(EXPR _seconds "${_end} - ${_start}")
  string(REPLACE "\r" "\n" _out "${_out}")  # progress bars
  string(JOIN " " _shown ${_command})
  if(fault)
    set(_shown "STRATA_COMM_FAULT=${fault} ${_shown}")
  endif()
  message("${_shown}\nexit: ${_rc} after ${_seconds} s\n----- output -----\n${_out}------------------")
  set(out_${name} "${_out}" PARENT_SCOPE)
  set(rc_${name} "${_rc}" PARENT_SCOPE)
  set(seconds_${name} "${_seconds}" PARENT_SCOPE)
endfunction()

function(params_hash text result)
  string(REGEX MATCH "summary: [^\n]*params_xxh3 ([0-9a-f]+)" _m "${text}")
  set(${result} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

run_case(faulty "${FAULT}")
if(NOT rc_faulty MATCHES "^-?[0-9]+$")
  list(APPEND _failures "the job did not end by itself within ${LIMIT} s (${rc_faulty}): a hang")
elseif(EXPECT_EXIT STREQUAL "nonzero" AND rc_faulty EQUAL 0)
  list(APPEND _failures "exit status 0, expected the job to fail")
elseif(EXPECT_EXIT STREQUAL "abort" AND NOT rc_faulty EQUAL 3)
  list(APPEND _failures "exit status ${rc_faulty}, expected strata's MPI_Abort code 3")
elseif(EXPECT_EXIT MATCHES "^[0-9]+$" AND NOT rc_faulty EQUAL EXPECT_EXIT)
  list(APPEND _failures "exit status ${rc_faulty}, expected ${EXPECT_EXIT}")
endif()
foreach(_regex IN LISTS EXPECT)
  if(NOT out_faulty MATCHES "${_regex}")
    list(APPEND _failures "no output matches: ${_regex}")
  endif()
endforeach()
# Nothing half-written is left where the next run looks.
file(GLOB _staging LIST_DIRECTORIES true "${_dir}/*/.tmp-*" "${_dir}/*/.old-*"
  "${_dir}/*/latest.tmp")
foreach(_entry IN LISTS _staging)
  list(APPEND _failures "a staging entry was left behind: ${_entry}")
endforeach()

if(RESUME)
  run_case(faulty "")
  if(NOT rc_faulty EQUAL 0)
    list(APPEND _failures "the rerun without the fault failed (exit ${rc_faulty})")
  elseif(NOT out_faulty MATCHES "run faulty: resumed from [^\n]*faulty/epoch-1")
    list(APPEND _failures "the rerun did not continue from the checkpoint of epoch 1")
  endif()
  params_hash("${out_faulty}" _resumed)
  run_case(straight "")
  params_hash("${out_straight}" _straight)
  if(NOT rc_straight EQUAL 0 OR _straight STREQUAL "")
    list(APPEND _failures "the uninterrupted run failed (exit ${rc_straight})")
  elseif(NOT _resumed STREQUAL _straight)
    list(APPEND _failures
      "params_xxh3 after the fault and the rerun ${_resumed}, uninterrupted ${_straight}")
  endif()
endif()

if(_failures)
  string(JOIN "\n  " _text ${_failures})
  message(FATAL_ERROR "fault case failed:\n  ${_text}")
endif()
message(STATUS "fault case passed")
