# SPDX-License-Identifier: Apache-2.0
# strata_require_vars(driver VAR...): stops a `cmake -P` test driver with an error naming the
# driver and the first -DVAR=... its command line lacks.
macro(strata_require_vars driver)
  foreach(_required ${ARGN})
    if(NOT DEFINED ${_required})
      message(FATAL_ERROR "${driver}: -D${_required}=... is required")
    endif()
  endforeach()
endmacro()
