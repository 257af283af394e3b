"""Request and response bodies of the served model: JSON, .npy / .npz, raw tensor bytes."""
from __future__ import annotations

import io
import json
import math
from typing import Mapping

import numpy as np

#: Content types the server reads and writes.
JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
RAW = "application/octet-stream"

#: Largest body read, so a client cannot exhaust a replica's memory with one request.
MAX_BODY_BYTES = 256 * 1024 * 1024


class BadRequest(ValueError):
    """A request the server refuses (HTTP 4xx) with a message for the client."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


#: The strings JSON answers write for the floats JSON has no numbers for (encode), read back here.
_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _BareConstant(str):
    """A bare NaN / Infinity / -Infinity in a request body, which Python's json reads but
    which is not JSON; kept as this marker so the input it sits in is refused by name."""


def _non_finite_read(name: str, value):
    """``value`` with the strings "NaN", "Infinity", "-Infinity" (as answers write them) made
    floats. A bare NaN / Infinity literal, and a number beyond float64's range (Python's json
    reads 1e400 as infinity), are refused naming the input: either would reach the model as a
    value the client did not write as one."""
    if isinstance(value, list):
        return [_non_finite_read(name, v) for v in value]
    if isinstance(value, _BareConstant):
        raise BadRequest(f"input '{name}': bare {str(value)} is not JSON; send the string \"{value}\" "
                         f"(as answers write it)")
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, float) and math.isinf(value):
        sign = "-" if value < 0 else ""
        raise BadRequest(f"input '{name}': a number is out of range for float64 (beyond +-1.8e308), which JSON "
                         f"reading made {sign}infinity; send the string \"{sign}Infinity\" if infinity is meant")
    return value


def _float_cast(name: str, array: np.ndarray, target: np.dtype) -> np.ndarray:
    """``array`` as the float dtype `target`, refusing finite values that `target` cannot
    hold (1e39 as float32, 70000 as float16: the cast made them infinity, silently)."""
    with np.errstate(over="ignore"):
        cast = array.astype(target)
    if array.size and not np.array_equal(np.isfinite(array), np.isfinite(cast)):
        raise BadRequest(f"input '{name}': values are out of range for {target.name} "
                         f"(+-{float(np.finfo(target).max):.4g})")
    return cast


def _int_beyond_int64(value) -> bool:
    """Whether the JSON value holds an integer (a Python int as json reads one, not a float
    such as 1e39) beyond int64's range."""
    if isinstance(value, list):
        return any(_int_beyond_int64(item) for item in value)
    return type(value) is int and not -(2**63) <= value < 2**63


def _json_array(name: str, value, dtype: str | None) -> np.ndarray:
    value = _non_finite_read(name, value)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as error:
        raise BadRequest(f"input '{name}' is not a rectangular array of numbers: {error}") from None
    if array.dtype == object or array.dtype.kind in "USV":
        # an integer beyond 64 bits also makes an object array
        raise BadRequest(f"input '{name}' is not a rectangular array of numbers within 64 bits")
    if dtype is None:
        if array.size == 0:  # numpy reads [] as float64: the dtype check would name that, not the emptiness
            raise BadRequest(f"input '{name}' is an empty array (shape {list(array.shape)}): it holds no values",
                             status=422)
        # Integers past int64 come as uint64 (all >= 0) or float64 (mixed with negative ones):
        # the dtype check would name those dtypes, not the range the client overstepped.
        if array.dtype == np.uint64 or (array.dtype == np.float64 and np.abs(array).max() >= 2.0**63
                                        and _int_beyond_int64(value)):
            info = np.iinfo(np.int64)
            raise BadRequest(f"input '{name}': integers are out of range for int64 ({info.min}..{info.max})")
        # JSON has one number type; a float input the client did not type is float32, what
        # models take. Integers stay int64 (token ids).
        return _float_cast(name, array, np.dtype(np.float32)) if array.dtype == np.float64 else array
    target = np.dtype(dtype)
    # The stated dtype must hold the values: a float made an integer, or an integer wrapped
    # around, would be another request than the one sent (floats are rounded, as JSON's
    # decimal numbers always are).
    if target.kind in "iub" and array.size:
        if array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.trunc(array))):
            raise BadRequest(f"input '{name}': values are not integers, which {target.name} takes")
        if target.kind == "b" and not np.all((array == 0) | (array == 1)):
            raise BadRequest(f"input '{name}': values are not 0 or 1, which bool takes")
        if target.kind in "iu":
            info = np.iinfo(target)
            if array.min() < info.min or array.max() > info.max:
                raise BadRequest(f"input '{name}': values are out of range for {target.name} "
                                 f"({info.min}..{info.max})")
    if target.kind == "f":
        return _float_cast(name, array, target)
    try:
        return array.astype(target)
    except (ValueError, TypeError, OverflowError) as error:
        raise BadRequest(f"input '{name}' cannot be made {target.name}: {error}") from None


def _npy_header(fp, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an .npy stream declares, read without its data."""
    version = np.lib.format.read_magic(fp)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(fp)
    return shape, dtype


def _within_limit(declared: list[tuple[str, tuple[int, ...], np.dtype]]) -> None:
    """Refuses arrays whose declared bytes (Python integers: no overflow) exceed the body
    limit together: a compressed .npz body of a few MB inflates to any size."""
    total = 0
    for name, shape, dtype in declared:
        if dtype.hasobject:
            raise BadRequest(f"input '{name}' holds Python objects ({dtype}), which aitune does not read")
        total += math.prod(shape) * dtype.itemsize
        if total > MAX_BODY_BYTES:
            raise BadRequest(f"input '{name}' ({dtype}{list(shape)}) makes the arrays {total} bytes, which exceeds the "
                             f"limit of {MAX_BODY_BYTES}", status=413)


def _once_each(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are each given once: json.loads keeps the last of a key given
    twice, and an input named twice would be answered with one of its two values, unsaid."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise BadRequest(f"JSON body gives '{key}' twice in one object; give each once")
        out[key] = value
    return out


def content_kind(content_type: str | None) -> str:
    """The media type of a Content-Type header, lower case, without its parameters."""
    return (content_type or JSON).split(";")[0].strip().lower()


_JSON_KINDS = (JSON, "text/json", "")  # an absent Content-Type reads as JSON


def is_json(content_type: str | None) -> bool:
    return content_kind(content_type) in _JSON_KINDS


def decode(body: bytes, content_type: str, query: Mapping[str, str], single_input: str | None) -> dict[str, np.ndarray]:
    """The named input arrays of a request body. `single_input` names the graph's input
    when it has exactly one (a .npy or raw body carries one unnamed array)."""
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"body of {len(body)} bytes exceeds the limit of {MAX_BODY_BYTES}", status=413)
    kind = content_kind(content_type)
    if kind in _JSON_KINDS:
        try:
            payload = json.loads(body, parse_constant=_BareConstant, object_pairs_hook=_once_each)
        except (ValueError, UnicodeDecodeError) as error:
            raise BadRequest(f"body is not JSON: {error}") from None
        except RecursionError:
            raise BadRequest("body is JSON nested too deep for an array of numbers") from None
        if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), dict):
            raise BadRequest('JSON body must be {"inputs": {"<name>": [...]}, "dtypes": {"<name>": "float32"}}')
        dtypes = payload.get("dtypes") or {}
        if not isinstance(dtypes, dict):
            raise BadRequest('"dtypes" must map input names to dtype names')
        if unknown := sorted(set(dtypes) - set(payload["inputs"])):
            # a typo (`input_inptu`) left the dtype it meant unapplied, silently
            raise BadRequest(f'"dtypes" names {", ".join(map(repr, unknown))}, which "inputs" does not hold '
                             f"(it holds {', '.join(map(repr, payload['inputs']))})")
        out = {}
        for name, value in payload["inputs"].items():
            dtype = dtypes.get(name)
            if dtype is not None:
                try:
                    np.dtype(dtype)
                except TypeError:
                    raise BadRequest(f"input '{name}': unknown dtype '{dtype}'") from None
            try:
                out[name] = _json_array(name, value, dtype)
            except RecursionError:
                raise BadRequest(f"input '{name}' is nested too deep for an array of numbers") from None
        return out
    if kind == NPZ:
        try:
            loaded = np.load(io.BytesIO(body), allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):  # an .npy array is no context manager
                raise BadRequest(f"body is not an .npz archive: it is one .npy array; send it as {NPY}")
            with loaded as archive:
                declared = []
                for info in archive.zip.infolist():  # the headers first: a member's size is known only from them
                    name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                    if any(name == seen for seen, *_ in declared):  # np.load keeps one of them, unsaid
                        raise BadRequest(f"input '{name}' is given twice in the .npz archive; give each once")
                    with archive.zip.open(info) as member:
                        declared.append((name, *_npy_header(member, name)))
                _within_limit(declared)
                return {name: archive[name] for name in archive.files}
        except BadRequest:
            raise
        except Exception as error:  # numpy raises several types for a damaged archive
            raise BadRequest(f"body is not an .npz archive of arrays: {error}") from None
    if single_input is None and kind in (NPY, RAW):
        raise BadRequest(f"{kind} carries one array but the graph takes several inputs: send {NPZ} or JSON")
    if kind == NPY:
        try:
            array = np.load(io.BytesIO(body), allow_pickle=False)
        except Exception as error:
            raise BadRequest(f"body is not an .npy array: {error}") from None
        if not isinstance(array, np.ndarray):
            raise BadRequest("body is not an .npy array")
        return {single_input: array}
    if kind == RAW:
        try:
            dtype = np.dtype(query["dtype"])
            shape = tuple(int(d) for d in query["shape"].split(",") if d.strip())
        except KeyError as missing:
            raise BadRequest(f"raw tensor bytes need the query parameters dtype and shape (missing {missing})") from None
        except (TypeError, ValueError) as error:
            raise BadRequest(f"raw tensor bytes: bad dtype or shape: {error}") from None
        if dtype.hasobject:
            raise BadRequest(f"raw tensor bytes cannot make Python objects (dtype {dtype})")
        # math.prod of Python integers: np.prod in int64 wrapped a huge shape around to 0 bytes
        if any(d < 0 for d in shape) or math.prod(shape) * dtype.itemsize != len(body):
            raise BadRequest(f"raw tensor bytes: {len(body)} bytes do not make a {dtype} array of shape {list(shape)}")
        return {single_input: np.frombuffer(body, dtype=dtype).reshape(shape)}
    raise BadRequest(f"unsupported content type '{kind}'; send {JSON}, {NPY}, {NPZ} or {RAW}", status=415)


def encode(outputs: dict[str, np.ndarray], accept: str) -> tuple[bytes, str]:
    """The response body for `outputs` in the type the client accepts (JSON by default)."""
    kind = (accept or JSON).split(",")[0].split(";")[0].strip().lower()
    if kind == NPZ:
        buffer = io.BytesIO()
        np.savez(buffer, **outputs)
        return buffer.getvalue(), NPZ
    if kind == NPY and len(outputs) == 1:
        buffer = io.BytesIO()
        np.save(buffer, next(iter(outputs.values())), allow_pickle=False)
        return buffer.getvalue(), NPY
    body = {"outputs": {k: _json_values(v) for k, v in outputs.items()},
            "dtypes": {k: str(v.dtype) for k, v in outputs.items()}}
    return json.dumps(body, allow_nan=False).encode(), JSON


def _json_values(array: np.ndarray):
    """The array as JSON values. JSON has no NaN or infinity (Python's json writes bare
    NaN / Infinity, which JSON.parse and most other parsers refuse): those are written as
    the strings "NaN", "Infinity", "-Infinity", as protobuf's JSON mapping does; numpy reads
    them back with the dtype (decode_response)."""
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return array.tolist()
    values = array.astype(object)
    values[np.isnan(array)] = "NaN"
    values[np.isposinf(array)] = "Infinity"
    values[np.isneginf(array)] = "-Infinity"
    return values.tolist()


def decode_response(body: bytes, content_type: str) -> dict[str, np.ndarray]:
    """The client side of `encode`: the named output arrays of a response."""
    kind = (content_type or JSON).split(";")[0].strip().lower()
    if kind == NPZ:
        with np.load(io.BytesIO(body), allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    if kind == NPY:
        return {"output": np.load(io.BytesIO(body), allow_pickle=False)}
    payload = json.loads(body)
    return {k: np.asarray(v, dtype=payload["dtypes"][k]) for k, v in payload["outputs"].items()}
