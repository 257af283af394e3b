# AITUNE_SANITIZE: build everything with AddressSanitizer + UndefinedBehaviorSanitizer
# (GCC or Clang). .ci/run builds the engine, CLI, C++ tests and fuzz targets this way;
# any UB report aborts (-fno-sanitize-recover), so a finding fails the test that hit it.
option(AITUNE_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
if(AITUNE_SANITIZE)
  if(AITUNE_BUILD_PYTHON)
    # An ASan extension needs the ASan runtime preloaded into python: not supported.
    message(FATAL_ERROR "aitune: AITUNE_SANITIZE builds the engine and C++ tests; set AITUNE_BUILD_PYTHON=OFF")
  endif()
  set(AITUNE_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  add_compile_options(${AITUNE_SANITIZER_FLAGS})
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "aitune: building with AddressSanitizer + UndefinedBehaviorSanitizer")
endif()
