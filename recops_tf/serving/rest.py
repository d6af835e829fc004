"""TF Serving's REST request and response bodies (``:predict``), to and from numpy.

A request names its signature (``signature_name``, default ``serving_default``) and gives its
inputs in the row form (``"instances"``: a list of rows, each a dict of named inputs or, with
one input, the value) or the columnar form (``"inputs"``: a dict of named inputs or, with one
input, the value). The answer is ``{"predictions": ...}`` (rows) or ``{"outputs": ...}``
(columns), as TF Serving gives them. Strings may be given as ``{"b64": "..."}``.
"""
import base64

from recops_tf.serving.models import RequestError
from recops_tf.serving.validation import DEFAULT_MAX_ELEMENTS, Budget, json_tensor


def request_tensors(body, signature, max_elements=DEFAULT_MAX_ELEMENTS):
    """``(tensors, row_form)`` of a ``:predict`` body for `signature`, checked by
    ``validation.json_tensor`` (dtypes exact, integer ranges, at most `max_elements` values
    in all, counted before any array is built) and against the signature."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    extra = set(body) - {"signature_name", "instances", "inputs"}
    if extra:
        raise RequestError(400, f"unknown fields in the body: {sorted(extra)}")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError(400, "give exactly one of 'instances' (rows) and 'inputs' (columns)")
    names = sorted(signature.inputs)
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list) or not rows:
            raise RequestError(400, "'instances' must be a non-empty list")
        if all(isinstance(r, dict) for r in rows):
            keys = {frozenset(r) for r in rows}
            if len(keys) != 1:
                raise RequestError(400, "every instance must name the same inputs")
            columns = {k: [r[k] for r in rows] for k in keys.pop()}
        elif len(names) == 1:
            columns = {names[0]: rows}
        else:
            raise RequestError(400, f"instances must be objects naming the inputs {names}")
    else:
        given = body["inputs"]
        if isinstance(given, dict) and (len(names) != 1 or set(given) <= set(names)):
            columns = given
        elif len(names) == 1:
            columns = {names[0]: given}
        else:
            raise RequestError(400, f"'inputs' must be an object naming the inputs {names}")
    tensors, budget = {}, Budget(max_elements)
    for key, value in columns.items():
        if key not in signature.inputs:
            raise RequestError(400, f"unknown input '{key}'; signature '{signature.name}' "
                               f"takes {names}")
        tensors[key] = json_tensor(value, signature.inputs[key][0], key, budget)
    signature.check(tensors)
    return tensors, "instances" in body


def _json(value):
    if value.dtype == object:
        return [_json(v) for v in value] if value.ndim else _text(value.item())
    return value.tolist()


def _text(b):
    try:
        return b.decode()
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(b).decode()}


def response_body(outputs, row_form):
    """TF Serving's answer for `outputs` (name -> np.ndarray)."""
    if not row_form:
        if len(outputs) == 1:
            return {"outputs": _json(next(iter(outputs.values())))}
        return {"outputs": {k: _json(v) for k, v in outputs.items()}}
    sizes = {v.shape[0] if v.ndim else None for v in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise RequestError(400, "the outputs do not share a batch size: ask in the columnar "
                           "form ('inputs')")
    if len(outputs) == 1:
        return {"predictions": _json(next(iter(outputs.values())))}
    cols = {k: _json(v) for k, v in outputs.items()}
    return {"predictions": [{k: cols[k][i] for k in cols} for i in range(sizes.pop())]}
