# Warnings and sanitizers for every target of the project, through one interface library.
add_library(engine_options INTERFACE)
target_compile_options(engine_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wimplicit-fallthrough>
  # GCC 12 reports a false -Wrestrict inside libstdc++'s string concatenation (GCC bug 105329).
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict>)

# The CPU kernels are written to vectorise; build them for a modern x86-64 level (AVX2 + FMA by
# default; x86-64-v4 adds AVX-512, `native` targets this machine only).
set(ENGINE_CPU_ARCH "x86-64-v3" CACHE STRING "Value of -march for the CPU code (empty: compiler default)")
# GCC's default -ftrapping-math keeps it from vectorising loops whose lanes could raise a floating-
# point exception the scalar code would not (the select-heavy GELU, SiLU and exp paths: 10x faster
# vectorised). The engine never reads the exception flags. The vector code contracts a*b+c into
# FMAs where the scalar code did not always, so results move in the last bits; golden files record
# the flags and were recorded with them.
target_compile_options(engine_options INTERFACE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-fno-trapping-math>)
if(ENGINE_CPU_ARCH AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  target_compile_options(engine_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=${ENGINE_CPU_ARCH}>)
endif()

if(ENGINE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "ENGINE_FUZZ needs clang (libFuzzer): configure with CXX=clang++ or the 'fuzz' preset")
  endif()
  set(ENGINE_SANITIZE ON)
  # Coverage feedback from all of the engine's code, not just the fuzz target's own file.
  target_compile_options(engine_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
if(ENGINE_SANITIZE)
  set(sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  target_compile_options(engine_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${sanitize_flags}>)
  # The instrumented loops no longer vectorise where the CPU kernels ask for it (`omp simd`): 72
  # "loop not vectorized" warnings about a build whose speed is not the point.
  target_compile_options(engine_options INTERFACE $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wno-pass-failed>)
  target_link_options(engine_options INTERFACE ${sanitize_flags})
  # Tests that cap address space (ulimit -v) skip themselves: ASan reserves terabytes of it.
  target_compile_definitions(engine_options INTERFACE ENGINE_SANITIZED=1)
  # lld links the instrumented binaries in a fifth of GNU ld's time (ops_test: 0.6 s against 3.1 s).
  # Only this build: the Release build's binaries are the ones that run on GPUs, and keep GNU ld.
  find_program(ENGINE_LLD ld.lld)
  if(ENGINE_LLD AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_link_options(engine_options INTERFACE -fuse-ld=lld)
  endif()
endif()
