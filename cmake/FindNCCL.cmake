# SPDX-License-Identifier: Apache-2.0
#[=======================================================================[.rst:
FindNCCL
--------

Finds NCCL, which ships neither a CMake package nor (in the CUDA toolkit layout) a pkg-config file.

Search order: ``NCCL_ROOT`` (variable or environment), ``NCCL_HOME``, the CUDA toolkit found by
``find_package(CUDAToolkit)`` (its include and library directories), then the system paths.

Result variables: ``NCCL_FOUND``, ``NCCL_INCLUDE_DIR``, ``NCCL_LIBRARY``, ``NCCL_VERSION``.
Imported target: ``NCCL::NCCL`` (links the shared library and CUDA::cudart).
#]=======================================================================]

include(FindPackageHandleStandardArgs)

if(NOT TARGET CUDA::cudart)
  find_package(CUDAToolkit QUIET)
endif()

set(_nccl_hints)
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}")
  if(_root)
    list(APPEND _nccl_hints "${_root}")
  endif()
endforeach()
if(CUDAToolkit_FOUND)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
  get_filename_component(_nccl_cuda_root "${CUDAToolkit_INCLUDE_DIRS}" DIRECTORY)
  list(APPEND _nccl_hints "${_nccl_cuda_root}")
endif()

find_path(NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
    REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_part IN ITEMS MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part}[ \t]+([0-9]+)" _match "${_nccl_version_lines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL SHARED IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  if(TARGET CUDA::cudart)
    set_property(TARGET NCCL::NCCL APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
  endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
