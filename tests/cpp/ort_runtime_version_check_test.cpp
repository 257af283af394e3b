// Tests that OrtRuntime refuses an ONNX Runtime older than the headers it was compiled
// with, naming that library's version (a stand-in library, fake_old_onnxruntime.cpp),
// and that the process can still load a proper one after the refusal.
#include <cstdlib>
#include <fstream>

#include "aitune/onnx_session.hpp"

#include "test_support.hpp"

#ifndef AITUNE_TEST_FAKE_OLD_ORT
#error "tests/cpp/CMakeLists.txt defines AITUNE_TEST_FAKE_OLD_ORT"
#endif

namespace aitune {
namespace {

using test::expect_error;

// First in this process, before any ONNX Runtime is loaded: a session whose runtime cannot
// load threw from inside create, and the half-built session's ONNX Runtime members were
// destroyed through an API never set up (a segfault of `aitune run` with a wrong
// AITUNE_ORT_LIBRARY, of ait.load and of the C++ example alike).
TEST(OrtRuntimeVersionCheck, ASessionWhoseRuntimeCannotLoadIsAnErrorNotACrash) {
  const std::string model = ::testing::TempDir() + "aitune-no-runtime.onnx";
  { std::ofstream(model) << "not loaded: the runtime fails first"; }
  ::setenv("AITUNE_ORT_LIBRARY", "/nonexistent/libonnxruntime.so", 1);
  const std::string msg =
      expect_error([&] { OnnxSession::create(model, OnnxSessionConfig{}); }, ErrorCode::kProviderUnavailable);
  ::unsetenv("AITUNE_ORT_LIBRARY");
  EXPECT_NE(msg.find("/nonexistent/libonnxruntime.so"), std::string::npos) << msg;
}

TEST(OrtRuntimeVersionCheck, RefusesALibraryOlderThanTheHeadersThenLoadsAGoodOne) {
  OrtRuntimeOptions old;
  old.library_path = AITUNE_TEST_FAKE_OLD_ORT;
  const std::string msg = expect_error([&] { OrtRuntime::load(old); }, ErrorCode::kProviderUnavailable);
  EXPECT_NE(msg.find(AITUNE_TEST_FAKE_OLD_ORT), std::string::npos) << "names the library: " << msg;
  EXPECT_NE(msg.find("ONNX Runtime 1.20.0"), std::string::npos) << "names its version: " << msg;
  EXPECT_NE(msg.find("ORT_API_VERSION " + std::to_string(ort_api_version())), std::string::npos) << msg;
  EXPECT_NE(msg.find(">= 1." + std::to_string(ort_api_version())), std::string::npos) << msg;

  // The same through AITUNE_ORT_LIBRARY: no silent fall-back to another library.
  ::setenv("AITUNE_ORT_LIBRARY", AITUNE_TEST_FAKE_OLD_ORT, 1);
  const std::string env_msg = expect_error([] { OrtRuntime::load(); }, ErrorCode::kProviderUnavailable);
  ::unsetenv("AITUNE_ORT_LIBRARY");
  EXPECT_NE(env_msg.find("AITUNE_ORT_LIBRARY"), std::string::npos) << env_msg;
  EXPECT_NE(env_msg.find("1.20.0"), std::string::npos) << env_msg;

  // Nothing was loaded by the refusals: the default search still works.
  auto rt = OrtRuntime::load();
  ASSERT_NE(rt, nullptr);
  EXPECT_NE(rt->library_path(), AITUNE_TEST_FAKE_OLD_ORT);
  EXPECT_EQ(rt->version().rfind("1.", 0), 0u) << rt->version();
}

}  // namespace
}  // namespace aitune
