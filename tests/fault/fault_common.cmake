# SPDX-License-Identifier: Apache-2.0
# Shared by the fault suite's drivers: runs of an example trainer with a fault given through the
# environment variable FAULT_VAR (default STRATA_COMM_FAULT), judged from outside. The runs use
# PROGRAM, ARGS, LIMIT, optional LAUNCHER, and _dir (the checkpoint directory).
if(NOT DEFINED FAULT_VAR)
  set(FAULT_VAR STRATA_COMM_FAULT)
endif()

# Stops with an error unless each variable named after `driver` is defined; LIMIT defaults to
# 60 s; WORK starts empty; sets _dir (WORK/checkpoints) and _failures (empty).
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/strata_require_vars.cmake")
macro(fault_driver_start driver)
  strata_require_vars(${driver} ${ARGN})
  if(NOT DEFINED LIMIT)
    set(LIMIT 60)
  endif()
  file(REMOVE_RECURSE "${WORK}")
  file(MAKE_DIRECTORY "${WORK}")
  set(_dir "${WORK}/checkpoints")
  set(_failures "")
endmacro()

# Runs the command for run `name` (with the fault when `fault` is not empty); sets out_<name>,
# rc_<name> and seconds_<name>.
function(run_case name fault)
  set(_command ${LAUNCHER})
  if(fault)
    set(ENV{${FAULT_VAR}} "${fault}")
    if(LAUNCHER)
      list(APPEND _command -x ${FAULT_VAR})
    endif()
  else()
    unset(ENV{${FAULT_VAR}})
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
    set(_shown "${FAULT_VAR}=${fault} ${_shown}")
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

# Appends to _failures each staging entry left where the next run looks (.tmp-*, .old-*,
# latest.tmp).
macro(check_no_staging)
  file(GLOB _staging LIST_DIRECTORIES true "${_dir}/*/.tmp-*" "${_dir}/*/.old-*"
    "${_dir}/*/latest.tmp")
  foreach(_entry IN LISTS _staging)
    list(APPEND _failures "a staging entry was left behind: ${_entry}")
  endforeach()
endmacro()

# Appends to _failures each process still running whose command line names _dir (a rank or a
# launcher the fault left behind). The pattern's first character is bracketed so that grep does
# not find itself.
macro(check_no_processes)
  string(SUBSTRING "${_dir}" 0 1 _first)
  string(SUBSTRING "${_dir}" 1 -1 _rest)
  execute_process(COMMAND sh -c "for f in $(grep -l -a -e \"$0\" /proc/[0-9]*/cmdline \
2>/dev/null); do tr '\\0' ' ' < $f 2>/dev/null; echo; done" "[${_first}]${_rest}"
    OUTPUT_VARIABLE _left)
  string(STRIP "${_left}" _left)
  if(_left)
    string(REPLACE "\n" "; " _left "${_left}")
    list(APPEND _failures "processes left behind: ${_left}")
  endif()
endmacro()

# Runs the uninterrupted run "straight"; appends to _failures unless it succeeds and ends with
# the parameters (params_xxh3 of the summary line) of `text`, the output of the resumed run.
macro(check_same_as_straight text)
  params_hash("${text}" _resumed)
  run_case(straight "")
  params_hash("${out_straight}" _straight)
  if(NOT rc_straight EQUAL 0 OR _straight STREQUAL "")
    list(APPEND _failures "the uninterrupted run failed (exit ${rc_straight})")
  elseif(NOT _resumed STREQUAL _straight)
    list(APPEND _failures
      "params_xxh3 after the faults and the reruns ${_resumed}, uninterrupted ${_straight}")
  endif()
endmacro()

# Fails the test with every entry of _failures, or says it passed.
macro(report_failures)
  if(_failures)
    string(JOIN "\n  " _text ${_failures})
    message(FATAL_ERROR "fault case failed:\n  ${_text}")
  endif()
  message(STATUS "fault case passed")
endmacro()
