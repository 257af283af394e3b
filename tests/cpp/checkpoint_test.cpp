// Tests for Checkpoint: save/load round trip with identical outputs, external data and
// cache directories, one test per corruption case, atomic save under injected failures,
// refusal to overwrite what is not a checkpoint, and `aitune run/inspect CHECKPOINT`.
#include <sys/wait.h>

#include <cstdio>
#include <utility>
#include <nlohmann/json.hpp>

#include "aitune/process_directory.hpp"
#include "aitune/onnx_external_data.hpp"  // not in aitune.hpp: the checkpoint's own file scanning
#include "onnx_wire.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_error;
using test::fixture;
using test::ScopedTempDir;
using test::values_of;

constexpr char kAbc[] = "abc";
// SHA-256("abc"), FIPS 180-2 appendix B.1.
constexpr char kAbcSha256[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

// The spec a front end records from mlp calls at batch sizes 1 and 4.
GraphSpec mlp_spec() {
  GraphSpecBuilder builder;
  for (int64_t b : {1, 4})
    builder.record({{"x", DType::kFloat32, {b, 64}}}, {{"y", DType::kFloat32, {b, 16}}}, b);
  return builder.build();
}

OnnxSessionConfig mlp_config() {
  OnnxSessionConfig config = test::cpu_config();
  config.graph_optimization_level = GraphOptimizationLevel::kBasic;
  config.intra_op_threads = 1;
  config.session_config = {{"session.disable_prepacking", "1"}};
  return config;
}

CheckpointManifest mlp_manifest(const std::string& module_name = "mlp-module", const std::string& key = "mlp") {
  CheckpointManifest m;
  m.module_name = module_name;
  m.metadata_json = R"({"front_end": "test", "epoch": 3})";
  CheckpointGraph g;
  g.key = key;
  g.graph_spec = mlp_spec();
  g.backend_config = mlp_config();
  g.structure_json = R"({"inputs": ["x"],  "outputs": ["y"]})";
  m.graphs.push_back(g);
  return m;
}

// A model plus a small extra file with a known digest.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    abc_ = tmp_.file("abc.txt");
    test::write_file_bytes(abc_, kAbc);
    dir_ = tmp_.file("ckpt");
  }

  std::map<std::string, std::string> mlp_files(const std::string& model = "mlp.onnx", const std::string& key = "mlp") {
    return {{"graphs/" + key + "/model_raw.onnx", fixture(model)}, {"graphs/" + key + "/notes/abc.txt", abc_}};
  }

  CheckpointManifest save_mlp(const std::string& module_name = "mlp-module") {
    return Checkpoint::save(dir_, mlp_manifest(module_name), mlp_files());
  }

  std::string artifact(const std::string& relative) const { return dir_ + "/" + relative; }
  std::string model_file() const { return artifact("graphs/mlp/model_raw.onnx"); }

  void edit_manifest(const std::function<void(json&)>& edit) {
    const std::string path = artifact("manifest.json");
    json j = json::parse(test::read_file_bytes(path));
    edit(j);
    test::write_file_bytes(path, j.dump(2));
  }

  // Entries of the checkpoint's parent directory other than the checkpoint's own inputs.
  std::vector<std::string> siblings() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp_.path())) {
      auto name = e.path().filename().string();
      if (name != "abc.txt") names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  ScopedTempDir tmp_;
  std::string abc_, dir_;
};

std::vector<float> run_mlp(const OnnxSession& backend) {
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  auto out = backend.infer({x.view()});
  EXPECT_EQ(out.size(), 1u);
  return out.empty() ? std::vector<float>{} : values_of<float>(out[0]);
}

std::vector<float> run_original_mlp() {
  auto backend = OnnxSession::create(fixture("mlp.onnx"), mlp_config(), mlp_spec());
  return run_mlp(*backend);
}

void expect_corrupt(const std::string& dir, std::vector<std::string> words, std::vector<std::string> substrings,
                    std::source_location loc = std::source_location::current()) {
  expect_error([&] { Checkpoint::load(dir); },
               test::ErrorExpectation{{ErrorCode::kCheckpointCorrupt}, std::move(words), std::move(substrings)}, loc);
}

// ---------------------------------------------------------------------------------
// Round trip

TEST_F(CheckpointTest, RoundTripKeepsManifestAndGivesIdenticalOutputs) {
  const auto written = save_mlp();
  ASSERT_EQ(written.graphs.size(), 1u);
  const auto& g = written.graphs[0];
  EXPECT_EQ(written.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(written.aitune_version, std::string(version()));
  EXPECT_EQ(written.onnxruntime_version, test::runtime()->version());
  EXPECT_EQ(written.module_name, "mlp-module");
  EXPECT_EQ(written.created.size(), 20u) << written.created;  // 2025-12-02T12:34:56Z
  EXPECT_EQ(written.metadata_json, R"({"front_end":"test","epoch":3})");
  EXPECT_EQ(g.structure_json, R"({"inputs":["x"],"outputs":["y"]})");
  EXPECT_EQ(g.model, "graphs/mlp/model_raw.onnx");
  EXPECT_EQ(g.backend, "onnxruntime");
  EXPECT_EQ(g.backend_config, mlp_config());
  EXPECT_EQ(g.graph_spec, mlp_spec());
  ASSERT_EQ(g.artifacts.size(), 2u);
  EXPECT_EQ(g.artifacts[0].path, "graphs/mlp/model_raw.onnx");
  EXPECT_EQ(g.artifacts[0].size, fs::file_size(fixture("mlp.onnx")));
  EXPECT_EQ(g.artifacts[1], (CheckpointArtifact{"graphs/mlp/notes/abc.txt", 3, kAbcSha256}));
  EXPECT_EQ(test::read_file_bytes(model_file()), test::read_file_bytes(fixture("mlp.onnx")));

  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(loaded.manifest(), written);
  EXPECT_EQ(loaded.directory(), fs::canonical(dir_).string());
  EXPECT_EQ(loaded.graph_keys(), std::vector<std::string>{"mlp"});
  EXPECT_EQ(loaded.model_path("mlp"), fs::canonical(model_file()).string());
  EXPECT_EQ(loaded.artifact_path("graphs/mlp/notes/abc.txt"), fs::canonical(artifact("graphs/mlp/notes/abc.txt")).string());

  auto backend = loaded.create_session("mlp");
  EXPECT_EQ(backend->config(), mlp_config());
  EXPECT_EQ(backend->graph_spec(), mlp_spec());
  const auto outputs = run_mlp(*backend);
  EXPECT_EQ(outputs, run_original_mlp());  // same model bytes, same provider: bit-identical
  test::expect_allclose_f32(backend->infer({test::load_fixture_npy("mlp_x.npy").view()})[0],
                            test::load_fixture_npy("mlp_y.npy"), 1e-5);
  // The saved graph spec bounds the inputs (batch 1..4): batch 5 is refused.
  const Tensor x5 = test::make_pattern_f32({5, 64}, 1);
  expect_error([&] { backend->infer({x5.view()}); }, ErrorCode::kShapeMismatch, {"x"});
}

TEST_F(CheckpointTest, ManifestJsonRoundTripsAndNamesEveryField) {
  const auto written = save_mlp();
  const json j = json::parse(test::read_file_bytes(artifact("manifest.json")));
  EXPECT_EQ(j.at("format"), "aitune-checkpoint");
  EXPECT_EQ(j.at("format_version"), kCheckpointFormatVersion);
  EXPECT_EQ(j.at("graphs")[0].at("backend"), "onnxruntime");
  EXPECT_EQ(j.at("graphs")[0].at("section_version"), 1);
  EXPECT_EQ(j.at("metadata").at("epoch"), 3);  // stored as JSON, not as a string
  EXPECT_EQ(j.at("graphs")[0].at("structure").at("outputs")[0], "y");
  EXPECT_EQ(j.at("graphs")[0].at("backend_config").at("session_config").at("session.disable_prepacking"), "1");
  EXPECT_EQ(j.at("graphs")[0].at("artifacts")[1].at("sha256"), kAbcSha256);
  EXPECT_EQ(CheckpointManifest::from_json(written.to_json()), written);
  EXPECT_EQ(CheckpointManifest::from_json(test::read_file_bytes(artifact("manifest.json"))), written);
}

TEST_F(CheckpointTest, ExternalDataIsSavedBesideTheModelAutomatically) {
  ScopedTempDir other;
  const auto written = Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/model_raw.onnx", fixture("mlp_ext.onnx")}});
  ASSERT_EQ(onnx_external_data_locations(fixture("mlp_ext.onnx")), std::vector<std::string>{"mlp_ext.onnx.data"});
  const auto& arts = written.graphs[0].artifacts;
  ASSERT_EQ(arts.size(), 2u);
  EXPECT_EQ(arts[0].path, "graphs/mlp/mlp_ext.onnx.data");
  EXPECT_EQ(arts[0].size, fs::file_size(fixture("mlp_ext.onnx.data")));
  EXPECT_EQ(arts[1].path, "graphs/mlp/model_raw.onnx");

  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(run_mlp(*loaded.create_session("mlp")), run_original_mlp());
  // The data file's digest is checked like any other.
  auto data = test::read_file_bytes(artifact("graphs/mlp/mlp_ext.onnx.data"));
  data[data.size() / 2] = static_cast<char>(data[data.size() / 2] ^ 0x01);
  test::write_file_bytes(artifact("graphs/mlp/mlp_ext.onnx.data"), data);
  expect_corrupt(dir_, {"sha256"}, {"mlp_ext.onnx.data"});
}

TEST_F(CheckpointTest, SaveOfAModelWhoseExternalDataIsMissingIsRefused) {
  ScopedTempDir src;
  fs::copy_file(fixture("mlp_ext.onnx"), src.file("lonely.onnx"));
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/model_raw.onnx", src.file("lonely.onnx")}}); },
               ErrorCode::kModelInvalid, {"mlp_ext.onnx.data"});
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(siblings(), std::vector<std::string>{});
}

TEST_F(CheckpointTest, CacheDirectoryIsSavedAndItsPathOptionReRootedOnLoad) {
  ScopedTempDir src;
  fs::create_directories(src.path() / "trt_cache" / "sub");
  test::write_file_bytes((src.path() / "trt_cache" / "model.engine").string(), "engine bytes");
  test::write_file_bytes((src.path() / "trt_cache" / "sub" / "model.timing").string(), "timing bytes");
  auto manifest = mlp_manifest();
  auto& config = manifest.graphs[0].backend_config;
  config.provider = ExecutionProvider::kTensorRT;
  config.device_id = 1;
  config.provider_options = {{"trt_engine_cache_enable", "1"},
                             {"trt_engine_cache_path", (src.path() / "trt_cache").string()},
                             {"trt_fp16_enable", "1"}};
  auto files = mlp_files();
  files["graphs/mlp/trt_cache"] = (src.path() / "trt_cache").string();
  const auto written = Checkpoint::save(dir_, manifest, files);
  const auto& g = written.graphs[0];
  EXPECT_EQ(g.path_options, std::vector<std::string>{"trt_engine_cache_path"});
  EXPECT_EQ(g.backend_config.provider_options.at("trt_engine_cache_path"), "graphs/mlp/trt_cache");
  std::vector<std::string> paths;
  for (const auto& a : g.artifacts) paths.push_back(a.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"graphs/mlp/model_raw.onnx", "graphs/mlp/notes/abc.txt",
                                              "graphs/mlp/trt_cache/model.engine", "graphs/mlp/trt_cache/sub/model.timing"}));
  EXPECT_EQ(test::read_file_bytes(artifact("graphs/mlp/trt_cache/sub/model.timing")), "timing bytes");

  const auto loaded = Checkpoint::load(dir_);
  const auto effective = loaded.backend_config("mlp");
  EXPECT_EQ(effective.provider, ExecutionProvider::kTensorRT);
  EXPECT_EQ(effective.provider_options.at("trt_engine_cache_path"), loaded.directory() + "/graphs/mlp/trt_cache");
  EXPECT_EQ(effective.provider_options.at("trt_fp16_enable"), "1");
  // device_map-style overrides: another device keeps the options, another provider drops them.
  CheckpointBackendOverrides device;
  device.device_id = 0;
  EXPECT_EQ(loaded.backend_config("mlp", device).device_id, 0);
  EXPECT_EQ(loaded.backend_config("mlp", device).provider_options.size(), 3u);
  CheckpointBackendOverrides cpu;
  cpu.provider = ExecutionProvider::kCPU;
  EXPECT_TRUE(loaded.backend_config("mlp", cpu).provider_options.empty());
  EXPECT_EQ(run_mlp(*loaded.create_session("mlp", cpu)), run_original_mlp());
  CheckpointBackendOverrides merged;
  merged.provider_options = std::map<std::string, std::string>{{"trt_fp16_enable", "0"}};
  EXPECT_EQ(loaded.backend_config("mlp", merged).provider_options.at("trt_fp16_enable"), "0");
  EXPECT_EQ(loaded.backend_config("mlp", merged).provider_options.size(), 3u);
}

TEST_F(CheckpointTest, SeveralGraphsAndUnknownKey) {
  auto manifest = mlp_manifest();
  auto second = mlp_manifest("", "add_graph").graphs[0];
  GraphSpecBuilder add;
  add.record({{"x", DType::kFloat32, {2, 4}}, {"y", DType::kFloat32, {2, 4}}}, {{"z", DType::kFloat32, {2, 4}}}, 2);
  second.graph_spec = add.build();
  manifest.graphs.push_back(second);
  auto files = mlp_files();
  files["graphs/add_graph/add.onnx"] = fixture("add.onnx");
  Checkpoint::save(dir_, manifest, files);
  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(loaded.graph_keys(), (std::vector<std::string>{"mlp", "add_graph"}));
  EXPECT_EQ(loaded.graph("add_graph").model, "graphs/add_graph/add.onnx");
  auto backend = loaded.create_session("add_graph");
  const Tensor x = test::make_pattern_f32({2, 4}, 3), y = test::make_pattern_f32({2, 4}, 4);
  auto z = values_of<float>(backend->infer({x.view(), y.view()})[0]);
  auto xv = values_of<float>(x), yv = values_of<float>(y);
  for (std::size_t i = 0; i < z.size(); ++i) EXPECT_EQ(z[i], xv[i] + yv[i]);
  expect_error([&] { loaded.graph("nope"); }, ErrorCode::kInvalidArgument, {"nope", "mlp", "add_graph"});
  expect_error([&] { loaded.create_session("nope"); }, ErrorCode::kInvalidArgument, {"nope"});
  expect_error([&] { loaded.artifact_path("graphs/mlp/other.bin"); }, ErrorCode::kInvalidArgument, {});
}

// A section per backend: the loader dispatches on the graph's backend name.
TEST_F(CheckpointTest, TorchCompileAndEagerSectionsLoadAndOnlyTheirCreationIsRefusedTyped) {
  auto manifest = mlp_manifest();
  CheckpointGraph compiled;
  compiled.key = "compiled";
  compiled.graph_spec = mlp_spec();
  compiled.backend = std::string(kTorchCompileBackendName);
  compiled.section_json = R"({"precision": "fp32", "mode": "default", "dynamic": null})";
  CheckpointGraph eager = compiled;
  eager.key = "eager";
  eager.backend = std::string(kEagerBackendName);
  eager.section_json = R"({"note": "kept"})";
  manifest.graphs.push_back(compiled);
  manifest.graphs.push_back(eager);
  auto files = mlp_files();
  files["graphs/compiled/tune_report.json"] = abc_;  // a front end's graph may keep files (its report)
  Checkpoint::save(dir_, manifest, files);

  const json j = json::parse(test::read_file_bytes(artifact("manifest.json")));
  EXPECT_EQ(j.at("graphs")[1].at("backend"), "torch_compile");
  EXPECT_EQ(j.at("graphs")[1].at("section").at("mode"), "default");  // JSON, not a string
  EXPECT_EQ(j.at("graphs")[1].at("section_version"), 1);
  EXPECT_EQ(j.at("graphs")[1].at("model"), "");

  const auto loaded = Checkpoint::load(dir_);  // the whole manifest loads and verifies
  EXPECT_EQ(loaded.graph_keys(), (std::vector<std::string>{"mlp", "compiled", "eager"}));
  EXPECT_TRUE(loaded.runs_in_engine("mlp"));
  EXPECT_FALSE(loaded.runs_in_engine("compiled"));
  EXPECT_EQ(json::parse(loaded.graph("compiled").section_json).at("precision"), "fp32");
  EXPECT_EQ(run_mlp(*loaded.create_session("mlp")), run_original_mlp());  // the ONNX Runtime graph still runs
  expect_error([&] { loaded.create_session("compiled"); }, ErrorCode::kBackendUnavailable,
               {"compiled", "torch_compile", "Python"});
  expect_error([&] { loaded.model_path("eager"); }, ErrorCode::kBackendUnavailable, {"eager"});
  EXPECT_EQ(CheckpointManifest::from_json(test::read_file_bytes(artifact("manifest.json"))), loaded.manifest());
}

TEST_F(CheckpointTest, UnknownSectionsAndNewerSectionVersionsAreCorrupt) {
  save_mlp();
  edit_manifest([](json& j) { j["graphs"][0]["backend"] = "tensorflow"; });
  expect_corrupt(dir_, {"unknown"}, {"tensorflow", "onnxruntime, torch_compile, eager"});
  edit_manifest([](json& j) {
    j["graphs"][0]["backend"] = "onnxruntime";
    j["graphs"][0]["section_version"] = 7;
  });
  expect_corrupt(dir_, {"upgrade"}, {"section_version 7", "onnxruntime"});
  // Format 1 had neither field: an ONNX Runtime graph of section version 1.
  edit_manifest([](json& j) {
    j["format_version"] = 1;
    j["graphs"][0].erase("section_version");
    j["graphs"][0].erase("section");
  });
  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(loaded.manifest().format_version, 1);
  EXPECT_EQ(loaded.graph("mlp").section_version, 1);
  EXPECT_EQ(run_mlp(*loaded.create_session("mlp")), run_original_mlp());
}

// ---------------------------------------------------------------------------------
// Corruption: one case each

TEST_F(CheckpointTest, AGraphWhoseFilesLieUnderAnotherKeyIsCorrupt) {
  // A key edited by hand while the files stay under graphs/mlp/: the C++ loader ran it
  // (ait.load refused it as corrupt), one graph's model answering for another key (a probe).
  save_mlp();
  edit_manifest([](json& j) { j["graphs"][0]["key"] = "other"; });
  expect_corrupt(dir_, {"not under the graph's directory"}, {"graphs/other/"});
}

TEST_F(CheckpointTest, TamperedByteIsASha256Mismatch) {
  save_mlp();
  auto bytes = test::read_file_bytes(model_file());
  bytes[bytes.size() - 10] = static_cast<char>(bytes[bytes.size() - 10] ^ 0x40);
  test::write_file_bytes(model_file(), bytes);
  expect_corrupt(dir_, {"sha256"}, {"graphs/mlp/model_raw.onnx", "changed"});
}

TEST_F(CheckpointTest, TruncatedFileIsReported) {
  save_mlp();
  fs::resize_file(model_file(), fs::file_size(model_file()) - 100);
  expect_corrupt(dir_, {"truncated"}, {"graphs/mlp/model_raw.onnx", "bytes"});
}

TEST_F(CheckpointTest, MissingFileIsReported) {
  save_mlp();
  fs::remove(artifact("graphs/mlp/notes/abc.txt"));
  expect_corrupt(dir_, {"missing"}, {"graphs/mlp/notes/abc.txt"});
}

TEST_F(CheckpointTest, MissingManifestIsReported) {
  save_mlp();
  fs::remove(artifact("manifest.json"));
  expect_corrupt(dir_, {}, {"manifest.json", "damaged checkpoint"});
}

TEST_F(CheckpointTest, ManifestThatIsADirectoryIsCorruptNotAStreamException) {
  save_mlp();
  fs::remove(artifact("manifest.json"));
  fs::create_directory(artifact("manifest.json"));
  expect_corrupt(dir_, {}, {"manifest.json", "not a regular file"});
  // a save to the path refuses it the same way (typed, naming it) rather than throwing from the stream
  try {
    aitune::Checkpoint::check_save_target(dir_, {});
    FAIL() << "a directory holding a directory manifest.json was taken as a save target";
  } catch (const aitune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, MalformedManifestIsReported) {
  save_mlp();
  test::write_file_bytes(artifact("manifest.json"), R"({"format": "aitune-checkpoint", "format_version": 1,)");
  expect_corrupt(dir_, {}, {"manifest.json", "not valid JSON"});
}

TEST_F(CheckpointTest, ManifestWithMissingOrMistypedFieldIsReported) {
  save_mlp();
  edit_manifest([](json& j) { j["graphs"][0]["artifacts"][1].erase("sha256"); });
  expect_corrupt(dir_, {}, {"graphs[0].artifacts[1].sha256", "missing"});
  edit_manifest([](json& j) { j["graphs"][0]["artifacts"][1]["sha256"] = kAbcSha256; j["graphs"][0]["artifacts"][1]["size"] = -3; });
  expect_corrupt(dir_, {}, {"graphs[0].artifacts[1].size", "non-negative"});
  edit_manifest([](json& j) { j["graphs"][0]["artifacts"][1]["size"] = 3; j["graphs"][0]["graph_spec"].erase("inputs"); });
  expect_corrupt(dir_, {}, {"graphs[0].graph_spec", "inputs"});
  edit_manifest([](json& j) { j.erase("format"); });
  expect_corrupt(dir_, {}, {"not an aitune checkpoint manifest"});
}

TEST_F(CheckpointTest, NewerFormatVersionIsRefusedNamingTheSupportedOnes) {
  save_mlp();
  // A future format may change any field: the version is checked before anything else.
  edit_manifest([](json& j) {
    j["format_version"] = kCheckpointFormatVersion + 1;
    j.erase("graphs");
  });
  expect_corrupt(dir_, {"newer"}, {"format_version " + std::to_string(kCheckpointFormatVersion + 1),
                                   "format versions 1 to " + std::to_string(kCheckpointFormatVersion)});
}

TEST_F(CheckpointTest, AbsoluteArtifactPathIsRefused) {
  save_mlp();
  test::write_file_bytes(tmp_.file("outside.txt"), kAbc);
  edit_manifest([&](json& j) { j["graphs"][0]["artifacts"][1]["path"] = tmp_.file("outside.txt"); });
  expect_corrupt(dir_, {"absolute"}, {tmp_.file("outside.txt")});
}

TEST_F(CheckpointTest, DotDotArtifactPathIsRefused) {
  save_mlp();
  test::write_file_bytes(tmp_.file("outside.txt"), kAbc);
  edit_manifest([](json& j) { j["graphs"][0]["artifacts"][1]["path"] = "graphs/mlp/../../../outside.txt"; });
  expect_corrupt(dir_, {}, {"graphs/mlp/../../../outside.txt", "'..'"});
}

TEST_F(CheckpointTest, SymlinkLeadingOutsideIsRefusedEvenWithTheRightBytes) {
  save_mlp();
  // Same bytes outside the directory: only the link check can catch this.
  ScopedTempDir outside;
  fs::copy_file(model_file(), outside.file("model.onnx"));
  fs::remove(model_file());
  fs::create_symlink(outside.file("model.onnx"), model_file());
  expect_corrupt(dir_, {"outside"}, {"symbolic link", "model_raw.onnx"});
}

TEST_F(CheckpointTest, SymlinkedDirectoryLeadingOutsideIsRefused) {
  save_mlp();
  ScopedTempDir outside;
  fs::copy(artifact("graphs/mlp"), outside.path() / "mlp", fs::copy_options::recursive);
  fs::remove_all(artifact("graphs/mlp"));
  fs::create_directory_symlink(outside.path() / "mlp", artifact("graphs/mlp"));
  expect_corrupt(dir_, {"outside"}, {"symbolic link"});
}

TEST_F(CheckpointTest, SymlinkInsideTheCheckpointIsAccepted) {
  save_mlp();
  fs::create_directories(artifact("store"));
  fs::rename(model_file(), artifact("store/model.onnx"));
  fs::create_symlink("../../store/model.onnx", model_file());
  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(run_mlp(*loaded.create_session("mlp")), run_original_mlp());
}

TEST_F(CheckpointTest, ExternalDataOutsideTheCheckpointIsRefused) {
  Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/model_raw.onnx", fixture("mlp_ext.onnx")}});
  // Point the model's data location (17 characters) at a same-length path outside the
  // checkpoint, and give the manifest the new digest, as a forger would.
  auto bytes = test::read_file_bytes(model_file());
  const std::string from = "mlp_ext.onnx.data", to = "../outside/x.data";
  ASSERT_EQ(from.size(), to.size());
  std::size_t replaced = 0;
  for (auto pos = bytes.find(from); pos != std::string::npos; pos = bytes.find(from, pos + 1), ++replaced)
    bytes.replace(pos, from.size(), to);
  ASSERT_GT(replaced, 0u);
  ScopedTempDir forge;
  test::write_file_bytes(forge.file("forged.bin"), bytes);
  // Saved as an opaque (non-.onnx) file, save computes the digest without scanning it.
  const auto digest = Checkpoint::save(forge.file("ckpt"), mlp_manifest(),
                                       {{"graphs/mlp/model_raw.onnx", fixture("mlp.onnx")},
                                        {"graphs/mlp/forged.bin", forge.file("forged.bin")}})
                          .graphs[0]
                          .artifacts[0];
  ASSERT_EQ(digest.path, "graphs/mlp/forged.bin");
  test::write_file_bytes(model_file(), bytes);
  edit_manifest([&](json& j) {
    for (auto& a : j["graphs"][0]["artifacts"])
      if (a["path"] == "graphs/mlp/model_raw.onnx") {
        a["size"] = digest.size;
        a["sha256"] = digest.sha256;
      }
  });
  expect_corrupt(dir_, {}, {"../outside/x.data", "'..'", "external data"});
}

TEST_F(CheckpointTest, UnlistedExternalDataIsRefused) {
  Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/model_raw.onnx", fixture("mlp_ext.onnx")}});
  // Drop the data file from the manifest: it would be read unverified.
  edit_manifest([](json& j) {
    auto& arts = j["graphs"][0]["artifacts"];
    arts.erase(arts.begin());
  });
  expect_corrupt(dir_, {}, {"mlp_ext.onnx.data", "not an artifact"});
}

// Regression (issue 17): the same entry written value-first (valid protobuf) was missed by
// the byte-pattern scan, so an unlisted file ran as weights while load said "verified".
TEST_F(CheckpointTest, UnlistedExternalDataWrittenValueFirstIsRefused) {
  ScopedTempDir src;
  std::string bytes = test::read_file_bytes(fixture("mlp_ext.onnx"));
  ASSERT_GT(test::onnx_wire::put_location_values_first(bytes), 0u);
  test::write_file_bytes(src.file("mlp_ext.onnx"), bytes);
  fs::copy_file(fixture("mlp_ext.onnx.data"), src.file("mlp_ext.onnx.data"));
  const auto saved = Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/model_raw.onnx", src.file("mlp_ext.onnx")}});
  ASSERT_EQ(saved.graphs[0].artifacts.size(), 2u) << "save must find the value-first data file and keep it";
  edit_manifest([](json& j) {
    auto& arts = j["graphs"][0]["artifacts"];
    arts.erase(arts.begin());  // graphs/mlp/mlp_ext.onnx.data sorts first
  });
  expect_corrupt(dir_, {}, {"mlp_ext.onnx.data", "not an artifact"});
}

// A TensorRT EPContext model dumped with embed_mode=0 loads its engine from a file beside
// it: save keeps that file as an artifact with its sha256, and load refuses a checkpoint
// whose engine file is unlisted or changed (it would run unverified).
TEST_F(CheckpointTest, EpContextEngineFileIsAVerifiedArtifact) {
  namespace w = test::onnx_wire;
  ScopedTempDir src;
  test::write_file_bytes(src.file("model_ctx.onnx"), w::model(w::graph({}, {w::ep_context_node(0, "model_ctx.engine")})));
  test::write_file_bytes(src.file("model_ctx.engine"), "serialized TensorRT engine");
  const auto saved = Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/model_raw.onnx", src.file("model_ctx.onnx")}});
  ASSERT_EQ(saved.graphs[0].artifacts.size(), 2u) << "save must keep the engine file beside the model";
  EXPECT_EQ(saved.graphs[0].artifacts[0].path, "graphs/mlp/model_ctx.engine");
  EXPECT_EQ(test::read_file_bytes(artifact("graphs/mlp/model_ctx.engine")), "serialized TensorRT engine");
  EXPECT_NO_THROW(Checkpoint::load(dir_));

  test::write_file_bytes(artifact("graphs/mlp/model_ctx.engine"), "serialized TensorRT enginf");
  expect_corrupt(dir_, {"sha256"}, {"model_ctx.engine"});
  test::write_file_bytes(artifact("graphs/mlp/model_ctx.engine"), "serialized TensorRT engine");
  edit_manifest([](json& j) {
    auto& arts = j["graphs"][0]["artifacts"];
    arts.erase(arts.begin());
  });
  expect_corrupt(dir_, {}, {"model_ctx.engine", "not an artifact"});
  // Without the engine file, save refuses the model (it could not run).
  ScopedTempDir lonely;
  test::write_file_bytes(lonely.file("m.onnx"), w::model(w::graph({}, {w::ep_context_node(0, "m.engine")})));
  expect_error([&] { Checkpoint::save(dir_ + "-2", mlp_manifest(), {{"graphs/mlp/model_raw.onnx", lonely.file("m.onnx")}}); },
               ErrorCode::kModelInvalid, {"m.engine"});
}

// Regression (issue 17): arrays nested 80,000 deep overflowed the stack when re-serialised.
TEST_F(CheckpointTest, DeeplyNestedManifestIsCorruptNotACrash) {
  save_mlp();
  const std::string manifest = test::read_file_bytes(artifact("manifest.json"));
  for (const std::string field : {"\"metadata\": ", "\"structure\": ", "\"graph_spec\": ", "\"backend_config\": "}) {
    SCOPED_TRACE(field);
    const auto at = manifest.find(field);
    ASSERT_NE(at, std::string::npos);
    const std::string deep = std::string(80000, '[') + std::string(80000, ']') + ", \"x\": ";
    std::string edited = manifest;
    // `"field": [[[...]]], "x": <the original value>` keeps the JSON valid.
    edited.insert(at + field.size(), deep);
    edited.replace(at, field.size(), field);
    test::write_file_bytes(artifact("manifest.json"), edited);
    expect_corrupt(dir_, {}, {"nested deeper than"});
  }
  // On save, the front end's JSON is bounded the same way.
  auto m = mlp_manifest();
  m.metadata_json = std::string(1000, '[') + std::string(1000, ']');
  expect_error([&] { Checkpoint::save(tmp_.file("deep"), m, mlp_files()); },
               test::ErrorExpectation{{ErrorCode::kInvalidArgument}, {}, {"nested deeper than"}});
  // 100 levels are fine.
  m.metadata_json = std::string(100, '[') + std::string(100, ']');
  Checkpoint::save(tmp_.file("deep_ok"), m, mlp_files());
  EXPECT_EQ(Checkpoint::load(tmp_.file("deep_ok")).manifest().metadata_json, m.metadata_json);
}

// Regression (issue 17): 100,000 intra-op threads hung a load for minutes; 1.5, 2^32 + 1,
// -5 and a device 2^40 were accepted (truncated).
TEST_F(CheckpointTest, UnboundedNumbersInTheBackendConfigAreCorrupt) {
  save_mlp();
  const std::vector<std::pair<std::string, json>> cases = {
      {"intra_op_threads", 100000}, {"intra_op_threads", 4294967297ull}, {"inter_op_threads", -5},
      {"intra_op_threads", 1.5},    {"device_id", 1099511627776ull},     {"device_id", -1},
      {"inter_op_threads", "2"},
  };
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key + "=" + value.dump());
    edit_manifest([&](json& j) {
      j["graphs"][0]["backend_config"] = json::parse(mlp_config().to_json());
      j["graphs"][0]["backend_config"][key] = value;
    });
    expect_corrupt(dir_, {}, {key});
  }
  auto m = mlp_manifest();
  m.graphs[0].backend_config.intra_op_threads = 100000;
  expect_error([&] { Checkpoint::save(tmp_.file("threads"), m, mlp_files()); },
               test::ErrorExpectation{{ErrorCode::kInvalidArgument}, {}, {"intra_op_threads"}});
}

// An edited manifest whose session config named session.optimized_model_filepath made a
// load overwrite that file with ONNX bytes (aitune run, the C++ example, ait.load alike):
// options that make ONNX Runtime write or read a file they name are refused, at load and at
// save; TensorRT's profile shapes (an option with "profile" in it) stay allowed.
TEST_F(CheckpointTest, OptionsThatNameFilesAreCorruptAndNotSaved) {
  save_mlp();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"session_config", "session.optimized_model_filepath"},
      {"session_config", "ep.context_enable"},
      {"session_config", "session.optimized_model_external_initializers_file_name"},
      {"provider_options", "trt_dump_subgraphs"},
      {"provider_options", "ep.context_file_path"},
  };
  const std::string victim = tmp_.file("victim.txt");
  for (const auto& [where, key] : cases) {
    SCOPED_TRACE(where + ": " + key);
    edit_manifest([&](json& j) {
      j["graphs"][0]["backend_config"] = json::parse(mlp_config().to_json());
      j["graphs"][0]["backend_config"][where][key] = victim;
    });
    expect_corrupt(dir_, {}, {key, "a checkpoint may not hold one"});
  }
  EXPECT_FALSE(fs::exists(victim));
  auto m = mlp_manifest();
  m.graphs[0].backend_config.session_config["session.optimized_model_filepath"] = victim;
  expect_error([&] { Checkpoint::save(tmp_.file("writes"), m, mlp_files()); },
               test::ErrorExpectation{{ErrorCode::kInvalidArgument}, {}, {"session.optimized_model_filepath"}});
  auto shapes = mlp_manifest();
  shapes.graphs[0].backend_config.provider_options["trt_profile_max_shapes"] = "x:4x64";
  EXPECT_NO_THROW(Checkpoint::save(tmp_.file("shapes"), shapes, mlp_files()));
}

// ---------------------------------------------------------------------------------
// Atomic save

TEST_F(CheckpointTest, FailureMidSaveLeavesThePreviousCheckpointLoadable) {
  save_mlp("first");
  const auto before = test::read_file_bytes(artifact("manifest.json"));
  CheckpointSaveOptions options;
  std::vector<std::string> written;
  options.on_file_written = [&](const std::string& path, std::size_t count) {
    written.push_back(path);
    if (count == 1) throw Error(ErrorCode::kIo, "injected failure after " + path);
  };
  auto files = mlp_files();
  files["graphs/mlp/notes/more.txt"] = abc_;
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest("second"), files, options); }, ErrorCode::kIo, {"injected"});
  EXPECT_EQ(written, std::vector<std::string>{"graphs/mlp/model_raw.onnx"});
  EXPECT_EQ(test::read_file_bytes(artifact("manifest.json")), before);
  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(loaded.manifest().module_name, "first");
  EXPECT_FALSE(fs::exists(artifact("graphs/mlp/notes/more.txt")));
  EXPECT_EQ(run_mlp(*loaded.create_session("mlp")), run_original_mlp());
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"}) << "the temporary directory was left behind";
}

// Two processes saving to one new path (the cache stress test's shared directory): the
// other's checkpoint lands after this save found the path free and before it moves its own
// in. With overwrite on, this save replaces it as if it had been there; with overwrite off,
// it refuses as for a checkpoint found at the start; either way nothing is left beside it.
TEST_F(CheckpointTest, ACheckpointSavedMeanwhileToTheSamePathIsReplacedWhenOverwriting) {
  CheckpointSaveOptions options;
  bool raced = false;
  options.on_file_written = [&](const std::string&, std::size_t) {
    if (!std::exchange(raced, true)) save_mlp("other");
  };
  Checkpoint::save(dir_, mlp_manifest("mine"), mlp_files(), options);
  EXPECT_TRUE(raced);
  EXPECT_EQ(Checkpoint::load(dir_).manifest().module_name, "mine");
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"}) << "a temporary or old directory was left behind";
}

TEST_F(CheckpointTest, ACheckpointSavedMeanwhileIsKeptWithoutOverwrite) {
  CheckpointSaveOptions options;
  options.overwrite = false;
  bool raced = false;
  options.on_file_written = [&](const std::string&, std::size_t) {
    if (!std::exchange(raced, true)) save_mlp("other");
  };
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest("mine"), mlp_files(), options); },
               ErrorCode::kInvalidArgument, {"already holds a checkpoint"});
  EXPECT_EQ(Checkpoint::load(dir_).manifest().module_name, "other");
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});
}

// A loaded checkpoint saved again over itself, its files read from the directory being
// replaced (a module loaded from it, saved back): twice in a row, with external data; and
// CheckpointSaveOptions::expected_sha256 refusing a source whose content changed.
TEST_F(CheckpointTest, ACheckpointSavesOverItselfFromItsOwnFilesAndChecksExpectedDigests) {
  Checkpoint::save(dir_, mlp_manifest("first"), {{"graphs/mlp/model_raw.onnx", fixture("mlp_ext.onnx")}});
  const auto session = Checkpoint::load(dir_).create_session("mlp");  // maps the external data
  for (int i = 0; i < 2; ++i) {
    const auto loaded = Checkpoint::load(dir_);
    CheckpointSaveOptions options;
    for (const auto& a : loaded.manifest().graphs[0].artifacts) options.expected_sha256[a.path] = a.sha256;
    Checkpoint::save(dir_, mlp_manifest("again"), {{"graphs/mlp/model_raw.onnx", loaded.model_path("mlp")}}, options);
    const auto again = Checkpoint::load(dir_);
    EXPECT_EQ(again.manifest().graphs[0].artifacts, loaded.manifest().graphs[0].artifacts);
    EXPECT_EQ(run_mlp(*again.create_session("mlp")), run_original_mlp());
    EXPECT_EQ(run_mlp(*session), run_original_mlp()) << "a session of the replaced checkpoint stopped computing";
  }
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});

  // The data file rewritten (new content, same size) after the caller took its digests.
  const auto loaded = Checkpoint::load(dir_);
  CheckpointSaveOptions options;
  for (const auto& a : loaded.manifest().graphs[0].artifacts) options.expected_sha256[a.path] = a.sha256;
  const auto before = test::read_file_bytes(artifact("manifest.json"));
  auto data = test::read_file_bytes(artifact("graphs/mlp/mlp_ext.onnx.data"));
  data[data.size() / 2] = static_cast<char>(data[data.size() / 2] ^ 0x01);
  const std::string rewritten = tmp_.file("rewritten.data");
  test::write_file_bytes(rewritten, data);
  fs::rename(rewritten, artifact("graphs/mlp/mlp_ext.onnx.data"));
  const std::map<std::string, std::string> from_itself{{"graphs/mlp/model_raw.onnx", model_file()}};
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest("again"), from_itself, options); },
               ErrorCode::kState, {"graphs/mlp/mlp_ext.onnx.data", "content changed", dir_});
  EXPECT_EQ(test::read_file_bytes(artifact("manifest.json")), before);
  EXPECT_EQ(test::read_file_bytes(artifact("graphs/mlp/mlp_ext.onnx.data")), data);
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});

  options.expected_sha256 = {{"graphs/mlp/model_raw.onnx", "ABC"}};
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest("again"), from_itself, options); },
               ErrorCode::kInvalidArgument, {"not a sha256"});
  EXPECT_EQ(test::read_file_bytes(artifact("manifest.json")), before);
}

// A checkpoint saved inside another would be removed by the next save over the outer one
// (it replaces the directory whole): refused, naming both, before anything is written.
TEST_F(CheckpointTest, ACheckpointInsideACheckpointIsRefused) {
  save_mlp("outer");
  EXPECT_EQ(Checkpoint::enclosing_checkpoint(artifact("sub")), dir_);
  EXPECT_EQ(Checkpoint::enclosing_checkpoint(artifact("graphs/mlp/deeper/x")), dir_);
  EXPECT_EQ(Checkpoint::enclosing_checkpoint(dir_), "");
  EXPECT_EQ(Checkpoint::enclosing_checkpoint(tmp_.file("beside")), "");
  for (const std::string inner : {artifact("sub"), artifact("graphs/new/deeper")}) {
    expect_error([&] { Checkpoint::save(inner, mlp_manifest("inner"), mlp_files()); }, ErrorCode::kInvalidArgument,
                 {inner, "lies inside the checkpoint '" + dir_ + "'", "outside"});
    expect_error([&] { Checkpoint::check_save_target(inner); }, ErrorCode::kInvalidArgument, {"lies inside"});
  }
  EXPECT_FALSE(fs::exists(artifact("sub")));
  EXPECT_FALSE(fs::exists(artifact("graphs/new")));
  // A pipeline checkpoint (pipeline.json) encloses as well; a directory with another
  // manifest.json does not.
  const std::string pipeline = tmp_.file("pipe");
  fs::create_directories(pipeline);
  test::write_file_bytes(pipeline + "/pipeline.json", "{}");
  EXPECT_EQ(Checkpoint::enclosing_checkpoint(pipeline + "/modules/x"), pipeline);
  const std::string other = tmp_.file("other");
  fs::create_directories(other);
  test::write_file_bytes(other + "/manifest.json", R"({"format": "something-else"})");
  EXPECT_EQ(Checkpoint::enclosing_checkpoint(other + "/x"), "");
  Checkpoint::save(other + "/x", mlp_manifest("inside another tool's directory"), mlp_files());
}

TEST_F(CheckpointTest, FailureOfAFirstSaveLeavesNothing) {
  CheckpointSaveOptions options;
  options.on_file_written = [](const std::string&, std::size_t) { throw std::runtime_error("not an aitune error"); };
  EXPECT_THROW(Checkpoint::save(dir_, mlp_manifest(), mlp_files(), options), std::runtime_error);
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(siblings(), std::vector<std::string>{});
}

TEST_F(CheckpointTest, FailureWritingAFileLeavesThePreviousCheckpoint) {
  save_mlp("first");
  // A real read error in the middle of the copy, after the model was written: reading
  // /proc/self/mem at offset 0 (an unmapped address) fails with EIO, even for root.
  if (!fs::is_regular_file("/proc/self/mem")) GTEST_SKIP() << "no /proc/self/mem here";
  auto files = mlp_files();
  files["graphs/mlp/z.bin"] = "/proc/self/mem";
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest("second"), files); }, ErrorCode::kIo, {"mem"});
  EXPECT_EQ(Checkpoint::load(dir_).manifest().module_name, "first");
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});
}

TEST_F(CheckpointTest, SaveReplacesAnExistingCheckpointCompletely) {
  save_mlp("first");
  Checkpoint::save(dir_, mlp_manifest("second"), {{"graphs/mlp/model_raw.onnx", fixture("mlp.onnx")}});
  const auto loaded = Checkpoint::load(dir_);
  EXPECT_EQ(loaded.manifest().module_name, "second");
  EXPECT_FALSE(fs::exists(artifact("graphs/mlp/notes/abc.txt"))) << "a file of the old checkpoint survived";
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});
  // Re-saving a loaded checkpoint onto itself, from its own files, works too.
  Checkpoint::save(dir_, mlp_manifest("third"), {{"graphs/mlp/model_raw.onnx", loaded.model_path("mlp")}});
  EXPECT_EQ(run_mlp(*Checkpoint::load(dir_).create_session("mlp")), run_original_mlp());
  EXPECT_EQ(Checkpoint::load(dir_).manifest().module_name, "third");
}

TEST_F(CheckpointTest, SaveCreatesParentsAndTakesAnEmptyDirectory) {
  const std::string nested = tmp_.file("a/b/ckpt/");
  Checkpoint::save(nested, mlp_manifest(), mlp_files());
  EXPECT_EQ(Checkpoint::load(nested).manifest().module_name, "mlp-module");
  fs::create_directory(dir_);
  Checkpoint::save(dir_, mlp_manifest(), mlp_files());
  EXPECT_TRUE(Checkpoint::is_checkpoint(dir_));
}

TEST_F(CheckpointTest, OverwritingWhatIsNotACheckpointIsRefused) {
  // A file.
  test::write_file_bytes(dir_, "precious");
  auto msg = expect_error([&] { save_mlp(); }, ErrorCode::kInvalidArgument, {"refusing"});
  EXPECT_NE(msg.find("is not a directory"), std::string::npos) << msg;
  // check_save_target refuses what save refuses, with the same error, writing nothing.
  EXPECT_EQ(expect_error([&] { Checkpoint::check_save_target(dir_); }, ErrorCode::kInvalidArgument), msg);
  expect_error([&] { Checkpoint::check_save_target(dir_ + "/below/ckpt"); }, ErrorCode::kIo, {"not a directory"});
  EXPECT_EQ(test::read_file_bytes(dir_), "precious");
  fs::remove(dir_);
  // A non-empty directory without a manifest.
  fs::create_directory(dir_);
  test::write_file_bytes(artifact("data.txt"), "precious");
  msg = expect_error([&] { save_mlp(); }, ErrorCode::kInvalidArgument, {"manifest.json"});
  EXPECT_NE(msg.find("not an aitune checkpoint"), std::string::npos) << msg;
  EXPECT_EQ(expect_error([&] { Checkpoint::check_save_target(dir_); }, ErrorCode::kInvalidArgument), msg);
  EXPECT_EQ(test::read_file_bytes(artifact("data.txt")), "precious");
  // Someone else's manifest.json.
  test::write_file_bytes(artifact("manifest.json"), R"({"name": "not ours"})");
  expect_error([&] { save_mlp(); }, ErrorCode::kInvalidArgument, {"aitune-checkpoint"});
  EXPECT_EQ(test::read_file_bytes(artifact("data.txt")), "precious");
  // A symbolic link.
  fs::remove_all(dir_);
  fs::create_directory(tmp_.file("real"));
  fs::create_directory_symlink(tmp_.file("real"), dir_);
  expect_error([&] { save_mlp(); }, ErrorCode::kInvalidArgument, {"symbolic"});
  expect_error([&] { Checkpoint::check_save_target(dir_); }, ErrorCode::kInvalidArgument, {"symbolic"});
  fs::remove(dir_);
  // An existing checkpoint with overwrite off.
  save_mlp("first");
  CheckpointSaveOptions keep;
  keep.overwrite = false;
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest("second"), mlp_files(), keep); }, ErrorCode::kInvalidArgument,
               {"overwrite"});
  expect_error([&] { Checkpoint::check_save_target(dir_, keep); }, ErrorCode::kInvalidArgument, {"overwrite"});
  Checkpoint::check_save_target(dir_);                      // overwrite on: fine
  Checkpoint::check_save_target(tmp_.file("new/nested"));  // absent: fine, and nothing is created
  EXPECT_FALSE(fs::exists(tmp_.file("new")));
  // A directory save cannot create its staging directory in (here /proc/self, where
  // mkdir fails even for root; a read-only file system is the common case) is refused
  // now, not after the tune that `aitune tune --checkpoint` checks it for.
  expect_error([] { Checkpoint::check_save_target("/proc/self/aitune-ckpt"); }, ErrorCode::kIo,
               {"temporary directory", "/proc/self"});
  EXPECT_FALSE(fs::exists(tmp_.file("new")));
  EXPECT_EQ(Checkpoint::load(dir_).manifest().module_name, "first");
  EXPECT_EQ(siblings(), (std::vector<std::string>{"ckpt", "real"}));
}

TEST_F(CheckpointTest, SaveRejectsBadInput) {
  auto files = mlp_files();
  auto with = [&](const std::string& rel, const std::string& src) {
    auto f = files;
    f[rel] = src;
    return f;
  };
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), with("/abs/x", abc_)); }, ErrorCode::kInvalidArgument,
               {"absolute"});
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), with("graphs/mlp/../x", abc_)); },
               ErrorCode::kInvalidArgument, {});
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), with("elsewhere/x", abc_)); }, ErrorCode::kInvalidArgument,
               {"elsewhere/x", "mlp"});
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), with("graphs/mlp/x", tmp_.file("nope"))); }, ErrorCode::kIo,
               {"graphs/mlp/x"});
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), with("graphs/mlp/notes", abc_)); },
               ErrorCode::kInvalidArgument, {"graphs/mlp/notes"});
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), with("graphs/mlp/second.onnx", fixture("add.onnx"))); },
               ErrorCode::kInvalidArgument, {"model"});
  expect_error([&] { Checkpoint::save(dir_, mlp_manifest(), {{"graphs/mlp/notes/abc.txt", abc_}}); },
               ErrorCode::kInvalidArgument, {"onnx"});
  auto bad_key = mlp_manifest("m", "a/b");
  expect_error([&] { Checkpoint::save(dir_, bad_key, {}); }, ErrorCode::kInvalidArgument, {"key"});
  auto twice = mlp_manifest();
  twice.graphs.push_back(twice.graphs[0]);
  expect_error([&] { Checkpoint::save(dir_, twice, files); }, ErrorCode::kInvalidArgument, {"twice"});
  auto bad_json = mlp_manifest();
  bad_json.graphs[0].structure_json = "{not json";
  expect_error([&] { Checkpoint::save(dir_, bad_json, files); }, ErrorCode::kInvalidArgument, {"structure_json"});
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_EQ(siblings(), std::vector<std::string>{});
}

TEST_F(CheckpointTest, AManifestWithoutGraphsKeepsOnlyItsMetadata) {
  // A front end's own decisions (aitune.torch's torch.compile graphs) need no ONNX model.
  auto no_graphs = mlp_manifest();
  no_graphs.graphs.clear();
  no_graphs.metadata_json = R"({"front_end": {"compiled": 1}})";
  Checkpoint::save(dir_, no_graphs, {});
  auto loaded = Checkpoint::load(dir_);
  EXPECT_TRUE(loaded.graph_keys().empty());
  EXPECT_NE(loaded.manifest().metadata_json.find("compiled"), std::string::npos);
}

TEST(CheckpointDocs, ManifestExampleIsAValidManifest) {
  // (Not __FILE__: ccache's CCACHE_BASEDIR makes it relative to the build directory.)
  const auto doc = fs::path(AITUNE_SOURCE_DIR) / "docs" / "checkpoints.md";
  const std::string text = test::read_file_bytes(doc.string());
  const auto start = text.find("```json\n");
  ASSERT_NE(start, std::string::npos) << doc << " has no ```json example";
  const auto end = text.find("```", start + 8);
  ASSERT_NE(end, std::string::npos);
  const auto m = CheckpointManifest::from_json(text.substr(start + 8, end - start - 8));
  ASSERT_EQ(m.graphs.size(), 1u);
  EXPECT_EQ(m.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(m.graphs[0].artifacts.size(), 2u);
  EXPECT_EQ(m.graphs[0].graph_spec, mlp_spec());
}

// The directories a save makes beside its target: a name near the 255-byte limit of the
// file system left no room for ".tmp-<pid>-<random>" (a session-36 probe: 218 bytes was the
// longest name ait.save took). Long names are cut, at a UTF-8 character's start, and keep a
// digest of the whole, the same in every process (the sweep of a later one finds them).
TEST(CheckpointPaths, SiblingPrefixesFitBesideTheLongestName) {
  EXPECT_EQ(sibling_prefix("model.ait", ".tmp-"), ".model.ait.tmp-");
  const std::string longest(255, 'x');
  const std::string prefix = sibling_prefix(longest, ".tmp-");
  EXPECT_LE(prefix.size() + 40, 255u) << prefix;  // room for "<pid>-<random>"
  EXPECT_EQ(prefix, sibling_prefix(longest, ".tmp-"));
  EXPECT_NE(prefix, sibling_prefix(std::string(254, 'x') + "y", ".tmp-"));  // the same first bytes, another name
  std::string accents;
  while (accents.size() < 200) accents += "\xc3\xa9";  // 'e' with an accent: two bytes each
  const std::string cut = sibling_prefix(accents, ".old-");
  const std::string kept = cut.substr(1, cut.find('~') - 1);
  EXPECT_EQ(kept.size() % 2, 0u) << "a character cut in half";
}

TEST(CheckpointPaths, SafeRelativePaths) {
  for (const char* ok : {"a", "graphs/k/model.onnx", "a.b/c-d_e", "..a/b.."})
    EXPECT_TRUE(is_safe_relative_path(ok)) << ok;
  for (const char* bad : {"", "/a", "a/../b", "..", "a/./b", ".", "a//b", "a/", "a\\b"})
    EXPECT_FALSE(is_safe_relative_path(bad)) << bad;
  EXPECT_FALSE(is_safe_relative_path(std::string("a\0b", 3)));
}

// was: "has no manifest.json: not an aitune checkpoint, or one whose save did not finish"
// (corrupt, exit 5 in `aitune run`) for a whole pipeline checkpoint
TEST(CheckpointLoad, APipelineCheckpointNamesItsModulesCheckpoints) {
  ScopedTempDir tmp;
  const fs::path root = tmp.file("pipe.ait");
  fs::create_directories(root / "modules" / "unet");
  fs::create_directories(root / "modules" / "vae.decoder");
  test::write_file_bytes((root / "pipeline.json").string(), R"({"format": "aitune-pipeline-checkpoint"})");
  test::write_file_bytes((root / "modules" / "unet" / "manifest.json").string(), "{}");
  test::write_file_bytes((root / "modules" / "vae.decoder" / "manifest.json").string(), "{}");
  expect_error([&] { Checkpoint::load(root.string()); }, ErrorCode::kInvalidArgument,
               {"pipeline checkpoint", "modules/unet", "modules/vae.decoder", "ait.load"});
}

TEST(CheckpointLoad, MissingOrNonDirectoryPath) {
  ScopedTempDir tmp;
  expect_error([&] { Checkpoint::load(tmp.file("nothing")); }, ErrorCode::kIo, {"exist"});
  test::write_file_bytes(tmp.file("file"), "x");
  expect_error([&] { Checkpoint::load(tmp.file("file")); }, ErrorCode::kInvalidArgument, {"directory"});
  fs::create_directory(tmp.file("empty"));
  // a folder that holds no checkpoint at all (a folder of .onnx files given by mistake) is a bad
  // argument (exit 2), not a corrupt checkpoint (exit 5: it was, before session 31)
  expect_error([&] { Checkpoint::load(tmp.file("empty")); }, ErrorCode::kInvalidArgument,
               {"manifest.json", "not an aitune checkpoint"});
  EXPECT_FALSE(Checkpoint::is_checkpoint(tmp.file("empty")));
}

// ---------------------------------------------------------------------------------
// The command line, in a separate process

#ifdef AITUNE_TEST_CLI
test::CommandResult run_cli(const std::string& args) { return test::run_command(std::string("'") + AITUNE_TEST_CLI + "' " + args); }

TEST_F(CheckpointTest, CliRunsACheckpoint) {
  save_mlp();
  const std::string out = tmp_.file("out");
  auto r = run_cli("run '" + dir_ + "' --iterations 2 --warmup 0 --input x=" + fixture("mlp_x.npy") +
                   " --save-outputs '" + out + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "graph 'mlp'")) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "2 artifacts verified")) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "output y: float32[3, 16]")) << r.output;
  test::expect_allclose_f32(load_npy(out + "/y.npy"), test::load_fixture_npy("mlp_y.npy"), 1e-5);
  // Random inputs are shaped from the saved spec (batch 1 is its smallest).
  r = run_cli("run '" + dir_ + "' --iterations 1 --warmup 0 --graph mlp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "input x: float32[1, 64] random")) << r.output;
  // The saved spec bounds given inputs: batch 5 is outside 1..4.
  save_npy(tmp_.file("x5.npy"), test::make_pattern_f32({5, 64}, 2));
  r = run_cli("run '" + dir_ + "' --iterations 1 --input x=" + tmp_.file("x5.npy"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_cli("run '" + dir_ + "' --graph nope");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(test::contains_word(r.output, "nope")) << r.output;
  r = run_cli("inspect '" + dir_ + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "graph mlp: onnxruntime on cpu")) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "input x: float32[b:1..4, 64]")) << r.output;
  // A model file still runs as before.
  r = run_cli("run " + fixture("mlp.onnx") + " --iterations 1 --warmup 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "input x: float32[1, 64] random")) << r.output;
}

// A manifest whose graph spec does not describe its own model (edited: another dtype, input
// name or rank) is a damaged checkpoint, not a bad argument of the caller's: `aitune run`
// exited 2 ("a bad argument or input") where no argument was bad (a session-37 probe).
TEST_F(CheckpointTest, AGraphSpecThatDoesNotDescribeItsModelIsCorrupt) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> edits = {
      {[](json& j) { j["graphs"][0]["graph_spec"]["inputs"][0]["dtype"] = "float16"; }, "float16"},
      {[](json& j) { j["graphs"][0]["graph_spec"]["inputs"][0]["name"] = "z"; }, "'x'"},
  };
  for (const auto& [edit, names] : edits) {
    SCOPED_TRACE(names);
    fs::remove_all(dir_);
    save_mlp();
    edit_manifest(edit);
    const auto loaded = Checkpoint::load(dir_);  // the files are as the manifest lists them
    expect_error([&] { loaded.create_session("mlp"); },
                 test::ErrorExpectation{{ErrorCode::kCheckpointCorrupt}, {}, {"graph 'mlp'", "graph spec", names}});
    auto r = run_cli("run '" + dir_ + "' --iterations 1 --warmup 0");
    EXPECT_EQ(r.exit_code, 5) << r.output;
  }
}

TEST_F(CheckpointTest, CliExitsWith5OnACorruptCheckpoint) {
  save_mlp();
  auto bytes = test::read_file_bytes(model_file());
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
  test::write_file_bytes(model_file(), bytes);
  auto r = run_cli("run '" + dir_ + "' --iterations 1");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(test::contains_word(r.output, "sha256")) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "model_raw.onnx")) << r.output;
  r = run_cli("inspect '" + dir_ + "'");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  // a folder that holds no checkpoint (a folder of models given by mistake): a bad argument, 2
  fs::create_directory(tmp_.file("not_a_checkpoint"));
  r = run_cli("run '" + tmp_.file("not_a_checkpoint") + "'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "not an aitune checkpoint")) << r.output;
  // one whose manifest was removed beside its graphs: corrupt, 5
  fs::remove(fs::path(dir_) / "manifest.json");
  r = run_cli("run '" + dir_ + "'");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "damaged checkpoint")) << r.output;
}
TEST_F(CheckpointTest, CliNamesAGraphOnlyThePythonFrontEndRunsAndExitsWith3) {
  auto manifest = mlp_manifest();
  CheckpointGraph compiled;
  compiled.key = "compiled";
  compiled.backend = std::string(kTorchCompileBackendName);
  compiled.section_json = R"({"config": {"mode": "default"}})";
  manifest.graphs.push_back(compiled);
  Checkpoint::save(dir_, manifest, mlp_files());
  auto r = run_cli("inspect '" + dir_ + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("graph compiled: torch_compile (section version 1"), std::string::npos) << r.output;
  r = run_cli("run '" + dir_ + "' --iterations 1 --warmup 0 --graph compiled");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("Python front end"), std::string::npos) << r.output;
  r = run_cli("run '" + dir_ + "' --iterations 1 --warmup 0 --graph mlp");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

#endif

// On a GPU: a checkpoint saved for CUDA loads (here and in a fresh process) to outputs
// identical to a backend on the original model; one saved for the CPU loads onto CUDA
// through overrides (a device_map).
TEST_F(CheckpointTest, CudaCheckpointGivesIdenticalOutputsHereAndInAFreshProcess) {
  AITUNE_REQUIRE_CUDA();
  auto manifest = mlp_manifest();
  OnnxSessionConfig cuda = test::cuda_config();
  cuda.provider_options = {{"use_tf32", "0"}};
  manifest.graphs[0].backend_config = cuda;
  Checkpoint::save(dir_, manifest, mlp_files());
  const auto loaded = Checkpoint::load(dir_);
  auto backend = loaded.create_session("mlp");
  EXPECT_EQ(backend->device(), Device::cuda(0));
  EXPECT_EQ(backend->config(), cuda);
  const Tensor x = test::load_fixture_npy("mlp_x.npy");
  const Tensor out = backend->to_host(backend->infer({backend->to_device(x).view()}).at(0));
  auto original = OnnxSession::create(fixture("mlp.onnx"), cuda, mlp_spec());
  const Tensor expected = original->to_host(original->infer({original->to_device(x).view()}).at(0));
  EXPECT_EQ(values_of<float>(out), values_of<float>(expected));
  test::expect_allclose_f32(out, test::load_fixture_npy("mlp_y.npy"), 1e-5);
#ifdef AITUNE_TEST_CLI
  auto r = run_cli("run '" + dir_ + "' --iterations 1 --warmup 0 --input x=" + fixture("mlp_x.npy") +
                   " --save-outputs '" + tmp_.file("gpu_out") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::contains_icase(r.output, "on cuda:0")) << r.output;
  EXPECT_EQ(values_of<float>(load_npy(tmp_.file("gpu_out") + "/y.npy")), values_of<float>(expected));
#endif
  Checkpoint::save(dir_, mlp_manifest(), mlp_files());  // saved for the CPU
  CheckpointBackendOverrides on_gpu;
  on_gpu.provider = ExecutionProvider::kCUDA;
  on_gpu.provider_options = std::map<std::string, std::string>{{"use_tf32", "0"}};
  auto moved = Checkpoint::load(dir_).create_session("mlp", on_gpu);
  EXPECT_EQ(moved->device(), Device::cuda(0));
  const Tensor moved_out = moved->to_host(moved->infer({moved->to_device(x).view()}).at(0));
  EXPECT_EQ(values_of<float>(moved_out), values_of<float>(expected));
}

#ifndef AITUNE_TEST_CLI
TEST(CheckpointCli, Skipped) { GTEST_SKIP() << "the aitune executable is not built (AITUNE_BUILD_CLI=OFF)"; }
#endif

}  // namespace
}  // namespace aitune
