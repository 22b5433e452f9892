# Test hygiene: no test names a fixed path under the temporary directory. Suites run concurrently,
# so scratch space comes from tests/temp_dir.h (mkdtemp) or Python's tempfile. Fails listing every
# file that uses temp_directory_path() or /tmp directly, with the offending statement.
#   cmake -DTESTS_DIR=<source>/tests -P no_fixed_temp_paths.cmake
set(pattern "temp_directory_path|[\"' =]/tmp/|[\"']/tmp[\"']")
file(GLOB_RECURSE files "${TESTS_DIR}/*.cpp" "${TESTS_DIR}/*.h" "${TESTS_DIR}/*.py" "${TESTS_DIR}/*.sh"
     "${TESTS_DIR}/CMakeLists.txt")
set(found "")
foreach(file IN LISTS files)
  if(file MATCHES "/temp_dir\\.h$")
    continue()
  endif()
  # Only the matching lines; a ';' inside one splits it, so each piece is tested again.
  file(STRINGS "${file}" lines REGEX "${pattern}")
  foreach(piece IN LISTS lines)
    if(piece MATCHES "${pattern}")
      string(STRIP "${piece}" piece)
      string(APPEND found "\n  ${file}: ${piece}")
    endif()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "fixed temporary paths (use engine::testing::TempDir from tests/temp_dir.h):${found}")
endif()
