"""ONNX Runtime GenAI's model builder graph of a transformers causal LM, run by aitune's
engine: the reference row of benchmarks/decoder.py (issue 30). The builder
(``onnxruntime_genai.models.builder``, onnxruntime-genai 0.18) writes the graph ONNX
Runtime's own generation library runs: one packed QKV MatMul per layer,
SkipSimplifiedLayerNormalization, GroupQueryAttention with rotary inside, the KV cache as
``past_key_values.N.key`` / ``.value`` inputs and ``present.N.*`` outputs. It builds
offline from a saved model directory and a tokenizer file; the model here has random
weights, so the tokenizer is a word-level one over its vocabulary (the graph does not
depend on it). decoder.py reports the row's largest difference from eager: the 0.18 builder
computes another model where ``intermediate_size == vocab_size`` (seen on a tiny Llama: its
logits differ by ~0.3), so a row is only a reference where that difference is small.

The builder runs in a subprocess (``site``: a directory put first on its PYTHONPATH, for a
host where onnxruntime-genai and the onnxruntime Python package it imports are unpacked
rather than installed); the graph then runs in this process through ``OnnxSession``, the
session aitune's own candidates run in, each ``present.N.*`` output written into its
``past_key_values.N.*`` input, as GenAI's runtime runs it (``past_present_share_buffer``;
bound here by ``OnnxSessionConfig.output_aliases``): prefill over zero caches as long as
the prompt, a decode step over the decode case's caches, its attention mask as long as
the tokens seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from aitune import _core


def version(site: Path | None = None) -> str:
    """onnxruntime-genai's version as installed (or unpacked in ``site``), without importing
    it (its native library loads ONNX Runtime)."""
    from importlib import metadata

    found = next(iter(metadata.distributions(name="onnxruntime-genai",
                                             path=[str(site)] * (site is not None) + sys.path)), None)
    return found.version if found is not None else "unknown"


class GenAIUnavailable(RuntimeError):
    """The model builder cannot run here (not installed, or it failed): the row is left out,
    with this as the reason."""


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer over ``vocab_size`` tokens ``t0`` .. (pad / unk ``t0``, bos
    ``t1``, eos ``t2``), saved as transformers saves a fast tokenizer: the builder copies it
    beside the graph."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", pad_token="t0", bos_token="t1",
                            eos_token="t2").save_pretrained(directory)


def build(model: torch.nn.Module, directory: Path, *, precision: str, provider: str, site: Path | None = None,
          timeout_s: float = 1200) -> tuple[Path, float]:
    """The builder's graph of ``model`` (a transformers causal LM) at ``precision`` ("fp16",
    "fp32") for ``provider`` ("cuda", "cpu"), written under ``directory``: (model.onnx's
    path, seconds the build took). Raises GenAIUnavailable naming why it could not."""
    source, out, cache = directory / "hf", directory / "genai", directory / "cache"
    model.save_pretrained(source)
    write_tokenizer(source, model.config.vocab_size)
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(out),
               "-p", precision, "-e", provider, "-c", str(cache)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise GenAIUnavailable(f"the model builder ran past {timeout_s:g} s") from None
    seconds = time.perf_counter() - start
    path = out / "model.onnx"
    if done.returncode != 0 or not path.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise GenAIUnavailable(f"the model builder failed (exit {done.returncode}): {' | '.join(tail)}")
    return path, seconds


class GenAIGraph:
    """The builder's graph in an ``OnnxSession`` on ``provider``, each ``present.N.*``
    output written into its ``past_key_values.N.*`` input."""

    def __init__(self, path: Path, *, provider: str):
        config = _core.OnnxSessionConfig(provider=_core.ExecutionProvider.CUDA if provider == "cuda"
                                         else _core.ExecutionProvider.CPU)
        decoder = json.loads((path.parent / "genai_config.json").read_text())["model"]["decoder"]
        self.layers = int(decoder["num_hidden_layers"])
        self.kv_heads, self.head_dim = int(decoder["num_key_value_heads"]), int(decoder["head_size"])
        config.output_aliases = {f"present.{i}.{kind}": f"past_key_values.{i}.{kind}"
                                 for i in range(self.layers) for kind in ("key", "value")}
        self.session = _core.OnnxSession.create(str(path), config)
        self.names = [i.name for i in self.session.inputs]
        io = {i.name: i for i in self.session.inputs}
        self.cache_dtype = getattr(torch, io["past_key_values.0.key"].dtype)

    def feeds(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keys, values) -> list[torch.Tensor]:
        named = {"input_ids": input_ids.contiguous(), "attention_mask": attention_mask.contiguous()}
        for i in range(self.layers):
            named[f"past_key_values.{i}.key"], named[f"past_key_values.{i}.value"] = keys[i], values[i]
        missing = [n for n in self.names if n not in named]
        if missing:
            raise GenAIUnavailable(f"the builder's graph has inputs this row does not feed: {missing}")
        return [named[n] for n in self.names]

    def prefill_feeds(self, inputs: dict) -> list[torch.Tensor]:
        """decoder.py's prefill case: the prompt's mask, and zero caches as long as the
        prompt as the past (GenAI's runtime passes its zero max-length buffers so; an
        empty past is refused by the engine), which the prompt's keys and values fill."""
        ids = inputs["input_ids"]

        def zeros():
            return [torch.zeros(ids.shape[0], self.kv_heads, ids.shape[1], self.head_dim, dtype=self.cache_dtype,
                                device=ids.device) for _ in range(self.layers)]

        return self.feeds(ids, inputs["attention_mask"], zeros(), zeros())

    def decode_feeds(self, inputs: dict) -> list[torch.Tensor]:
        """decoder.py's decode case (DecodeStep's inputs): its caches as the past, a mask
        over the slots seen once this token is written (GroupQueryAttention counts the
        written slots from it: the new token goes at the first slot past them)."""
        seen = int(inputs["cache_position"][0]) + 1
        mask = inputs["attention_mask"][:, :seen]
        if not bool(mask.all()):
            raise GenAIUnavailable("the decode case's mask has gaps; the builder's graph counts slots from it")
        return self.feeds(inputs["input_ids"], mask, inputs["key_cache"], inputs["value_cache"])

    def run(self, feeds: list[torch.Tensor]) -> torch.Tensor:
        """The logits of one call."""
        return self.session.infer(feeds)[0]
