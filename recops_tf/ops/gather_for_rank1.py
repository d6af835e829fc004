"""Rank-1 gather and its deterministic scatter-add adjoint (stem gather_for_rank1)."""
import tensorflow as tf

from recops_tf.ops._common import index_tensor, lib, value_tensors


def gather_for_rank1(x, index, name=None):
    """Gathers elements of a vector: ``y[k] = x[index[k]]``.

    A bounds-checked ``tf.gather`` for short rank-1 tables (position or bias tables), with
    no limit on the table length.

    Args:
      x: ``[E]`` float32, float16, bfloat16 or float64.
      index: ``[K]`` int32 or int64, every entry in ``[0, E)``.
      name: optional op name.

    Returns:
      ``[K]`` of ``x``'s dtype.

    Gradient: ``index_select_for_rank1_backward(dy, x, index)`` w.r.t. ``x`` (a deterministic
    scatter-add); none for ``index``.

    Raises:
      InvalidArgumentError: ``x`` or ``index`` not rank 1; an index outside ``[0, E)`` (the
        message names its position and value).
      TypeError: ``x`` not float32/float16/bfloat16/float64, ``index`` not int32/int64.

    Example:

    >>> gather_for_rank1(tf.constant([1., 2., 3.]), [2, 0, 2]).numpy().tolist()
    [3.0, 1.0, 3.0]
    """
    with tf.name_scope(name or "gather_for_rank1"):
        x, = value_tensors("gather_for_rank1", dtype_hint=None, x=x)
        return lib().recops_gather_for_rank1(x, index_tensor(index, "index"))


def index_select_for_rank1_backward(grad_y, x, index, name=None):
    """Adjoint of ``gather_for_rank1``: ``grad_x[j] = sum(grad_y[k] for k if index[k] == j)``.

    Deterministic: the positions k are cut into at most 16 chunks whose boundaries depend only
    on ``len(index)`` and ``len(x)`` (never on the thread count); each chunk sums in ascending
    k and the chunks are added in order, so results are bitwise identical on every run and
    thread count, and for up to 65536 indices equal the plain ascending-k sum. bfloat16 and
    float16 accumulate in float32 and round once.

    Args:
      grad_y: ``[K]`` gradient of the gather's output.
      x: ``[E]`` the gathered vector (only its length is used), same dtype as ``grad_y``.
      index: ``[K]`` int32/int64 in ``[0, E)``.
      name: optional op name.

    Returns:
      ``[E]`` of ``grad_y``'s dtype.

    Gradient: linear in ``grad_y``: ``gather_for_rank1(upstream, index)``; none for the rest.

    Raises:
      InvalidArgumentError: wrong ranks, ``len(grad_y) != len(index)``, index out of range.
      TypeError: ``x`` not float32/float16/bfloat16/float64, ``grad_y`` of another dtype, ``index``
        not int32/int64.

    Example:

    >>> index_select_for_rank1_backward([1., 2., 4.], tf.zeros([3]), [2, 0, 2]).numpy().tolist()
    [2.0, 0.0, 5.0]
    """
    with tf.name_scope(name or "index_select_for_rank1_backward"):
        x, grad_y = value_tensors("index_select_for_rank1_backward", dtype_hint=None, x=x,
                                  grad_y=grad_y)
        return lib().recops_index_select_for_rank1_backward(grad_y, x,
                                                            index_tensor(index, "index"))


@tf.RegisterGradient("Recops>GatherForRank1")
def _gather_for_rank1_grad(op, grad):
    return [lib().recops_index_select_for_rank1_backward(grad, op.inputs[0], op.inputs[1]), None]


@tf.RegisterGradient("Recops>IndexSelectForRank1Backward")
def _index_select_for_rank1_backward_grad(op, grad):
    return [lib().recops_gather_for_rank1(grad, op.inputs[2]), None, None]
