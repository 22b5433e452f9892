# Writes the build-identity header at every build (not only at configure time), so
# `engine --version` names the commit that was built. The file is rewritten only when its
# content changes, so an unchanged revision rebuilds nothing.
# Inputs: SOURCE_DIR, INPUT (version.h.in), OUTPUT, PROJECT_VERSION, CMAKE_BUILD_TYPE.
set(ENGINE_GIT_REVISION "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE revision OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
  if(NOT failed AND revision)
    set(ENGINE_GIT_REVISION ${revision})
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(dirty)
      string(APPEND ENGINE_GIT_REVISION "-modified")
    endif()
  endif()
endif()
configure_file(${INPUT} ${OUTPUT}.tmp @ONLY)
file(COPY_FILE ${OUTPUT}.tmp ${OUTPUT} ONLY_IF_DIFFERENT)
