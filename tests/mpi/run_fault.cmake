# SPDX-License-Identifier: Apache-2.0
# Runs one scenario of fault_scenarios under mpiexec with a time limit and checks the outcome:
# never a hang (the limit), never a silent result (the exit status and the printed errors).
#   cmake -DMPIEXEC=mpiexec -DNUMPROC_FLAG=-n -DNP=2 -DPROGRAM=fault_scenarios -DSCENARIO=hang
#         [-DLIMIT=30] [-DMODE=always|sampled] -P run_fault.cmake
# MODE is the fingerprint mode of the late_* scenarios (their second argument).
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/strata_require_vars.cmake")
strata_require_vars(run_fault.cmake MPIEXEC NUMPROC_FLAG NP PROGRAM SCENARIO)
if(NOT DEFINED LIMIT)
  set(LIMIT 30)
endif()

# What each scenario must end with. expect_exit: 0, or "abort" (strata's MPI_Abort code, see
# mpi_environment::abort_code), or "nonzero". expect: regexes that must all match the output.
set(fault "")
set(expect "")
math(EXPR _last "${NP} - 1")
if(SCENARIO MATCHES "^(count_1001|count_100000|dtype|op|root|skip|wrong_count)$")
  set(expect_exit 0)
  foreach(_rank RANGE ${_last})
    list(APPEND expect
      "rank ${_rank}: caught comm error \\(mismatch\\) on rank ${_rank} in [a-z_]+ #[0-9]+: the ranks called different collectives"
      "rank ${_rank}: after the mismatch, all_reduce gives ${NP}")
  endforeach()
  if(SCENARIO STREQUAL "count_1001")
    list(APPEND expect "rank 1: all_reduce #0 float32 x 1001 op sum \\(count differs from rank 0\\)")
  elseif(SCENARIO STREQUAL "count_100000")
    list(APPEND expect "rank 1: all_reduce #0 float32 x 100000 op sum \\(count differs from rank 0\\)")
  elseif(SCENARIO STREQUAL "dtype")
    list(APPEND expect "rank 1: all_reduce #0 float64 x 1000 op sum \\(dtype differs from rank 0\\)")
  elseif(SCENARIO STREQUAL "op")
    list(APPEND expect "rank 1: all_reduce #0 float32 x 1000 op max \\(reduction differs from rank 0\\)")
  elseif(SCENARIO STREQUAL "root")
    list(APPEND expect "rank 1: broadcast #0 float32 x 1000 root 1 \\(root differs from rank 0\\)")
  elseif(SCENARIO STREQUAL "skip")
    list(APPEND expect "rank 0: all_reduce #1 float32 x 1000 op sum; rank 1: barrier #1")
  elseif(SCENARIO STREQUAL "wrong_count")
    set(fault "rank=1,op=all_reduce,seq=0,action=wrong_count")
    list(APPEND expect "rank 1: all_reduce #0 float32 x 1001 op sum \\(count differs from rank 0\\)")
  endif()
elseif(SCENARIO MATCHES "^late_(count_1001|count_100000|skip)$" AND MODE STREQUAL "always")
  # Every collective checked: the mismatch at #100 is caught before data moves, as at #0.
  set(expect_exit 0)
  foreach(_rank RANGE ${_last})
    list(APPEND expect
      "rank ${_rank}: caught comm error \\(mismatch\\) on rank ${_rank} in [a-z_]+ #10[01]: the ranks called different collectives"
      "rank ${_rank}: after the mismatch, all_reduce gives ${NP}")
  endforeach()
  if(SCENARIO STREQUAL "late_count_1001")
    list(APPEND expect "rank 1: all_reduce #100 float32 x 1001 op sum \\(count differs from rank 0\\)")
  elseif(SCENARIO STREQUAL "late_count_100000")
    list(APPEND expect "rank 1: all_reduce #100 float32 x 100000 op sum \\(count differs from rank 0\\)")
  else()
    list(APPEND expect "rank 0: all_reduce #101 float32 x 1000 op sum; rank 1: barrier #101")
  endif()
elseif(SCENARIO MATCHES "^late_(count_1001|count_100000|skip)$" AND MODE STREQUAL "sampled")
  # #100 is not sampled: MPI meets the mismatch. Whatever it does with it (an error on some
  # ranks, garbage or a wait on others), the job ends with strata's abort and an error that
  # names the collective.
  # Counts: MPI reports a truncation on some rank, which says the call was not fingerprinted;
  # the program catches it and returns, and mpi_environment ends the job as it goes. A skipped
  # call: the ranks wait in different calls until the deadline.
  set(expect_exit abort)
  if(SCENARIO STREQUAL "late_skip")
    list(APPEND expect "comm error \\(timeout\\) on rank [0-9]+ in [a-z_]+ #101: [^\n]*waiting for the other ranks of the communicator[^\n]*it was not fingerprinted \\(comm_config.fingerprint = sampled\\)")
  else()
    list(APPEND expect "comm error \\(backend\\) on rank [0-9]+ in all_reduce #100: [^\n]*this collective was not fingerprinted \\(comm_config.fingerprint = sampled\\)"
      "strata: rank [0-9]+ of ${NP}: MPI failed an operation of this rank, which leaves its communicator unusable")
  endif()
  list(APPEND expect "calling MPI_Abort")
elseif(SCENARIO STREQUAL "kill")
  set(fault "rank=1,op=all_reduce,seq=1,action=kill")
  set(expect_exit nonzero)
  list(APPEND expect "rank 1 .*exited on signal 9")
elseif(SCENARIO STREQUAL "hang")
  set(fault "rank=1,op=all_reduce,seq=1,action=hang")
  set(expect_exit abort)
  list(APPEND expect
    "strata: comm error \\(timeout\\) on rank 0 in all_reduce #1: all_reduce #1 float32 x 1000 op sum did not complete within"
    "world ranks \\[0, 1\\]"
    "strata: the last operations of rank 0 \\(oldest first\\):"
    "all_reduce #0 float32 x 1000 op sum: completed"
    "all_reduce #1 float32 x 1000 op sum: started"
    "calling MPI_Abort")
elseif(SCENARIO STREQUAL "hang_alone")
  set(fault "rank=0,op=all_reduce,seq=1,action=hang")
  set(expect_exit abort)
  list(APPEND expect
    "strata: rank 0: injected fault 'hang' in all_reduce #1 and no other rank ended the job")
elseif(SCENARIO STREQUAL "throw")
  set(fault "rank=1,op=all_reduce,seq=1,action=throw")
  set(expect_exit abort)
  list(APPEND expect
    "strata: rank 1 of ${NP}: an exception is leaving strata::comm::mpi_environment"
    "injected fault 'throw' on rank 1 in all_reduce #1")
elseif(SCENARIO STREQUAL "skip_last")
  set(expect_exit abort)
  list(APPEND expect "strata: comm error \\(timeout\\) on rank 0 in all_reduce #1")
elseif(SCENARIO STREQUAL "recv_timeout")
  set(expect_exit abort)
  list(APPEND expect
    "strata: comm error \\(timeout\\) on rank [01] in recv #0: recv #0 float32 x 1000 peer [01] tag [78] did not complete[^\n]*missing: \\[[01]\\]")
elseif(SCENARIO STREQUAL "unchecked_100000")
  # Fingerprints off: MPI itself meets 100000 vs 1000 elements. Open MPI 4.1's non-blocking
  # all-reduce reports a truncation (a backend comm_error, which aborts the job as it leaves
  # mpi_environment); if it hung instead, the deadline would abort the job.
  set(expect_exit abort)
  list(APPEND expect "MPI_ERR_TRUNCATE|comm error \\(timeout\\)")
else()
  message(FATAL_ERROR "run_fault.cmake: unknown scenario '${SCENARIO}'")
endif()

set(_command "${MPIEXEC}" ${NUMPROC_FLAG} ${NP} --allow-run-as-root --oversubscribe)
if(fault)
  set(ENV{STRATA_COMM_FAULT} "${fault}")
  list(APPEND _command -x STRATA_COMM_FAULT)
else()
  unset(ENV{STRATA_COMM_FAULT})
endif()
list(APPEND _command "${PROGRAM}" "${SCENARIO}")
if(DEFINED MODE)
  list(APPEND _command "${MODE}")
endif()
string(JOIN " " _shown ${_command})
if(fault)
  set(_shown "STRATA_COMM_FAULT=${fault} ${_shown}")
endif()

string(TIMESTAMP _start "%s")
execute_process(COMMAND ${_command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
  TIMEOUT ${LIMIT})
string(TIMESTAMP _end "%s")
math(EXPR _seconds "${_end} - ${_start}")
message("${_shown}\nexit: ${rc} after ${_seconds} s\n----- output -----\n${out}------------------")

set(_failures "")
if(NOT rc MATCHES "^-?[0-9]+$")
  list(APPEND _failures "the job did not end by itself within ${LIMIT} s (${rc}): a hang")
elseif(expect_exit STREQUAL "0" AND NOT rc EQUAL 0)
  list(APPEND _failures "exit status ${rc}, expected 0")
elseif(expect_exit STREQUAL "abort" AND NOT rc EQUAL 3)
  list(APPEND _failures "exit status ${rc}, expected strata's MPI_Abort code 3")
elseif(expect_exit STREQUAL "nonzero" AND rc EQUAL 0)
  list(APPEND _failures "exit status 0, expected the job to fail")
endif()
foreach(_regex IN LISTS expect)
  if(NOT out MATCHES "${_regex}")
    list(APPEND _failures "no output matches: ${_regex}")
  endif()
endforeach()
if(out MATCHES "not reached")
  list(APPEND _failures "a rank went on as if nothing had happened ('not reached' printed)")
endif()
if(_failures)
  string(JOIN "\n  " _text ${_failures})
  message(FATAL_ERROR "scenario '${SCENARIO}':\n  ${_text}")
endif()
message("scenario '${SCENARIO}': as expected")
