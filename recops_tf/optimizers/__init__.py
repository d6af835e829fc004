"""Keras 3 optimizers with fused sparse updates (TensorFlow backend)."""
from recops_tf.optimizers.lazy_adam import LazyAdam
from recops_tf.optimizers.sparse_sgd import SparseSGD

__all__ = ["LazyAdam", "SparseSGD"]
