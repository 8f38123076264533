# SPDX-License-Identifier: Apache-2.0
# The checkpoint writer killed at each phase of a save, again and again: runs an example trainer
# once per entry of KILLS with STRATA_CHECKPOINT_FAULT="phase=<phase>,save=<N>" (the process
# that writes checkpoints kills itself there, see train/checkpoint_fault.hpp), then once without
# a fault. Each run must die where it was told to, and the next one must continue from the
# checkpoint `latest` named after the kill (or start afresh when there was none); the last run
# must finish with nothing half-written left behind and end with the parameters of a run that
# was never interrupted. Before that last run the newest checkpoint's parameters file is cut
# short, as a full disk or a bad copy would leave it: the run must say it skips that checkpoint,
# naming the file, and continue from the one before.
#
#   cmake -DPROGRAM=fashion_mnist_mlp "-DLAUNCHER=mpiexec;-n;2;..." "-DARGS=..." -DWORK=dir
#         "-DKILLS=shards:2;manifest:2;rename:2;latest:2;cleanup:1" [-DLIMIT=60]
#         -P run_checkpoint_kills.cmake
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
set(FAULT_VAR STRATA_CHECKPOINT_FAULT)
include("${CMAKE_CURRENT_LIST_DIR}/fault_common.cmake")
fault_driver_start(run_checkpoint_kills.cmake PROGRAM WORK KILLS)

# Appends to _failures unless run "faulty" continued from checkpoint `from` ("" = started
# afresh).
macro(check_continued from what)
  if("${from}" STREQUAL "")
    if(NOT out_faulty MATCHES "run faulty: starting afresh")
      list(APPEND _failures "${what}: expected a fresh start (no checkpoint was committed)")
    endif()
  elseif(NOT out_faulty MATCHES "run faulty: resumed from [^\n]*faulty/${from}[ \n]")
    list(APPEND _failures "${what}: did not continue from ${from}, which `latest` named")
  endif()
endmacro()

# Appends to _failures unless the run directory shows what a kill at `phase` leaves: a staging
# directory without a manifest (shards, manifest) or with one (rename); the new checkpoint in
# place but `latest` naming an older one (latest); `latest` naming the newest checkpoint with a
# set-aside copy or more than `keep` (2) checkpoints not yet removed (cleanup).
function(check_phase_left phase what)
  set(_run "${_dir}/faulty")
  file(GLOB _staged LIST_DIRECTORIES true "${_run}/.tmp-*")
  file(GLOB _aside LIST_DIRECTORIES true "${_run}/.old-*")
  file(GLOB _committed LIST_DIRECTORIES true RELATIVE "${_run}" "${_run}/epoch-*")
  list(SORT _committed COMPARE NATURAL)
  list(LENGTH _committed _count)
  set(_newest "")
  if(_count GREATER 0)
    list(GET _committed -1 _newest)
  endif()
  set(_latest "")
  if(EXISTS "${_run}/latest")
    file(STRINGS "${_run}/latest" _latest LIMIT_COUNT 1)
  endif()
  set(_ok FALSE)
  if(phase MATCHES "^(shards|manifest|rename)$")
    list(LENGTH _staged _n)
    if(_n EQUAL 1)
      set(_has_manifest FALSE)
      if(EXISTS "${_staged}/manifest.json")
        set(_has_manifest TRUE)
      endif()
      if(phase STREQUAL "rename" AND _has_manifest)
        set(_ok TRUE)
      elseif(NOT phase STREQUAL "rename" AND NOT _has_manifest)
        set(_ok TRUE)
      endif()
    endif()
  elseif(phase STREQUAL "latest")
    if(NOT _latest STREQUAL "" AND NOT _latest STREQUAL _newest)
      set(_ok TRUE)
    endif()
  elseif(phase STREQUAL "cleanup")
    if(_latest STREQUAL _newest AND (_aside OR _count GREATER 2))
      set(_ok TRUE)
    endif()
  endif()
  if(NOT _ok)
    set(_failures ${_failures} "${what}: the directory does not show a kill at phase ${phase} \
(staged: ${_staged}; set aside: ${_aside}; checkpoints: ${_committed}; latest: ${_latest})"
      PARENT_SCOPE)
  endif()
endfunction()

set(_from "")
foreach(_kill IN LISTS KILLS)
  string(REPLACE ":" ";" _parts "${_kill}")
  list(GET _parts 0 _phase)
  list(GET _parts 1 _save)
  set(_what "the run killed at phase ${_phase} of save ${_save}")
  run_case(faulty "phase=${_phase},save=${_save}")
  if(rc_faulty MATCHES "timeout" OR rc_faulty STREQUAL "0")
    list(APPEND _failures "${_what}: exit ${rc_faulty}, expected to be killed")
  endif()
  if(NOT out_faulty MATCHES "killing this process at phase ${_phase} of save ${_save} ")
    list(APPEND _failures "${_what}: the fault did not fire")
  endif()
  check_continued("${_from}" "${_what}")
  check_no_processes()
  check_phase_left("${_phase}" "${_what}")
  set(_from "")
  if(EXISTS "${_dir}/faulty/latest")
    file(STRINGS "${_dir}/faulty/latest" _from LIMIT_COUNT 1)
  endif()
endforeach()

# The newest checkpoint damaged from outside.
file(WRITE "${_dir}/faulty/${_from}/rank-0.params.bin" "cut short")
file(GLOB _committed LIST_DIRECTORIES true RELATIVE "${_dir}/faulty" "${_dir}/faulty/epoch-*")
list(REMOVE_ITEM _committed "${_from}")
list(SORT _committed COMPARE NATURAL)
set(_damaged "${_from}")
list(POP_BACK _committed _from)

run_case(faulty "")
if(NOT out_faulty MATCHES "checkpoint skipped: [^\n]*faulty/${_damaged}/rank-0.params.bin")
  list(APPEND _failures "the run after the damage did not report ${_damaged}'s parameters file")
endif()
if(NOT rc_faulty EQUAL 0)
  list(APPEND _failures "the run without a fault failed (exit ${rc_faulty})")
endif()
check_continued("${_from}" "the run without a fault")
check_no_staging()
check_same_as_straight("${out_faulty}")
report_failures()
