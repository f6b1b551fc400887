# Writes OUT (a header) with the source tree's git commit, at every build, touching it only
# when the commit changes so that only its one includer recompiles. Run by CMakeLists.txt:
#   cmake -DSRC=<source dir> -DOUT=<header> -P cmake/version.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SRC}"
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit "unknown")
else()
  # Tracked files changed since the commit: the binary is not exactly that commit.
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY "${SRC}"
                  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(dirty)
    string(APPEND commit "+modified")
  endif()
endif()
file(WRITE "${OUT}.tmp" "#define MASSKV_GIT_COMMIT \"${commit}\"\n")
execute_process(COMMAND "${CMAKE_COMMAND}" -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
