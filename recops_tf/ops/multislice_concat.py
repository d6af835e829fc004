"""Many column slices concatenated into several outputs in one pass (stem multislice_concat)."""
import tensorflow as tf

from recops_tf.ops._common import lib, value_tensors, zeros_if_none


def _int_list(values, name):
    try:
        out = [int(v) for v in values]
    except TypeError as e:
        raise TypeError(f"{name} must be a list of Python ints") from e
    return out


def multislice_concat(x, concat_sizes, slice_begins, slice_lengths, name=None):
    """Builds several tensors, each a column-wise concatenation of column slices of ``x``.

    Definition: slices are consumed in order; output ``k`` concatenates along axis 1 the next
    ``concat_sizes[k]`` slices ``x[:, slice_begins[s] : slice_begins[s] + slice_lengths[s]]``
    (``slice_lengths[s] = -1`` means to the end of the row). Slices may overlap and repeat.
    It fuses the many ``x[:, b:b+l]`` + ``tf.concat`` of feature-splitting code into one
    parallel pass over the rows.

    Args:
      x: ``[R, D]`` float32, float16, bfloat16 or float64.
      concat_sizes: list of ``C >= 1`` ints, each ``>= 1``: slices per output.
      slice_begins: list of ``sum(concat_sizes)`` ints in ``[0, D)``.
      slice_lengths: list of ``sum(concat_sizes)`` ints, each ``>= 1`` with
        ``begin + length <= D``, or ``-1``.
      name: optional op name.

    Returns:
      A list of ``C`` tensors; output ``k`` is ``[R, sum of its slices' lengths]``.

    Gradient: the adjoint scatter-add: zeros ``[R, D]``, and each slice's columns of its
    output's gradient added in (overlapping slices accumulate; bfloat16/float16 in float32).

    Raises:
      InvalidArgumentError: ``x`` not rank 2; counts that do not add up; a begin outside
        ``[0, D)``, a length below 1 (other than -1) or running past ``D``.
      TypeError: ``x`` not float32/float16/bfloat16/float64.

    Example:

    >>> x = tf.reshape(tf.range(8.), [2, 4])
    >>> a, b = multislice_concat(x, [2, 1], [0, 3, 1], [1, 1, -1])
    >>> a.numpy().tolist(), b.numpy().tolist()
    ([[0.0, 3.0], [4.0, 7.0]], [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]])
    """
    concat_sizes = _int_list(concat_sizes, "concat_sizes")
    slice_begins = _int_list(slice_begins, "slice_begins")
    slice_lengths = _int_list(slice_lengths, "slice_lengths")
    if not concat_sizes:
        raise ValueError("multislice_concat: concat_sizes must not be empty")
    with tf.name_scope(name or "multislice_concat"):
        x, = value_tensors("multislice_concat", dtype_hint=None, x=x)
        return list(lib().recops_multislice_concat(
            x, N=len(concat_sizes), concat_sizes=concat_sizes, slice_begins=slice_begins,
            slice_lengths=slice_lengths))


@tf.RegisterGradient("Recops>MultisliceConcat")
def _multislice_concat_grad(op, *grads):
    grads = [zeros_if_none(g, out) for g, out in zip(grads, op.outputs)]
    return [lib().recops_multislice_concat_grad(
        grads, tf.shape(op.inputs[0], out_type=tf.int64),
        concat_sizes=op.get_attr("concat_sizes"), slice_begins=op.get_attr("slice_begins"),
        slice_lengths=op.get_attr("slice_lengths"))]


@tf.RegisterGradient("Recops>MultisliceConcatGrad")
def _multislice_concat_grad_grad(op, grad):
    outs = lib().recops_multislice_concat(
        grad, N=op.get_attr("N"), concat_sizes=op.get_attr("concat_sizes"),
        slice_begins=op.get_attr("slice_begins"), slice_lengths=op.get_attr("slice_lengths"))
    return list(outs) + [None]
