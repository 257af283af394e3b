// Umbrella header: everything a C++ user of aitune needs.
#pragma once

#include "aitune/device.hpp"
#include "aitune/dtype.hpp"
#include "aitune/error.hpp"
#include "aitune/execution_provider.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/latency_stats.hpp"
#include "aitune/npy.hpp"
#include "aitune/onnx_runtime_backend.hpp"
#include "aitune/ort_runtime.hpp"
#include "aitune/tensor.hpp"
#include "aitune/version.hpp"
