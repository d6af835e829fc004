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


def step_inputs(target, gradient, indices, lr):
    """(is_table, gradient, indices, lr) with `gradient` split when it is an IndexedSlices."""
    if isinstance(gradient, tf.IndexedSlices):
        if indices is not None:
            raise ValueError("pass indices only with a dense gradient, not an IndexedSlices")
        gradient, indices = gradient.values, gradient.indices
    if indices is None:
        raise ValueError("indices are required with a dense [N, D] gradient")
    is_table = isinstance(target, DynamicEmbeddingTable)
    gradient = tf.convert_to_tensor(gradient, tf.float32, name="gradient")
    if is_table:
        indices = tf.convert_to_tensor(indices, tf.int64, name="addresses")
    else:
        indices = index_tensor(indices, "indices")
    lr = tf.convert_to_tensor(lr, tf.float32, name="lr")
    return is_table, gradient, indices, lr
