# SPDX-License-Identifier: Apache-2.0
# Exact resume across processes: runs PROGRAM (a trainer binary) straight through, then again in
# two processes (stopped by max_steps = STOP, then resumed), and checks that every step's loss
# and the final parameters' xxh3 are identical.
#   cmake -DPROGRAM=... -DWORK=dir -DSTOP=11 "-DARGS=--epochs;2;..." -P this file
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/straight" "${WORK}/split")

function(run_trainer dir extra out_var)
  execute_process(COMMAND "${PROGRAM}" ${ARGS} --checkpoint_dir "${dir}/checkpoints"
    --metrics_file "${dir}/metrics.jsonl" ${extra}
    WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} ${extra} failed (${rc}):\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

function(step_losses file out_var)
  file(STRINGS "${file}" lines)
  set(losses "")
  foreach(line IN LISTS lines)
    string(JSON type GET "${line}" type)
    if(type STREQUAL "step")
      string(JSON step GET "${line}" step)
      string(JSON loss GET "${line}" loss)
      list(APPEND losses "${step}:${loss}")
    endif()
  endforeach()
  set(${out_var} "${losses}" PARENT_SCOPE)
endfunction()

function(params_hash text out_var)
  if(NOT text MATCHES "params_xxh3 ([0-9a-f]+)")
    message(FATAL_ERROR "no params_xxh3 in the summary:\n${text}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

run_trainer("${WORK}/straight" "--resume;false" straight_out)
run_trainer("${WORK}/split" "--resume;false;--max_steps;${STOP}" first_out)
if(NOT first_out MATCHES "stopped after max_steps")
  message(FATAL_ERROR "the first part did not stop at max_steps = ${STOP}:\n${first_out}")
endif()
run_trainer("${WORK}/split" "--resume;true" second_out)
if(NOT second_out MATCHES "resumed from")
  message(FATAL_ERROR "the second part did not resume:\n${second_out}")
endif()

step_losses("${WORK}/straight/metrics.jsonl" straight_losses)
step_losses("${WORK}/split/metrics.jsonl" split_losses)
list(LENGTH straight_losses n)
if(n EQUAL 0)
  message(FATAL_ERROR "no step rows in ${WORK}/straight/metrics.jsonl")
endif()
if(NOT straight_losses STREQUAL split_losses)
  message(FATAL_ERROR "per-step losses differ after resuming at step ${STOP}:\n"
    "straight: ${straight_losses}\nsplit:    ${split_losses}")
endif()
params_hash("${straight_out}" straight_hash)
params_hash("${second_out}" split_hash)
if(NOT straight_hash STREQUAL split_hash)
  message(FATAL_ERROR "final parameters differ: ${straight_hash} straight, ${split_hash} resumed")
endif()
message(STATUS "${n} steps identical, final parameters ${straight_hash} in both runs")
