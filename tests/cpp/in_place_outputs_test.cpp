// find_in_place_outputs and output_alias_indices: which outputs are written into an input's
// buffer (a ScatterND of an input nothing else reads), declared aliases checked, the
// string attributes the wire reader gives them, and the CUDA-graph slot key of such inputs.
#include "aitune/in_place_outputs.hpp"

#include <fstream>
#include <gtest/gtest.h>

#include "onnx_wire.hpp"
#include "session/cuda_graph_runner.hpp"
#include "test_support.hpp"

namespace aitune {
namespace {

namespace w = test::onnx_wire;
using Aliases = std::map<std::string, std::string>;

IoInfo io(const std::string& name, DType dtype = DType::kFloat32, Shape shape = {-1, 2, 8, 4}) {
  return IoInfo{name, dtype, std::move(shape), {}};
}

OnnxNode node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs) {
  OnnxNode n;
  n.op_type = op;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

// A decode step's shape: two caches each written by a ScatterND, read elsewhere only by Shape.
struct DecodeGraph {
  std::vector<OnnxNode> nodes{node("Shape", {"past_0"}, {"s"}), node("ScatterND", {"past_0", "idx", "upd_0"}, {"present_0"}),
                              node("ScatterND", {"past_1", "idx", "upd_1"}, {"present_1"}),
                              node("MatMul", {"present_0", "present_1"}, {"logits"})};
  std::vector<IoInfo> inputs{io("pos", DType::kInt64, {1}), io("past_0"), io("past_1")};
  std::vector<IoInfo> outputs{io("logits"), io("present_0"), io("present_1")};
};

TEST(InPlaceOutputs, AScatterNdOfAnInputNothingElseReadsIsWrittenIntoIt) {
  DecodeGraph g;
  EXPECT_EQ(find_in_place_outputs(g.nodes, g.inputs, g.outputs),
            (Aliases{{"present_0", "past_0"}, {"present_1", "past_1"}}));
  EXPECT_EQ(output_alias_indices(find_in_place_outputs(g.nodes, g.inputs, g.outputs), g.inputs, g.outputs, "m"),
            (std::vector<int>{-1, 1, 2}));
}

TEST(InPlaceOutputs, AnythingElseIsNotAliased) {
  {  // the input read by another node (it would see the write)
    DecodeGraph g;
    g.nodes.push_back(node("Add", {"past_1", "past_1"}, {"extra"}));
    EXPECT_EQ(find_in_place_outputs(g.nodes, g.inputs, g.outputs), (Aliases{{"present_0", "past_0"}}));
  }
  {  // a reduction accumulates over reruns of one sample
    DecodeGraph g;
    g.nodes[1].string_attributes["reduction"] = "add";
    g.nodes[2].string_attributes["reduction"] = "none";
    EXPECT_EQ(find_in_place_outputs(g.nodes, g.inputs, g.outputs), (Aliases{{"present_1", "past_1"}}));
  }
  {  // the output is not the ScatterND itself (a Transpose after it), or its data is not an input
    DecodeGraph g;
    g.nodes[1].outputs = {"scattered"};
    g.nodes.push_back(node("Transpose", {"scattered"}, {"present_0"}));
    g.nodes[2].inputs[0] = "computed";
    EXPECT_EQ(find_in_place_outputs(g.nodes, g.inputs, g.outputs), Aliases{});
  }
  {  // another dtype or rank, or the input passed through as an output too
    DecodeGraph g;
    g.outputs[1].dtype = DType::kFloat16;
    g.outputs[2].shape = {2, 8, 4};
    EXPECT_EQ(find_in_place_outputs(g.nodes, g.inputs, g.outputs), Aliases{});
    DecodeGraph h;
    h.outputs.push_back(io("past_0"));
    EXPECT_EQ(find_in_place_outputs(h.nodes, h.inputs, h.outputs), (Aliases{{"present_1", "past_1"}}));
  }
}

TEST(InPlaceOutputs, AGroupQueryAttentionsPresentIsWrittenIntoItsPast) {
  // decoder_fusions.CachedGroupQueryAttention's node: present_key / present_value (outputs
  // 1, 2) over past_key / past_value (inputs 3, 4); the attention output (0) is no cache.
  auto gqa = node("GroupQueryAttention", {"q", "k", "v", "past_k", "past_v", "seqlens", "total"},
                  {"attn", "present_k", "present_v"});
  std::vector<IoInfo> inputs{io("q"), io("k"), io("v"), io("past_k"), io("past_v")};
  std::vector<IoInfo> outputs{io("attn"), io("present_k"), io("present_v")};
  EXPECT_EQ(find_in_place_outputs({gqa, node("Shape", {"past_k"}, {"s"})}, inputs, outputs),
            (Aliases{{"present_k", "past_k"}, {"present_v", "past_v"}}));
  // the past read by another node, or by the node as something else too: not aliased
  EXPECT_EQ(find_in_place_outputs({gqa, node("Relu", {"past_v"}, {"r"})}, inputs, outputs),
            (Aliases{{"present_k", "past_k"}}));
  auto twice = gqa;
  twice.inputs[1] = "past_k";
  EXPECT_EQ(find_in_place_outputs({twice}, inputs, outputs), (Aliases{{"present_v", "past_v"}}));
  // without a past (a prompt-only GQA): nothing to write into
  auto prompt = gqa;
  prompt.inputs[3] = prompt.inputs[4] = "";
  EXPECT_EQ(find_in_place_outputs({prompt}, inputs, outputs), Aliases{});
}

TEST(InPlaceOutputs, DeclaredAliasesAreChecked) {
  DecodeGraph g;
  auto fails = [&](const Aliases& aliases, std::initializer_list<std::string> words) {
    test::expect_error([&] { output_alias_indices(aliases, g.inputs, g.outputs, "m.onnx"); },
                       ErrorCode::kInvalidArgument, words);
  };
  fails({{"nosuch", "past_0"}}, {"m.onnx", "no output 'nosuch'"});
  fails({{"present_0", "nosuch"}}, {"no input 'nosuch'"});
  fails({{"present_0", "pos"}}, {"'present_0' -> 'pos'", "int64"});
  fails({{"present_0", "past_0"}, {"present_1", "past_0"}}, {"another output is written into 'past_0'"});
  g.inputs[1].shape = {1, 2, 16, 4};
  g.outputs[1].shape = {1, 2, 8, 4};
  fails({{"present_0", "past_0"}}, {"[1, 2, 16, 4]"});
}

TEST(InPlaceOutputs, TheWireReaderGivesStringAttributes) {
  test::ScopedTempDir dir;
  // NodeProto {input = 1, output = 2, op_type = 4, attribute = 5 {name = 1, s = 4}}
  const std::string scatter = w::bytes_field(1, "past") + w::bytes_field(1, "idx") + w::bytes_field(1, "upd") +
                              w::bytes_field(2, "present") + w::bytes_field(4, "ScatterND") +
                              w::bytes_field(5, w::bytes_field(1, "reduction") + w::bytes_field(4, "mul")) +
                              w::bytes_field(5, w::bytes_field(1, "axis") + w::varint_field(3, 2));
  const std::string path = dir.file("model.onnx");
  std::ofstream(path, std::ios::binary) << w::model(w::graph({}, {scatter}));
  const auto nodes = onnx_graph_nodes(path);
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].string_attributes, (Aliases{{"reduction", "mul"}})) << "only string attributes are kept";
}

// cache_write.onnx (tests/fixtures/make_models.py): present = ScatterND(past, indices, new),
// total = ReduceSum(present); past [1, 2, 4, 3], one slot written per (batch, head).
struct CacheWrite {
  Tensor past = Tensor::empty_host(DType::kFloat32, {1, 2, 4, 3});
  Tensor indices = Tensor::empty_host(DType::kInt64, {1, 2, 1, 3});
  Tensor fresh = Tensor::empty_host(DType::kFloat32, {1, 2, 1, 3});
  float offset;  // past holds offset + i at element i
  explicit CacheWrite(float offset_ = 0) : offset(offset_) {
    auto* p = static_cast<float*>(past.data());
    for (int i = 0; i < 24; ++i) p[i] = offset + static_cast<float>(i);
    auto* idx = static_cast<int64_t*>(indices.data());
    for (int h = 0; h < 2; ++h) idx[h * 3] = 0, idx[h * 3 + 1] = h, idx[h * 3 + 2] = 2;  // slot 2
    for (int i = 0; i < 6; ++i) static_cast<float*>(fresh.data())[i] = -1.0f - static_cast<float>(i);
  }
  std::vector<TensorView> views() const { return {past.view(), indices.view(), fresh.view()}; }
  // past as it must be after the write: slot 2 of each head replaced by `fresh`.
  std::vector<float> expected() const {
    std::vector<float> out(24);
    for (int i = 0; i < 24; ++i) out[static_cast<std::size_t>(i)] = offset + static_cast<float>(i);
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < 3; ++d) out[static_cast<std::size_t>(h * 12 + 2 * 3 + d)] = -1.0f - static_cast<float>(h * 3 + d);
    return out;
  }
  std::vector<float> past_values() const {
    const auto* p = static_cast<const float*>(past.data());
    return {p, p + 24};
  }
};

TEST(InPlaceOutputs, ACpuSessionWritesTheOutputIntoTheInputsBuffer) {
  OnnxSessionConfig config = test::cpu_config();
  config.in_place_outputs = true;
  auto session = OnnxSession::create(test::fixture("cache_write.onnx"), config);
  EXPECT_EQ(session->output_aliases(), (std::vector<int>{0, -1}));
  CacheWrite c;
  for (int run = 0; run < 2; ++run) {  // a rerun on the updated input gives the same results
    auto outputs = session->infer(c.views());
    EXPECT_EQ(outputs[0].data(), c.past.data()) << "present is past's buffer";
    EXPECT_EQ(c.past_values(), c.expected());
    float sum = 0;
    for (float v : c.expected()) sum += v;
    EXPECT_FLOAT_EQ(*static_cast<const float*>(outputs[1].data()), sum);
  }
  // Without the option: a new output, the input left alone.
  auto plain = OnnxSession::create(test::fixture("cache_write.onnx"), test::cpu_config());
  EXPECT_EQ(plain->output_aliases(), (std::vector<int>{-1, -1}));
  CacheWrite d;
  const auto before = d.past_values();
  auto outputs = plain->infer(d.views());
  EXPECT_NE(outputs[0].data(), d.past.data());
  EXPECT_EQ(d.past_values(), before);
  const auto* present = static_cast<const float*>(outputs[0].data());
  EXPECT_EQ(std::vector<float>(present, present + 24), d.expected());
}

TEST(InPlaceOutputs, AnInputUpdatedInPlaceMayNotOverlapAnother) {
  OnnxSessionConfig config = test::cpu_config();
  config.in_place_outputs = true;
  auto session = OnnxSession::create(test::fixture("cache_write.onnx"), config);
  CacheWrite c;
  // One buffer holding past (floats 0..23) and a `new` that overlaps its end (20..25).
  Tensor room = Tensor::empty_host(DType::kFloat32, {32});
  TensorView past = c.past.view(), overlapping = c.fresh.view();
  past.data = room.data();
  overlapping.data = static_cast<float*>(room.data()) + 20;
  test::expect_error([&] { session->infer({past, c.indices.view(), overlapping}); }, ErrorCode::kInvalidArgument,
                     {"input 'past' is updated in place", "shares memory with input 'new'"});
}

// The device paths (IOBinding; CUDA graphs, whose lanes bind the caller's cache instead of
// copying it in and out): skipped without a GPU; written for the GPU run.
TEST(InPlaceOutputs, CudaSessionsWriteTheOutputIntoTheCallersBuffer) {
  AITUNE_REQUIRE_CUDA();
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "enable_cuda_graph=1" : "IOBinding");
    OnnxSessionConfig config = test::cuda_config();
    config.in_place_outputs = true;
    if (graphs) config.provider_options["enable_cuda_graph"] = "1";
    auto session = OnnxSession::create(test::fixture("cache_write.onnx"), config);
    CacheWrite c, d(100);
    const Tensor past = session->to_device(c.past), other = session->to_device(d.past);
    const Tensor indices = session->to_device(c.indices), fresh = session->to_device(c.fresh);
    auto on_host = [&](const Tensor& t) {
      const Tensor host = session->to_host(t);
      const auto* p = static_cast<const float*>(host.data());
      return std::vector<float>(p, p + 24);
    };
    for (int step = 0; step < 4; ++step) {  // one cache passed again and again: one captured graph replayed
      auto outputs = session->infer({past.view(), indices.view(), fresh.view()});
      EXPECT_EQ(outputs[0].data(), past.data()) << "step " << step;
      EXPECT_EQ(on_host(past), c.expected()) << "step " << step;
    }
    // Another cache (another address: a slot of its own) is written, the first left as it was.
    auto outputs = session->infer({other.view(), indices.view(), fresh.view()});
    EXPECT_EQ(outputs[0].data(), other.data());
    EXPECT_EQ(on_host(other), d.expected());
    EXPECT_EQ(on_host(past), c.expected());
  }
}

TEST(InPlaceOutputs, ACudaGraphSlotIsKeyedByTheAddressOfAnInputUpdatedInPlace) {
  float cache_a[4] = {}, cache_b[4] = {}, ids[1] = {};
  const Shape shape{4};
  auto view = [&](float* data) { return TensorView{data, DType::kFloat32, shape, {}, Device::cpu()}; };
  using Runner = detail::CudaGraphRunner;
  const std::vector<bool> in_place{false, true};
  const auto a = Runner::slot_key({view(ids), view(cache_a)}, in_place);
  EXPECT_EQ(a, Runner::slot_key({view(ids + 0), view(cache_a)}, in_place)) << "the same cache: one slot";
  EXPECT_NE(a, Runner::slot_key({view(ids), view(cache_b)}, in_place)) << "another cache: a slot of its own";
  EXPECT_EQ(Runner::slot_key({view(cache_a), view(ids)}, {false, false}),
            Runner::slot_key({view(cache_b), view(ids)}, {false, false}))
      << "inputs copied into the graph's buffers: only their shapes count";
}

}  // namespace
}  // namespace aitune
