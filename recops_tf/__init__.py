"""recops_tf: fused recommendation-model operators for TensorFlow 2 / Keras 3.

Importing the package loads the op library once and registers every gradient once.
"""
from recops_tf import _loader

_loader.load()

from recops_tf.ops import *  # noqa: E402,F401,F403  (the public functions)
from recops_tf.ops import __all__ as _ops_all  # noqa: E402

__version__ = "0.1.0"
__all__ = list(_ops_all)
