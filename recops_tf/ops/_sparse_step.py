"""Argument handling shared by the fused sparse optimizer steps (lazy_adam_update, sgd_update)."""
import tensorflow as tf

from recops_tf.ops._common import index_tensor
from recops_tf.ops.embedding_by_address import DynamicEmbeddingTable


def resource_handle(variable, name):
    """The resource handle of a tf.Variable or a Keras variable."""
    if hasattr(variable, "value") and not isinstance(variable, tf.Variable):
        variable = variable.value  # a Keras variable wraps a tf.Variable
    if not isinstance(variable, tf.Variable) or not hasattr(variable, "handle"):
        raise TypeError(f"{name} must be a resource tf.Variable, a Keras variable or a "
                        f"DynamicEmbeddingTable, got {type(variable).__name__}")
    return variable.handle


def float32_handle(variable, name, fn):
    """`resource_handle`, for a float32 variable (the fused steps' dtype: checked first, so a
    float64 variable is named, not its gradient); `fn` names the public function."""
    handle = resource_handle(variable, name)
    if tf.as_dtype(variable.dtype) != tf.float32:
        raise TypeError(f"{fn}: {name} must be float32, got {tf.as_dtype(variable.dtype).name}")
    return handle


def step_inputs(fn, target, gradient, indices, lr):
    """(is_table, gradient, indices, lr) with `gradient` split when it is an IndexedSlices."""
    is_table = isinstance(target, DynamicEmbeddingTable)
    if gradient is None:
        raise ValueError(
            f"{fn}: gradient is None: the loss does not depend on " +
            ("the table's lookups (take tape.gradient(loss, table.resource_handle) over "
             "embedding_lookup(table, ...) or embedding_lookup_by_address)" if is_table
             else "var"))
    if isinstance(gradient, tf.IndexedSlices):
        if indices is not None:
            raise ValueError(f"{fn}: pass indices only with a dense gradient, not an "
                             f"IndexedSlices")
        gradient, indices = gradient.values, gradient.indices
    if indices is None:
        raise ValueError(f"{fn}: indices are required with a dense [N, D] gradient")
    if tf.is_tensor(gradient) and gradient.dtype != tf.float32:
        raise TypeError(f"{fn}: gradient must be float32, got {gradient.dtype.name}")
    gradient = tf.convert_to_tensor(gradient, tf.float32, name="gradient")
    if is_table:
        indices = tf.convert_to_tensor(indices, tf.int64, name="addresses")
    else:
        indices = index_tensor(indices, "indices")
    lr = tf.convert_to_tensor(lr, tf.float32, name="lr")
    return is_table, gradient, indices, lr
