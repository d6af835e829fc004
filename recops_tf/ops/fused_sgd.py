"""The Rec SDK's fused sparse SGD step (stem fused_sgd)."""
import tensorflow as tf

from recops_tf.ops._common import lib
from recops_tf.ops._sparse_step import float32_handle, step_inputs
from recops_tf.ops.embedding_by_address import DynamicEmbeddingTable


def sgd_update(var, gradient, indices, lr, weight_decay=0.0, name=None):
    """One sparse SGD step with weight decay, in place (the Rec SDK's ``Sgd``).

    For every ``i`` with ``r = indices[i] >= 0``::

        var[r] += -lr * (gradient[i] + weight_decay * var_old[r])

    where ``var_old`` is ``var`` before the step. Duplicate indices accumulate (weight decay
    counted once per occurrence), exactly ``scatter_nd_add(var, indices, -lr * (gradient +
    weight_decay * gather(var, indices)))``; negative indices are skipped.

    With a ``DynamicEmbeddingTable`` as ``var``, ``indices`` are addresses and the step
    applies to the rows' embedding columns; address 0 is skipped. Its gradient is
    ``tape.gradient(loss, table.resource_handle)``, an IndexedSlices keyed by address
    (lookups are watched automatically).

    Args:
      var: ``[V, D]`` float32 resource variable (tf or Keras), or a ``DynamicEmbeddingTable``.
      gradient: ``[N, D]`` float32, or a ``tf.IndexedSlices`` (then ``indices=None``).
      indices: ``[N]`` (or ``[N, 1]``) int32/int64 rows; int64 addresses for a table.
      lr: scalar learning rate.
      weight_decay: >= 0.
      name: optional op name.

    Returns:
      The update op (None when executing eagerly).

    Gradient: none (an optimizer step).

    Raises:
      TypeError: ``var`` or ``gradient`` not float32 (the message names it), ``var``
        neither a resource variable nor a table.
      ValueError: ``gradient`` None (the loss does not depend on ``var``), ``indices``
        missing for a dense gradient.
      InvalidArgumentError: an index ``>= V`` (nothing is written), a bad address, wrong
        shapes, a negative ``weight_decay``.

    Example:

    >>> var = tf.Variable([[1., 1.], [1., 1.]])
    >>> _ = sgd_update(var, [[1., 2.], [1., 2.]], [0, 0], lr=0.5)
    >>> var.numpy().tolist()
    [[0.0, -1.0], [1.0, 1.0]]
    """
    with tf.name_scope(name or "sgd_update"):
        is_table = isinstance(var, DynamicEmbeddingTable)
        handle = var.resource_handle if is_table else float32_handle(var, "var", "sgd_update")
        _, gradient, indices, lr = step_inputs("sgd_update", var, gradient, indices, lr)
        if is_table:
            return lib().recops_sgd_by_address(handle, lr, gradient, indices,
                                               weight_decay=float(weight_decay))
        return lib().recops_sgd(handle, lr, gradient, indices,
                                weight_decay=float(weight_decay))


tf.no_gradient("Recops>Sgd")
tf.no_gradient("Recops>SgdByAddress")
