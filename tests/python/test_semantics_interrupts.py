"""Issue 27 item 5: an interrupt during an export or a candidate leaves the process able
to tune again and the module as it was."""

from __future__ import annotations

import sys

import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState, candidate_isolation


class InterruptedOnce(MLP):
    """Raises KeyboardInterrupt the first time it is exported (as Ctrl-C would, mid-export)."""

    interrupted = False

    def forward(self, x):
        exporting = torch.compiler.is_compiling() or torch.jit.is_tracing()
        if exporting and not InterruptedOnce.interrupted:
            InterruptedOnce.interrupted = True
            raise KeyboardInterrupt
        return super().forward(x)


def _samples():
    return [torch.randn(16) for _ in range(2)]


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_interrupt_during_export_then_tune_again(use_dynamo):
    InterruptedOnce.interrupted = False
    inner = InterruptedOnce().eval()
    model = ait.Module(inner, "interrupted", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    with pytest.raises(KeyboardInterrupt):
        ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
    assert InterruptedOnce.interrupted
    assert model.ait_state is not ModuleState.TUNED  # as it was: recorded, running eagerly
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), MLP.forward(inner, x))
    ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    torch.testing.assert_close(model(x), MLP.forward(inner, x), atol=1e-4, rtol=1e-4)


def test_interrupt_during_a_candidate_keeps_the_tuned_graphs(monkeypatch):
    inner = MLP().eval()
    model = ait.Module(inner, "retuned", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, _samples(), ignore_failing_modules=False)
    tuned_backends = model.ait_backends

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(candidate_isolation, "evaluate", interrupt)
        with pytest.raises(KeyboardInterrupt):
            ait.tune(model, _samples(), ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED and model.ait_backends == tuned_backends
    x = torch.randn(2, 16)
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")
    torch.testing.assert_close(model(x), MLP.forward(inner, x), atol=1e-4, rtol=1e-4)
    del model.ait_module.forward
    ait.tune(model, _samples(), ignore_failing_modules=False)  # and tuning again works
    assert model.ait_state is ModuleState.TUNED


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_interrupt_inside_an_exporter_import_then_tune_again(use_dynamo, tmp_path, monkeypatch):
    """Ctrl-C while the exporter imports a package on first use (sympy, onnxscript) leaves
    it half-initialised in sys.modules: its finished submodules stay, the package itself
    is gone, and the next import of it fails (``module 'sympy' has no attribute 'core'``)."""
    package = tmp_path / "halfpkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .done import ONE\nfrom .cut import CUT\n")  # as sympy's does
    (package / "done.py").write_text("ONE = 1.0\n")
    flag = tmp_path / "interrupted"
    (package / "cut.py").write_text(
        f"import pathlib\nflag = pathlib.Path({str(flag)!r})\n"
        "if not flag.exists():\n    flag.touch()\n    raise KeyboardInterrupt\nCUT = 2.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    real_export = torch.onnx.export

    def export_importing_lazily(*args, **kwargs):
        import halfpkg  # as the exporter imports its dependencies on first use

        assert halfpkg.done.ONE == 1.0
        return real_export(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export_importing_lazily)
    model = ait.Module(MLP().eval(), "lazy", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    with pytest.raises(KeyboardInterrupt):
        ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
    assert flag.exists()
    ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    for name in [n for n in sys.modules if n.startswith("halfpkg")]:
        del sys.modules[name]


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_interrupt_keeps_modules_the_export_imported_in_full(use_dynamo, tmp_path, monkeypatch):
    """A module the export imported in full before the interrupt stays imported: importing
    it again would run it twice, which torch's own refuse (a TORCH_LIBRARY namespace
    registers once: 'Only a single TORCH_LIBRARY can be used to register the namespace
    c10d_functional' after a Ctrl-C during the first dynamo export). Stood in for by a
    module that refuses a second run."""
    package = tmp_path / "oncepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "registry.py").write_text(
        "import builtins\nif getattr(builtins, '_oncepkg_ran', False):\n"
        "    raise RuntimeError('oncepkg.registry ran twice')\nbuiltins._oncepkg_ran = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    real_export = torch.onnx.export
    interrupted = []

    def export_importing_then_interrupted(*args, **kwargs):
        import oncepkg.registry  # noqa: F401  imported in full on the export's first use

        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return real_export(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", export_importing_then_interrupted)
    model = ait.Module(MLP().eval(), "once", strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    try:
        with pytest.raises(KeyboardInterrupt):
            ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
        assert "oncepkg.registry" in sys.modules
        ait.tune(model, _samples(), ignore_failing_modules=False, disable_external_logging=True)
        assert model.ait_state is ModuleState.TUNED
    finally:
        import builtins

        builtins.__dict__.pop("_oncepkg_ran", None)
        for name in [n for n in sys.modules if n.startswith("oncepkg")]:
            del sys.modules[name]
