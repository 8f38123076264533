# SPDX-License-Identifier: Apache-2.0
# One case of the fault suite: runs an example trainer (under a launcher or alone) with a fault
# injected from outside (STRATA_COMM_FAULT, given to every rank), within a time limit, and judges
# what a user would meet: the exit status, the messages, the time it took; then, when asked,
# runs the same command again without the fault and requires it to continue from the last
# committed checkpoint and end with the parameters of a run that was never interrupted.
#
#   cmake -DPROGRAM=fashion_mnist_mlp "-DLAUNCHER=mpiexec;-n;2;..." "-DARGS=..." -DWORK=dir
#         -DFAULT=rank=1,op=all_reduce,seq=70,action=kill -DEXPECT_EXIT=nonzero|abort|N
#         "-DEXPECT=regex;regex" [-DLIMIT=60] [-DRESUME=ON [-DRESUME_FROM=regex]]
#         [-DKILLED_WRITING=ON] [-DFAULT_VAR=STRATA_GRADIENT_FAULT [-DCOMPARE_FAULT=spec]]
#         [-DEND_WITHIN=seconds] [-DEXTRA_SKIPS=N] -P run_example_fault.cmake
#
# END_WITHIN (with RESUME): the faulty job must end at most this many seconds later than the
# uninterrupted run takes in all (which does more work than the faulty run before its fault),
# 1 s added for the clock's whole seconds: the bound on how long the survivors may wait.
# EXTRA_SKIPS: the faulty run (exit 0) reports exactly N more skipped steps than a run without
# the fault ("clean"), so that a fault that does nothing cannot pass.
# FAULT_VAR: the variable that carries the fault (default STRATA_COMM_FAULT). COMPARE_FAULT: a
# run with this fault instead must end with the same parameters as the faulty run (both exit 0).
# RESUME_FROM: the checkpoints the rerun may continue from (default epoch-1). KILLED_WRITING: the
# fault may end the job while rank 0 writes a checkpoint, so its staging directory may remain
# until the rerun's first save (checked after the rerun instead of after the fault).
#
# The runs write checkpoints under WORK/checkpoints (emptied first): run "faulty" (the fault
# and its rerun) and run "straight" (uninterrupted, only with RESUME).
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
include("${CMAKE_CURRENT_LIST_DIR}/fault_common.cmake")
fault_driver_start(run_example_fault.cmake PROGRAM WORK FAULT EXPECT_EXIT)

run_case(faulty "${FAULT}")
set(_seconds_fault ${seconds_faulty})  # the rerun below reuses the name
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
# No rank or launcher outlives the job.
check_no_processes()
# Nothing half-written is left where the next run looks.
if(NOT KILLED_WRITING)
  check_no_staging()
endif()
if(NOT DEFINED RESUME_FROM)
  set(RESUME_FROM epoch-1)
endif()

if(DEFINED COMPARE_FAULT AND NOT COMPARE_FAULT STREQUAL "")
  run_case(other "${COMPARE_FAULT}")
  params_hash("${out_faulty}" _faulty)
  params_hash("${out_other}" _other)
  if(NOT rc_other EQUAL 0 OR _other STREQUAL "")
    list(APPEND _failures "the run with ${COMPARE_FAULT} failed (exit ${rc_other})")
  elseif(NOT _faulty STREQUAL _other)
    list(APPEND _failures
      "params_xxh3 with ${FAULT} ${_faulty}, with ${COMPARE_FAULT} ${_other}: they must agree")
  endif()
endif()

if(DEFINED EXTRA_SKIPS AND NOT EXTRA_SKIPS STREQUAL "")
  run_case(clean "")
  foreach(_run faulty clean)
    set(_skips_${_run} 0)
    if(out_${_run} MATCHES "summary: [^\n]* skipped_steps ([0-9]+)")
      set(_skips_${_run} ${CMAKE_MATCH_1})
    endif()
  endforeach()
  math(EXPR _want "${_skips_clean} + ${EXTRA_SKIPS}")
  if(NOT rc_clean EQUAL 0)
    list(APPEND _failures "the run without the fault failed (exit ${rc_clean})")
  elseif(NOT _skips_faulty EQUAL _want)
    list(APPEND _failures "skipped steps: ${_skips_faulty} with the fault, ${_skips_clean} \
without it; expected ${EXTRA_SKIPS} more")
  endif()
endif()

if(RESUME)
  run_case(faulty "")
  if(NOT rc_faulty EQUAL 0)
    list(APPEND _failures "the rerun without the fault failed (exit ${rc_faulty})")
  elseif(NOT out_faulty MATCHES "run faulty: resumed from [^\n]*faulty/${RESUME_FROM}[ \n]")
    list(APPEND _failures "the rerun did not continue from ${RESUME_FROM}")
  endif()
  check_no_staging()
  check_same_as_straight("${out_faulty}")
  if(DEFINED END_WITHIN AND NOT END_WITHIN STREQUAL "")
    math(EXPR _bound "${seconds_straight} + ${END_WITHIN} + 1")
    if(_seconds_fault GREATER _bound)
      list(APPEND _failures "the job with the fault took ${_seconds_fault} s to end, more than \
the uninterrupted run's ${seconds_straight} s + ${END_WITHIN} s + 1 s")
    endif()
  endif()
endif()

report_failures()
