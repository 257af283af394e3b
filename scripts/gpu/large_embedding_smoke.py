"""GPU smoke check of a tune of a model whose embedding exceeds 2**24 elements (session 27:
the weights digest's float32 linspace indexed past such a tensor, a device-side assert that
failed the tune and poisoned the CUDA context). A 1-layer GPT-2 with a 32000 x 1024
embedding, tuned on the CUDA provider and compared with eager; prints one line.
``--device cpu`` runs the same tune on the CPU provider (a check of the script itself)."""
import sys
import time

import torch
import transformers

import aitune.torch as ait
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig

device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
torch.manual_seed(0)
# use_cache=False: the logits alone (a DynamicCache is no graph output; session 32's lease
# lost the line to that refusal)
config = transformers.GPT2Config(vocab_size=32000, n_embd=1024, n_layer=1, n_head=16, use_cache=False,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config).to(device).eval()
assert model.transformer.wte.weight.numel() > 2**24
module = ait.Module(model, "large-embedding", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend(
    ONNXRuntimeBackendConfig(execution_provider=device, tune_provider_options=False))))
ids = torch.randint(0, 32000, (2, 32), device=device)
start = time.perf_counter()
ait.tune(module, lambda size: [{"input_ids": ids}], batch_sizes=[1], ignore_failing_modules=False,
         performance_validation=False, progress=False)
with torch.no_grad():
    got = module(input_ids=ids).logits
    want = model(input_ids=ids).logits
print(f"large-embedding smoke: tuned in {time.perf_counter() - start:.1f} s, {module.ait_backends}, "
      f"max abs error {(got - want).abs().max().item():.3g}, cuda ok: {torch.cuda.is_available() and device == 'cuda'}")
