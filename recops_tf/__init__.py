"""recops_tf: fused recommendation-model operators for TensorFlow 2 / Keras 3.

Importing the package loads the op library once and registers every gradient once.
"""
try:
    import tensorflow  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "recops_tf needs TensorFlow 2.21: pip install 'recops_tf[cpu]' (tensorflow-cpu) or "
        "'recops_tf[full]' (tensorflow), or install tensorflow==2.21.* yourself") from e

from recops_tf import _loader  # noqa: E402

_loader.load()

from recops_tf.ops import *  # noqa: E402,F401,F403  (the public functions)
from recops_tf.ops import __all__ as _ops_all  # noqa: E402

from recops_tf import layers  # noqa: E402,F401  (Keras layers)
from recops_tf import optimizers  # noqa: E402,F401  (Keras optimizers)
from recops_tf import distributed  # noqa: E402,F401  (collectives, ShardedEmbedding)
from recops_tf import saving  # noqa: E402,F401  (SavedModel export with ragged signatures)
from recops_tf import compat  # noqa: E402,F401  (generative-recommenders' hstu_mha)

__version__ = "0.1.0"
__all__ = list(_ops_all)
