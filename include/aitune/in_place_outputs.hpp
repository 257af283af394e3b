// Outputs of an ONNX graph that a session writes into the buffer of the input they update
// (a decode step's KV cache: present_key_3 into past_key_3), so that input is updated in
// place instead of copied into a new output on every call.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "aitune/onnx_nodes.hpp"
#include "aitune/onnx_session.hpp"

namespace aitune {

/// The outputs (by name) a session may write into an input's buffer (by name), found in
/// the graph: each such output is produced by a ScatterND (reduction "none") whose data
/// input is a graph input of the same dtype and rank that nothing else reads (Shape and
/// Size, which read only its shape, aside), and that is not itself a graph output.
///
/// Why that makes the write safe: ScatterND's output is its data input with some slots
/// replaced, and ONNX Runtime's ScatterND kernels skip the input->output copy when the
/// two are one buffer (onnxruntime/core/providers/cpu/tensor/scatter_nd.cc,
/// ScatterNDBase::PrepareForCompute: "If input/output Tensor* are the same, do not copy";
/// cuda/tensor/scatter_nd.cc, ScatterND::ComputeInternal: `if (input_data !=
/// output_data) cudaMemcpyAsync(...)`). With no other reader of the input, no node sees
/// it after the write. A rerun on the same (already updated) input gives the same
/// results: the replaced slots are written again with values that cannot depend on
/// their old contents, which is what lets the tuner run a candidate on one sample many
/// times. A reduction (add, mul, ...) would accumulate across reruns: not aliased.
///
/// Also a com.microsoft GroupQueryAttention's present_key / present_value (outputs 1, 2)
/// over its past_key / past_value (inputs 3, 4) under the same conditions: with the two
/// bound to one buffer, GQA shares them (its CPU and CUDA kernels test the pointers, and
/// then write only this step's keys and values at the slots after `seqlens_k`'s past),
/// which is what a decode step fused by decoder_fusions.CachedGroupQueryAttention needs;
/// a rerun writes the same slots with the same values.
std::map<std::string, std::string> find_in_place_outputs(const std::vector<OnnxNode>& nodes,
                                                         const std::vector<IoInfo>& inputs,
                                                         const std::vector<IoInfo>& outputs);

/// Per output, the index of the input whose buffer it is written into (-1: none), from
/// `aliases` (output name -> input name, as declared in OnnxSessionConfig::output_aliases
/// or found by find_in_place_outputs). Error(kInvalidArgument) naming the alias when an
/// output or input is unknown, their dtypes or ranks differ, a declared extent differs,
/// or two outputs name one input.
std::vector<int> output_alias_indices(const std::map<std::string, std::string>& aliases,
                                      const std::vector<IoInfo>& inputs, const std::vector<IoInfo>& outputs,
                                      const std::string& model_path);

}  // namespace aitune
