# Finds the header-only dependencies (nlohmann/json, CLI11, DLPack), the ONNX Runtime
# headers and library fetched by scripts/fetch-onnxruntime.sh, and GoogleTest.
# Nothing is downloaded here: scripts/setup.sh installs what a machine lacks.

find_package(Threads REQUIRED)

function(aitune_find_header var header package_hint)
  find_path(${var} ${header} HINTS ${AITUNE_DEPS_INCLUDE} /usr/include /usr/local/include)
  if(NOT ${var})
    message(FATAL_ERROR "aitune: ${header} not found; install ${package_hint} (scripts/setup.sh does) "
                        "or set AITUNE_DEPS_INCLUDE")
  endif()
endfunction()

aitune_find_header(AITUNE_JSON_INCLUDE nlohmann/json.hpp "nlohmann-json3-dev")
aitune_find_header(AITUNE_CLI11_INCLUDE CLI/CLI.hpp "libcli11-dev")
aitune_find_header(AITUNE_DLPACK_INCLUDE dlpack/dlpack.h "libdlpack-dev")

if(NOT EXISTS "${AITUNE_ORT_ROOT}/include/onnxruntime_cxx_api.h")
  message(FATAL_ERROR "aitune: ONNX Runtime headers not found under ${AITUNE_ORT_ROOT}/include; "
                      "run scripts/fetch-onnxruntime.sh or set AITUNE_ORT_ROOT")
endif()
set(AITUNE_ORT_INCLUDE "${AITUNE_ORT_ROOT}/include")
set(AITUNE_ORT_LIBRARY_FILE "${AITUNE_ORT_ROOT}/lib/libonnxruntime.so.1")

if(AITUNE_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND)
    # Debian's libgtest-dev ships the sources; hosts that carry them name the dir.
    set(AITUNE_GTEST_SOURCE "/usr/src/googletest" CACHE PATH "GoogleTest source tree")
    if(NOT EXISTS "${AITUNE_GTEST_SOURCE}/CMakeLists.txt")
      message(FATAL_ERROR "aitune: GoogleTest not found; install libgtest-dev or set AITUNE_GTEST_SOURCE")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory(${AITUNE_GTEST_SOURCE} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()

# OpenSSL's libcrypto computes the sha256 of checkpoint artifacts (src/core/sha256.cpp).
# A host without libssl-dev (the GPU host) has neither the headers nor the unversioned
# libcrypto.so symlink that FindOpenSSL looks for: there the headers come from
# AITUNE_DEPS_INCLUDE (scripts/stage-gpu-build-deps.sh copies them; system headers win
# where both exist) and the library falls back to the runtime's libcrypto.so.3. Either
# can be named: -DOPENSSL_INCLUDE_DIR=DIR -DOPENSSL_CRYPTO_LIBRARY=/path/libcrypto.so.3
if(AITUNE_DEPS_INCLUDE)
  find_path(OPENSSL_INCLUDE_DIR NAMES openssl/ssl.h openssl/evp.h PATHS "${AITUNE_DEPS_INCLUDE}")
endif()
if(NOT OPENSSL_CRYPTO_LIBRARY)
  find_library(aitune_libcrypto_dev NAMES crypto NO_CACHE)
  if(NOT aitune_libcrypto_dev)
    find_library(OPENSSL_CRYPTO_LIBRARY NAMES libcrypto.so.3)
  endif()
endif()
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
