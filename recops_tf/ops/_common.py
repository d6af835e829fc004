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


def flat_rows(x, u, fn_name):
    """(x, u, rebuild): the dense values of x and u (ragged: their flat values, which must have
    the same row structure) and a function that gives a result x's structure back."""
    if isinstance(x, tf.RaggedTensor) or isinstance(u, tf.RaggedTensor):
        if not (isinstance(x, tf.RaggedTensor) and isinstance(u, tf.RaggedTensor)):
            raise TypeError(f"{fn_name}: x and u must both be ragged or both dense")
        return x.flat_values, u.flat_values, x.with_flat_values
    return x, u, lambda y: y


class JaggedBatch:
    """A batch of sequences as jagged ``rows`` ``[T, ...]`` and row ``offsets`` ``[B + 1]``
    (int64), built from

    * a ``tf.RaggedTensor`` ``[B, (L), ...]`` (one ragged axis; its values and row splits),
    * a dense ``[B, S, ...]`` whose rows all have length S (``offsets = range(B + 1) * S``),
    * a padded dense ``[B, S, ...]`` with its ``lengths`` ``[B]`` (checked when run:
      one per row, ``0 <= length <= S``; the padding is dropped).

    ``output(rows)`` gives result rows ``[T, ...]`` back in the input's kind (ragged; dense; or
    padded with zeros) and ``rows_of(x)`` a per-token companion (timestamps) in the rows' order.
    The one place where a layout becomes jagged rows: the ops and the layers use it.
    """

    def __init__(self, x, lengths=None, fn="recops_tf"):
        self._lengths = self._shape = None
        if isinstance(x, tf.RaggedTensor):
            if lengths is not None:
                raise ValueError(f"{fn}: lengths are for a padded dense input; a "
                                 "tf.RaggedTensor carries its own")
            self.rows, self.offsets = x.values, x.row_splits
            return
        x = tf.convert_to_tensor(x)
        self._shape = tf.shape(x, out_type=tf.int64)
        self._static = x.shape[:2]
        if lengths is None:
            self.rows = tf.reshape(x, tf.concat([[-1], self._shape[2:]], 0))
            self.rows.set_shape(tf.TensorShape([None]).concatenate(x.shape[2:]))
            self.offsets = tf.range(self._shape[0] + 1) * self._shape[1]
            return
        lengths = tf.cast(index_tensor(lengths, "lengths"), tf.int64)
        checks = [
            tf.debugging.assert_equal(tf.size(lengths, out_type=tf.int64), self._shape[0],
                                      message=f"{fn}: lengths must have one entry per row "
                                      "of the batch"),
            tf.debugging.assert_non_negative(lengths, message=f"{fn}: lengths must be >= 0"),
            tf.debugging.assert_less_equal(lengths, self._shape[1],
                                           message=f"{fn}: lengths must be <= S, the padded "
                                           "input's sequence axis")]
        with tf.control_dependencies(checks):
            self._lengths = tf.identity(lengths)
        ragged = tf.RaggedTensor.from_tensor(x, lengths=self._lengths)
        self.rows, self.offsets = ragged.values, ragged.row_splits

    def rows_of(self, x, name="timestamps"):
        """A per-token companion (``[B, (L)]`` ragged or ``[B, S]`` dense) as ``[T]``, in the
        rows' order (None stays None)."""
        if x is None:
            return None
        if isinstance(x, tf.RaggedTensor):
            if x.ragged_rank != 1:
                raise ValueError(f"ragged {name} must be [B, (L)], got {describe(x)}")
            return x.values
        if self._lengths is not None:
            return tf.RaggedTensor.from_tensor(x, lengths=self._lengths).values
        return tf.reshape(x, [-1])

    def output(self, rows):
        """Result rows ``[T, ...]`` in the input's kind: ``[B, (L), ...]`` or ``[B, S, ...]``."""
        ragged = tf.RaggedTensor.from_row_splits(rows, self.offsets, validate=False)
        if self._shape is None:
            return ragged
        shape = tf.concat([self._shape[:2], tf.shape(rows, out_type=tf.int64)[1:]], 0)
        out = (tf.reshape(rows, shape) if self._lengths is None
               else ragged.to_tensor(shape=shape))
        out.set_shape(self._static.concatenate(rows.shape[1:]))
        return out


KERNELS = ("fused", "reference")


def check_kernel(kernel, fn):
    """``kernel`` of a public function: ``"fused"`` (the op library) or ``"reference"`` (the
    stock-TF composite of ``recops_tf.reference``, same arguments and layouts, differentiated
    by TensorFlow). Returns True for the fused kernel."""
    if kernel not in KERNELS:
        raise ValueError(f"{fn}: kernel must be 'fused' or 'reference', got {kernel!r}")
    return kernel == "fused"


def zeros_if_none(grad, like):
    return tf.zeros_like(like) if grad is None else grad


def op_attrs(op, names):
    """Attributes of `op` by name, strings decoded (for gradient functions)."""
    attrs = {a: op.get_attr(a) for a in names}
    return {a: v.decode() if isinstance(v, bytes) else v for a, v in attrs.items()}
