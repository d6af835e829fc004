"""Helpers shared by the public op wrappers (argument conversion, checks and ragged handling).

Error convention of the public functions and layers: what is wrong when the call is traced is
raised in Python before any op runs, the same eagerly and inside ``tf.function``: a wrong dtype
is a ``TypeError``, a wrong Python value (``max_seq_len=0``, an unknown ``mask_type``) or a
wrong static shape or ragged layout a ``ValueError`` (TF's and Keras' convention for trace-time
checks). What only the data shows (offsets, lengths, indices, shapes unknown until run time)
is a ``tf.errors.InvalidArgumentError`` from the kernel or an assertion.
"""
import tensorflow as tf

from recops_tf import _loader, _ops_table

INDEX_DTYPES = (tf.int32, tf.int64)
FLOAT_DTYPES = tuple(tf.as_dtype(d) for d in _ops_table.FLOAT_DTYPES)


def lib():
    """The generated wrappers of the op library."""
    return _loader.load()


def stem_dtypes(stem):
    """The value dtypes the kernels of ``stem`` are registered for (its ops-table row)."""
    row, = (r for r in _ops_table.OPS if r.stem == stem)
    return tuple(tf.as_dtype(d) for d in row.dtypes)


def index_tensor(x, name):
    """Converts `x` to an int32/int64 tensor (Python ints become int64)."""
    if not tf.is_tensor(x):
        x = tf.convert_to_tensor(x, dtype_hint=tf.int64, name=name)
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {x.dtype.name}")
    return x


def _dtype_list(dtypes):
    names = [tf.as_dtype(d).name for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def value_tensors(fn, *, dtypes=FLOAT_DTYPES, dtype_hint=tf.float32, **named):
    """The keyword arguments ``named`` (argument name -> value) as tensors of one dtype, in
    order (None stays None).

    The first one sets the dtype, which must be one of ``dtypes`` (a Python or NumPy value is
    converted with ``dtype_hint``). A later one that is already a tensor or variable must have
    that dtype; Python and NumPy values are converted to it. Raises ``TypeError`` naming the
    argument and both dtypes, at trace time (no op is built)."""
    out, first = [], None
    for name, value in named.items():
        if value is None:
            out.append(None)
            continue
        if first is None:
            if not tf.is_tensor(value):
                value = tf.convert_to_tensor(value, dtype_hint=dtype_hint, name=name)
            dtype = tf.as_dtype(value.dtype)
            if dtype not in dtypes:
                raise TypeError(f"{fn}: {name} must be {_dtype_list(dtypes)}, got "
                                f"{dtype.name}")
            first = name
        elif tf.is_tensor(value):
            if tf.as_dtype(value.dtype) != dtype:
                raise TypeError(f"{fn}: {name} is {tf.as_dtype(value.dtype).name} but {first} "
                                f"is {dtype.name}; they must have the same dtype")
        else:
            try:
                value = tf.convert_to_tensor(value, dtype=dtype, name=name)
            except (TypeError, ValueError):
                raise TypeError(f"{fn}: {name} cannot be converted to {first}'s dtype "
                                f"{dtype.name}") from None
        out.append(tf.convert_to_tensor(value, dtype=dtype, name=name))
    return out


def positive_int(value, name, fn):
    """``int(value)``, which must be at least 1 (a Python int: it becomes an op attribute)."""
    if tf.is_tensor(value) and not tf.executing_eagerly():
        raise TypeError(f"{fn}: {name} must be a Python int (it is an attribute of the op), "
                        "got a symbolic tensor")
    number = int(value)
    if number != value or number < 1:
        raise ValueError(f"{fn}: {name} must be a positive int, got {value!r}")
    return number


def describe(x):
    """``x``'s kind and shape in the docs' notation: ``a tf.RaggedTensor [3, (L), 16]
    (ragged_rank 1)`` or ``a dense tensor [8, 16]`` (``None``: a dimension unknown when
    traced)."""
    if isinstance(x, tf.RaggedTensor):
        dims = [str(d) for d in x.shape.as_list()] if x.shape.rank is not None else ["..."]
        for axis in range(1, x.ragged_rank + 1):
            if axis < len(dims):
                dims[axis] = "(L)" if x.ragged_rank == 1 else f"(L{axis})"
        return f"a tf.RaggedTensor [{', '.join(dims)}] (ragged_rank {x.ragged_rank})"
    shape = getattr(x, "shape", None)
    if shape is None or tf.TensorShape(shape).rank is None:
        return "a tensor of unknown rank"
    return f"a dense tensor [{', '.join(str(d) for d in tf.TensorShape(shape).as_list())}]"


def same_index_dtype(a, b):
    """Casts two index tensors to a common dtype (int64 if they differ)."""
    if a.dtype != b.dtype:
        a, b = tf.cast(a, tf.int64), tf.cast(b, tf.int64)
    return a, b


def ragged_parts(rt, name):
    """(values, row_splits) of a RaggedTensor with exactly one ragged dimension."""
    if rt.ragged_rank != 1:
        raise ValueError(f"{name} must have exactly one ragged dimension, got "
                         f"{describe(rt)}")
    return rt.values, rt.row_splits


def zeros_if_none(grad, like):
    return tf.zeros_like(like) if grad is None else grad


def op_attrs(op, names):
    """Attributes of `op` by name, strings decoded (for gradient functions)."""
    attrs = {a: op.get_attr(a) for a in names}
    return {a: v.decode() if isinstance(v, bytes) else v for a, v in attrs.items()}
