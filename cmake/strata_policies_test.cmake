# SPDX-License-Identifier: Apache-2.0
# The data-parallel policies an example trainer picks from its configuration: runs PROGRAM
# (optionally under LAUNCHER, e.g. "mpiexec;-n;2;--allow-run-as-root") with ARGS and each
# policy's keys, and checks every run against the plain all-reduce run:
#   - gradient_sync = parameter_server, hierarchical and zero_stage = 1, and adaptive_batch = true
#     (with all_reduce and zero1) compute the same average gradient: test loss within 0.001 (the
#     adaptive zero1 case against all-reduce with the same micro-batches);
#   - gradient_compression = float16 / bfloat16 (all-reduce; float16 hierarchical) and top-k (ratio 0.1, through the parameter
#     server and by all-gather) train on approximations: test accuracy within 3 points.
#   cmake -DPROGRAM=... -DWORK=dir "-DARGS=--world_size;2;..." [-DLAUNCHER=...] -P file
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")

include("${CMAKE_CURRENT_LIST_DIR}/strata_units.cmake")  # to_units

# Runs one case; sets <name>_accuracy and <name>_loss (units of 1e-4) in the caller.
function(run_case name)
  file(MAKE_DIRECTORY "${WORK}/${name}")
  execute_process(COMMAND ${LAUNCHER} "${PROGRAM}" ${ARGS} ${ARGN} --resume false
    --checkpoint_dir "${WORK}/${name}/checkpoints"
    WORKING_DIRECTORY "${WORK}/${name}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} (${name}: ${ARGN}) failed (${rc}):\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "summary: test_accuracy ([0-9.]+) test_loss ([0-9.]+)")
    message(FATAL_ERROR "no summary line in the output of ${name}:\n${out}\n${err}")
  endif()
  message(STATUS "${name}: test accuracy ${CMAKE_MATCH_1}, test loss ${CMAKE_MATCH_2}")
  set(accuracy "${CMAKE_MATCH_1}")
  to_units("${CMAKE_MATCH_2}" loss)
  to_units("${accuracy}" accuracy)
  set(${name}_accuracy "${accuracy}" PARENT_SCOPE)
  set(${name}_loss "${loss}" PARENT_SCOPE)
endfunction()

# check_within(name what tolerance [reference]): the case against the reference run (default:
# `reference`, the plain all-reduce).
function(check_within name what tolerance)
  set(ref reference)
  if(ARGC GREATER 3)
    set(ref "${ARGV3}")
  endif()
  units_apart("${${name}_${what}}" "${${ref}_${what}}" diff)
  if(diff GREATER tolerance)
    message(FATAL_ERROR "${name}: test ${what} ${${name}_${what}} against ${ref}'s "
      "${${ref}_${what}} (units of 1e-4): more than ${tolerance} apart")
  endif()
endfunction()

run_case(reference)
# The cases whose gradients are the all-reduce's average.
run_case(parameter_server --gradient_sync parameter_server)
check_within(parameter_server loss 10)
run_case(hierarchical --gradient_sync hierarchical)
check_within(hierarchical loss 10)
run_case(zero1 --zero_stage 1)
check_within(zero1 loss 10)
# The adaptive batch: each rank picks its micro-batch in its own budget, the ranks agree on the
# smallest; the same global batches, so the same average gradient.
run_case(adaptive --adaptive_batch true --memory_budget_mb 256)
check_within(adaptive loss 10)
# (zero1: micro-batches of 8, four to a step of the reference's 32 samples per rank, against the
# plain all-reduce accumulating the same four micro-batches: the sums are associated alike. Against
# the reference's whole batches the loss drifts by a few 1e-4 with the CPU's vector width.)
set(micro8 --batch_size_per_gpu 8 --gradient_accumulation_steps 4)
run_case(accumulate8 ${micro8})
check_within(accumulate8 accuracy 300)
run_case(adaptive_zero1 --adaptive_batch true --memory_budget_mb 256 --zero_stage 1 ${micro8}
  --adaptive_batch_max 8)
check_within(adaptive_zero1 loss 10 accumulate8)
# The compressed ones.
run_case(float16 --gradient_compression float16)
check_within(float16 accuracy 300)
run_case(bfloat16 --gradient_compression bfloat16)
check_within(bfloat16 accuracy 300)
run_case(hierarchical_float16 --gradient_sync hierarchical --gradient_compression float16)
check_within(hierarchical_float16 accuracy 300)
run_case(topk_parameter_server --gradient_sync parameter_server --gradient_compression topk
  --topk_ratio 0.1)
check_within(topk_parameter_server accuracy 300)
run_case(topk_all_gather --gradient_sync all_gather --gradient_compression topk --topk_ratio 0.1)
check_within(topk_all_gather accuracy 300)
message(STATUS "every data-parallel policy trained like all_reduce")
