"""Which positions of a recorded call's outputs the model defines: masks by which the
correctness check leaves out the rest (a padded batch's positions where attention_mask
is 0, whose outputs a decoder leaves undefined; where ``nn.Transformer*``'s
``src_key_padding_mask`` is True, whose outputs PyTorch's fast path leaves zero). The engine applies them
(``aitune/valid_positions.hpp``); this module only finds the masks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union

import torch

#: ``ait.tune(valid_positions=...)``: None (derive from a keyword input named
#: ``attention_mask``), False (every position is defined), the name of the forward's
#: argument that holds the mask, or ``fn(arguments, outputs) -> mask or None``.
ValidPositionsOption = Union[None, bool, str, Callable[[dict, list], Any]]

AUTO_INPUT = "attention_mask"
#: ``nn.TransformerEncoder`` / ``nn.TransformerEncoderLayer``'s key padding mask: True (or,
#: as a float mask, non-zero) where the position is padding; ``[batch, seq]``, whatever
#: ``batch_first`` is.
PADDING_INPUT = "src_key_padding_mask"


def _argument(arguments: dict[str, Any], name: str) -> Any:
    value = arguments.get(name)
    if value is None and isinstance(arguments.get("kwargs"), dict):  # forward(**kwargs)
        value = arguments["kwargs"].get(name)
    return value


def _padding_masks(padding: torch.Tensor, outputs: list[torch.Tensor],
                   batch_first: bool | None) -> list[torch.Tensor | None]:
    """Per output, the defined positions by a ``[batch, seq]`` key padding mask: an output
    ``[batch, seq, ...]`` (batch_first) takes them as they are, one ``[seq, batch, ...]``
    transposed. Where batch equals seq only the module's ``batch_first`` tells which, and
    without it the output is compared everywhere."""
    if padding.dim() != 2:
        return [None] * len(outputs)
    host = padding.detach().to("cpu")
    valid = (~host if host.dtype == torch.bool else host == 0).to(torch.uint8)
    batch, seq = valid.shape
    masks = []
    for out in outputs:
        leading = tuple(out.shape[:2]) if out.dim() > 2 else None
        if leading == (batch, seq) and (batch != seq or batch_first is True):
            masks.append(valid.contiguous())
        elif leading == (seq, batch) and (batch != seq or batch_first is False):
            masks.append(valid.t().contiguous())
        else:
            masks.append(None)
    return masks


def check_option(option: ValidPositionsOption) -> None:
    if option is None or isinstance(option, (bool, str)) or callable(option):
        return
    raise TypeError(
        "valid_positions must be None (derive from attention_mask), False, the name of the argument holding "
        f"the mask, or a callable (arguments, outputs) -> mask; got {type(option).__name__}"
    )


def _prefixes(mask: torch.Tensor, output: torch.Tensor, derived: bool) -> bool:
    """Derived masks apply only to outputs with more dims than the mask ([batch, seq, ...]):
    a [batch, hidden] pooled output whose hidden size happens to equal the sequence length
    must not be masked by position. A declared mask may also cover an output of its shape."""
    longer = mask.dim() < output.dim() if derived else mask.dim() <= output.dim()
    return mask.dim() > 0 and longer and tuple(mask.shape) == tuple(output.shape[: mask.dim()])


#: The dtypes a mask is handed to the engine in as it is (non-zero: defined).
_MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.int16)


def _derived_defined(host: torch.Tensor) -> torch.Tensor | None:
    """The defined positions by a mask found by its name (``attention_mask``), or None where
    its values do not say which positions are padding, so every position is compared:
    - integers or bools: non-zero is defined (transformers' 0/1 mask);
    - floats of 0 and 1 only: the same, a 0/1 mask cast to float;
    - floats of 0 and negatives only: an *additive* mask (0 attends, -1e4 or -inf pads), as
      many custom and older models take it: 0 is defined. Read as a 0/1 mask it left out
      exactly the valid positions, and without padding every one: the check compared
      nothing and passed a wrong graph;
    - anything else (other values, all zeros of a float: an additive mask without padding or
      a mask padding every position, which no real batch is) and a mask that leaves every
      position out: None. Nothing is left out on a guess."""
    if host.is_floating_point():
        if bool(((host == 0) | (host == 1)).all()) and bool((host == 1).any()):
            host = (host == 1).to(torch.uint8)
        elif bool(((host == 0) | (host < 0)).all()) and bool((host < 0).any()):
            host = (host == 0).to(torch.uint8)
        else:
            return None
    elif host.dtype not in _MASK_DTYPES:
        return None  # complex: not a mask
    return host if bool((host != 0).any()) else None


def _per_output(mask: torch.Tensor, outputs: list[torch.Tensor], derived: bool = False) -> list[torch.Tensor | None]:
    """The mask for every output whose leading dims it matches (logits, hidden states),
    None for the others (a pooled output is defined everywhere). A ``derived`` mask (found by
    its name) is read by its values (``_derived_defined``); a declared one is non-zero where
    defined."""
    host = mask.detach().to("cpu").contiguous()
    if derived:
        host = _derived_defined(host)
        if host is None:
            return [None] * len(outputs)
    elif host.dtype not in _MASK_DTYPES:
        host = (host != 0).to(torch.uint8)
    return [host if _prefixes(host, out, derived) else None for out in outputs]


#: Arguments of an encoder-decoder call (transformers' BART, T5, Marian: ``forward(input_ids,
#: attention_mask, decoder_input_ids, ...)``) holding the decoder's sequence.
DECODER_INPUTS = ("decoder_input_ids", "decoder_inputs_embeds")
DECODER_MASK = "decoder_attention_mask"


def _encoder_decoder_masks(arguments: dict[str, Any], outputs: list[torch.Tensor],
                           output_names: list[str]) -> tuple[list[torch.Tensor | None], str] | None:
    """The derived masks of an encoder-decoder call: ``attention_mask`` is the encoder's, so
    it covers the encoder's outputs alone (``encoder_last_hidden_state``, ``encoder_hidden_states``),
    and ``decoder_attention_mask``, where given, the others (``logits``). By shape alone the
    encoder's mask also covered the decoder's logits wherever the two sequences had one
    length (both padded to one max_length, as tokenizers do): the logits at the positions of
    the source's padding, which the decoder defines, were left out of the check."""
    encoder = _argument(arguments, AUTO_INPUT)
    decoder = _argument(arguments, DECODER_MASK)
    masks: list[torch.Tensor | None] = [None] * len(outputs)
    used = []
    for mask, name, mine in ((encoder, AUTO_INPUT, True), (decoder, DECODER_MASK, False)):
        if not isinstance(mask, torch.Tensor):
            continue
        for i, (per_output, output_name) in enumerate(zip(_per_output(mask, outputs, derived=True), output_names,
                                                          strict=True)):
            if per_output is not None and ("encoder" in output_name) == mine:
                masks[i] = per_output
                if name not in used:
                    used.append(name)
    return None if not used else (masks, " and ".join(used))


def batch_first_of(module: torch.nn.Module) -> bool | None:
    """The ``batch_first`` of the ``nn.MultiheadAttention`` layers in ``module`` (every
    ``nn.Transformer*`` layer has them) when they all agree, else None."""
    found = {sub.batch_first for sub in module.modules() if isinstance(sub, torch.nn.MultiheadAttention)}
    return found.pop() if len(found) == 1 else None


def masks_for(option: ValidPositionsOption, arguments: dict[str, Any], outputs: list[torch.Tensor],
              where: str, output_names: list[str] | None = None,
              batch_first: bool | None = None) -> tuple[list[torch.Tensor | None], str] | None:
    """Per output, the mask of its defined positions (None: all defined), and where the
    masks came from; None when nothing is left out. ``arguments``: the recorded call's
    arguments by the forward's parameter names; ``output_names``: the graph's, by which the
    masks derived for an encoder-decoder call (``_encoder_decoder_masks``) tell the
    encoder's outputs from the decoder's; ``batch_first``: the module's (``batch_first_of``),
    for a ``src_key_padding_mask`` whose batch equals its length."""
    if option is False:
        return None
    if callable(option) and not isinstance(option, str):
        try:
            mask = option(arguments, outputs)
        except Exception as error:  # the user's function: named with where it ran (was a bare error)
            message = f"{where}: the valid_positions function raised {type(error).__name__}: {error}"
            try:
                named = type(error)(message)  # the same type, for a caller that catches it
            except Exception:  # a type whose constructor takes other arguments
                named = ValueError(message)
            raise named from error
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{where}: valid_positions returned {type(mask).__name__}, expected a tensor or None")
        masks = _per_output(mask, outputs)
        if all(m is None for m in masks):
            raise ValueError(
                f"{where}: the valid_positions mask {list(mask.shape)} prefixes no output's shape "
                f"({[list(o.shape) for o in outputs]})"
            )
        return _checked_not_vacuous(masks, where, "valid_positions"), "valid_positions"
    name = AUTO_INPUT if option in (None, True) else option
    if (option in (None, True) and output_names is not None
            and any(isinstance(_argument(arguments, d), torch.Tensor) for d in DECODER_INPUTS)):
        return _encoder_decoder_masks(arguments, outputs, output_names)
    mask = _argument(arguments, name)
    if option in (None, True) and not isinstance(mask, torch.Tensor) \
            and isinstance(padding := _argument(arguments, PADDING_INPUT), torch.Tensor):
        masks = _padding_masks(padding, outputs, batch_first)
        return None if all(m is None for m in masks) else (masks, PADDING_INPUT)
    if not isinstance(mask, torch.Tensor):
        if option in (None, True):
            return None  # nothing to derive from: every position is defined
        raise ValueError(f"{where}: valid_positions={name!r}, but the call has no tensor argument {name!r} "
                         f"(its arguments: {sorted(arguments)})")
    masks = _per_output(mask, outputs, derived=option in (None, True))
    if all(m is None for m in masks):
        return None
    return _checked_not_vacuous(masks, where, f"valid_positions={name!r}"), name


def _checked_not_vacuous(masks: list[torch.Tensor | None], where: str, said: str) -> list[torch.Tensor | None]:
    """A declared mask that leaves every position out would let the check compare nothing
    (and pass any graph): refused."""
    if not any(bool((m != 0).any()) for m in masks if m is not None):
        raise ValueError(f"{where}: the mask of {said} marks no position as defined (all zero), so the check "
                         "would compare nothing; pass a mask that is non-zero where the outputs are defined")
    return masks


def mask_like_inputs(arguments: dict[str, Any], outputs: list[torch.Tensor]) -> list[str]:
    """The names of the call's arguments that look like a padding mask the option was not
    told of: a 2-D integer or bool tensor of 0s and 1s, with a 0 somewhere, whose shape
    prefixes an output's (``[batch, seq]`` of ``[batch, seq, vocab]`` logits). Named in the
    refusal of a tune whose candidates all differ: a wrapper's mask argument named otherwise
    than ``attention_mask`` was not derived, and the errors at its padded positions read as
    "every candidate differs from eager PyTorch" without a word of it (a session-36 probe)."""
    found = []
    for name, value in arguments.items():
        if (name in (AUTO_INPUT, PADDING_INPUT) or not isinstance(value, torch.Tensor) or value.dim() != 2
                or value.dtype not in _MASK_DTYPES):
            continue
        host = value.detach().to("cpu")
        if not bool(((host == 0) | (host == 1)).all()) or bool(host.all()):
            continue
        if any(_prefixes(host, out, derived=True) for out in outputs):
            found.append(name)
    return found
