"""Concatenation and split of jagged tensors (stem concat_jagged_tensor)."""
import tensorflow as tf

from recops_tf.ops._common import (index_tensor, lib, ragged_parts, same_index_dtype,
                                   stem_dtypes, value_tensors, zeros_if_none)

_DTYPES = stem_dtypes("concat_jagged_tensor")


def concat_jagged_tensor(values_a, offsets_a=None, values_b=None, offsets_b=None,
                         n_prefix_from_right=0, name=None):
    """Concatenates two jagged tensors sample by sample.

    Definition: with ``a_b = values_a[offsets_a[b]:offsets_a[b+1]]``,
    ``b_b = values_b[offsets_b[b]:offsets_b[b+1]]`` and ``q_b = min(p, len(b_b))`` for
    ``p = n_prefix_from_right``, sample ``b`` of the output is
    ``concat(b_b[:q_b], a_b, b_b[q_b:])`` along rows. With ``p = 0`` the A rows come first,
    then the B rows (HSTU models append target or context tokens this way); ``p > 0`` moves
    the first ``p`` rows of each B segment in front of A. The output's offsets are
    ``offsets_a + offsets_b``.

    generative-recommenders' ``concat_2D_jagged`` is the same op where every B segment has at
    least ``p`` rows (bitwise). Where a segment is shorter, GR's composite still takes ``p``
    prefix rows (reading past the segment: a zero row after the last one, otherwise the next
    segment's rows) and keeps only ``len(a_b) + len(b_b) - p`` rows of A; this op takes
    ``min(p, len(b_b))`` and keeps every row once (docs/gr_compat.md).

    Two calling forms:

    * jagged: ``concat_jagged_tensor(values_a, offsets_a, values_b, offsets_b)``;
    * ragged: ``concat_jagged_tensor(rt_a, rt_b)`` with two ``tf.RaggedTensor`` of one ragged
      dimension (``[B, (L), ...]``), returning a ``tf.RaggedTensor``.

    Args:
      values_a: ``[RA, ...]`` rows of A (float32, float16, bfloat16, float64, int32, int64),
        or a ``tf.RaggedTensor`` (then pass the other ragged tensor second).
      offsets_a: ``[B+1]`` int32/int64 offsets of A: start at 0, non-decreasing, end at RA.
      values_b: ``[RB, ...]`` rows of B, same dtype and row shape as ``values_a``.
      offsets_b: ``[B+1]`` offsets of B, same length as ``offsets_a``.
      n_prefix_from_right: int >= 0, the number of leading B rows per sample placed before A.
      name: optional op name.

    Returns:
      ``[RA+RB, ...]`` values (or a ``tf.RaggedTensor`` with row_splits
      ``offsets_a + offsets_b`` in the ragged form).

    Gradient: ``split_jagged_tensor`` of the upstream gradient with the same offsets; the
    offsets get none.

    Raises:
      InvalidArgumentError: offsets not starting at 0, decreasing, of different lengths, or
        not ending at the row count; different row shapes.
      TypeError: values not float32/float16/bfloat16/float64/int32/int64, or A and B of
        different dtypes.

    Example:

    >>> a = tf.constant([[1.], [2.], [3.]]); b = tf.constant([[10.], [20.]])
    >>> concat_jagged_tensor(a, [0, 2, 3], b, [0, 1, 2])[:, 0].numpy().tolist()
    [1.0, 2.0, 10.0, 3.0, 20.0]

    Notes: a parallel row copy: it reads and writes each row once (memory bound).
    """
    with tf.name_scope(name or "concat_jagged_tensor"):
        if isinstance(values_a, tf.RaggedTensor):
            rt_b = values_b if values_b is not None else offsets_a
            if not isinstance(rt_b, tf.RaggedTensor):
                raise TypeError("concat_jagged_tensor(rt_a, rt_b): both must be tf.RaggedTensor")
            va, oa = ragged_parts(values_a, "rt_a")
            vb, ob = ragged_parts(rt_b, "rt_b")
            va, vb = value_tensors("concat_jagged_tensor", dtypes=_DTYPES, dtype_hint=None,
                                   rt_a=va, rt_b=vb)
            oa, ob = same_index_dtype(oa, ob)
            values = lib().recops_concat_jagged_tensor(
                va, oa, vb, ob, n_prefix_from_right=n_prefix_from_right)
            return tf.RaggedTensor.from_row_splits(values, oa + ob, validate=False)
        if offsets_a is None or values_b is None or offsets_b is None:
            raise TypeError("concat_jagged_tensor needs values_a, offsets_a, values_b, offsets_b "
                            "(or two tf.RaggedTensor)")
        values_a, values_b = value_tensors("concat_jagged_tensor", dtypes=_DTYPES,
                                           dtype_hint=None, values_a=values_a,
                                           values_b=values_b)
        offsets_a, offsets_b = same_index_dtype(index_tensor(offsets_a, "offsets_a"),
                                                index_tensor(offsets_b, "offsets_b"))
        return lib().recops_concat_jagged_tensor(
            values_a, offsets_a, values_b, offsets_b, n_prefix_from_right=n_prefix_from_right)


def split_jagged_tensor(values, offsets_a, offsets_b=None, n_prefix_to_right=0, name=None):
    """Splits a concatenated jagged tensor back into its A and B parts.

    The exact inverse of ``concat_jagged_tensor`` (``n_prefix_to_right`` plays the role of
    ``n_prefix_from_right``): walking sample ``b`` of ``values`` in order, the first
    ``q_b = min(p, lenB_b)`` rows go to B, the next ``lenA_b`` rows to A and the remaining
    ``lenB_b - q_b`` rows to B.

    Two calling forms:

    * jagged: ``split_jagged_tensor(values, offsets_a, offsets_b)`` returns
      ``(values_a, values_b)``;
    * ragged: ``split_jagged_tensor(rt, offsets_a)`` with ``rt`` a ``tf.RaggedTensor`` returns
      ``(rt_a, rt_b)``; ``offsets_b`` defaults to ``rt.row_splits - offsets_a`` (if given, it
      must equal that).

    Args:
      values: ``[RA+RB, ...]`` (float32, float16, bfloat16, float64, int32, int64) or a
        ``tf.RaggedTensor``.
      offsets_a: ``[B+1]`` int32/int64 offsets of A.
      offsets_b: ``[B+1]`` offsets of B.
      n_prefix_to_right: int >= 0.
      name: optional op name.

    Returns:
      ``(values_a [offsets_a[-1], ...], values_b [offsets_b[-1], ...])`` or two ragged tensors.

    Gradient: ``concat_jagged_tensor`` of the upstream gradients.

    Raises:
      InvalidArgumentError: bad offsets, or ``offsets_a[-1] + offsets_b[-1]`` different from
        the number of rows.
      TypeError: values not float32/float16/bfloat16/float64/int32/int64.

    Example:

    >>> v = tf.constant([1., 2., 10., 3., 20.])
    >>> a, b = split_jagged_tensor(v, [0, 2, 3], [0, 1, 2])
    >>> a.numpy().tolist(), b.numpy().tolist()
    ([1.0, 2.0, 3.0], [10.0, 20.0])
    """
    with tf.name_scope(name or "split_jagged_tensor"):
        if isinstance(values, tf.RaggedTensor):
            vals, splits = ragged_parts(values, "values")
            offsets_a = tf.cast(index_tensor(offsets_a, "offsets_a"), splits.dtype)
            derived_b = splits - offsets_a
            if offsets_b is None:
                offsets_b = derived_b
            else:
                offsets_b = tf.cast(index_tensor(offsets_b, "offsets_b"), splits.dtype)
                with tf.control_dependencies([tf.debugging.assert_equal(
                        offsets_b, derived_b,
                        message="offsets_a + offsets_b must equal the row_splits of values")]):
                    offsets_b = tf.identity(offsets_b)
            a, b = lib().recops_concat_jagged_tensor_grad(
                vals, offsets_a, offsets_b, n_prefix_to_right=n_prefix_to_right)
            return (tf.RaggedTensor.from_row_splits(a, offsets_a, validate=False),
                    tf.RaggedTensor.from_row_splits(b, offsets_b, validate=False))
        if offsets_b is None:
            raise TypeError("split_jagged_tensor(values, offsets_a, offsets_b): offsets_b is "
                            "required unless values is a tf.RaggedTensor")
        values, = value_tensors("split_jagged_tensor", dtypes=_DTYPES, dtype_hint=None,
                                values=values)
        offsets_a, offsets_b = same_index_dtype(index_tensor(offsets_a, "offsets_a"),
                                                index_tensor(offsets_b, "offsets_b"))
        a, b = lib().recops_concat_jagged_tensor_grad(
            values, offsets_a, offsets_b, n_prefix_to_right=n_prefix_to_right)
        return a, b


@tf.RegisterGradient("Recops>ConcatJaggedTensor")
def _concat_jagged_tensor_grad(op, grad):
    da, db = lib().recops_concat_jagged_tensor_grad(
        grad, op.inputs[1], op.inputs[3], n_prefix_to_right=op.get_attr("n_prefix_from_right"))
    return [da, None, db, None]


@tf.RegisterGradient("Recops>ConcatJaggedTensorGrad")
def _split_jagged_tensor_grad(op, grad_a, grad_b):
    grad_a = zeros_if_none(grad_a, op.outputs[0])
    grad_b = zeros_if_none(grad_b, op.outputs[1])
    d = lib().recops_concat_jagged_tensor(
        grad_a, op.inputs[1], grad_b, op.inputs[2],
        n_prefix_from_right=op.get_attr("n_prefix_to_right"))
    return [d, None, None]
