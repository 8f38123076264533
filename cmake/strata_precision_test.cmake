# SPDX-License-Identifier: Apache-2.0
# Mixed precision against float32 on real data: runs PROGRAM (a trainer binary) once with
# mixed_precision_dtype = float32 and once with each of DTYPES, the rest of ARGS equal, and
# checks that each one's test accuracy differs from float32's by at most TOLERANCE (a fraction:
# 0.005 is half a point).
#   cmake -DPROGRAM=... -DWORK=dir "-DDTYPES=bfloat16;float16" -DTOLERANCE=0.005
#         "-DARGS=--epochs;3" -P file
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")

function(accuracy dtype out_var)
  file(MAKE_DIRECTORY "${WORK}/${dtype}")
  execute_process(COMMAND "${PROGRAM}" ${ARGS} --mixed_precision_dtype ${dtype} --resume false
    --checkpoint_dir "${WORK}/${dtype}/checkpoints"
    WORKING_DIRECTORY "${WORK}/${dtype}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} (${dtype}) failed (${rc}):\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "summary: test_accuracy ([0-9.]+)")
    message(FATAL_ERROR "no summary line in the output of ${dtype}:\n${out}")
  endif()
  message(STATUS "${dtype}: test accuracy ${CMAKE_MATCH_1}")
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

accuracy(float32 reference)
include("${CMAKE_CURRENT_LIST_DIR}/strata_units.cmake")  # to_units: compare in units of 1e-4
to_units("${reference}" ref_digits)
to_units("${TOLERANCE}" tol_digits)
foreach(dtype IN LISTS DTYPES)
  accuracy(${dtype} mixed)
  to_units("${mixed}" mixed_digits)
  units_apart("${mixed_digits}" "${ref_digits}" diff)
  if(diff GREATER tol_digits)
    message(FATAL_ERROR "${dtype} reached ${mixed}, float32 ${reference}: they differ by more "
      "than ${TOLERANCE}")
  endif()
  message(STATUS "${dtype} ${mixed} vs float32 ${reference}: within ${TOLERANCE}")
endforeach()
