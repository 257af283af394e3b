// Umbrella header: the user-facing API of aitune (sessions, checkpoints, the candidate plan, tuning, reports).
// Helpers the engine and the front ends use internally (CUDA event timing, ONNX external
// data scanning, TensorRT option composition) have headers of their own, included by name.
#pragma once

#include "aitune/candidates.hpp"
#include "aitune/checkpoint.hpp"
#include "aitune/correctness.hpp"
#include "aitune/device.hpp"
#include "aitune/dtype.hpp"
#include "aitune/error.hpp"
#include "aitune/execution_provider.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/latency_stats.hpp"
#include "aitune/npy.hpp"
#include "aitune/onnx_session.hpp"
#include "aitune/ort_runtime.hpp"
#include "aitune/profiler.hpp"
#include "aitune/strategy.hpp"
#include "aitune/tensor.hpp"
#include "aitune/triton_export.hpp"
#include "aitune/tune_report.hpp"
#include "aitune/tuner.hpp"
#include "aitune/version.hpp"
