# SPDX-License-Identifier: Apache-2.0
# Installs strata and builds small consumer projects against it, as a user would:
#   1. cmake --install of the main build; a consumer through find_package(strata COMPONENTS <built>)
#   2. a consumer that add_subdirectory()s the source tree
#   3. find_package with an unknown component fails with a message naming it
#   4. a core-only installation (no MPI, CUDA, NCCL) serves a core consumer, and refuses the
#      mpi component with a message that says it was not built
cmake_minimum_required(VERSION 3.25)  # modern policies (CMP0054: quoted if() arguments)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(_here "${CMAKE_CURRENT_LIST_DIR}")

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test step '${name}' failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "ok: ${name}")
endfunction()

function(expect_failure name regex)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "install test step '${name}' succeeded but must fail with '${regex}'")
  endif()
  if(NOT "${out}${err}" MATCHES "${regex}")
    message(FATAL_ERROR "install test step '${name}' failed without '${regex}':\n${out}\n${err}")
  endif()
  message(STATUS "ok: ${name} (refused as expected)")
endfunction()

# 1. install the main build and consume it with every component it was built with
set(_prefix "${WORK_DIR}/prefix")
run_step("install" ${CMAKE_COMMAND} --install "${STRATA_BINARY_DIR}" --prefix "${_prefix}")
set(_components ${BUILT_COMPONENTS})
list(REMOVE_ITEM _components core)
string(REPLACE ";" "," _components_arg "${_components}")
run_step("configure find_package consumer (components: ${_components})"
  ${CMAKE_COMMAND} -S "${_here}/find_package" -B "${WORK_DIR}/fp"
  "-DCMAKE_PREFIX_PATH=${_prefix}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DSTRATA_COMPONENTS=${_components_arg}")
run_step("build find_package consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/fp")
run_step("run find_package consumer" "${WORK_DIR}/fp/consumer")
run_step("run find_package consumer reusing its precompiled header"
  "${WORK_DIR}/fp/consumer_pch_reuse")

# 2. add_subdirectory of the source tree
run_step("configure add_subdirectory consumer"
  ${CMAKE_COMMAND} -S "${_here}/add_subdirectory" -B "${WORK_DIR}/as"
  "-DSTRATA_SOURCE_DIR=${STRATA_SOURCE_DIR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
run_step("build add_subdirectory consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/as")
run_step("run add_subdirectory consumer" "${WORK_DIR}/as/consumer")

# 3. an unknown component
expect_failure("unknown component" "strata has no component 'tensorflow'"
  ${CMAKE_COMMAND} -S "${_here}/find_package" -B "${WORK_DIR}/fp-bad"
  "-DCMAKE_PREFIX_PATH=${_prefix}" "-DSTRATA_COMPONENTS=tensorflow")

# 4. a core-only installation
run_step("configure core-only strata"
  ${CMAKE_COMMAND} -S "${STRATA_SOURCE_DIR}" -B "${WORK_DIR}/core-build"
  -DSTRATA_ENABLE_MPI=OFF -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_ENABLE_NCCL=OFF
  -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCH=OFF
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
run_step("install core-only strata"
  ${CMAKE_COMMAND} --install "${WORK_DIR}/core-build" --prefix "${WORK_DIR}/prefix-core")
run_step("configure core consumer of the core-only installation"
  ${CMAKE_COMMAND} -S "${_here}/find_package" -B "${WORK_DIR}/fp-core"
  "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix-core" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
# The precompiled header pair was built in step 1; the core consumer alone shows the installation.
run_step("build core consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/fp-core" --target consumer)
run_step("run core consumer" "${WORK_DIR}/fp-core/consumer")
expect_failure("mpi component of a core-only installation"
  "strata component 'mpi' was not built in this installation"
  ${CMAKE_COMMAND} -S "${_here}/find_package" -B "${WORK_DIR}/fp-core-mpi"
  "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix-core" "-DSTRATA_COMPONENTS=mpi")
