// Tests of the Triton export: config.pbtxt text from graph specs and backend
// configurations, the repository layout, atomic writes, bad input, the CLI subcommand.
// (tests/python/test_triton_export.py parses the configs with Triton's protobuf.)
#include "aitune/onnx_external_data.hpp"  // not in aitune.hpp
#include "aitune/tensorrt_options.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

namespace fs = std::filesystem;
using test::ScopedTempDir;

// A graph spec recorded at batch sizes 1 and 4 from the model's declared shapes, its rows
// found independent as the tuner finds a model's that keeps them apart (GraphSpec::batch_rows).
GraphSpec spec_of(const std::string& model) {
  OnnxSessionConfig cpu;
  cpu.provider = ExecutionProvider::kCPU;
  auto backend = OnnxSession::create(model, cpu);
  GraphSpecBuilder builder;
  for (int64_t batch : {1, 4}) {
    auto records = [batch](const std::vector<IoInfo>& ios) {
      std::vector<TensorRecord> list;
      for (const auto& io : ios) {
        Shape shape = io.shape;
        for (auto& d : shape) d = d < 0 ? batch : d;
        list.push_back({io.name, io.dtype, shape});
      }
      return list;
    };
    builder.record(records(backend->inputs()), records(backend->outputs()), batch);
  }
  GraphSpec spec = builder.build();
  spec.batch_rows = BatchRows::kIndependent;
  return spec;
}

struct GraphSource {
  std::string key;
  std::string model;  // fixture file name
  OnnxSessionConfig config;
  std::map<std::string, std::string> extra_files = {};  // relative path in the graph dir -> source
  std::vector<std::string> conditions = {};             // ShapeCondition JSON the graph was exported under
};

// Saves a checkpoint of `graphs` (module "tuned-mlp") into `dir`.
Checkpoint make_checkpoint(const fs::path& dir, const std::vector<GraphSource>& graphs,
                           const std::string& metadata = "{}") {
  CheckpointManifest manifest;
  manifest.module_name = "tuned-mlp";
  manifest.metadata_json = metadata;
  std::map<std::string, std::string> files;
  for (const auto& g : graphs) {
    CheckpointGraph graph;
    graph.key = g.key;
    graph.graph_spec = spec_of(test::fixture(g.model));
    for (const auto& c : g.conditions) graph.graph_spec.conditions.push_back(ShapeCondition::from_json(c));
    graph.backend_config = g.config;
    manifest.graphs.push_back(graph);
    files[Checkpoint::graph_directory(g.key) + "/" + g.model] = test::fixture(g.model);
    for (const auto& [rel, source] : g.extra_files) files[Checkpoint::graph_directory(g.key) + "/" + rel] = source;
  }
  Checkpoint::save(dir.string(), manifest, files);
  return Checkpoint::load(dir.string());
}

OnnxSessionConfig cpu_config() {
  OnnxSessionConfig c;
  c.provider = ExecutionProvider::kCPU;
  return c;
}

std::string read(const fs::path& p) { return test::read_file_bytes(p.string()); }

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Entries of a directory whose names start with '.' (temporary or set-aside entries).
std::vector<std::string> hidden_entries(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().front() == '.') out.push_back(e.path().filename().string());
  return out;
}

TEST(TritonExport, MlpOnCpuWritesConfigModelAndExternalData) {
  ScopedTempDir tmp;
  auto config = cpu_config();
  config.intra_op_threads = 2;
  config.graph_optimization_level = GraphOptimizationLevel::kBasic;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"graph_0", "mlp_ext.onnx", config}});
  TritonExportOptions options;
  options.instances = 3;
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string(), options);

  ASSERT_EQ(result.models.size(), 1u);
  EXPECT_EQ(result.models[0].name, "tuned-mlp");  // the module name by default
  EXPECT_EQ(result.models[0].graph_key, "graph_0");
  EXPECT_EQ(result.models[0].max_batch_size, 4);
  EXPECT_TRUE(result.ensemble.empty());
  EXPECT_TRUE(result.notes.empty()) << result.notes.front();
  const fs::path model_dir = tmp.path() / "repo" / "tuned-mlp";
  EXPECT_EQ(fs::path(result.models[0].directory), model_dir);

  // The exact file that won, and its external data under the name the model references.
  EXPECT_EQ(read(model_dir / "1" / "model.onnx"), read(checkpoint.model_path("graph_0")));
  auto locations = onnx_external_data_locations((model_dir / "1" / "model.onnx").string());
  ASSERT_EQ(locations.size(), 1u);
  EXPECT_EQ(read(model_dir / "1" / locations[0]), read(test::fixture(locations[0])));

  const std::string text = read(model_dir / "config.pbtxt");
  EXPECT_TRUE(contains(text, "name: \"tuned-mlp\"")) << text;
  EXPECT_TRUE(contains(text, "platform: \"onnxruntime_onnx\"")) << text;
  EXPECT_TRUE(contains(text, "max_batch_size: 4\n")) << text;
  EXPECT_TRUE(contains(text, "name: \"x\"\n    data_type: TYPE_FP32\n    dims: [64]")) << text;
  EXPECT_TRUE(contains(text, "name: \"y\"\n    data_type: TYPE_FP32\n    dims: [16]")) << text;
  EXPECT_TRUE(contains(text, "dynamic_batching { }")) << text;
  EXPECT_TRUE(contains(text, "kind: KIND_CPU\n    count: 3")) << text;
  EXPECT_TRUE(contains(text, "graph { level: -1 }")) << text;
  EXPECT_TRUE(contains(text, "parameters { key: \"intra_op_thread_count\" value: { string_value: \"2\" } }")) << text;
  EXPECT_FALSE(contains(text, "execution_accelerators")) << text;  // the CPU provider has none
  EXPECT_TRUE(contains(read(model_dir / "README.md"), "Nothing: every setting")) << read(model_dir / "README.md");
  EXPECT_TRUE(hidden_entries(tmp.path() / "repo").empty());
}

TEST(TritonExport, TensorRtOptionsBecomeTheTensorRtAccelerator) {
  ScopedTempDir tmp;
  fs::create_directories(tmp.path() / "engines");
  test::write_file_bytes((tmp.path() / "engines" / "a.engine").string(), "ENGINE");
  OnnxSessionConfig config;
  config.provider = ExecutionProvider::kTensorRT;
  config.device_id = 1;
  config.provider_options = tensorrt_provider_options(spec_of(test::fixture("mlp.onnx")), "");
  config.provider_options["trt_fp16_enable"] = "1";
  config.provider_options["trt_engine_cache_enable"] = "1";
  config.provider_options["trt_engine_cache_path"] = (tmp.path() / "engines").string();
  config.provider_options["trt_max_workspace_size"] = "1073741824";
  config.provider_options["trt_made_up_option"] = "7";
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", config,
                                                           {{"trt_engine_cache", (tmp.path() / "engines").string()}}}});
  ASSERT_EQ(checkpoint.graph("g").path_options, std::vector<std::string>{"trt_engine_cache_path"});
  TritonExportOptions options;
  options.model_name = "mlp_trt";
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string(), options);
  const fs::path model_dir = tmp.path() / "repo" / "mlp_trt";
  const std::string text = read(model_dir / "config.pbtxt");
  EXPECT_TRUE(contains(text, "kind: KIND_GPU\n    count: 1")) << text;
  EXPECT_TRUE(contains(text, "name: \"tensorrt\"")) << text;
  EXPECT_TRUE(contains(text, "parameters { key: \"precision_mode\" value: \"FP16\" }")) << text;
  EXPECT_TRUE(contains(text, "parameters { key: \"max_workspace_size_bytes\" value: \"1073741824\" }")) << text;
  EXPECT_TRUE(contains(text, "parameters { key: \"trt_engine_cache_enable\" value: \"1\" }")) << text;
  EXPECT_TRUE(contains(text, "parameters { key: \"trt_profile_max_shapes\" value: \"x:4x64\" }")) << text;
  // The cache travels into the model's version directory and the option points there.
  const fs::path cache = model_dir / "1" / "trt_engine_cache";
  EXPECT_TRUE(contains(text, "parameters { key: \"trt_engine_cache_path\" value: \"" + cache.string() + "\" }"))
      << text;
  EXPECT_EQ(read(cache / "a.engine"), "ENGINE");
  EXPECT_FALSE(contains(text, "trt_fp16_enable")) << text;
  EXPECT_FALSE(contains(text, "trt_made_up_option")) << text;

  // What Triton cannot take is listed, in the result and the README.
  const std::string readme = read(model_dir / "README.md");
  const auto& notes = result.models.at(0).not_expressed;
  auto noted = [&](const std::string& word) {
    return std::any_of(notes.begin(), notes.end(), [&](const auto& n) { return contains(n, word); }) &&
           contains(readme, word);
  };
  EXPECT_TRUE(noted("trt_made_up_option=7")) << readme;
  EXPECT_TRUE(noted("device_id 1")) << readme;
  EXPECT_TRUE(noted("by absolute path")) << readme;
}

TEST(TritonExport, CudaOptionsAndCudaGraphs) {
  ScopedTempDir tmp;
  OnnxSessionConfig config;
  config.provider = ExecutionProvider::kCUDA;
  config.provider_options = {{"enable_cuda_graph", "1"},
                             {"cudnn_conv_algo_search", "HEURISTIC"},
                             {"use_tf32", "0"},
                             {"user_compute_stream", "1234"}};
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", config}});
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string());
  const std::string text = read(tmp.path() / "repo" / "tuned-mlp" / "config.pbtxt");
  EXPECT_TRUE(contains(text, "name: \"cuda\"")) << text;
  EXPECT_TRUE(contains(text, "parameters { key: \"use_tf32\" value: \"0\" }")) << text;
  // The backend resets cudnn_conv_algo_search when a model has parameters; as one it holds.
  EXPECT_TRUE(contains(text, "parameters { key: \"cudnn_conv_algo_search\" value: { string_value: \"1\" } }")) << text;
  EXPECT_FALSE(contains(text, "enable_cuda_graph")) << text;
  EXPECT_FALSE(contains(text, "graphs:")) << text;  // optimization.cuda.graphs is the TensorRT backend's
  EXPECT_FALSE(contains(text, "user_compute_stream")) << text;
  const std::string readme = read(tmp.path() / "repo" / "tuned-mlp" / "README.md");
  EXPECT_TRUE(contains(readme, "enable_cuda_graph=1: not expressible")) << readme;
  EXPECT_EQ(result.models.at(0).not_expressed.size(), 1u);  // the checkpoint dropped the stream

  // A configuration that still names the tuning process's stream: said, not written.
  CheckpointGraph graph = checkpoint.graph("g");
  graph.backend_config.provider_options["user_compute_stream"] = "1234";
  auto cfg = triton_model_config(graph, "m", std::nullopt, 1);
  EXPECT_FALSE(contains(cfg.text, "user_compute_stream")) << cfg.text;
  ASSERT_EQ(cfg.not_expressed.size(), 2u);
  EXPECT_TRUE(contains(cfg.not_expressed[1], "user_compute_stream=1234")) << cfg.not_expressed[1];
}

TEST(TritonExport, MaxBatchSizeChoices) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", cpu_config()}});
  const auto& graph = checkpoint.graph("g");

  auto off = triton_model_config(graph, "m", 0, 1);
  EXPECT_EQ(off.max_batch_size, 0);
  EXPECT_TRUE(contains(off.text, "dims: [-1, 64]")) << off.text;  // the batch axis stays, dynamic
  EXPECT_FALSE(contains(off.text, "dynamic_batching")) << off.text;
  EXPECT_EQ(off.not_expressed.size(), 1u);

  auto larger = triton_model_config(graph, "m", 16, 1);
  EXPECT_TRUE(contains(larger.text, "max_batch_size: 16\n")) << larger.text;
  ASSERT_EQ(larger.not_expressed.size(), 1u);
  EXPECT_TRUE(contains(larger.not_expressed[0], "1..4")) << larger.not_expressed[0];

  // A TensorRT engine built for batches up to 4 cannot serve 16.
  CheckpointGraph trt = graph;
  trt.backend_config.provider = ExecutionProvider::kTensorRT;
  trt.backend_config.provider_options = tensorrt_provider_options(graph.graph_spec, "");
  test::expect_error([&] { triton_model_config(trt, "m", 16, 1); }, ErrorCode::kInvalidArgument,
                     {"trt_profile_max_shapes"});
  EXPECT_EQ(triton_model_config(trt, "m", 4, 1).max_batch_size, 4);

  // A graph without a batch axis cannot be batched.
  CheckpointGraph fixed = graph;
  for (auto* list : {&fixed.graph_spec.inputs, &fixed.graph_spec.outputs})
    for (auto& t : *list) t.batch_axis.reset();
  EXPECT_EQ(triton_model_config(fixed, "m", std::nullopt, 1).max_batch_size, 0);
  test::expect_error([&] { triton_model_config(fixed, "m", 2, 1); }, ErrorCode::kInvalidArgument, {"x"});

  // Rows the tuner found coupled (a batch mean): Triton's batcher would join requests into
  // one batch and hand each part of the others' answers, so no batching, and none forced.
  CheckpointGraph coupled = graph;
  coupled.graph_spec.batch_rows = BatchRows::kCoupled;
  coupled.graph_spec.batch_rows_reason = "output 'y' of row 0 of a batch of 4 differs from that row alone";
  auto apart = triton_model_config(coupled, "m", std::nullopt, 1);
  EXPECT_EQ(apart.max_batch_size, 0);
  EXPECT_FALSE(contains(apart.text, "dynamic_batching")) << apart.text;
  test::expect_error([&] { triton_model_config(coupled, "m", 2, 1); }, ErrorCode::kInvalidArgument,
                     {"batch rows depend on each other", "differs from that row alone"});
  // Unchecked (a checkpoint written before the check): off unless asked for, and said.
  CheckpointGraph unchecked = graph;
  unchecked.graph_spec.batch_rows = BatchRows::kUnchecked;
  auto unsure = triton_model_config(unchecked, "m", std::nullopt, 1);
  EXPECT_EQ(unsure.max_batch_size, 0);
  ASSERT_EQ(unsure.not_expressed.size(), 1u);
  EXPECT_TRUE(contains(unsure.not_expressed[0], "did not check")) << unsure.not_expressed[0];
  EXPECT_EQ(triton_model_config(unchecked, "m", 4, 1).max_batch_size, 4);
  test::expect_error([&] { triton_model_config(graph, "m", -1, 1); }, ErrorCode::kInvalidArgument);
  test::expect_error([&] { triton_model_config(graph, "m", std::nullopt, 0); }, ErrorCode::kInvalidArgument,
                     {"instances"});
}

// A dynamic axis other than the batch is -1 in dims, where the graph was tuned over a range
// only: the README says so (it said "Nothing" for such a model, a session-26 probe).
TEST(TritonExport, BoundedDynamicAxesAreNamedAsNotExpressed) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", cpu_config()}});
  CheckpointGraph graph = checkpoint.graph("g");
  EXPECT_TRUE(triton_model_config(graph, "m", std::nullopt, 1).not_expressed.empty());
  graph.graph_spec.inputs[0].min_shape[1] = 8;
  graph.graph_spec.inputs[0].max_shape[1] = 64;
  auto config = triton_model_config(graph, "m", std::nullopt, 1);
  ASSERT_EQ(config.not_expressed.size(), 1u);
  EXPECT_TRUE(contains(config.not_expressed[0], "input 'x' axis 1 was tuned and checked over 8..64"))
      << config.not_expressed[0];
}

TEST(TritonExport, TwoInputsWithSeveralDtypes) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "multi_dtype.onnx", cpu_config()}});
  auto cfg = triton_model_config(checkpoint.graph("g"), "multi", std::nullopt, 1);
  EXPECT_TRUE(contains(cfg.text, "name: \"ids\"\n    data_type: TYPE_INT64\n    dims: [8]")) << cfg.text;
  EXPECT_TRUE(contains(cfg.text, "name: \"mask\"\n    data_type: TYPE_BOOL\n    dims: [8]")) << cfg.text;
  EXPECT_TRUE(contains(cfg.text, "name: \"mask_f\"\n    data_type: TYPE_FP32")) << cfg.text;
}

TEST(TritonExport, SeveralGraphsWithoutAChainGetNoEnsemble) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt",
                                    {{"first", "mlp.onnx", cpu_config()}, {"second", "add.onnx", cpu_config()}});
  TritonExportOptions options;
  options.model_name = "pair";
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string(), options);
  ASSERT_EQ(result.models.size(), 2u);
  EXPECT_EQ(result.models[0].name, "pair_first");
  EXPECT_EQ(result.models[1].name, "pair_second");
  EXPECT_TRUE(result.ensemble.empty());
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_TRUE(contains(result.notes[0], "pair_first, pair_second")) << result.notes[0];
  EXPECT_TRUE(contains(result.notes[0], "no ensemble")) << result.notes[0];
  EXPECT_FALSE(fs::exists(tmp.path() / "repo" / "pair"));
  EXPECT_TRUE(fs::exists(tmp.path() / "repo" / "pair_second" / "1" / "model.onnx"));
}

TEST(TritonExport, ConditionsTritonCannotCheckAreNamed) {
  // A graph exported under `x.shape[0] != 3`: Triton's config has no place for it, so the
  // export says so (and the checkpoint it was read from kept it).
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", cpu_config(), {},
                                                           {R"(["ne", ["dim", "x", 0], 3])"}}});
  ASSERT_EQ(checkpoint.graph("g").graph_spec.conditions.size(), 1u);
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string());
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_TRUE(contains(result.notes[0], "graph 'g' holds only where `x.shape[0] != 3`")) << result.notes[0];
  EXPECT_TRUE(contains(result.notes[0], "Triton does not check it")) << result.notes[0];
  // and in the model's README, which lists what config.pbtxt lacks (it named none of them)
  ASSERT_EQ(result.models.size(), 1u);
  const std::string readme = read(fs::path(result.models[0].directory) / "README.md");
  EXPECT_TRUE(contains(readme, "holds only where `x.shape[0] != 3`")) << readme;
  EXPECT_FALSE(contains(readme, "Nothing: every setting")) << readme;
}

TEST(TritonExport, EagerGraphsOfTheFrontEndAreNamed) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(
      tmp.path() / "ckpt", {{"g", "mlp.onnx", cpu_config()}},
      R"({"aitune.torch": {"eager_graphs": [{"key": "graph_eager", "note": "slower than eager"}]}})");
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string());
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_TRUE(contains(result.notes[0], "graph_eager")) << result.notes[0];
  EXPECT_TRUE(contains(result.notes[0], "slower than eager")) << result.notes[0];
}

TEST(TritonExport, GraphsOfSectionsThisEngineDoesNotRunAreNamedNotExported) {
  ScopedTempDir tmp;
  CheckpointManifest manifest;
  manifest.module_name = "tuned-mlp";
  CheckpointGraph onnx;
  onnx.key = "g";
  onnx.graph_spec = spec_of(test::fixture("mlp.onnx"));
  onnx.backend_config = cpu_config();
  CheckpointGraph compiled;
  compiled.key = "graph_compiled";
  compiled.backend = std::string(kTorchCompileBackendName);
  compiled.section_json = R"({"config": {"mode": "default"}})";
  manifest.graphs = {onnx, compiled};
  Checkpoint::save((tmp.path() / "ckpt").string(), manifest, {{"graphs/g/mlp.onnx", test::fixture("mlp.onnx")}});
  auto checkpoint = Checkpoint::load((tmp.path() / "ckpt").string());
  auto result = export_triton(checkpoint, (tmp.path() / "repo").string());
  ASSERT_EQ(result.models.size(), 1u);  // the ONNX Runtime graph alone, under the module's name
  EXPECT_EQ(result.models[0].name, "tuned-mlp");
  ASSERT_EQ(result.notes.size(), 1u);
  EXPECT_TRUE(contains(result.notes[0], "graph_compiled")) << result.notes[0];
  EXPECT_TRUE(contains(result.notes[0], "torch_compile")) << result.notes[0];

  manifest.graphs = {compiled};  // nothing this engine runs: nothing to export
  Checkpoint::save((tmp.path() / "only").string(), manifest, {});
  test::expect_error([&] { export_triton(Checkpoint::load((tmp.path() / "only").string()),
                                         (tmp.path() / "repo2").string()); },
                     ErrorCode::kBackendUnavailable, {"no ONNX Runtime graphs", "run only in the Python front end"});
}

TEST(TritonExport, BadInputWritesNothing) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", cpu_config()}});
  const fs::path repo = tmp.path() / "repo";
  auto with_name = [](std::string name) {
    TritonExportOptions o;
    o.model_name = std::move(name);
    return o;
  };
  for (const std::string& bad : std::vector<std::string>{"a/b", "..", ".hidden", "has space", std::string(256, 'a')})
    test::expect_error([&] { export_triton(checkpoint, repo.string(), with_name(bad)); }, ErrorCode::kInvalidArgument);
  TritonExportOptions zero;
  zero.instances = 0;
  test::expect_error([&] { export_triton(checkpoint, repo.string(), zero); }, ErrorCode::kInvalidArgument,
                     {"instances"});
  EXPECT_FALSE(fs::exists(repo));  // refused before anything was created
  // A repository inside the checkpoint (the checkpoint itself included) is refused: the
  // next save over the checkpoint would remove the models, which its manifest does not list.
  for (const fs::path& inside : {tmp.path() / "ckpt", tmp.path() / "ckpt" / "models", tmp.path() / "ckpt" / "x" / ".." / "m"})
    test::expect_error([&] { export_triton(checkpoint, inside.string()); }, ErrorCode::kInvalidArgument,
                       {"inside the checkpoint"});
  EXPECT_FALSE(fs::exists(tmp.path() / "ckpt" / "tuned-mlp"));
  EXPECT_FALSE(fs::exists(tmp.path() / "ckpt" / "models"));
  export_triton(checkpoint, (tmp.path() / "ckpt-models").string());  // a sibling sharing the name's prefix is fine
  EXPECT_TRUE(fs::exists(tmp.path() / "ckpt-models" / "tuned-mlp" / "config.pbtxt"));

  // An existing non-empty entry is kept unless overwrite is given.
  fs::create_directories(repo / "tuned-mlp");
  test::write_file_bytes((repo / "tuned-mlp" / "mine.txt").string(), "keep me");
  test::expect_error([&] { export_triton(checkpoint, repo.string()); }, ErrorCode::kInvalidArgument,
                     {"overwrite"});
  EXPECT_EQ(read(repo / "tuned-mlp" / "mine.txt"), "keep me");
  EXPECT_FALSE(fs::exists(repo / "tuned-mlp" / "config.pbtxt"));
  EXPECT_TRUE(hidden_entries(repo).empty());

  TritonExportOptions overwrite;
  overwrite.overwrite = true;
  export_triton(checkpoint, repo.string(), overwrite);
  EXPECT_FALSE(fs::exists(repo / "tuned-mlp" / "mine.txt"));
  EXPECT_TRUE(fs::exists(repo / "tuned-mlp" / "config.pbtxt"));
  EXPECT_TRUE(hidden_entries(repo).empty());

  // An empty directory is taken; a file in the entry's place, or as the repository, is not.
  fs::create_directories(repo / "empty");
  export_triton(checkpoint, repo.string(), with_name("empty"));
  EXPECT_TRUE(fs::exists(repo / "empty" / "config.pbtxt"));
  test::write_file_bytes((repo / "file").string(), "x");
  test::expect_error([&] { export_triton(checkpoint, repo.string(), with_name("file")); },
                     ErrorCode::kInvalidArgument);
  test::expect_error([&] { export_triton(checkpoint, (repo / "file").string()); }, ErrorCode::kInvalidArgument);

  // A module name that is no directory name needs an explicit model name.
  CheckpointManifest manifest = checkpoint.manifest();
  manifest.module_name = "my model";
  Checkpoint::save((tmp.path() / "ckpt2").string(), manifest,
                   {{"graphs/g/mlp.onnx", test::fixture("mlp.onnx")}});
  auto spaced = Checkpoint::load((tmp.path() / "ckpt2").string());
  auto message = test::expect_error([&] { export_triton(spaced, repo.string()); }, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(message, "pass a model name")) << message;
}

TEST(TritonExport, RepositoryIsUntouchedWhenAWriteFails) {
  ScopedTempDir tmp;
  auto checkpoint = make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp_ext.onnx", cpu_config()}});
  const fs::path repo = tmp.path() / "repo";
  fs::create_directories(repo / "tuned-mlp");
  test::write_file_bytes((repo / "tuned-mlp" / "config.pbtxt").string(), "old");
  // The external data vanishes after the checkpoint was verified: the copy fails midway.
  for (const auto& e : fs::directory_iterator(fs::path(checkpoint.model_path("g")).parent_path()))
    if (e.path().extension() == ".data") fs::remove(e.path());
  TritonExportOptions overwrite;
  overwrite.overwrite = true;
  test::expect_error([&] { export_triton(checkpoint, repo.string(), overwrite); }, ErrorCode::kIo);
  EXPECT_EQ(read(repo / "tuned-mlp" / "config.pbtxt"), "old");
  EXPECT_TRUE(hidden_entries(repo).empty());
}

#ifdef AITUNE_TEST_CLI
TEST(TritonExport, CommandLine) {
  ScopedTempDir tmp;
  make_checkpoint(tmp.path() / "ckpt", {{"g", "mlp.onnx", cpu_config()}});
  const std::string cli = std::string("'") + AITUNE_TEST_CLI + "' export-triton '" + (tmp.path() / "ckpt").string() +
                          "' '" + (tmp.path() / "repo").string() + "' ";
  auto ok = test::run_command(cli + "--model-name served --max-batch-size 2 --instances 2");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "model served: graph g, max_batch_size 2")) << ok.output;
  const std::string text = read(tmp.path() / "repo" / "served" / "config.pbtxt");
  EXPECT_TRUE(contains(text, "max_batch_size: 2\n")) << text;
  EXPECT_TRUE(contains(text, "count: 2")) << text;

  auto again = test::run_command(cli + "--model-name served");
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_TRUE(contains(again.output, "overwrite")) << again.output;
  EXPECT_EQ(test::run_command(cli + "--model-name served --overwrite").exit_code, 0);
  auto bad = test::run_command(cli + "--model-name 'a/b'");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
}
#endif

}  // namespace
}  // namespace aitune
