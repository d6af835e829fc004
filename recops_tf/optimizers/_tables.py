"""What LazyAdam and SparseSGD share: Keras' optimizer loop, taught to step
DynamicEmbeddingTables and to keep sparse gradients sparse."""
import keras
import tensorflow as tf

from recops_tf.ops.embedding_by_address import optimizer_variable


class TableAwareOptimizer(keras.optimizers.Optimizer):
    """A Keras optimizer that also takes a ``DynamicEmbeddingTable`` where a variable goes.

    ``build``, ``apply`` and ``apply_gradients`` replace each table (or its entry of
    ``tape.watched_variables()``) by the scalar gradient anchor standing for it, so Keras'
    loop runs unchanged: the step count (bias correction), gradient clipping, the learning
    rate schedule; ``update_step`` then sees the anchor and steps the table by address.
    Global-norm clipping keeps IndexedSlices sparse.
    """

    def build(self, variables):
        super().build([optimizer_variable(v) for v in variables])

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is not None:
            trainable_variables = [optimizer_variable(v) for v in trainable_variables]
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads):
        # Keras' global-norm clipping multiplies each gradient by the scale, which turns an
        # IndexedSlices dense (and fails for a table's, which has no dense_shape): scale the
        # values instead. The norm is the same (Keras squares an IndexedSlices' values).
        if (self.global_clipnorm and self.global_clipnorm > 0 and not self.clipnorm
                and any(isinstance(g, tf.IndexedSlices) for g in grads)):
            return tf.clip_by_global_norm(grads, self.global_clipnorm)[0]
        return super()._clip_gradients(grads)


def slices_of_table(gradient):
    """A table's gradient, checked to be the IndexedSlices keyed by address its lookups
    give."""
    if not isinstance(gradient, tf.IndexedSlices):
        raise TypeError(f"the gradient of a DynamicEmbeddingTable must be an IndexedSlices "
                        f"keyed by address (from its lookups), got {type(gradient).__name__}")
    return gradient
