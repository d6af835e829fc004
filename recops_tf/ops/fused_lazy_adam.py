"""The Rec SDK's fused LazyAdam step (stem fused_lazy_adam)."""
import tensorflow as tf

from recops_tf.ops._common import lib
from recops_tf.ops._sparse_step import float32_handle, step_inputs
from recops_tf.ops.embedding_by_address import DynamicEmbeddingTable


def lazy_adam_update(var, m, v, gradient, indices, lr, beta1=0.9, beta2=0.999, epsilon=1e-7,
                     name=None):
    """One LazyAdam step on the rows a sparse gradient touches, in place.

    For each distinct row ``r`` of ``indices`` (duplicates' gradients summed first, in
    order, so the result is deterministic; negative indices skipped)::

        m[r] = beta1 * m[r] + (1 - beta1) * g
        v[r] = beta2 * v[r] + (1 - beta2) * g**2
        var[r] -= lr * m[r] / (sqrt(v[r]) + epsilon)

    ``lr`` is used as given: the caller applies Adam's bias correction
    (``lr * sqrt(1 - beta2**t) / (1 - beta1**t)``), as ``recops_tf.optimizers.LazyAdam`` does
    and as the Rec SDK's op expects. Rows not in ``indices`` are untouched (that is the
    "lazy"). Epsilon is outside the square root (TF-Addons LazyAdam).

    With a ``DynamicEmbeddingTable`` as ``var`` (``m`` and ``v`` None), ``indices`` are
    addresses and m, v are the rows' slots 0 and 1 (the table needs ``num_slots >= 2``);
    address 0 is skipped. Its gradient is ``tape.gradient(loss, table.resource_handle)``,
    an IndexedSlices keyed by address (lookups are watched automatically).

    Args:
      var: ``[V, D]`` float32 resource variable (tf or Keras), or a ``DynamicEmbeddingTable``.
      m: ``[V, D]`` float32 first-moment variable (None for a table).
      v: ``[V, D]`` float32 second-moment variable (None for a table).
      gradient: ``[N, D]`` float32 rows, or a ``tf.IndexedSlices`` (then ``indices=None``).
      indices: ``[N]`` (or ``[N, 1]``) int32/int64 rows of ``var``; int64 addresses for a table.
      lr: scalar learning rate, already bias-corrected.
      beta1: first-moment decay in [0, 1).
      beta2: second-moment decay in [0, 1).
      epsilon: > 0, added to ``sqrt(v)``.
      name: optional op name.

    Returns:
      The update op (None when executing eagerly).

    Gradient: none (an optimizer step).

    Raises:
      TypeError: ``var``, ``m``, ``v`` or ``gradient`` not float32 (the message names it),
        ``var`` neither a resource variable nor a table.
      ValueError: ``gradient`` None (the loss does not depend on ``var``), ``indices``
        missing for a dense gradient, ``m``/``v`` given for a table.
      InvalidArgumentError: an index ``>= V`` (nothing is written), a bad address, wrong
        shapes, ``beta``/``epsilon`` out of range, a table without slots.

    Example:

    >>> var = tf.Variable([[1., 1.], [1., 1.]])
    >>> m, v = tf.Variable(tf.zeros([2, 2])), tf.Variable(tf.zeros([2, 2]))
    >>> _ = lazy_adam_update(var, m, v, [[1., -1.]], [1], lr=0.1)
    >>> np.round(var.numpy().astype(float), 3).tolist()
    [[1.0, 1.0], [0.684, 1.316]]
    """
    with tf.name_scope(name or "lazy_adam_update"):
        if isinstance(var, DynamicEmbeddingTable):
            if m is not None or v is not None:
                raise ValueError("lazy_adam_update: a DynamicEmbeddingTable keeps m and v in "
                                 "its slots: pass m=None, v=None")
            handles = None
        else:  # the variables first: a float64 var is named as such, not via its gradient
            handles = [float32_handle(x, n, "lazy_adam_update")
                       for x, n in ((var, "var"), (m, "m"), (v, "v"))]
        _, gradient, indices, lr = step_inputs("lazy_adam_update", var, gradient, indices, lr)
        attrs = dict(beta1=float(beta1), beta2=float(beta2), epsilon=float(epsilon))
        if handles is None:
            return lib().recops_lazy_adam_by_address(var.resource_handle, lr, gradient,
                                                     indices, **attrs)
        return lib().recops_lazy_adam(*handles, lr, gradient, indices, **attrs)


tf.no_gradient("Recops>LazyAdam")
tf.no_gradient("Recops>LazyAdamByAddress")
