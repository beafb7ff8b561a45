# Warnings for every threewalls target: threewalls_warnings(<target>)
function(threewalls_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
      -Wcast-align -Wunused -Woverloaded-virtual -Wdouble-promotion -Wformat=2 -Wimplicit-fallthrough>)
  # GCC 12 reports -Wrestrict false positives inside libstdc++ for `"literal" + std::string` at -O2/-O3
  # (GCC bug 105651, fixed in GCC 13): keep the warning, but not as an error there.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=restrict>)
  endif()
  if(THREEWALLS_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()
