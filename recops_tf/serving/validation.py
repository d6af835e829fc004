"""The one layer between the wire and the model, for REST and gRPC alike.

Everything a request brings is checked here before the server allocates for it or hands it to a
model or the users' cache; a bad value is a ``RequestError`` with its status and one line (the
server answers it as ``{"error": ...}`` with that status over REST, as the matching gRPC code
over gRPC):

* **versions in a path**: ASCII digits only, 1..2**63-1 (``\\d`` also matches "³" and "١",
  which ``int`` refuses or reads as 1; ``int`` refuses more than 4,300 digits): anything else
  names no version, 404;
* **tensors** (REST JSON values and gRPC TensorProtos): the signature's dtype exactly (a JSON
  ``true`` is not an integer, ``2.0`` is not an integer id; a TensorProto's ``dtype`` is the
  signature's), integers within their dtype's range, a rectangular shape of at most
  ``MAX_RANK`` (32) dimensions (numpy's arrays have at most 64: JSON lists nested deeper were
  a 500), and the request's element count at most ``--max-request-elements`` (413 /
  RESOURCE_EXHAUSTED), counted from the JSON lists' lengths or the TensorProto's declared
  shape *before* any array is built. A
  TensorProto holds its values as TensorFlow's ``Tensor::FromProto`` reads them: exactly
  ``tensor_content`` bytes for its shape, or in its dtype's ``*_val`` field as many values as
  its shape, none (all zeros), or fewer (the last repeated); more values than its shape, values
  in another dtype's field, a negative or unknown dimension are INVALID_ARGUMENT;
* **``:recommend``'s fields**: ``user_id`` a string of at most ``MAX_USER_ID_BYTES`` bytes
  (UTF-8) or a 64-bit integer; ``timestamps`` integers in ``-MAX_TIMESTAMP..MAX_TIMESTAMP``
  (so that no difference of two, nor the implied timestamps after the last one, can overflow
  int64); item names as the catalogue has them (strings, or integers read as their decimal
  names; never booleans or floats); ``candidates`` without duplicates.
"""
import base64
import binascii
import itertools
import math
import re

import numpy as np
import tensorflow as tf

from recops_tf.serving.models import RequestError

# --max-request-elements' default: the most values (all inputs together) a request may hold or
# declare. 4,000,000 int64 are 32 MB of arrays, past what a 4 MiB body (--max-request-mb's
# default) can spell in JSON ("1," a value) or a gRPC message holds in tensor_content.
DEFAULT_MAX_ELEMENTS = 4_000_000
# The longest user_id (UTF-8 bytes) of :recommend; the cache counts an id's bytes against its
# budget, and longer ids are refused before the cache is touched.
MAX_USER_ID_BYTES = 1024
# :recommend's timestamps are within +-2**61 (seconds, milli-, micro- or nanoseconds since 1970
# all fit until 2043): any two differ by less than 2**62, and the implied timestamps after the
# last event (a second apart, one per new event) stay far from int64's end.
MAX_TIMESTAMP = 1 << 61
INT64_MAX = (1 << 63) - 1
# The most dimensions a request's tensor may have (REST's nested lists, a TensorProto's shape);
# numpy's arrays have at most 64, and no signature here takes more than 2.
MAX_RANK = 32

_VERSION = re.compile(r"[0-9]{1,19}")


def _show(text, limit=40):
    """`text` cut for an error message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shown(value):
    """`value`'s repr for an error message, cut."""
    return _show(repr(value), 60)


def version_number(text):
    """The version a path names (``/versions/N``); RequestError(404) unless `text` is ASCII
    digits for 1..2**63-1."""
    number = int(text) if _VERSION.fullmatch(text) else 0
    if not 0 < number <= INT64_MAX:
        raise RequestError(404, f"version {_show(text)!r} of the model is not served (a "
                           "version is a number 1..2**63-1 in ASCII digits)")
    return number


def elements_exceeded(count, limit, what="the request"):
    return RequestError(413, f"{what} holds {count:,} values, more than --max-request-elements "
                        f"{limit:,}")


class Budget:
    """The values a request may still hold (``--max-request-elements`` at its start); every
    input and list takes its count from it before it is built."""

    def __init__(self, limit):
        self.limit, self.left = int(limit), int(limit)

    def take(self, count):
        if count > self.left:
            raise elements_exceeded(self.limit - self.left + count, self.limit)
        self.left -= count


# -- REST: JSON values ------------------------------------------------------------------------
def _kind_names(kinds):
    names = {bool: "true/false", int: "an integer",  # orjson reads 2.0, 1e3 and integers
             float: "a number that is not a 64-bit integer",  # past 64 bits as floats
             str: "a string", dict: "an object", list: "a list", type(None): "null"}
    return ", ".join(sorted(names.get(k, k.__name__) for k in kinds))


def _nested(value, name, budget):
    """``(shape, leaves)`` of a JSON value as a rectangular array (`leaves` flat, in order),
    counting its values against `budget` level by level, before the leaves are listed."""
    shape, level = [], [value]
    while level and type(level[0]) is list:
        width = len(level[0])
        if set(map(type, level)) != {list} or set(map(len, level)) != {width}:
            raise RequestError(400, f"input '{name}' is not a rectangular array (lists of "
                               "equal lengths, values at one depth)")
        shape.append(width)
        if len(shape) > MAX_RANK:  # lists 33 deep or more (orjson reads 1,024 levels)
            raise RequestError(400, f"input '{name}' is nested more than {MAX_RANK} lists "
                               "deep")
        budget.take(len(level) * width - len(level))  # the level's values less its lists
        level = list(itertools.chain.from_iterable(level))
    return shape, level


def json_tensor(value, dtype, name, budget):
    """A JSON value -> np.ndarray of `dtype` (tf.DType) exactly: booleans for bool, integers
    (not booleans, not floats) within the dtype's range for integer dtypes, numbers for
    floating dtypes, strings (or ``{"b64": ...}``) for string; RequestError otherwise."""
    budget.take(1)
    shape, leaves = _nested(value, name, budget)
    kinds = set(map(type, leaves))
    if dtype == tf.string:
        want = object
        allowed = {str, dict}
    elif dtype.is_bool:
        want, allowed = np.bool_, {bool}
    elif dtype.is_integer:
        want, allowed = dtype.as_numpy_dtype, {int}
    elif dtype.is_floating:
        want, allowed = dtype.as_numpy_dtype, {int, float}
    else:
        raise RequestError(400, f"input '{name}': dtype {dtype.name} is not served over REST")
    if not kinds <= allowed:
        what = {object: "strings (or {\"b64\": ...})", np.bool_: "true or false"}.get(
            want, f"integers of {dtype.name} (JSON numbers without a fraction)"
            if dtype.is_integer else f"numbers ({dtype.name})")
        raise RequestError(400, f"input '{name}' must hold {what}; got "
                           f"{_kind_names(kinds - allowed)}")
    if not leaves:
        return np.zeros(shape, want if want is not object else object)
    if want is object:
        return np.array([_string(v, name) for v in leaves], dtype=object).reshape(shape)
    if dtype.is_integer:
        low, high = min(leaves), max(leaves)
        info = np.iinfo(want)
        if low < info.min or high > info.max:
            raise RequestError(400, f"input '{name}': {low if low < info.min else high} is out "
                               f"of {dtype.name}'s range")
    try:
        array = np.array(leaves, dtype=want)
    except OverflowError:  # an integer past the float dtype's range
        array = None
    if array is None or (dtype.is_floating and not np.isfinite(array).all()):
        raise RequestError(400, f"input '{name}': a value is out of {dtype.name}'s range")
    return array.reshape(shape)


def _string(value, name):
    if type(value) is str:
        return value.encode()
    if set(value) == {"b64"} and type(value["b64"]) is str:
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError):
            pass
    raise RequestError(400, f"input '{name}': a string is a JSON string or {{\"b64\": "
                       "\"base64 text\"}}")


# -- gRPC: TensorProtos -----------------------------------------------------------------------
_VALUE_FIELDS = ("half_val", "float_val", "double_val", "int_val", "string_val",
                 "scomplex_val", "int64_val", "bool_val", "dcomplex_val", "uint32_val",
                 "uint64_val")


def _value_field(dtype):
    """The TensorProto field that holds `dtype`'s values (as TensorFlow's tensor.cc reads
    them) and how many field values make one tensor value."""
    if dtype in (tf.float16, tf.bfloat16):
        return "half_val", 1
    if dtype in (tf.int32, tf.int16, tf.int8, tf.uint8, tf.uint16):
        return "int_val", 1
    return {tf.float32: ("float_val", 1), tf.float64: ("double_val", 1),
            tf.int64: ("int64_val", 1), tf.bool: ("bool_val", 1),
            tf.string: ("string_val", 1), tf.uint32: ("uint32_val", 1),
            tf.uint64: ("uint64_val", 1), tf.complex64: ("scomplex_val", 2),
            tf.complex128: ("dcomplex_val", 2)}.get(dtype, (None, 1))


def _dtype_name(enum):
    try:
        return tf.as_dtype(enum).name
    except TypeError:
        return f"dtype enum {enum}"


def proto_tensor(proto, dtype, name, budget):
    """A TensorProto -> np.ndarray of `dtype` (tf.DType): its dtype the signature's exactly,
    its shape known with every dimension >= 0, its declared element count taken from `budget`
    before anything is built, its values in one of TensorFlow's forms (the module's
    docstring); RequestError otherwise."""
    if proto.dtype != dtype.as_datatype_enum:
        raise RequestError(400, f"input '{name}' is {_dtype_name(proto.dtype)}; the signature "
                           f"wants {dtype.name}")
    if proto.tensor_shape.unknown_rank:
        raise RequestError(400, f"input '{name}': its tensor_shape has an unknown rank")
    dims = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise RequestError(400, f"input '{name}': its tensor_shape {dims} has a negative "
                           "dimension")
    if len(dims) > MAX_RANK:
        raise RequestError(400, f"input '{name}': its tensor_shape has {len(dims)} dimensions "
                           f"({MAX_RANK} at most)")
    count = math.prod(dims)
    budget.take(count)
    field, per_value = _value_field(dtype)
    if field is None:
        raise RequestError(400, f"input '{name}': dtype {dtype.name} is not served")
    others = [f for f in _VALUE_FIELDS if f != field and len(getattr(proto, f))]
    if others:
        raise RequestError(400, f"input '{name}' ({dtype.name}) has values in {others[0]}; "
                           f"a {dtype.name} tensor's values are in {field} or tensor_content")
    content = proto.tensor_content
    if content:
        if dtype == tf.string:
            raise RequestError(400, f"input '{name}': a string tensor's values are in "
                               "string_val, not tensor_content")
        size = dtype.size
        if len(content) != count * size:
            raise RequestError(400, f"input '{name}': tensor_content holds {len(content):,} "
                               f"bytes; its shape {dims} of {dtype.name} needs "
                               f"{count * size:,}")
        if len(getattr(proto, field)):
            raise RequestError(400, f"input '{name}' has values both in tensor_content and in "
                               f"{field}")
    else:
        values = getattr(proto, field)
        given = len(values)
        if given % per_value or given // per_value > count:
            raise RequestError(400, f"input '{name}' holds {given // per_value:,} values; its "
                               f"shape {dims} holds {count:,}")
        if field == "int_val" and dtype != tf.int32 and given:  # int8, uint8, int16, uint16
            info = np.iinfo(dtype.as_numpy_dtype)
            low, high = min(values), max(values)
            if low < info.min or high > info.max:
                raise RequestError(400, f"input '{name}': {low if low < info.min else high} "
                                   f"is out of {dtype.name}'s range")
    try:
        return tf.make_ndarray(proto)
    except (ValueError, TypeError, OverflowError):  # e.g. an int_val out of int8's range
        raise RequestError(400, f"input '{name}': its values do not fit {dtype.name}") from None


# -- :recommend -------------------------------------------------------------------------------
def user_key(value):
    """The cache's key of a ``user_id``: a string of at most ``MAX_USER_ID_BYTES`` UTF-8
    bytes, or a 64-bit integer (``("u", n)``, apart from the string of its digits)."""
    if type(value) is int:
        if not -(1 << 63) <= value < 1 << 64:
            raise RequestError(400, "'user_id': an integer user id is 64-bit")
        return ("u", value)
    if type(value) is not str:
        raise RequestError(400, "'user_id' (a string or an integer) is required")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_USER_ID_BYTES:
        raise RequestError(400, f"'user_id' is {size:,} bytes long; at most "
                           f"{MAX_USER_ID_BYTES} (UTF-8)")
    return value


def timestamps(values, count, what):
    """A list of `count` integers within +-``MAX_TIMESTAMP`` -> int64 array."""
    if not isinstance(values, list) or len(values) != count or not all(
            type(t) is int for t in values):
        raise RequestError(400, f"'{what}' must be a list of {count} integers (one per item)")
    if values and (min(values) < -MAX_TIMESTAMP or max(values) > MAX_TIMESTAMP):
        bad = next(t for t in values if not -MAX_TIMESTAMP <= t <= MAX_TIMESTAMP)
        raise RequestError(400, f"'{what}': {_show(str(bad))} is out of range (timestamps are "
                           f"within +-2**61 = {MAX_TIMESTAMP})")
    return np.asarray(values, np.int64)


def item_ids(version, values, what, budget):
    """Item names (or ids, without a catalogue) -> int64 ids in 1..num_items."""
    if not isinstance(values, list):
        raise RequestError(400, f"'{what}' must be a list of items")
    budget.take(len(values))
    if version.index is not None:
        kinds = set(map(type, values)) - {str, int}
        if kinds:
            raise RequestError(400, f"'{what}': items are named by strings (or integers, read "
                               f"as their names); got {_kind_names(kinds)}")
        ids = [version.index.get(v if type(v) is str else str(v)) for v in values]
    else:
        top = version.info.get("num_items", 0)
        ids = [v if type(v) is int and 1 <= v <= top else None for v in values]
    bad = [v for v, i in zip(values, ids) if i is None]
    if bad:
        shown = [_show(v) if type(v) is str else v for v in bad[:5]]
        raise RequestError(400, f"'{what}': items not in the model's catalogue: {shown}")
    return np.asarray(ids, np.int64)


def distinct(ids, values, what):
    """RequestError(400) naming the first item `ids` holds twice."""
    if len(np.unique(ids)) != len(ids):
        seen = set()
        for i, v in zip(ids.tolist(), values):
            if i in seen:
                raise RequestError(400, f"'{what}' names {_show(str(v))!r} twice (each item "
                                   "once)")
            seen.add(i)
