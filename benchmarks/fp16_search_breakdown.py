"""Where an ONNX Runtime tune's time goes for a Llama-shaped decoder (issue 24 point 3): export,
each model transform, one step of the fp32-node search (its conversion piece by piece),
session creation and the check, on the CPU provider.

    python benchmarks/fp16_search_breakdown.py [--hidden 1024] [--layers 4] [--seq 128] [--steps 3]

A transformers LlamaForCausalLM from a config (random weights, vocab 32000), recorded with
``ait.tune(dry_run=True)`` at batch 1, exported with the dynamo exporter. Prints seconds per
stage (wall clock; one run each; the search steps' mean over --steps) and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch import export, transforms


def timed(results: dict, name: str, fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    results[name] = round(time.perf_counter() - start, 3)
    print(f"{name:48s} {results[name]:8.3f} s", flush=True)
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=3, help="search steps timed (mean reported)")
    parser.add_argument("--out", type=Path, help="also write the results here (JSON)")
    parser.add_argument("--search-seconds", type=float, default=0,
                        help="also run the backend's whole fp32-node search with this bound (where the all-fp16 "
                             "model is rejected) and report how it ended")
    args = parser.parse_args()
    import transformers
    import onnxruntime
    from onnxruntime.transformers import float16

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      intermediate_size=args.hidden * 11 // 4, num_hidden_layers=args.layers,
                                      num_attention_heads=16, num_key_value_heads=4,
                                      max_position_embeddings=max(256, args.seq))
    results: dict[str, float | int | str] = {"model": f"llama hidden {args.hidden}, {args.layers} layers, vocab "
                                                      f"{args.vocab}, seq {args.seq}, batch 1"}
    model = ait.Module(transformers.LlamaForCausalLM(config).eval(), "llama_breakdown")

    def batches(size):
        ids = torch.randint(0, args.vocab, (size, args.seq), generator=torch.Generator().manual_seed(size))
        return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}]

    timed(results, "record (ait.tune dry_run)", ait.tune, model, batches, batch_sizes=[1], dry_run=True,
          disable_external_logging=True)
    (graph,) = model.ait_graphs
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        spec = graph.graph_spec()
        exported = timed(results, "export (dynamo)", export.export_onnx, graph, spec, directory / "model_raw.onnx",
                         use_dynamo=True)
        results["model_mb"] = round(sum(p.stat().st_size for p in directory.glob("model_raw.onnx*")) / 1e6, 1)
        context = transforms.TransformContext(directory, "llama")
        models = transforms.TransformedModels(exported, context)
        timed(results, "transform fp16 (all nodes)", models.get, transforms.FP16)
        timed(results, "transform fp16_mixed", models.get, transforms.FP16_MIXED)
        timed(results, "transform ort_fusions", models.get, transforms.ORT_FUSIONS)

        samples = [([t.contiguous() for t in s.inputs], [t.contiguous() for t in s.outputs], s.batch_size)
                   for s in graph.samples]
        tuner = _core.GraphTuner("llama_breakdown", spec, samples, _core.TunerOptions())
        core_config = _core.OnnxSessionConfig()
        core_config.provider = _core.parse_execution_provider("cpu")
        names, _ = export.onnx_io_names(exported)
        order = [graph.input_names.index(n) for n in names]
        candidate = _core.OnnxCandidate("cpu fp16 probe", core_config, _core.Precision.FP16)

        nodes = timed(results, "search: list the float nodes", transforms.float_compute_nodes, exported)
        results["float_nodes"] = len(nodes)
        kept = nodes[: len(nodes) // 2]  # a mid-search set
        probe = directory / "probe.onnx"

        # One step as the search made it before (main at 7f3fa13: transforms.fp16_keeping reloading
        # the export, the converter inferring shapes through a serialisation round trip,
        # ByteSize() then onnx.save), piece by piece, alternating with a step as it is made now
        # (transforms.Fp16Keeping: loaded and inferred once, a copy converted per step), so
        # both see the same load on a shared machine.
        pieces = {"load source": 0.0, "load source again (constants)": 0.0, "shape inference": 0.0,
                  "convert": 0.0, "clean up (duplicates, round trips)": 0.0, "save (ByteSize + onnx.save)": 0.0}
        before = after = 0.0
        keeping = timed(results, "search set-up now: load + infer once", transforms.Fp16Keeping, exported)
        for _ in range(args.steps):
            step_start = t = time.perf_counter()
            proto = onnx.load(str(exported))
            export.separate_consumed_outputs(proto)
            pieces["load source"] += time.perf_counter() - t
            t = time.perf_counter()
            constants = transforms.float_constant_nodes(onnx.load(str(exported), load_external_data=False))
            pieces["load source again (constants)"] += time.perf_counter() - t
            t = time.perf_counter()
            inferred = onnx.shape_inference.infer_shapes(proto)
            pieces["shape inference"] += time.perf_counter() - t
            t = time.perf_counter()
            converted = float16.convert_float_to_float16(inferred, keep_io_types=True,
                                                         op_block_list=list(float16.DEFAULT_OP_BLOCK_LIST),
                                                         node_block_list=[*kept, *constants],
                                                         disable_shape_infer=True)
            pieces["convert"] += time.perf_counter() - t
            t = time.perf_counter()
            export._drop_duplicate_nodes(converted)
            export._drop_fp16_round_trips(converted)
            pieces["clean up (duplicates, round trips)"] += time.perf_counter() - t
            t = time.perf_counter()
            large = converted.ByteSize() > 1_800_000_000
            onnx.save(converted, str(probe), save_as_external_data=large)
            pieces["save (ByteSize + onnx.save)"] += time.perf_counter() - t
            before += time.perf_counter() - step_start
            t = time.perf_counter()
            keeping.write(probe, kept)
            after += time.perf_counter() - t
        for piece, seconds in pieces.items():
            results[f"step before: {piece}"] = round(seconds / args.steps, 3)
            print(f"{'step before: ' + piece:48s} {seconds / args.steps:8.3f} s", flush=True)
        for name, seconds in (("step conversion before (main)", before), ("step conversion now", after)):
            results[name] = round(seconds / args.steps, 3)
            print(f"{name:48s} {seconds / args.steps:8.3f} s", flush=True)
        timed(results, "session creation (onnxruntime, CPU)", onnxruntime.InferenceSession, str(probe),
              providers=["CPUExecutionProvider"])
        timed(results, "check (engine: session + run + compare)", tuner.check_onnx, str(probe), candidate, order)
        if args.search_seconds > 0:
            import types

            from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

            fp16 = models.get(transforms.FP16)
            tuner.evaluate_onnx(str(fp16.path), _core.OnnxCandidate("cpu fp16 model", core_config,
                                                                    _core.Precision.FP16, fp16.transform),
                                "ONNXRuntimeBackend", 0)
            results["all-fp16 model"] = tuner.report.candidates[-1].status
            backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu",
                                                                  fp16_search_seconds=args.search_seconds))
            planned = types.SimpleNamespace(name="cpu fp16 searched model", config=core_config,
                                            precision=_core.Precision.FP16)
            # The search itself, run even where the all-fp16 model passed (random weights often
            # do): what its steps cost end to end, conversion and check together.
            outcome = timed(results, f"whole search (bound {args.search_seconds:g} s)", backend._run_fp16_search,
                            planned, models, tuner, order, directory)
            results["search outcome"] = (f"{len(outcome.kept)} of {len(nodes)} nodes kept; "
                                         f"{outcome.failure or outcome.note}")
            print(results["search outcome"])
    print(json.dumps(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
