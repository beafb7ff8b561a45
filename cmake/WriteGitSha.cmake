# Run at build time (not configure time) so output headers name the commit actually built:
# writes OUT with git_sha() only when the sha changed (no needless rebuilds).
#   cmake -DSRC=<source dir> -DOUT=<file> -P WriteGitSha.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE sha OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR sha STREQUAL "")
  set(sha "unknown")
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SRC} RESULT_VARIABLE dirty ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    set(sha "${sha}-dirty")
  endif()
endif()
set(content "#include \"threewalls/core/version.hpp\"\nnamespace threewalls {\nstd::string_view git_sha() { return \"${sha}\"; }\n}  // namespace threewalls\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
else()
  set(old "")
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUT} "${content}")
endif()
