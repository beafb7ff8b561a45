# Tool version and git sha, written into every output header.
execute_process(COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY ${CMAKE_SOURCE_DIR} OUTPUT_VARIABLE THREEWALLS_GIT_SHA
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _sha_rc)
if(NOT _sha_rc EQUAL 0 OR THREEWALLS_GIT_SHA STREQUAL "")
  set(THREEWALLS_GIT_SHA "unknown")
endif()
