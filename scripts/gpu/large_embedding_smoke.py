"""GPU smoke check of a tune of a model whose embedding exceeds 2**24 elements (session 27:
the weights digest's float32 linspace indexed past such a tensor, a device-side assert that
failed the tune and poisoned the CUDA context). A 1-layer GPT-2 with a 32000 x 1024
embedding, tuned on the CUDA provider and compared with eager; prints one line."""
import time

import torch
import transformers

import aitune.torch as ait
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=32000, n_embd=1024, n_layer=1, n_head=16)
model = transformers.GPT2LMHeadModel(config).cuda().eval()
assert model.transformer.wte.weight.numel() > 2**24
module = ait.Module(model, "large-embedding", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(
    ONNXRuntimeBackendConfig(execution_provider="cuda", tune_provider_options=False))))
ids = torch.randint(0, 32000, (2, 32), device="cuda")
start = time.perf_counter()
ait.tune(module, lambda size: [{"input_ids": ids}], batch_sizes=[1], ignore_failing_modules=False,
         performance_validation=False, progress=False)
with torch.no_grad():
    got = module(input_ids=ids).logits
    want = model(input_ids=ids).logits
print(f"large-embedding smoke: tuned in {time.perf_counter() - start:.1f} s, {module.ait_backends}, "
      f"max abs error {(got - want).abs().max().item():.3g}, cuda ok: {torch.cuda.is_available()}")
