# SPDX-License-Identifier: Apache-2.0
# to_units(text out_var): a decimal like 0.7820 in units of 1e-4 (CMake's math is integer-only),
# for the test scripts that compare accuracies and losses read from a summary line.
function(to_units text out_var)
  if(NOT text MATCHES "^([0-9]+)\\.?([0-9]*)$")
    message(FATAL_ERROR "not a number: ${text}")
  endif()
  set(whole "${CMAKE_MATCH_1}")
  string(SUBSTRING "${CMAKE_MATCH_2}0000" 0 4 fraction)
  math(EXPR units "${whole} * 10000 + 1${fraction} - 10000")  # 1 in front: no octal, no empty
  set(${out_var} "${units}" PARENT_SCOPE)
endfunction()

# units_apart(a b out_var): |a - b| of two integers (units from to_units).
function(units_apart a b out_var)
  math(EXPR diff "${a} - ${b}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  set(${out_var} "${diff}" PARENT_SCOPE)
endfunction()
