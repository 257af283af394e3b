"""ait.Module as a proxy: transparency, states, recording, names and graph identity."""

from __future__ import annotations

import pytest
import torch
from torch_models import MLP, DictModel, MaskedModel, cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState


def test_attributes_parameters_and_state_dict_pass_through():
    inner = MLP()
    inner.label = "mlp"
    model = ait.Module(inner, "mlp", strategy=cpu_strategy())
    assert model.fc1 is inner.fc1
    assert model.label == "mlp"
    model.label = "changed"  # lands on the wrapped module
    assert inner.label == "changed"
    assert list(model.state_dict()) == list(inner.state_dict())  # no prefix
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in inner.named_parameters()]
    state = {k: torch.zeros_like(v) for k, v in inner.state_dict().items()}
    model.load_state_dict(state)
    assert torch.count_nonzero(inner.fc1.weight) == 0
    assert model.ait_module is inner and model.ait_name == "mlp"


def test_a_parent_module_sees_the_wrapped_parameters_unprefixed():
    parent = torch.nn.Sequential(MLP())
    names = list(parent.state_dict())
    parent[0] = ait.Module(parent[0], "inner", strategy=cpu_strategy())
    assert list(parent.state_dict()) == names
    parent.load_state_dict(parent.state_dict())


def test_train_eval_and_to_act_on_the_wrapped_module():
    inner = MLP()
    model = ait.Module(inner, strategy=cpu_strategy())
    assert model.eval() is model
    assert not inner.training and not inner.fc1.training and not model.training
    model.train()
    assert inner.training and inner.fc1.training
    assert model.to(torch.float64) is model
    assert inner.fc1.weight.dtype == torch.float64
    assert model.ait_device() == torch.device("cpu")


def test_default_name_is_the_class_name_and_double_wrapping_is_refused():
    model = ait.Module(MLP(), strategy=cpu_strategy())
    assert model.ait_name == "MLP"
    assert model.ait_state is ModuleState.INIT
    with pytest.raises(TypeError, match="already wrapped"):
        ait.Module(model)
    with pytest.raises(TypeError, match="nn.Module"):
        ait.Module(lambda x: x)


def test_forward_hooks_on_the_proxy_run_on_every_call():
    model = ait.Module(MLP().eval(), strategy=cpu_strategy())
    seen = []
    model.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    model(torch.randn(3, 16))
    assert seen == [torch.Size([3, 8])]


def test_calls_outside_tune_run_eagerly_and_record_a_bounded_number_until_tuned(monkeypatch):
    # AITune's record-by-calling (for module.tune()), capped so an untuned module never
    # keeps copies of every input; ait.tune's own recording ends recording by calling.
    from aitune.torch import module as module_file

    monkeypatch.setattr(module_file, "MAX_CALLS_RECORDED_BY_CALLING", 3)
    inner = MLP().eval()
    model = ait.Module(inner, strategy=cpu_strategy())
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), inner(x))
    assert model.ait_state is ModuleState.RECORDING and len(model.ait_graphs) == 1
    for _ in range(5):
        model(x)
    assert len(model.ait_graphs[0].samples) == 3
    ait.tune(model, [torch.randn(16)], dry_run=True)
    assert [len(g.samples) for g in model.ait_graphs] == [2]  # batch sizes 1 and 2
    model(x)
    assert [len(g.samples) for g in model.ait_graphs] == [2]  # calls outside ait.tune no longer recorded


def test_positional_and_keyword_forms_are_one_graph_and_names_follow_the_signature():
    model = ait.Module(MaskedModel().eval(), strategy=cpu_strategy())
    data = [(torch.randn(8),), ((), {"x": torch.randn(8)}), ((torch.randn(8),), {"mask": torch.ones(8)})]
    ait.tune(model, data, dry_run=True)
    assert model.ait_state is ModuleState.RECORDING
    graphs = model.ait_graphs
    assert [g.input_names for g in graphs] == [["input_x"], ["input_x", "input_mask"]]
    assert all(g.output_names == ["output_0"] for g in graphs)
    assert [len(g.samples) for g in graphs] == [4, 2]  # m(x) and m(x=x) at batch sizes 1 and 2


def test_nested_inputs_and_outputs_are_named_by_their_path():
    model = ait.Module(DictModel().eval(), strategy=cpu_strategy())
    sample = {"inputs": {"image": torch.randn(12), "meta": torch.randn(4)}}
    ait.tune(model, [sample], dry_run=True)
    (graph,) = model.ait_graphs
    assert graph.input_names == ["input_inputs_image", "input_inputs_meta"]
    assert graph.output_names == ["output_0", "output_1_embedding", "output_1_pooled"]


def test_dtype_rank_and_non_tensor_values_make_distinct_graphs():
    class Scaled(torch.nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    model = ait.Module(Scaled(), strategy=cpu_strategy())
    data = [
        (torch.randn(4),),
        (torch.randn(4, 4),),
        (torch.randn(4).double(),),
        ((torch.randn(4),), {"scale": 2.0}),
    ]
    ait.tune(model, data, dry_run=True)
    assert len(model.ait_graphs) == 4
    assert len({g.key for g in model.ait_graphs}) == 4


def test_tune_without_wrapped_modules_is_an_error():
    with pytest.raises(ValueError, match="no ait.Module"):
        ait.tune(MLP(), torch.randn(16))


def test_a_tuned_module_refuses_deepcopy_and_pickling_saying_what_to_do_instead(tmp_path):
    """copy.deepcopy of a tuned module (or of a model holding one) and torch.save of the
    model failed inside pickling ("cannot pickle 'OnnxSession' object", "Can't pickle local
    object ..."): now a TypeError names the module and ait.save / ait.load. An untuned one
    still copies."""
    import copy

    untuned = ait.Module(MLP().eval(), "copied", strategy=cpu_strategy(tune_provider_options=False))
    copy.deepcopy(untuned)
    model = ait.Module(MLP().eval(), "copied", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(16) for _ in range(2)], ignore_failing_modules=False, progress=False)
    parent = torch.nn.Sequential(model)
    for attempt in (lambda: copy.deepcopy(model), lambda: copy.deepcopy(parent),
                    lambda: torch.save(parent, tmp_path / "model.pt")):
        with pytest.raises(TypeError, match="ait.Module 'copied' is tuned.*ait.save"):
            attempt()


class Flagged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, use_cache=None, scale=1.0):
        return self.fc(x) * scale if use_cache is None else self.fc(x) * -scale


def test_an_unrecorded_call_names_the_non_tensor_values_that_differ():
    """GraphNotRecordedError listed the recorded graph's non-tensor values without names
    ("[False, 2.0]") and left out a call's None: the user could not see which argument
    differed. Now each value is named, and the values that differ from the closest
    recorded graph are listed, None included."""
    model = ait.Module(Flagged().eval(), "flagged-call", strategy=cpu_strategy(tune_provider_options=False))
    samples = [((torch.randn(4),), {"use_cache": False, "scale": 2.0}) for _ in range(2)]
    ait.tune(model, samples, ignore_failing_modules=False, progress=False)
    with pytest.raises(ait.GraphNotRecordedError) as raised, torch.no_grad():
        model(torch.randn(2, 4), scale=2.0)  # use_cache left at its default, None
    message = str(raised.value)
    assert "non-tensor values: use_cache=False, scale=2.0" in message, message
    assert "use_cache: None here, False recorded" in message, message


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x, mask=None, labels=None):
        y = self.fc(x) if mask is None else self.fc(x) * mask
        return y if labels is None else (torch.nn.functional.cross_entropy(y, labels), y)


def test_an_unrecorded_call_names_a_tensor_a_tensor_not_absent():
    """labels= given as a tensor where None was recorded read "labels: absent here, None
    recorded", and a mask tensor recorded but left out "mask: None here, absent recorded":
    "absent" stood for "a tensor"."""
    model = ait.Module(Masked().eval(), "masked-call", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [((torch.randn(8),), {"mask": torch.ones(3)}) for _ in range(2)], progress=False,
             ignore_failing_modules=False)
    x = torch.randn(2, 8)
    with pytest.raises(ait.GraphNotRecordedError) as raised, torch.no_grad():
        model(x, mask=torch.ones(2, 3), labels=torch.tensor([0, 1]))
    assert "labels: a tensor here, None recorded" in str(raised.value), str(raised.value)
    with pytest.raises(ait.GraphNotRecordedError) as raised, torch.no_grad():
        model(x)
    assert "mask: None here, a tensor recorded" in str(raised.value), str(raised.value)


class _Settings:
    """A config object of the user's, compared by identity (no __eq__)."""

    def __init__(self, scale: float):
        self.scale = scale
        self.bias = torch.zeros(4)


class _Configured(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, settings, k=1.0):
        return self.fc(x) * settings.scale + settings.bias + 1 / torch.full_like(x, k)


def test_an_argument_object_changed_in_place_or_a_negative_zero_is_another_call():
    """The graph holds a non-tensor argument's attributes as constants: the same object
    changed in place (a float, a tensor filled) matched the recorded graph, 2.65 and 3.0 off
    eager, silently; -0.0 matched 0.0 (+inf where eager gives -inf). Both are other calls."""
    settings = _Settings(1.0)
    model = ait.Module(_Configured().eval(), "configured", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [((torch.randn(4), settings), {"k": 0.5}) for _ in range(2)], ignore_failing_modules=False,
             progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x, settings, k=0.5), model.ait_module(x, settings, k=0.5))
    settings.scale = 4.0
    with pytest.raises(ait.GraphNotRecordedError, match="settings: .* changed in place since it was recorded"):
        model(x, settings, k=0.5)
    settings.scale = 1.0
    settings.bias.fill_(3.0)
    with pytest.raises(ait.GraphNotRecordedError, match="changed in place"):
        model(x, settings, k=0.5)

    zero = ait.Module(_Configured().eval(), "configured-zero", strategy=cpu_strategy(tune_provider_options=False))
    plain = _Settings(1.0)
    ait.tune(zero, [((torch.randn(4), plain), {"k": 0.0}) for _ in range(2)], ignore_failing_modules=False,
             progress=False)
    with pytest.raises(ait.GraphNotRecordedError, match="k=-0.0"):
        zero(x, plain, k=-0.0)


class _Activated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, act):
        return act(self.fc(x))


@pytest.mark.parametrize("change", ["value", "hook", "mode"])
def test_an_argument_module_changed_in_place_is_another_call(change):
    """An nn.Module passed to forward was keyed by its weights only: its plain values
    (``act.negative_slope = 0.9``), a hook registered on it, or its mode (a Dropout put in
    train()) changed after tuning were served the old graph, 0.75 and 1.69 off eager, silently
    (a session-37 probe)."""
    torch.manual_seed(0)
    act = torch.nn.Sequential(torch.nn.LeakyReLU(0.1), torch.nn.Dropout(0.5)).eval()
    model = ait.Module(_Activated().eval(), f"activated-{change}", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [((torch.randn(4), act), {}) for _ in range(2)], ignore_failing_modules=False, progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x, act), model.ait_module(x, act))
        if change == "value":
            act[0].negative_slope = 0.9
        elif change == "hook":
            act[0].register_forward_hook(lambda module, args, out: out * 3)
        else:
            act.train()
        with pytest.raises(ait.GraphNotRecordedError, match=r"(?s)act: .* changed in place since it was recorded"):
            model(x, act)


class _SlottedSettings:
    __slots__ = ("scale", "bias")

    def __init__(self, scale: float):
        self.scale = scale
        self.bias = torch.zeros(4)


def test_an_argument_object_with_slots_changed_in_place_is_another_call():
    """An argument object holding its values in ``__slots__`` was keyed by identity alone:
    ``cfg.scale = 4.0`` after tuning was served the old graph, 0.48 off eager, silently (a
    session-37 probe)."""
    settings = _SlottedSettings(1.0)
    model = ait.Module(_Configured().eval(), "slotted", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [((torch.randn(4), settings), {}) for _ in range(2)], ignore_failing_modules=False,
             progress=False)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x, settings), model.ait_module(x, settings))
    settings.scale = 4.0
    with pytest.raises(ait.GraphNotRecordedError, match="settings: .* changed in place since it was recorded"):
        model(x, settings)
