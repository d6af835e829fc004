"""Reversal of the valid prefix of each sequence (stem reverse_sequence)."""
import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib, stem_dtypes, value_tensors

_DTYPES = stem_dtypes("reverse_sequence")


def reverse_sequence(x, seq_lengths, name=None):
    """Reverses the first ``seq_lengths[b]`` steps of each sequence of a ``[B, T, D]`` tensor.

    Definition: ``out[b, len_b - 1 - t] = x[b, t]`` for ``t < len_b``; steps ``t >= len_b``
    are copied unchanged. The same as ``tf.reverse_sequence(x, seq_lengths, seq_axis=1,
    batch_axis=0)`` with the axes fixed, as a single parallel row copy.

    Args:
      x: ``[B, T, D]`` bfloat16, float16, float32, float64 or int64.
      seq_lengths: ``[B]`` int32/int64, each in ``[0, T]``.
      name: optional op name.

    Returns:
      ``[B, T, D]`` of ``x``'s dtype.

    Gradient: the op is its own inverse: ``reverse_sequence(dy, seq_lengths)``; none for
    ``seq_lengths`` (and none for int64 ``x``).

    Raises:
      InvalidArgumentError: ``x`` not rank 3, ``len(seq_lengths) != B``, a length outside
        ``[0, T]`` (negative lengths are rejected, as TensorFlow does, rather than treated
        as 0 as the seed does).
      TypeError: ``x`` not float32/float16/bfloat16/float64/int64, ``seq_lengths`` not
        int32/int64.

    Example:

    >>> x = tf.reshape(tf.range(4.), [1, 4, 1])
    >>> reverse_sequence(x, [3])[0, :, 0].numpy().tolist()
    [2.0, 1.0, 0.0, 3.0]
    """
    with tf.name_scope(name or "reverse_sequence"):
        x, = value_tensors("reverse_sequence", dtypes=_DTYPES, dtype_hint=None, x=x)
        return lib().recops_reverse_sequence(x, index_tensor(seq_lengths, "seq_lengths"))


@tf.RegisterGradient("Recops>ReverseSequence")
def _reverse_sequence_grad(op, grad):
    return [lib().recops_reverse_sequence(grad, op.inputs[1]), None]
