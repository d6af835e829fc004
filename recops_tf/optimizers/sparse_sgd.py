"""Plain SGD with per-row weight decay for Keras 3, on the fused SGD kernels."""
import keras
import tensorflow as tf

from recops_tf.ops.embedding_by_address import table_of_anchor
from recops_tf.ops.fused_sgd import sgd_update
from recops_tf.optimizers._tables import TableAwareOptimizer, slices_of_table
from recops_tf.optimizers.lazy_adam import _constant


@keras.saving.register_keras_serializable(package="recops_tf")
class SparseSGD(TableAwareOptimizer):
    """SGD, sparse where the gradient is: ``var[r] -= lr * (g + weight_decay * var[r])``.

    For a ``tf.IndexedSlices`` gradient only the touched rows change, each occurrence of a
    row applying its own step from the row's value before the batch (the Rec SDK's ``Sgd``:
    duplicates accumulate, weight decay counted once per occurrence); float32 variables use the
    fused ``sgd_update`` kernel, other dtypes the same math from stock ops. Dense gradients
    update every row: ``var -= lr * (g + weight_decay * var)``. A
    ``recops_tf.layers.DynamicEmbedding`` table (any ``num_slots``) is updated by address;
    so is a raw ``DynamicEmbeddingTable`` passed where a variable goes
    (``apply_gradients([(tape.gradient(loss, table.resource_handle), table)])``).

    Unlike Keras' decoupled ``weight_decay`` (applied to every row of every variable each
    step), this weight decay is part of the gradient, so untouched embedding rows do not decay.

    Args:
      learning_rate: float, schedule or callable.
      weight_decay: >= 0.
      name, **kwargs: as ``keras.optimizers.Optimizer``.
    """

    def __init__(self, learning_rate=0.01, weight_decay=0.0, name="sparse_sgd", **kwargs):
        if weight_decay is None or weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.sparse_weight_decay = float(weight_decay)

    def update_step(self, gradient, variable, learning_rate):
        wd = self.sparse_weight_decay
        table = table_of_anchor(variable)
        if table is not None:
            return sgd_update(table, slices_of_table(gradient), None, learning_rate,
                              weight_decay=wd)
        if isinstance(gradient, tf.IndexedSlices):
            if variable.dtype == tf.float32 and len(variable.shape) == 2:  # the kernel's case
                return sgd_update(variable, gradient, None, learning_rate, weight_decay=wd)
            dtype = variable.dtype
            values = tf.cast(gradient.values, dtype)
            if wd:
                values += _constant(wd, dtype) * tf.gather(variable, gradient.indices)
            return self.assign_sub(variable, tf.IndexedSlices(
                tf.cast(learning_rate, dtype) * values, gradient.indices))
        lr = tf.cast(learning_rate, variable.dtype)
        g = tf.cast(gradient, variable.dtype)
        if wd:
            g += _constant(wd, variable.dtype) * variable
        self.assign_sub(variable, lr * g)

    def get_config(self):
        config = super().get_config()
        config["weight_decay"] = self.sparse_weight_decay
        return config
